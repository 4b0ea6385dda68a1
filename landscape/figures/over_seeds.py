"""Numbers over the seeds of a configuration that the matplotlib figures and the plotly report both draw.

``by_seed_group`` puts per-run extractions (``extract.HessianSummary``, ``extract.CosineMatrix``: each
carries its run) in the seed groups of their runs (``landscape.figures.seeds.groups``); ``mean_cosines`` is a
group's mean gradient-cosine matrix with its standard errors; ``density_floor`` the lowest density the
log-scale spectral density plots show; ``rounds_text`` names the rounds a group's values come from.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from landscape.figures.extract import CosineMatrix, HessianSummary
from landscape.figures.seeds import SeedGroup, groups, mean_se

PerRun = TypeVar("PerRun", HessianSummary, CosineMatrix)


def by_seed_group(items: Sequence[PerRun]) -> list[tuple[SeedGroup, list[PerRun]]]:
    """The items in the seed groups of their runs, in the groups' order: (group, its seeds' items)."""
    by_run = {id(item.run): item for item in items}
    return [(group, [by_run[id(run)] for run in group.runs])
            for group in groups([item.run for item in items])]


def rounds_text(rounds: Sequence[int]) -> str:
    """'round 3' or 'rounds 2, 3'."""
    return f"round{'s' if len(rounds) > 1 else ''} {', '.join(map(str, rounds))}"


def density_floor(densities: Sequence[np.ndarray]) -> float:
    """The lowest density a log-scale plot of these spectral densities shows: 1e-7 of their peak."""
    peak = max((float(np.nanmax(d)) for d in densities if d.size), default=1.0)
    return peak * 1e-7 if peak > 0 else 1e-12


@dataclass(frozen=True)
class SeedCosines:
    """A group's gradient-cosine matrices over its seeds: the mean matrix, its standard error (None for one
    seed), n, the mean off-diagonal cosine with its standard error, and the rounds they were analysed at."""

    matrix: np.ndarray
    se: np.ndarray | None
    n: int
    off_diagonal: float
    off_diagonal_se: float | None
    rounds: list[int]


def mean_cosines(members: Sequence[CosineMatrix]) -> SeedCosines:
    """``mean_se`` of the members' cosine matrices (of one shape) and of their mean off-diagonal cosines."""
    matrix, se, n = mean_se([m.matrix for m in members])
    off, off_se, _ = mean_se([m.mean_off_diagonal for m in members])
    return SeedCosines(matrix, se, n, off, off_se, sorted({m.round for m in members}))
