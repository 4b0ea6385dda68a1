"""Everything on disk: atomic file writes and locks, checkpoints, the run directory and its life, the read model of a run."""
