"""The measurement library: curvature operators and their estimators (Lanczos, trace, density), sharpness,
flatness distance and incompatibility, alignment, loss-surface grids and their evaluation, on a model and its data
in memory (docs/metrics.md). Torch only: it imports nothing of landscape but ``core`` (an import-linter contract),
so the notebook API (``landscape.api``) and the run pipeline (``landscape.analyze``) both sit on it."""
