"""Experiment tracking: a run's metrics rows and its analysis results' summary numbers, also written to
TensorBoard event files (``<run>/tensorboard/``) and to Weights & Biases in offline mode
(``<run>/wandb/``), as the recipe's ``train.log`` asks.

Both are optional extras (``pip install 'fedlandscape[tensorboard]'``, ``'fedlandscape[wandb]'``): nothing here
imports them unless a recipe asks for them. A recipe asking for one that is not installed or whose import fails
(a broken install), and a run whose tracker folder cannot be written, are refused in one line before training or
analysis starts, with nothing written. Every numeric key of a metrics row is a scalar at step = its round (the
row's own name: ``train_loss``, ``test_acc``, ...); an event row (a divergence) is text under ``event``; an
analysis result's summary numbers are scalars ``<result name>/<quantity>`` (``hessian/lambda_max``) at step =
the checkpoint's round. TensorBoard's are plain scalar summaries (``SummaryWriter.add_scalar``: a float32
``simple_value``), what its scalar dashboard and ``EventAccumulator(path).Reload().Scalars(tag)`` read: each
reads back as metrics.jsonl's value rounded to float32 (metrics.jsonl keeps the exact float64). Weights & Biases
never reaches a network (``mode="offline"``; ``wandb sync <run>/wandb/offline-run-*`` uploads later); its x-axis
is the logged ``round``.

Each tracker's folder holds a ledger of what it was given (``logged-metrics.json``: the last round and the
number of event rows; ``logged-results.json``: the results), so that a resumed run appends to the same logs
without logging a round twice: the rounds a resume computes again (after the checkpoint it starts from)
give the same numbers and are not logged again, and rows the tracker has not seen (metrics.jsonl rows
written while it was off) are caught up when training starts. Removing a tracker's folder starts it
afresh. Only rank 0 of a torchrun job logs.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import os
import tempfile
import threading
import uuid
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from landscape.core.errors import LandscapeError
from landscape.core.reading import read_json
from landscape.store.fileio import os_reason, refuse_links, write_text

TRACKERS = ("tensorboard", "wandb")  # the choices of train.log
_MODULE = {"tensorboard": "tensorboard", "wandb": "wandb"}  # what each needs installed
_IMPORTS = {"tensorboard": "torch.utils.tensorboard", "wandb": "wandb"}  # what each imports to work
_FOLDER = {"tensorboard": "tensorboard", "wandb": "wandb"}  # where each writes in a run directory
_SHOWN = {"tensorboard": "TensorBoard", "wandb": "Weights & Biases"}
_METRICS_LEDGER = "logged-metrics.json"
_RESULTS_LEDGER = "logged-results.json"


def _distribution() -> str:
    """The name this package is installed under (the extras are pip's), ``landscape`` when unknown."""
    try:
        from importlib.metadata import packages_distributions

        return (packages_distributions().get("landscape") or ["landscape"])[0]
    except Exception:  # an odd environment: the import name is the best guess
        return "landscape"


def _way_out(name: str, recipe_file: Path | None) -> str:
    """How to go without tracker ``name``: the command line's way, or a run's recipe.toml (its ``train.log``
    may be edited: it changes no number, docs/tracking.md)."""
    if recipe_file is None:
        return f"leave {name} out of train.log / --log"
    return f"leave {name} out of train.log in {recipe_file}: a run's train.log may be edited, it changes no number"


def check_installed(names: Iterable[str], recipe_file: Path | None = None) -> None:
    """Refuse in one line a ``train.log`` naming a tracker whose package is missing, or installed but broken
    (its import raises: a damaged install). The packages are imported here, so only when a recipe asks for
    them. ``recipe_file``: the run's recipe.toml the ``train.log`` comes from (a resumed or analysed run), named
    as the way out; None: a recipe being trained (``--log``)."""
    for name in dict.fromkeys(names):
        try:
            found = importlib.util.find_spec(_MODULE[name]) is not None
        except (ImportError, ValueError):  # a module in sys.modules without a spec: importing tells
            found = True
        if not found:
            raise LandscapeError(f"train.log asks for {name}, which is not installed: pip install "
                                 f"'{_distribution()}[{name}]' (or {_way_out(name, recipe_file)})")
        try:
            importlib.import_module(_IMPORTS[name])
        except Exception as e:  # a broken install raises anything: one line, before anything is written
            raise LandscapeError(f"train.log asks for {name}, which is installed but does not import "
                                 f"({type(e).__name__}: {_first_line(e)}): repair it (pip install --force-reinstall "
                                 f"{_MODULE[name]}), or {_way_out(name, recipe_file)}") from None


def check_writable(root: Path, names: Iterable[str], recipe_file: Path | None = None) -> None:
    """Refuse in one line, before any work, a tracker folder of run directory ``root`` that cannot be written
    (read-only, not a folder): a file is made in it and removed again. A folder not there yet is made when the
    tracker starts, in the run directory whose own writes are checked where they happen."""
    for name in dict.fromkeys(names):
        folder = Path(root) / _FOLDER[name]
        if not (folder.exists() or folder.is_symlink()):
            continue
        try:
            fd, probe = tempfile.mkstemp(prefix=".landscape-probe.", suffix=".tmp", dir=folder)
            os.close(fd)
            os.unlink(probe)
        except OSError as e:
            raise LandscapeError(f"cannot write {_SHOWN[name]} logs in {folder}: {os_reason(e)}; make it writable, "
                                 f"or {_way_out(name, recipe_file)}") from None


def check_run(root: Path, names: Iterable[str], recipe_file: Path | None) -> None:
    """``check_installed`` and ``check_writable`` for the trackers of the run directory ``root`` (its
    ``recipe_file`` names them): everything a resume or an analysis checks before any work."""
    names = list(names)
    check_installed(names, recipe_file)
    check_writable(root, names, recipe_file)


def _numbers(values: Mapping[str, Any]) -> dict[str, float]:
    """The numeric values of a row (bools, lists, strings and the round itself left out)."""
    return {k: float(v) for k, v in values.items()
            if k != "round" and isinstance(v, (int, float)) and not isinstance(v, bool)}


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


# ----------------------------------------------------------------------------------------------------------
# the two trackers


def _quiet_writer_threads() -> None:
    """TensorBoard's writer thread keeps the error that stops it and the next call of the main thread raises
    it (turned into one line here); the thread's own traceback, printed by ``threading.excepthook``, is left
    out. Other threads' errors go to the hook there was before."""
    from tensorboard.summary.writer.event_file_writer import _AsyncWriterThread

    previous = threading.excepthook
    if getattr(previous, "landscape_quiet", False):
        return

    def hook(args: Any) -> None:
        if not isinstance(args.thread, _AsyncWriterThread):
            previous(args)

    hook.landscape_quiet = True  # type: ignore[attr-defined]
    threading.excepthook = hook


class _TensorBoard:
    """Event files under ``<run>/tensorboard/`` (torch.utils.tensorboard's SummaryWriter), flushed often; a
    failed write (read-only folder, full disk) is one line naming the folder."""

    def __init__(self, root: Path, project: str) -> None:
        from torch.utils.tensorboard import SummaryWriter

        _quiet_writer_threads()
        self.folder = root / "tensorboard"
        self.writer = None
        self.writer = self._writing(lambda: SummaryWriter(log_dir=str(self.folder), flush_secs=10))

    def _writing(self, write: Any) -> Any:
        try:
            return write()
        except OSError as e:
            with contextlib.suppress(Exception):  # its thread has stopped: the files are closed
                if self.writer is not None:
                    self.writer.close()
            raise LandscapeError(f"cannot write TensorBoard logs in {self.folder}: {os_reason(e)}") from None

    def log(self, round: int, scalars: dict[str, float], text: dict[str, str]) -> None:
        def write() -> None:
            for tag, value in scalars.items():
                self.writer.add_scalar(tag, value, round)  # a simple_value: what EventAccumulator.Scalars reads
            for tag, value in text.items():
                self.writer.add_text(tag, value, round)
            self.writer.flush()

        self._writing(write)

    def close(self) -> None:
        self._writing(self.writer.close)


class _Wandb:
    """An offline Weights & Biases run in ``<run>/wandb/``, its id kept in ``<run>/wandb/run-id`` so that a
    resumed run (and its analysis) continues the same run when synced."""

    def __init__(self, root: Path, project: str) -> None:
        import wandb

        self.folder = root / "wandb"
        id_file = self.folder / "run-id"
        try:
            run_id = id_file.read_text().strip() if id_file.is_file() else ""
        except OSError as e:
            raise LandscapeError(f"cannot read {id_file}: {os_reason(e)}") from None
        if not run_id:
            run_id = uuid.uuid4().hex[:12]
            write_text(id_file, run_id + "\n")
        # No console capture, no system metrics, no machine metadata; a run of its own beside any other in
        # this process (a user's, another run directory's): reinit="create_new", wandb >= 0.19.10.
        settings = wandb.Settings(mode="offline", console="off", silent=True, x_disable_stats=True,
                                  x_disable_meta=True)
        try:
            self.run = wandb.init(mode="offline", dir=str(root), project=project, name=root.name, id=run_id,
                                  resume="allow", reinit="create_new", settings=settings)
            self.run.define_metric("round")
            self.run.define_metric("*", step_metric="round")  # the x-axis: rounds come in any order
        except Exception as e:  # wandb's own errors are many kinds: one line
            raise LandscapeError(f"wandb could not start an offline run in {self.folder}: "
                                 f"{_first_line(e)}") from None

    def log(self, round: int, scalars: dict[str, float], text: dict[str, str]) -> None:
        self.run.log({"round": round, **scalars, **text})

    def close(self) -> None:
        self.run.finish()


_KINDS = {"tensorboard": _TensorBoard, "wandb": _Wandb}


# ----------------------------------------------------------------------------------------------------------
# the trackers of one run directory


class _Ledger:
    """What one tracker has logged, in a JSON file of its folder (written after each entry, atomically)."""

    def __init__(self, path: Path, empty: dict) -> None:
        self.path = path
        self.data = dict(empty)
        try:
            found = read_json(path, "a tracker's ledger") if path.is_file() else {}
        except LandscapeError:
            found = {}  # unreadable (damaged, nested too deep, not a file): what is there is logged again, never lost
        if isinstance(found, dict):
            self.data.update({k: v for k, v in found.items() if k in empty and type(v) is type(empty[k])})

    def save(self) -> None:
        write_text(self.path, json.dumps(self.data) + "\n")


class RunTrackers:
    """The trackers ``train.log`` names, for one run directory (none: every call does nothing)."""

    def __init__(self, root: Path, names: Iterable[str], project: str) -> None:
        self.root = Path(root)
        self.trackers: dict[str, Any] = {}
        self.metrics: dict[str, _Ledger] = {}
        self.results: dict[str, _Ledger] = {}
        for name in dict.fromkeys(names):  # a tracker's folder linked outside the run is refused (issue 46)
            refuse_links(self.root / name, itself=True, what="log into")
        try:
            for name in dict.fromkeys(names):
                tracker = self.trackers[name] = _KINDS[name](self.root, project)
                self.metrics[name] = _Ledger(tracker.folder / _METRICS_LEDGER, {"round": 0, "events": 0})
                self.results[name] = _Ledger(tracker.folder / _RESULTS_LEDGER, {"results": []})
        except BaseException:
            self.close()
            raise

    @classmethod
    def of(cls, root: Path, recipe: Any) -> RunTrackers:
        """The trackers a recipe asks for (its ``train.log``), writing into the run directory ``root``."""
        return cls(root, recipe.train.log, recipe.name or "landscape")

    def __bool__(self) -> bool:
        return bool(self.trackers)

    def log_row(self, row: Mapping[str, Any]) -> None:
        """One round row of metrics.jsonl, by every tracker that has not logged its round yet."""
        for name, tracker in self.trackers.items():
            ledger = self.metrics[name]
            if row["round"] > ledger.data["round"]:
                tracker.log(row["round"], _numbers(row), {})
                ledger.data["round"] = row["round"]
                ledger.save()

    def catch_up(self, rows: list[dict], events: list[dict]) -> None:
        """The round rows and event rows of metrics.jsonl (``RunDir.read_rows``) a tracker has not logged yet:
        rounds after its last one, and the event rows after those it has (event rows are never removed)."""
        for row in rows:
            self.log_row(row)
        for name, tracker in self.trackers.items():
            ledger = self.metrics[name]
            for event in events[ledger.data["events"]:]:
                text = json.dumps(event, allow_nan=True)
                tracker.log(event["round"], {}, {"event": text})
                ledger.data["events"] += 1
                ledger.save()

    def log_result(self, round: int, name: str, summary: Mapping[str, Any]) -> None:
        """One analysis result's summary numbers (scalars ``<name>/<quantity>`` at step = ``round``), once."""
        key = f"round-{round:04d}/{name}"
        scalars = {f"{name}/{k}": v for k, v in _numbers(summary).items()}
        for tracker_name, tracker in self.trackers.items():
            ledger = self.results[tracker_name]
            if key not in ledger.data["results"] and scalars:
                tracker.log(round, scalars, {})
                ledger.data["results"].append(key)
                ledger.save()

    def close(self) -> None:
        errors = []
        for tracker in self.trackers.values():
            try:
                tracker.close()
            except Exception as e:  # close the others first
                errors.append(e)
        self.trackers = {}
        if errors:
            raise LandscapeError(f"cannot finish the tracker logs in {self.root}: {_first_line(errors[0])}")


@contextlib.contextmanager
def for_training(run_dir: Any, recipe: Any, enabled: bool = True) -> Iterator[RunTrackers]:
    """The trackers of a run that trains (``run_dir``: a ``directory.RunDir``), with the rows of metrics.jsonl they
    have not logged caught up on entry and again on exit (the event row of a divergence). ``enabled`` false
    (a torchrun rank other than 0) or an empty ``train.log``: no tracker, nothing read."""
    if not (enabled and recipe.train.log):
        yield RunTrackers(run_dir.path, (), "")
        return
    trackers = RunTrackers.of(run_dir.path, recipe)
    try:
        trackers.catch_up(*run_dir.read_rows())
        yield trackers
    except BaseException:
        with contextlib.suppress(Exception):  # the error that stopped training is the one to see
            trackers.catch_up(*run_dir.read_rows())
            trackers.close()
        raise
    trackers.catch_up(*run_dir.read_rows())
    trackers.close()


class ResultLog:
    """The trackers of the runs an analysis writes results into: each run's opened at its first result, all
    closed together. Only run directories are logged (a loose folder of checkpoints or a state_dict is not);
    a run whose recipe asks for a tracker that is not installed is refused when this is made, before any
    work."""

    def __init__(self, sources: Iterable[Any] = ()) -> None:
        self.open: dict[Path, RunTrackers] = {}
        for source in sources:
            if self._asked(source):
                check_run(source.run_dir.path, source.recipe.train.log, source.run_dir.recipe)

    @staticmethod
    def _asked(source: Any) -> bool:
        return source.run_dir is not None and source.recipe is not None and bool(source.recipe.train.log)

    def log(self, source: Any, round: int, name: str, summary: Mapping[str, Any]) -> None:
        """The summary of result ``name`` of ``source`` (an ``analyze.source.Source``) at ``round``."""
        if not self._asked(source):
            return
        root = Path(source.run_dir.path)
        try:
            if root not in self.open:
                self.open[root] = RunTrackers.of(root, source.recipe)
            self.open[root].log_result(round, name, summary)
        except LandscapeError as e:  # the result is written: say how it reaches the trackers
            raise LandscapeError(f"{e}; the result analysis/round-{round:04d}/{name}.json is written but not "
                                 "logged: once the logs can be written, analyse it again with --force to log "
                                 "it") from None

    def close(self) -> None:
        opened, self.open = list(self.open.values()), {}
        for trackers in opened:
            trackers.close()
