"""Make-like steps shared by the workflows: a run directory trained to its recipe, the analyses it lacks."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from landscape.analyze.summary import AnalysisReport
    from landscape.config.recipe import Recipe
    from landscape.core.rounds import Rounds

# receives a workflow's progress lines and notes (the CLI prints them on stderr)
Notify = Callable[[str], None]


def ignore(line: str) -> None:
    """The default ``notify``: progress lines and notes go nowhere."""


def ensure_run(recipe: Recipe, path: Path, *, progress: bool = False, notify: Notify = ignore) -> None:
    """Train a run directory the workflow owns, make-like: reuse it when done, resume it when unfinished,
    retrain it when its recipe changed."""
    from landscape.store import lifecycle
    from landscape.train import loop

    status = lifecycle.owned_run_status(recipe, path)
    notify(f"train {path}: {status}")
    if status == "new":
        lifecycle.claim_runs_folder(path.parent)
    if status in ("new", "replace"):
        loop.start_run(recipe, path, overwrite=status == "replace", progress=progress)
    elif status == "resume":
        loop.resume_run(path, rounds=recipe.train.rounds, progress=progress, threads=recipe.train.threads)


def ensure_analysis(paths: list[Path], pass_rounds: dict[str, Rounds], settings: Any, options: dict[str, Any], *,
                    progress: bool = False) -> list[AnalysisReport]:
    """Analyse each run of ``paths`` with each pass at its rounds (``pass_rounds``), its options and the
    analysis ``settings``; what is already computed with the same settings is skipped (its summary read).
    Returns the report of each run and pass, in that order."""
    from landscape.analyze.scheduler import run_analysis

    return [run_analysis(path, rounds=rounds, passes=[name], settings=settings, options={name: options[name]},
                         progress=progress)
            for path in paths for name, rounds in pass_rounds.items()]
