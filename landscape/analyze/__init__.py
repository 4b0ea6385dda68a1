"""Analysis of checkpoints: curvature, sharpness, flatness, incompatibility, alignment (docs/metrics.md)."""
