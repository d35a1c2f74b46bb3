"""The torch side: the reference drafter (`reference.py`), loading a checkpoint into it (`loader.py`), running an
HF target (`hf.py`) and the speculative loop's counts by replay (`replay.py`)."""
