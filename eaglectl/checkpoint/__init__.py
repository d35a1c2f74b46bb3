"""What a checkpoint's files say: the drafter and the target folders, ModelOpt's speculation profile, what publishing sends."""
