"""The repairs a resume makes to its run directory once every check has passed (``loop.resume_run``): damaged
checkpoints set aside, partition.json and metrics.jsonl repaired, each said through ``warn``.
"""

from __future__ import annotations

from collections.abc import Callable

from landscape.config.recipe import Recipe
from landscape.config.setup import DataSetup
from landscape.store import lifecycle
from landscape.store.checkpoints import partition_problem
from landscape.store.directory import RunDir
from landscape.store.lifecycle import ResumePoint


def set_aside_damaged(run_dir: RunDir, point: ResumePoint, target: str, warn: Callable[[str], None]) -> None:
    """The damaged newest checkpoints renamed ``.damaged`` (never deleted), each said with the checkpoint the
    run resumes from (``target``); a run with no checkpoint at all said too."""
    for error in point.damaged:
        moved = run_dir.set_aside(error.path)
        warn(f"{lifecycle.relative(run_dir, error.path)} is damaged ({error.reason}); moved to {moved.name}; {target}")
    if point.checkpoint is None and not point.damaged:
        warn(f"{run_dir.path} has no checkpoint yet (its first process stopped early); {target}")


def repair_partition(run_dir: RunDir, recipe: Recipe, setup: DataSetup, warn: Callable[[str], None]) -> None:
    """partition.json written where it is missing; one that is not the recipe's partition renamed
    ``partition.json.damaged`` and written again (training always uses the recipe's)."""
    if not run_dir.partition.is_file():
        lifecycle.write_run_files(run_dir, recipe, setup, recipe_too=False)
        return
    problem = partition_problem(run_dir.partition, setup.client_indices, len(setup.bundle.train))
    if problem is not None:
        moved = run_dir.set_aside(run_dir.partition)
        lifecycle.write_run_files(run_dir, recipe, setup, recipe_too=False)
        warn(f"partition.json {problem}; moved to {moved.name} and written again from the recipe "
             "(training always uses the recipe's seeded partition)")


def repair_metrics(run_dir: RunDir, repair: lifecycle.MetricsRepair, until: int, recomputed: list[dict],
                   warn: Callable[[str], None]) -> None:
    """metrics.jsonl repaired: its damaged lines moved to ``metrics.jsonl.damaged``, the rows after round
    ``until`` dropped and the missing rows (``recomputed``) put in their places, each said through ``warn``."""
    if repair.damaged:
        aside = run_dir.set_aside_lines(repair.damaged)
        numbers = [n for n, _ in repair.damaged]
        lines = f"line {numbers[0]} is" if len(numbers) == 1 else "lines " + ", ".join(map(str, numbers)) + " are"
        warn(f"metrics.jsonl {lines} damaged (not a JSON row); moved to {aside.name}")
    if repair.missing:
        start = repair.start.name if repair.start is not None else "the initial model"
        warn(f"metrics.jsonl had no row for {lifecycle.rounds_text(repair.missing)}; recomputed from "
             f"{start} (the checkpoints are unchanged)")
    run_dir.truncate_metrics(until, [row for row in recomputed if row["round"] in repair.missing])
