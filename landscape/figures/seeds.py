"""Seeds aggregated: runs of one configuration that differ only in their recipe's ``seed`` are one group.

Grouping. ``recipe_groups`` groups recipes (``recipe.toml`` as a dict) whose keys are all equal but ``seed``,
ignoring the keys that say where or how a run was made, not what it is (``name``, ``train.device``,
``train.threads``, ``dataset.root``, ``dataset.download``). A configuration in which a seed repeats (two copies
of one run) is not aggregated: each of its runs stays a group of its own. ``rundata.load_runs`` marks the runs of
a group (``RunData.group``, ``RunData.group_label``, one colour); a figure recipe groups by run id instead
(``figure_recipe.figure_runs``: every seed of an id has the id's label and colour). ``groups`` turns loaded runs
into ``SeedGroup``s, in the order of their first run.

Statistics. ``mean_se`` is the one mean and standard error every figure, table and CSV uses: the mean over
seeds and the standard error of that mean, ``std(ddof=1) / sqrt(n)``; for one seed the standard error is
None (a single seed is drawn and printed exactly as before, without a band or "n=1"). ``series_mean`` applies
it per round to a series over rounds (the rounds every seed has).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from landscape.config.recipe import PLACE_KEYS
from landscape.core.errors import LandscapeError

# A run is a ``rundata.RunData`` (not imported: rundata imports this module, and the package has no import cycle).
RunData = Any

# Recipe keys that do not make two runs different experiments: the seed itself and where and how a round is
# computed (device, threads, vectorize, memory_format: the same numbers to float tolerance).
GROUP_IGNORES = PLACE_KEYS | {"seed"}


def mean_se(values: Sequence[Any]) -> tuple[Any, Any, int]:
    """(mean, standard error of the mean, n) over ``values`` (numbers, or arrays of one shape: element-wise).

    The standard error is ``std(ddof=1) / sqrt(n)``, None for n = 1. Non-finite values are kept (a diverged
    seed makes the mean NaN, it is not hidden)."""
    if len(values) == 0:
        raise LandscapeError("mean_se needs at least one value")
    try:
        stack = np.stack([np.asarray(v, dtype=float) for v in values])
    except (TypeError, ValueError) as e:
        raise LandscapeError(f"mean_se needs numbers or arrays of one shape ({e})") from None
    n = stack.shape[0]
    mean = stack.mean(axis=0)
    se = None if n == 1 else stack.std(axis=0, ddof=1) / math.sqrt(n)
    if mean.ndim == 0:
        return float(mean), (None if se is None else float(se)), n
    return mean, se, n


def flat_recipe(recipe: dict, prefix: str = "") -> dict[str, Any]:
    """A recipe's keys as dotted paths (``train.lr``)."""
    out: dict[str, Any] = {}
    for key, value in recipe.items():
        if isinstance(value, dict):
            out.update(flat_recipe(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def configuration(recipe: dict) -> str:
    """What a run is, without its seed (nor where or how it ran): equal for the seeds of one configuration."""
    flat = {k: v for k, v in flat_recipe(recipe).items() if k not in GROUP_IGNORES}
    return json.dumps(flat, sort_keys=True, default=repr)


def without_seed(recipe: dict) -> dict:
    return {k: v for k, v in recipe.items() if k != "seed"}


def recipe_groups(recipes: Sequence[dict]) -> list[list[int]]:
    """Indices of ``recipes`` grouped by configuration (first appearance first); a configuration whose seeds
    are not all different is split into one group per run."""
    by_key: dict[str, list[int]] = {}
    for i, recipe in enumerate(recipes):
        by_key.setdefault(configuration(recipe), []).append(i)
    out: list[list[int]] = []
    for members in by_key.values():
        seeds = [recipes[i].get("seed") for i in members]
        if len(set(map(repr, seeds))) == len(seeds):
            out.append(members)
        else:
            out += [[i] for i in members]
    return sorted(out, key=lambda g: g[0])


@dataclass
class SeedGroup:
    """The runs of one configuration, one per seed (a single run is a group of one)."""

    label: str
    runs: list[RunData]
    seeds: list[int | None]

    @property
    def n(self) -> int:
        return len(self.runs)

    @property
    def colour(self) -> str:
        return self.runs[0].color

    @property
    def legend(self) -> str:
        """The label, with the number of seeds when there are several: 'FedSAM, Dir(0.1) (n=3)'."""
        return f"{self.label} (n={self.n})" if self.n > 1 else self.label

    @property
    def name(self) -> str:
        """The run directories' names, compact: a common prefix and suffix around the parts that differ."""
        return compact_names([run.name for run in self.runs])


def compact_names(names: Sequence[str]) -> str:
    """'digits-fedsam-s{0,1,2}' for ['digits-fedsam-s0', 'digits-fedsam-s1', 'digits-fedsam-s2']; one name as is."""
    if len(names) == 1:
        return names[0]
    head = 0
    while all(len(n) > head for n in names) and len({n[head] for n in names}) == 1:
        head += 1
    tail = 0
    while all(len(n) - head > tail for n in names) and len({n[len(n) - 1 - tail] for n in names}) == 1:
        tail += 1
    middles = [n[head:len(n) - tail] for n in names]
    return f"{names[0][:head]}{{{','.join(middles)}}}{names[0][len(names[0]) - tail:]}"


def groups(runs: Sequence[RunData]) -> list[SeedGroup]:
    """The runs as seed groups: runs with one ``group`` key together (``None``: a group of its own), in the
    order of each group's first run."""
    found: dict[Any, list[RunData]] = {}
    for k, run in enumerate(runs):
        found.setdefault(("run", k) if run.group is None else ("group", run.group), []).append(run)
    out = []
    for members in found.values():
        first = members[0]
        label = (first.group_label or first.label) if len(members) > 1 else first.label
        out.append(SeedGroup(label, members, [run.recipe.get("seed") for run in members]))
    return out


def series_mean(group: SeedGroup, series: Callable[[RunData], tuple[np.ndarray, np.ndarray]]
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, int]:
    """(rounds, mean, standard error or None, n) of ``series(run) -> (rounds, values)`` over the group's seeds,
    at the rounds every seed has (one seed: its own series, SE None)."""
    data = [series(run) for run in group.runs]
    if len(data) == 1:
        rounds, values = data[0]
        return np.asarray(rounds, dtype=int), np.asarray(values, dtype=float), None, 1
    common = sorted(set.intersection(*(set(np.asarray(r).tolist()) for r, _ in data)))
    if not common:
        return np.zeros(0, dtype=int), np.zeros(0), np.zeros(0), len(data)
    picked = []
    for rounds, values in data:
        where = {int(r): i for i, r in enumerate(np.asarray(rounds).tolist())}
        picked.append(np.asarray(values, dtype=float)[[where[r] for r in common]])
    mean, se, n = mean_se(picked)
    return np.asarray(common, dtype=int), mean, se, n
