"""Starting and resuming a run: the entry points of training (``start_run``, ``resume_run``), with the replay
that recomputes a resumed run's missing metrics rows. The rounds themselves are run by the trainer
(``landscape.train.trainer.Trainer``); the run directory's life (creating it safely, what a sweep does with it,
where a resume starts) is ``landscape.store.lifecycle``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

from landscape.config import recipe as recipes
from landscape.config.recipe import Recipe
from landscape.config.setup import prepare_data, using_threads
from landscape.core import parallel
from landscape.core.errors import LandscapeError
from landscape.store import lifecycle, tracking
from landscape.store.checkpoints import load_checkpoint
from landscape.store.directory import RunDir
from landscape.store.fileio import RunLock, os_reason, write_text
from landscape.store.lifecycle import ResumePoint
from landscape.train.repair import repair_metrics, repair_partition, set_aside_damaged
from landscape.train.state import TrainerState
from landscape.train.trainer import Trainer


def start_run(recipe: Recipe, out: Path, *, overwrite: bool = False, progress: bool = True) -> TrainerState:
    """Validate everything, then create the run directory and train. Nothing is written on bad input.

    The run directory is locked (``RunLock``) while the run trains: a second process is refused. Under
    torchrun rank 0 alone checks, locks and writes the directory; every rank trains."""
    run_dir = RunDir(out)
    parallel.on_main(lambda: lifecycle.check_out_dir(run_dir, overwrite))
    lifecycle.check_recipe_writable(recipe)
    setup = prepare_data(recipe)
    trainer = Trainer(recipe, run_dir, setup)
    with contextlib.ExitStack() as held:

        def open_run_dir() -> None:
            try:
                run_dir.path.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise LandscapeError(f"cannot create {run_dir.path}: {os_reason(e)}") from None
            held.enter_context(RunLock(run_dir))
            lifecycle.check_out_dir(run_dir, overwrite)  # again, locked: another process may have filled it meanwhile
            if overwrite:
                lifecycle.clear_run_dir(run_dir)
            run_dir.remove_stale_temp_files()
            run_dir.mark()  # before recipe.toml: a folder this tool made, whatever happens next
            lifecycle.write_run_files(run_dir, recipe, setup)

        parallel.on_main(open_run_dir)
        return trainer.train(trainer.initial_state(), progress=progress)


def resume_run(path: Path, rounds: int | None = None, progress: bool = True,
               warn: Callable[[str], None] | None = None, threads: int | None = None) -> TrainerState:
    """Continue a run from its last good checkpoint, to the recipe's rounds or to ``rounds`` (with ``threads``
    CPU threads from now on, when given: recorded in recipe.toml).

    Everything is checked before the directory changes (recipe, checkpoint, model shapes, ``rounds``). Then,
    with the run locked: a damaged newest checkpoint is renamed ``round-NNNN.pt.damaged`` (never deleted)
    and ``warn`` (default: a line on stderr) says which checkpoint the run resumes from; temporary files of
    a killed process are removed; metrics rows after the resumed round are dropped (they are recomputed).
    metrics.jsonl keeps every intact row: a damaged line goes to ``metrics.jsonl.damaged``, and the rows of
    rounds up to the checkpoint that have none are recomputed from an earlier checkpoint (the checkpoints
    are not touched); a partition.json that is not the recipe's partition is renamed
    ``partition.json.damaged`` and written again; a thread count other than the checkpoint's is named.
    Each of these says so through ``warn``. Under torchrun rank 0 alone locks, chooses the checkpoint and
    changes the directory; the other ranks load the checkpoint it chose (the run directory must be on a
    file system every machine sees).
    """
    warn = warn or lifecycle.print_warning
    run_dir = RunDir(path)
    with contextlib.ExitStack() as held:
        found: dict[str, ResumePoint] = {}

        def locate() -> tuple[Recipe, Path | None, lifecycle.MetricsRepair, int, bool]:
            if not run_dir.path.is_dir() or not run_dir.is_run():
                raise LandscapeError(f"{path} is not a run directory (no recipe.toml); nothing to resume")
            recorded = recipes.read_recipe(run_dir.recipe)
            changed = {"train.rounds": rounds, "train.threads": threads}
            recipe = recorded.with_values({k: v for k, v in changed.items() if v is not None})
            tracking.check_run(run_dir.path, recipe.train.log, run_dir.recipe)  # train.log: before any work
            held.enter_context(RunLock(run_dir))
            point = found["point"] = lifecycle.find_resume_point(run_dir)
            if rounds is not None and rounds < point.round:
                raise LandscapeError(f"--rounds {rounds} is below the last checkpoint's round {point.round}")
            repair = lifecycle.plan_metrics_repair(run_dir, point.round)
            return recipe, point.path, repair, recorded.train.rounds, recipe != recorded

        recipe, checkpoint_path, repair, recorded_rounds, changed = parallel.on_main(locate)
        point = found.get("point")
        if point is None:  # a rank other than 0: the checkpoint rank 0 chose
            checkpoint = load_checkpoint(checkpoint_path) if checkpoint_path is not None else None
            point = ResumePoint(0 if checkpoint is None else int(checkpoint["round"]), checkpoint, checkpoint_path)
        trainer = Trainer(recipe, run_dir)
        if point.checkpoint is not None:
            state = trainer.state_from_checkpoint(point.checkpoint, point.path)
            target = f"resuming from {point.path.name}"
        else:
            state = trainer.initial_state()
            target = "starting again from the initial model (round 0)"
        recomputed = replay_rows(trainer, repair, point.round, recorded_rounds) if repair.missing else []
        trained_with = point.checkpoint.get("threads") if point.checkpoint is not None else None

        def prepare() -> None:
            # Every check has passed: from here on the directory changes.
            set_aside_damaged(run_dir, point, target, warn)
            if type(trained_with) is int and trained_with != trainer.threads:
                warn(f"{point.path.name} was trained with {trained_with} CPU thread{'s' if trained_with > 1 else ''}, "
                     f"this resume uses {trainer.threads} (train.threads): its rounds may differ in the last bits "
                     "from a run that kept one count")
            run_dir.remove_stale_temp_files()
            repair_partition(run_dir, recipe, trainer.setup, warn)
            repair_metrics(run_dir, repair, state.round, recomputed, warn)
            if changed:  # --rounds, --threads
                write_text(run_dir.recipe, trainer.recipe_text)

        parallel.on_main(prepare)
        return trainer.train(state, progress=progress)


def replay_rows(trainer: Trainer, repair: lifecycle.MetricsRepair, until: int, final: int) -> list[dict]:
    """The metrics rows of ``repair.missing``, recomputed by running the rounds again from ``repair.start``
    (or the initial model) up to round ``until``; nothing is written. The test set is evaluated where the run
    evaluated it (every eval_every rounds and at its last round, ``final``)."""
    checkpoint = load_checkpoint(repair.start) if repair.start is not None else None
    state = trainer.state_from_checkpoint(checkpoint, repair.start) if checkpoint else trainer.initial_state()
    rows = []
    with using_threads(trainer.train_cfg.threads):
        while state.round < until:
            state, _, row = trainer.run_round(state)
            if state.round not in repair.missing:
                continue
            if state.round == final and "test_acc" not in row and parallel.is_main():
                row["test_loss"], row["test_acc"] = trainer.evaluate(state)
                row["seconds"] = row.pop("seconds")
            rows.append(row)
    return rows
