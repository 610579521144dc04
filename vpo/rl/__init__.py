"""Training: the one-jit RL step (`step`), the SFT warm start (`sft`), grain data (`data`), the
host loop with checkpoints and resume (`loop`), metric and sample logs, host memory."""
