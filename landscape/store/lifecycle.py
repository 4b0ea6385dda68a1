"""The life of a run directory: create it (refusing to harm what is there), decide what a sweep or an owning
command does with an existing one, write its recipe and partition, find where a killed run resumes.

Training (``landscape.train.loop``) calls these; so do the sweep, figure and demo workflows
(``landscape.workflows``). Nothing here trains or loads a model.
"""

from __future__ import annotations

import json
import shlex
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from landscape.config import recipe as recipes
from landscape.config.recipe import PLACE_KEYS, Recipe
from landscape.config.setup import DataSetup
from landscape.core import parallel
from landscape.core.errors import LandscapeError
from landscape.data.partitions import heterogeneity
from landscape.store.checkpoints import CheckpointError, load_checkpoint
from landscape.store.directory import RUN_MARKER, RunDir, partition_record
from landscape.store.fileio import LOCK_NAME, os_reason, write_text

# The file that marks a folder whose runs a command made (and may therefore retrain when their recipe changes).
OWNED_MARKER = ".landscape-owned"


def print_warning(message: str) -> None:
    """The default ``warn`` of a resume: one line on stderr."""
    print(f"warning: {message}", file=sys.stderr, flush=True)


def check_recipe_writable(recipe: Recipe) -> None:
    """recipe.toml must read back as the same recipe (resume and analysis read it): else a one-line error
    naming the first value that does not survive the trip (e.g. a character TOML cannot escape)."""
    def survives(value: object) -> bool:
        try:
            return recipes.tomllib.loads(recipes.to_toml({"v": value}))["v"] == value
        except (recipes.tomllib.TOMLDecodeError, TypeError, ValueError):
            return False

    try:
        if recipes.resolve(recipes.tomllib.loads(recipes.to_toml(recipe))) == recipe:
            return
    except (recipes.tomllib.TOMLDecodeError, LandscapeError, TypeError, ValueError):
        pass
    for key, value in recipe.to_dict().items():
        for sub, v in (value.items() if isinstance(value, dict) else [("", value)]):
            if not survives(v):
                where = f"{key}.{sub}" if sub else key
                raise LandscapeError(f"{where} = {v!r} cannot be written to recipe.toml and read back the same")
    raise LandscapeError("this recipe cannot be written to recipe.toml and read back the same")


def write_run_files(run_dir: RunDir, recipe: Recipe, setup: DataSetup, recipe_too: bool = True) -> None:
    """recipe.toml (which makes the folder a run directory: a process killed after it can be resumed), then
    partition.json (which a resume writes again when it is missing)."""
    if recipe_too:
        write_text(run_dir.recipe, recipes.to_toml(recipe))
    settings = {"name": recipe.partition.name, **recipe.partition.options, "seed": recipe.seed}
    record = partition_record(setup.client_indices, setup.histogram, settings,
                              heterogeneity(setup.histogram, setup.client_indices, len(setup.bundle.train)).record())
    write_text(run_dir.partition, json.dumps(record) + "\n")


def clear_run_dir(run_dir: RunDir) -> None:
    """Empty a run directory that --overwrite replaces (keeping our own lock file and the marker)."""
    for entry in run_dir.path.iterdir():
        if entry.name in (LOCK_NAME, RUN_MARKER) and entry.is_file() and not entry.is_symlink():
            continue
        try:
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
        except OSError as e:
            raise LandscapeError(f"cannot replace {run_dir.path}: {entry}: {os_reason(e)}") from None


def check_out_dir(run_dir: RunDir, overwrite: bool) -> None:
    """A new run may start in ``run_dir``: it is missing or empty, or ``overwrite`` is given and it is a run
    directory this tool made (its marker, ``.landscape-run``). A run made before the marker existed is
    replaced only when it holds nothing but a run's files (recipe.toml, partition.json, metrics.jsonl,
    checkpoints/, analysis/, figures/, the lock): a folder holding anything else, or a recipe.toml alone,
    may be the user's, and is left as it is."""
    path = run_dir.path
    if path.exists() and not path.is_dir():
        raise LandscapeError(f"{path} exists and is not a directory")
    if path.is_dir() and not run_dir.is_empty():
        if not overwrite:
            raise LandscapeError(f"{path} already exists and is not empty; pass --resume "
                                 f"{shlex.quote(str(path))} to continue it "
                                 "or --overwrite to replace it")
        check_run_folder(run_dir)
        if run_dir.marker.is_file() and not run_dir.marker.is_symlink():
            return
        foreign = run_dir.foreign_entries()
        if foreign:
            shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
            raise LandscapeError(f"{path} holds files that are not a run's ({shown}); --overwrite replaces only a "
                                 "run directory this tool made: move them away, or choose another --out (or --name, "
                                 "for a single run)")
        if not run_dir.holds_run_files():
            raise LandscapeError(f"{path} holds a recipe.toml but no run files (partition.json, metrics.jsonl, "
                                 "checkpoints/); --overwrite replaces only a run directory this tool made: "
                                 "move it away, or choose another --out (or --name, for a single run)")


