"""The analysis settings shared by every pass (``AnalysisSettings``: split, subset, BN mode, device, backend,
product, batch size, seed, dtype, threads, memory format), a schema of the one loader
(``landscape.core.schema``): their kinds, ranges and choices are in the annotations, checked where they enter
(CLI flags, analysis recipes, figure recipes). Imports nothing of the analysis, so figures, reports and recipes
read them without loading models or data sets."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Annotated, Literal

from landscape.config.sections import DTYPES
from landscape.core.schema import check, choices, rule

# "auto": the run's dtype (train.dtype) or the state_dict's; else one of the training recipe's dtypes
Dtype = Literal[("auto", *DTYPES)]


# Settings that say how a result is computed, not what: recorded beside its settings (the last bits only).
HOW_COMPUTED = frozenset({"threads", "memory_format"})
# Settings that only the passes declaring them read (``PassSpec.reads``: the hessian pass's backend and
# products); every other pass records them at their defaults, which is what a record without them means to the
# names (``store.results.names.ResultNames.qualified_settings`` fills defaults), so ``--backend pyhessian`` names
# and recomputes only the results it changes.
READ_BY_DECLARATION = frozenset({"backend", "hvp"})


@dataclass(frozen=True)
class AnalysisSettings:
    """Settings shared by every pass (recorded with each result)."""

    split: Literal["train", "test"] = "train"  # train: all clients' training data pooled; test: the test set
    # 0: all of the split; N: a fixed seeded subset of N samples
    analysis_samples: Annotated[int, rule("0: all of the split", ge=0)] = 0
    bn_mode: Literal["eval", "train-batch-stats", "recompute"] = "eval"
    device: Annotated[str, rule(min_length=1, text="must be auto, cpu, cuda or cuda:N")] = "auto"
    # pyhessian: the lambda_max and trace cross-check (the hessian pass's; the other passes' results are the same)
    backend: Literal["native", "pyhessian"] = "native"
    # auto: double-backward, through kept graphs where they fit, rebuilt otherwise (the same numbers); the hessian
    # pass's products (the other passes make none)
    hvp: Literal["auto", "double-backward", "forward-over-reverse"] = "auto"
    batch_size: Annotated[int, rule(ge=1)] = 512  # analysis batches (fixed order and boundaries)
    seed: Annotated[int, rule(ge=0, le=2**32 - 1, text="must be in 0..4294967295")] = 0
    dtype: Dtype = "auto"
    # CPU threads of torch during the analysis (0: every core): set by the analysis, never taken from the
    # machine, so the numbers do not change with it. Not part of what a result records as its settings (the
    # result records it beside them, with its seconds): another count changes the last bits only.
    threads: Annotated[int, rule(ge=0, le=4096, text="must be in 0..4096 (0: every core)")] = 1
    # the layout of the losses' and gradients' 4-D tensors (landscape.core.memory_format; auto: channels-last on
    # the CPU for a model with 2-D convolutions); Hessian-vector products are contiguous always.
    # Like threads, recorded beside a result's settings, not among them: it changes the last bits only.
    memory_format: Literal["auto", "channels-last", "contiguous"] = "auto"

    def __post_init__(self) -> None:
        """Made directly too (from CLI flags): every setting checked as the loader checks an analysis recipe's
        [settings], a bad value one line naming it, never a silent zero or a result under a wrong name."""
        check(self, "settings", noun="analysis setting")

    def record(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k not in HOW_COMPUTED}

    def read_by(self, reads: frozenset[str]) -> AnalysisSettings:
        """These settings as a pass that reads ``reads`` of ``READ_BY_DECLARATION`` sees them (and its result
        records them): the others of ``READ_BY_DECLARATION`` at their defaults."""
        unknown = sorted(set(reads) - READ_BY_DECLARATION)
        if unknown:
            raise ValueError(f"reads {', '.join(unknown)}: only {', '.join(sorted(READ_BY_DECLARATION))} are "
                             "declared per pass (every pass reads the other settings)")
        defaults = AnalysisSettings()
        unread = {k: getattr(defaults, k) for k in READ_BY_DECLARATION - set(reads)}
        return replace(self, **unread) if any(getattr(self, k) != v for k, v in unread.items()) else self


# The choices of the settings that have them: the analyze command's click choices derive from these.
SETTING_CHOICES = {key: choices(AnalysisSettings, key)
                   for key in ("split", "bn_mode", "backend", "hvp", "dtype", "memory_format")}
