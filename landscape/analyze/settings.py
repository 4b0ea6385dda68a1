"""The analysis settings shared by every pass (``AnalysisSettings``: split, subset, BN mode, device, backend,
product, batch size, seed, dtype, threads), checked where they enter. Imports nothing of the analysis, so
figures, reports and recipes read them without loading models or data sets."""

from __future__ import annotations

from dataclasses import dataclass

from landscape.config.recipe_sections import DTYPES
from landscape.core.errors import LandscapeError

SETTING_CHOICES = {"split": ("train", "test"), "bn_mode": ("eval", "train-batch-stats", "recompute"),
                   "backend": ("native", "pyhessian"), "hvp": ("double-backward", "forward-over-reverse"),
                   "dtype": ("auto", *DTYPES)}


@dataclass(frozen=True)
class AnalysisSettings:
    """Settings shared by every pass (recorded with each result)."""

    split: str = "train"  # train: union of all clients' training data; test: the test set
    analysis_samples: int = 0  # 0: all of the split; N: a fixed seeded subset of N samples
    bn_mode: str = "eval"
    device: str = "auto"
    backend: str = "native"  # native | pyhessian (lambda_max and trace cross-check)
    hvp: str = "double-backward"  # or forward-over-reverse
    batch_size: int = 512  # analysis batches (fixed order and boundaries)
    seed: int = 0
    dtype: str = "auto"  # auto: the run's (train.dtype) or the state_dict's dtype; float32; float64
    # CPU threads of torch during the analysis (0: every core): set by the analysis, never taken from the
    # machine, so the numbers do not change with it. Not part of what a result records as its settings (the
    # result records it beside them, with its seconds): another count changes the last bits only.
    threads: int = 1

    def __post_init__(self) -> None:
        """Every setting checked where it enters (CLI flags, analysis recipes, figure recipes): a bad value is one
        line naming it, never a silent zero or a result under a wrong name."""
        for key, allowed in SETTING_CHOICES.items():
            if getattr(self, key) not in allowed:
                raise LandscapeError(f"analysis setting {key} must be one of {', '.join(allowed)} "
                                     f"(got {getattr(self, key)!r})")
        for key, low, high in (("analysis_samples", 0, None), ("batch_size", 1, None), ("seed", 0, 2**32 - 1),
                               ("threads", 0, 4096)):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < low or (high and value > high):
                bounds = f">= {low}" if high is None else f"in {low}..{high}"
                raise LandscapeError(f"analysis setting {key} must be a whole number {bounds} (got {value!r})")
        if not isinstance(self.device, str) or not self.device:
            raise LandscapeError(f"analysis setting device must be auto, cpu, cuda or cuda:N (got {self.device!r})")

    def record(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "threads"}