def check_run_folder(run_dir: RunDir) -> None:
    """``run_dir`` is missing, empty or a run directory (not a file, not a folder of something else)."""
    path = run_dir.path
    if path.exists() and not path.is_dir():
        raise LandscapeError(f"{path} exists and is not a directory")
    if path.is_dir() and not run_dir.is_empty() and not run_dir.is_run():
        raise LandscapeError(f"{path} is not empty and not a run directory; --overwrite only replaces runs")


def sweep_status(recipe: Recipe, path: Path, overwrite: bool) -> str:
    """What ``landscape train`` does with one run directory: 'new' (train), 'done' (skip), 'resume', or with
    ``overwrite`` 'replace' (train anew, whatever run it holds: this recipe's, finished or not, or another's).
    Decided by rank 0 under torchrun (the other ranks could see a directory rank 0 is creating)."""
    return parallel.on_main(lambda: _sweep_status(recipe, path, overwrite))


def held_run_text(recipe: Recipe, path: Path) -> str:
    """What the run directory ``path`` holds, in words, for the line that says it is replaced: 'a run of another
    recipe (train.lr is 0.05 there, 0.01 here)', "this recipe's run, finished (round 30)" or "this recipe's run,
    unfinished (last checkpoint: round 10)"."""
    held = _held_run(path)
    if held is None:
        return "nothing"
    run_dir, recorded = held
    if recorded is None:
        return "a run whose recipe.toml does not read"
    stale = recipes.difference(recorded, recipe, ignore=PLACE_KEYS)
    if stale is not None:
        return f"a run of another recipe ({stale.replace(' in recipe.toml', ' here')})"
    rounds = run_dir.rounds()
    last = rounds[-1] if rounds else 0
    if _done_or_resume(run_dir, recipe) == "done":
        return f"this recipe's run, finished (round {last})"
    return f"this recipe's run, unfinished (last checkpoint: round {last})"


def _held_run(path: Path) -> tuple[RunDir, str | None] | None:
    """What ``path`` holds: None where a new run starts (missing or empty); else its run directory (checked to be
    one, whatever the flags: replacing checks more) and its recorded recipe as TOML, resolved again so that a key
    added to the recipes since reads as its default (None when it does not read)."""
    run_dir = RunDir(path)
    if not path.exists() or (path.is_dir() and run_dir.is_empty()):
        return None
    check_run_folder(run_dir)
    try:
        return run_dir, recipes.to_toml(recipes.read_recipe(run_dir.recipe))
    except LandscapeError:
        return run_dir, None


def _done_or_resume(run_dir: RunDir, recipe: Recipe) -> str:
    rounds = run_dir.rounds()
    return "done" if rounds and rounds[-1] >= recipe.train.rounds else "resume"


def _sweep_status(recipe: Recipe, path: Path, overwrite: bool) -> str:
    held = _held_run(path)
    if held is None:
        return "new"
    run_dir, recorded = held
    if overwrite:
        check_out_dir(run_dir, overwrite)  # refused now, before any run starts, when it is no run this tool made
        return "replace"
    if recorded is None:  # compared as written
        recorded = run_dir.recipe.read_text(errors="replace")
    # Where and how a round is computed (device, threads, vectorize, memory_format) is not which run it is.
    if recipes.difference(recorded, recipe, ignore=PLACE_KEYS) is not None:
        raise LandscapeError(f"{path} holds a run of another recipe; pass --overwrite to replace it")
    return _done_or_resume(run_dir, recipe)


def owned_run_status(recipe: Recipe, path: Path) -> str:
    """What a command that owns a run directory (``landscape figures``, ``landscape demo``) does with it: 'new'
    (train), 'done' (reuse), 'resume' (same recipe, unfinished) or 'replace' (its recorded recipe differs in
    a key other than where it ran: retrain). Like ``make``: the recipe is the input, the run its product.
    Decided by rank 0 under torchrun, as ``sweep_status``."""
    return parallel.on_main(lambda: _owned_run_status(recipe, path))


