"""Training: the one-jit RL step (`step`) in its stages (`groups`, `ppo`, `mismatch`), the
overlapped and environment steps, the SFT warm start (`sft`), the checks of a run's settings
(`checks`), compile-ahead and host memory (`host_memory`). The host loop around the step is
`vpo.run`."""
