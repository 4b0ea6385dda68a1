"""The runs of one ``landscape train`` command, one or a sweep: every run's folder under one parent (``--out``),
checked before any of them starts, then each trained, resumed or skipped by what its folder holds."""

from __future__ import annotations

import shlex
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from landscape.core.errors import LandscapeError
from landscape.workflows.ensure import Notify, ignore

if TYPE_CHECKING:
    from landscape.config.recipe import Recipe


class SweepRun(NamedTuple):
    """One run of a sweep: its recipe, its folder, what the sweep does with it (``lifecycle.sweep_status``:
    new, done, resume or replace) and, for replace, what the folder holds (``lifecycle.held_run_text``)."""

    recipe: Recipe
    path: Path
    status: str
    held: str = ""


def plan_sweep(runs: list[tuple[Recipe, dict[str, Any]]], parent: Path, overwrite: bool,
               name: str | None = None) -> list[SweepRun]:
    """The runs of ``recipe_overrides.build_sweep`` under ``parent``, each named systematically
    (``recipe_overrides.sweep_run_name``: a single run as a sweep's), or ``name`` for a single run (refused for
    several). Refused in one line when two of them get the same name, or when ``parent`` is itself a run
    directory (--out names the folder the runs go into, never a run)."""
    from landscape.config import overrides as recipe_overrides
    from landscape.config import recipe as recipes
    from landscape.store import lifecycle
    from landscape.store.directory import RunDir

    if name is not None:
        if len(runs) > 1:
            raise LandscapeError(f"--name names the directory of a single run, and this command makes {len(runs)} "
                                 "runs, each named <out>/<its generated name>: leave --name out (--set "
                                 "name=PREFIX puts PREFIX- before each generated name)")
        if not name:
            raise LandscapeError("--name must not be empty (leave it out for the generated name)")
        recipes.check_name(name, what="--name")
    if RunDir(parent).is_run():
        example = name or recipe_overrides.sweep_run_name(*runs[0])
        raise LandscapeError(f"--out {parent} is a run directory (it holds recipe.toml), and --out is the folder "
                             f"the runs go into (the run would be {parent / example}): to continue that run, "
                             f"--resume {shlex.quote(str(parent))}; to train into it, --out "
                             f"{shlex.quote(str(parent.parent))} --name {shlex.quote(parent.name)}")
    plan = [(recipe, parent / (name or recipe_overrides.sweep_run_name(recipe, swept))) for recipe, swept in runs]
    names = [p.name for _, p in plan]
    if len(set(names)) != len(names):
        first = next(i for i, n in enumerate(names) if names.index(n) != i)
        a, b = runs[names.index(names[first])][1], runs[first][1]
        differ = ", ".join(f"{k} = {a[k]!r} and {b[k]!r}" for k in a if a[k] != b.get(k)) or ", ".join(
            f"{k} = {v!r}" for k, v in a.items())
        raise LandscapeError(f"two runs of this sweep get the same name '{names[first]}' ({differ}); give "
                             "them different values or a name")
    planned = []
    for recipe, path in plan:
        status = lifecycle.sweep_status(recipe, path, overwrite)
        held = lifecycle.held_run_text(recipe, path) if status == "replace" else ""
        planned.append(SweepRun(recipe, path, status, held))
    return planned


def run_sweep(plan: list[SweepRun], *, overwrite: bool, progress: bool = False, notify: Notify = ignore,
              replacing: Callable[[SweepRun], None] | None = None) -> Iterator[tuple[Path, int]]:
    """Train the runs of ``plan`` in order (a done run is skipped, an unfinished one resumed, one to replace
    announced through ``replacing`` first), yielding each trained run's folder and its last round as it
    finishes."""
    from landscape.train import loop

    for i, run in enumerate(plan, start=1):
        notify(f"[{i}/{len(plan)}] {run.status}: {run.path}")
        if run.status == "done":
            continue
        if run.status == "resume":
            state = loop.resume_run(run.path, progress=progress, threads=run.recipe.train.threads)
        else:
            if run.status == "replace" and replacing is not None:
                replacing(run)
            state = loop.start_run(run.recipe, run.path, overwrite=overwrite or run.status == "replace",
                                   progress=progress)
        yield run.path, state.round