def _owned_run_status(recipe: Recipe, path: Path) -> str:
    held = _held_run(path)
    if held is None:
        return "new"
    run_dir, recorded = held
    if recorded is None:
        return "replace"
    # More rounds continue the run when no schedule depends on the number of rounds (the numbers of round t
    # are then those of a fresh run); otherwise a run of other length is another run.
    extendable = recipe.train.lr_schedule != "cosine" and not recipe.train.swa
    ignore = PLACE_KEYS | {"train.rounds"} if extendable else PLACE_KEYS
    rounds = run_dir.rounds()
    stale = recipes.difference(recorded, recipe, ignore=ignore)
    if stale is None and rounds and rounds[-1] > recipe.train.rounds:  # longer than asked
        stale = f"it ran {rounds[-1]} rounds, {recipe.train.rounds} are asked"
    if stale is not None:
        if not (path.parent / OWNED_MARKER).is_file():
            raise LandscapeError(f"{path} holds a run this command did not make ({stale}); it is left as it is: "
                                 "move it away or choose another --out (or --name, for a single run)")
        return "replace"
    return _done_or_resume(run_dir, recipe)


def claim_runs_folder(folder: Path) -> None:
    """Mark ``folder`` as holding runs made by ``landscape figures`` / ``landscape demo`` (rank 0 writes)."""
    def write() -> None:
        marker = folder / OWNED_MARKER
        if not marker.is_file():
            write_text(marker, "runs made by `landscape figures` or `landscape demo`: retrained when their recipe "
                               "changes\n")

    parallel.on_main(write)


@dataclass
class ResumePoint:
    """Where a run continues: the newest checkpoint that loads (None: from the initial model), and the
    damaged newer ones that resuming sets aside."""

    round: int
    checkpoint: dict | None
    path: Path | None
    damaged: list[CheckpointError] = field(default_factory=list)


def find_resume_point(run_dir: RunDir) -> ResumePoint:
    """The newest loadable checkpoint; newer damaged ones (truncated, corrupted) are listed, not touched.

    A checkpoint that would run code, or that is not a landscape checkpoint, stops the search with a
    one-line error: it is not damage from a crash, and the user should look at it. So does one holding NaN or
    inf (``load_checkpoint`` checks every tensor): the run diverged by that round, and resuming from an earlier
    checkpoint would compute the same rounds again (training is deterministic); nothing is moved."""
    damaged: list[CheckpointError] = []
    for r in reversed(run_dir.rounds()):
        path = run_dir.checkpoint(r)
        try:
            return ResumePoint(r, load_checkpoint(path), path, damaged)
        except CheckpointError as e:
            if e.kind == "missing":
                continue
            if e.kind == "non-finite":
                raise LandscapeError(f"cannot resume {run_dir.path}: {relative(run_dir, path)}: {e.reason}: the "
                                     f"run diverged by round {r}, and --resume cannot continue from it (nothing "
                                     "was changed); to train its rounds again from an earlier checkpoint, which "
                                     "gives the same values unless the file was damaged after it was written, "
                                     "move it away") from None
            if e.kind != "damaged":
                raise LandscapeError(f"cannot resume {run_dir.path}: {relative(run_dir, path)}: {e.reason}; move "
                                     "it away to resume from an earlier checkpoint") from None
            damaged.append(e)
    return ResumePoint(0, None, None, damaged)


@dataclass
class MetricsRepair:
    """What a resume does to metrics.jsonl besides dropping the rows after its checkpoint: set damaged lines
    aside, and recompute the rows of rounds up to the checkpoint that have none (a damaged or cut line),
    replaying from ``start`` (a checkpoint before the first of them; None: the initial model)."""

    damaged: list[tuple[int, str]] = field(default_factory=list)
    missing: list[int] = field(default_factory=list)
    start: Path | None = None


def plan_metrics_repair(run_dir: RunDir, resume_round: int) -> MetricsRepair:
    rows, damaged = run_dir.scan_metrics()
    have = {r["round"] for r in rows if "event" not in r}
    missing = [t for t in range(1, resume_round + 1) if t not in have]
    start = None
    if missing:
        for r in reversed(run_dir.rounds()):
            if r < missing[0]:
                try:
                    load_checkpoint(run_dir.checkpoint(r))
                except CheckpointError:
                    continue  # only a starting point: an earlier one will do
                start = run_dir.checkpoint(r)
                break
    return MetricsRepair(damaged, missing, start)


def rounds_text(rounds: list[int]) -> str:
    """'round 3' or 'rounds 3, 5, 6'."""
    return f"round {rounds[0]}" if len(rounds) == 1 else "rounds " + ", ".join(map(str, rounds))


def relative(run_dir: RunDir, path: Path) -> str:
    try:
        return str(path.relative_to(run_dir.path))
    except ValueError:
        return str(path)
