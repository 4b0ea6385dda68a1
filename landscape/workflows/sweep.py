"""A sweep of training runs: every run's folder under one parent, checked before any of them starts, then
each trained, resumed or skipped by what its folder holds."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from landscape.core.errors import LandscapeError
from landscape.workflows.ensure import Notify, ignore

if TYPE_CHECKING:
    from landscape.config.recipe import Recipe


class SweepRun(NamedTuple):
    """One run of a sweep: its recipe, its folder and what the sweep does with it (``lifecycle.sweep_status``:
    new, done, resume or replace)."""

    recipe: Recipe
    path: Path
    status: str


def plan_sweep(runs: list[tuple[Recipe, dict[str, Any]]], parent: Path, overwrite: bool) -> list[SweepRun]:
    """The runs of ``recipe_overrides.build_sweep`` under ``parent``, each named systematically; refused in
    one line when two of them get the same name."""
    from landscape.config import overrides as recipe_overrides
    from landscape.store import lifecycle

    plan = [(recipe, parent / recipe_overrides.sweep_run_name(recipe, swept)) for recipe, swept in runs]
    names = [p.name for _, p in plan]
    if len(set(names)) != len(names):
        first = next(i for i, name in enumerate(names) if names.index(name) != i)
        a, b = runs[names.index(names[first])][1], runs[first][1]
        differ = ", ".join(f"{k} = {a[k]!r} and {b[k]!r}" for k in a if a[k] != b.get(k)) or ", ".join(
            f"{k} = {v!r}" for k, v in a.items())
        raise LandscapeError(f"two runs of this sweep get the same name '{names[first]}' ({differ}); give "
                             "them different values or a name")
    return [SweepRun(recipe, path, lifecycle.sweep_status(recipe, path, overwrite)) for recipe, path in plan]


def run_sweep(plan: list[SweepRun], *, overwrite: bool, progress: bool = False,
              notify: Notify = ignore) -> Iterator[tuple[Path, int]]:
    """Train the runs of ``plan`` in order (a done run is skipped, an unfinished one resumed), yielding each
    trained run's folder and its last round as it finishes."""
    from landscape.train import loop

    for i, run in enumerate(plan, start=1):
        notify(f"[{i}/{len(plan)}] {run.status}: {run.path}")
        if run.status == "done":
            continue
        if run.status == "resume":
            state = loop.resume_run(run.path, progress=progress, threads=run.recipe.train.threads)
        else:
            state = loop.start_run(run.recipe, run.path, overwrite=overwrite, progress=progress)
        yield run.path, state.round
