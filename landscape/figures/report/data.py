"""The numbers the report's tables show, extracted from loaded runs once (compare's CSV and claims read them
too).

Each pass's registered summary quantities in the tables' order (``quantities``), the radii the runs' sharpness
results have (``all_rhos``), per run its training outcome and each quantity's value at the latest round its
pass analysed (``ComparisonRow``), and per configuration the same over its seeds (``ComparisonGroup``, each
cell a ``SeedStat``: mean, standard error, n and each seed's value). ``surface_files`` lists a run's loss
surfaces, whatever their directions and settings.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from landscape.analyze.registry import Quantity
from landscape.figures.rundata import RunData
from landscape.figures.seeds import SeedGroup, groups, mean_se
from landscape.store.run import PassRecord

# The order of the passes' columns in the tables; a pass not named here comes after these, in name order.
TABLE_PASSES = ("hessian", "sharpness", "flatness", "incompatibility", "alignment", "loss")


def quantities(rhos: Sequence[float]) -> list[Quantity]:
    """Every analysis quantity the tables show (each pass's registered ``Quantity``s), with S_rho at each of
    ``rhos``."""
    from landscape.analyze.passes import PASSES as registry  # the declared passes (no pass function)

    order = [name for name in TABLE_PASSES if name in registry]
    order += [name for name in registry.names() if name not in order]
    return [q for name in order for q in registry.quantities(name, rhos)]


def all_rhos(runs: Sequence[RunData]) -> list[float]:
    """Every radius rho at which some analysed round of some run has S_rho, ascending."""
    found: set[float] = set()
    for run in runs:
        for rec in (run.analyses[r]["sharpness"] for r in run.analysed_rounds("sharpness")):
            found |= {round(float(v), 12) for v in np.atleast_1d(rec.array("global.rhos"))}
    return sorted(found)


def metric_at(run: RunData, key: str, round: int) -> Any:
    """The run's metrics.jsonl value of ``key`` at ``round`` (None where that round does not log it)."""
    for row in run.metrics:
        if row.get("round") == round and row.get(key) is not None:
            return row[key]
    return None


@dataclass(frozen=True)
class ComparisonRow:
    """One run's line of a comparison: training outcome, and per quantity (value, standard error, round) at
    the latest round its pass analysed (None where the pass never ran)."""

    run: RunData
    rounds: int | None
    final_acc: float | None
    best_acc: float | None
    final_loss: float | None
    online_distance: float | None  # Delta_D logged by training at the last round
    latest: int | None  # the latest analysed round
    values: list[tuple[Any, Any, int] | None]


def comparison_rows(runs: Sequence[RunData], shown: Sequence[Quantity]) -> list[ComparisonRow]:
    """One ``ComparisonRow`` per run, reading the ``shown`` quantities."""
    rows = []
    for run in runs:
        _, acc = run.series("test_acc")
        _, loss = run.series("train_loss")
        _, distance = run.series("flatness_distance")
        analysed = sorted(run.analyses)
        values: list[tuple[Any, Any, int] | None] = []
        for q in shown:
            done = run.analysed_rounds(q.pass_name)
            values.append((*q.read(run.analyses[done[-1]][q.pass_name]), done[-1]) if done else None)
        rows.append(ComparisonRow(
            run, max((r["round"] for r in run.metrics if "round" in r), default=None),
            float(acc[-1]) if acc.size else None, float(np.nanmax(acc)) if acc.size else None,
            float(loss[-1]) if loss.size else None, float(distance[-1]) if distance.size else None,
            analysed[-1] if analysed else None, values))
    return rows


# A standard error of exactly 0 is no error estimate: not "+- 0" but what it means (a pass's Monte-Carlo draws, or
# the seeds of a group, all gave this value).
SAME_DRAWS = "every draw the same"
SAME_SEEDS = "every seed the same"


@dataclass(frozen=True)
class SeedStat:
    """One quantity over the seeds of a group: mean, standard error (None for one value), how many seeds have
    it, and each seed's value (None where a seed lacks it)."""

    mean: float | None
    se: float | None
    n: int
    per_seed: list[float | None]

    def text(self, *, plusmn: str = "+-", digits: str = ".4g") -> str:
        """'0.1234 +- 0.0056', with '(n=2)' when fewer seeds than the group's have the value; '-' for none, 'n/a'
        for NaN; a standard error of 0 as what it means (``SAME_DRAWS`` for one run's, ``SAME_SEEDS`` over seeds)."""
        if self.mean is None:
            return "-"
        if math.isnan(self.mean):
            return "n/a"
        same = SAME_DRAWS if len(self.per_seed) == 1 else SAME_SEEDS
        error = "" if self.se is None else f" {plusmn} {self.se:.2g}" if self.se else f" ({same})"
        out = f"{self.mean:{digits}}" + error
        return out + (f" (n={self.n})" if self.n < len(self.per_seed) else "")

    def seeds_text(self) -> str:
        """Each seed's value, '; '-separated ('-' where a seed lacks it): the CSV's per-seed cells."""
        return "; ".join("-" if v is None else f"{v:.6g}" for v in self.per_seed)


def seed_stat(values: Sequence[Any]) -> SeedStat:
    """``mean_se`` over the values that are there (None: the seed lacks the quantity)."""
    numbers: list[float | None] = []
    for value in values:
        try:
            numbers.append(None if value is None else float(value))
        except (TypeError, ValueError):
            numbers.append(None)
    have = [v for v in numbers if v is not None]
    if not have:
        return SeedStat(None, None, 0, numbers)
    mean, se, n = mean_se(have)
    return SeedStat(mean, se, n, numbers)


@dataclass(frozen=True)
class ComparisonGroup:
    """One configuration's line of a comparison: its seed group and each seed's ``ComparisonRow``."""

    group: SeedGroup
    rows: list[ComparisonRow]

    def stat(self, read: Callable[[ComparisonRow], Any]) -> SeedStat:
        return seed_stat([read(row) for row in self.rows])

    def quantity(self, k: int) -> tuple[SeedStat, list[int], bool]:
        """The ``k``-th shown quantity over the seeds, the rounds it was read at, and whether each seed's is
        at its latest analysed round."""
        values = [row.values[k] for row in self.rows]
        rounds = sorted({v[2] for v in values if v is not None})
        latest = all(v is None or v[2] == row.latest for v, row in zip(values, self.rows))
        return seed_stat([v[0] if v is not None else None for v in values]), rounds, latest


def comparison_groups(runs: Sequence[RunData], shown: Sequence[Quantity]) -> list[ComparisonGroup]:
    """``comparison_rows`` grouped by configuration (``seeds.groups``): one group per run unless runs differ
    only in their seed."""
    by_run = {id(row.run): row for row in comparison_rows(runs, shown)}
    return [ComparisonGroup(group, [by_run[id(run)] for run in group.runs]) for group in groups(runs)]


def missing_reason(rec: PassRecord | None, q: Quantity) -> str:
    """Why a stored result has no number (NaN) for ``q``: the note its result gives for that part (a
    ``<part>_note`` text whose part starts the quantity's key: ``applied_note`` for
    ``applied_incompatibility``, e.g. 'fedavg applies no perturbation'); 'not computed' without one."""
    if rec is not None and isinstance(rec.result, dict):
        parts = q.key.split(".")[-1].split("_")
        for end in range(len(parts) - 1, 0, -1):
            note = rec.result.get("_".join(parts[:end]) + "_note")
            if isinstance(note, str) and note:
                return note
    return "not computed"


def is_surface(rec: PassRecord) -> bool:
    """Whether a stored result is a loss surface: its result says along which directions it was evaluated
    (random, pca, clients, interpolate), as only surface results do."""
    return isinstance(rec.result, dict) and "directions" in rec.result


def surface_files(run: RunData) -> list[tuple[int, Path]]:
    """(round, path) of every surface of the run, whatever its directions and settings: the NPZ of each
    surface result (a partial grid is not a result yet), and ``surface*.npz`` files without a record."""
    found = {(r, rec.path.with_suffix(".npz")) for r, recs in run.results.items() for rec in recs
             if is_surface(rec) and rec.path.with_suffix(".npz").is_file()}
    recorded = {path for _, path in found}
    found |= {(r, path) for r, path in run.run.loose_arrays() if path.name.startswith("surface")
              and not path.name.endswith(".partial.npz") and path not in recorded}
    return sorted(found)
