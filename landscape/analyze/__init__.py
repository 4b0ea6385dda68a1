"""The analysis of a run's checkpoints: the passes, their plan and scheduler, the checkpoints' sources and the
results they file (docs/metrics.md); the computations themselves are in ``landscape.measure``."""
