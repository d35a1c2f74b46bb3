"""Numbers from running the target and the reference drafter: the target loaded once, the probe, workloads, acceptance."""
