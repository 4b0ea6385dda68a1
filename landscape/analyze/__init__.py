"""Analysis of checkpoints: curvature, sharpness, flatness, incompatibility, alignment (METRICS.md)."""
