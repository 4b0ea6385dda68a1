"""Experiment tracking (``train.log``, ``--log``): TensorBoard event files and offline Weights & Biases runs
read back and compared with metrics.jsonl and the analysis results, a resume that logs no round twice, a
divergence logged as text, and the optional extras refused in one line when missing, imported only when
asked."""

from __future__ import annotations

import errno
import importlib.util
import io
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from support.helpers import invoke, one_line_error, tiny_recipe

from landscape.analyze.catalog import pass_options
from landscape.analyze.scheduler import run_analysis
from landscape.analyze.settings import AnalysisSettings
from landscape.config import recipe as recipes
from landscape.core.errors import LandscapeError
from landscape.store import tracking
from landscape.store.directory import RunDir
from landscape.store.results.files import stored_results
from landscape.train import loop

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = AnalysisSettings(device="cpu")
MLP = {"model__name": "mlp", "model__hidden": [16]}


def tensorboard_logs(run: Path) -> dict[str, list[tuple[int, object]]]:
    """Every tag of the run's event files -> its (step, value) in the order written, read as anyone reads them:
    scalars with ``EventAccumulator(path).Reload().Scalars(tag)`` (a float32 each), text from its tensors (as
    str); orphaned steps are not purged, so a step logged twice shows twice."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util

    events = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0},
                              purge_orphaned_data=False).Reload()
    out: dict[str, list] = {tag: [(e.step, e.value) for e in events.Scalars(tag)]
                            for tag in events.Tags()["scalars"]}
    for tag in events.Tags()["tensors"]:
        values = [(e.step, tensor_util.make_ndarray(e.tensor_proto)) for e in events.Tensors(tag)]
        out[tag] = [(step, v.item().decode()) for step, v in values]
    return out


def as_float32(logs: dict[str, list[tuple[int, float]]]) -> dict[str, list[tuple[int, float]]]:
    """The values TensorBoard's scalars hold of exact ones: each rounded to float32 (its simple_value)."""
    return {tag: [(step, float(np.float32(value))) for step, value in steps] for tag, steps in logs.items()}


def metrics_scalars(run: Path, leave_out: tuple[str, ...] = ()) -> dict[str, list[tuple[int, float]]]:
    """What the trackers must hold of metrics.jsonl: every numeric key of every round row at step = round."""
    expected: dict[str, list] = {}
    for row in RunDir(run).read_metrics():
        for key, value in row.items():
            if key != "round" and key not in leave_out and isinstance(value, (int, float)) \
                    and not isinstance(value, bool):
                expected.setdefault(key, []).append((row["round"], float(value)))
    return expected


def analyse(run: Path, **more):
    return run_analysis(run, rounds="all", passes=["loss"], settings=SETTINGS,
                        options={"loss": pass_options("loss", {})}, progress=False, **more)


def result_summaries(run: Path) -> dict[str, list[tuple[int, float]]]:
    """Every summary number of the run's results as the trackers name it: ``<result name>/<quantity>``."""
    expected: dict[str, list] = {}
    for folder in sorted((run / "analysis").iterdir()):
        for path, record in stored_results(folder):
            for key, value in record["summary"].items():
                expected.setdefault(f"{path.stem}/{key}", []).append((record["round"], float(value)))
    return expected


def test_tensorboard_holds_every_metrics_row_and_result_and_a_resume_logs_no_round_twice(tmp_path):
    run = tmp_path / "run"
    loop.start_run(tiny_recipe(train__log=["tensorboard"], **MLP), run, progress=False)
    assert tensorboard_logs(run) == as_float32(metrics_scalars(run))
    assert "train_loss" in metrics_scalars(run) and "test_acc" in metrics_scalars(run)
    # what TensorBoard's own reader gives back is metrics.jsonl's numbers (float32), not placeholders
    (_, first), *_ = metrics_scalars(run)["train_loss"]
    assert first > 0 and tensorboard_logs(run)["train_loss"][0][1] == pytest.approx(first, rel=1e-6)

    # Killed after round 3 was logged but before its checkpoint: the resume starts from round 2, computes
    # round 3 again (the same numbers, but for its time) and logs it no second time.
    RunDir(run).checkpoint(3).unlink()
    loop.resume_run(run, rounds=4, progress=False, warn=lambda message: None)
    logged = tensorboard_logs(run)
    assert {tag: [s for s, _ in steps] for tag, steps in logged.items()} == \
        {tag: [1, 2, 3, 4] for tag in metrics_scalars(run)}
    assert {k: v for k, v in logged.items() if k != "seconds"} == \
        as_float32(metrics_scalars(run, leave_out=("seconds",)))

    # The analysis results' summary numbers, at step = round, once: skipped and forced results are not
    # logged again.
    analyse(run)
    analyse(run)
    analyse(run, force=True)
    logged = tensorboard_logs(run)
    summaries = result_summaries(run)
    assert "loss/loss" in summaries and [s for s, _ in summaries["loss/loss"]] == [0, 1, 2, 3, 4]
    assert {tag: logged[tag] for tag in summaries} == as_float32(summaries)
    assert set(logged) == set(summaries) | set(metrics_scalars(run))


def test_a_divergence_is_logged_as_text_each_time(tmp_path):
    run = tmp_path / "run"
    recipe = tiny_recipe(train__log=["tensorboard"], train__lr=1e6, train__rounds=3, **MLP)
    with pytest.raises(LandscapeError, match="diverged in round 2"):
        loop.start_run(recipe, run, progress=False)
    with pytest.raises(LandscapeError, match="diverged in round 2"):
        loop.resume_run(run, progress=False)
    logged = tensorboard_logs(run)
    events = RunDir(run).read_events()
    assert [json.loads(text) for _, text in logged["event/text_summary"]] == events and len(events) == 2
    assert [step for step, _ in logged["event/text_summary"]] == [2, 2]
    assert {k: v for k, v in logged.items() if k != "event/text_summary"} == as_float32(metrics_scalars(run))


def test_a_missing_extra_is_one_line_before_anything_is_written(tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(LandscapeError) as caught:
        loop.start_run(tiny_recipe(train__log=["tensorboard", "wandb"]), tmp_path / "run", progress=False)
    message = str(caught.value)
    assert message.startswith("train.log asks for wandb, which is not installed: pip install '")
    assert "[wandb]'" in message and "\n" not in message
    assert not (tmp_path / "run").exists()

    line = one_line_error(invoke("train", "--log", "wandb", "--quiet", "-o", tmp_path / "cli"))
    assert line == f"error: {message.replace('tensorboard, ', '')}" and not (tmp_path / "cli").exists()

    # an analysis of a run whose recipe asks for it is refused before any work
    source = SimpleNamespace(run_dir=RunDir(tmp_path), recipe=tiny_recipe(train__log=["wandb"]))
    with pytest.raises(LandscapeError, match=r"^train.log asks for wandb, which is not installed"):
        tracking.ResultLog([source])
    tracking.ResultLog([SimpleNamespace(run_dir=None, recipe=source.recipe)])  # a loose folder: never logged


def test_log_flag_is_one_list_checked_by_the_schema(tmp_path):
    result = invoke("train", "--log", "tensorboard,wandb", "--dry-run")
    assert result.exit_code == 0, result.output
    printed = recipes.tomllib.loads(result.output.split("# run directory")[0])
    assert printed["train"]["log"] == ["tensorboard", "wandb"]
    line = one_line_error(invoke("train", "--log", "tensorbord", "--dry-run"))
    assert line == "error: train.log[0] must be one of 'tensorboard' or 'wandb' (got 'tensorbord')"
    default = recipes.tomllib.loads(invoke("train", "--dry-run").output.split("# run directory")[0])
    assert default["train"]["log"] == []


def test_nothing_imports_the_trackers_unless_a_recipe_asks(tmp_path):
    recipe_file = tmp_path / "r.toml"
    recipe_file.write_text(recipes.to_toml(tiny_recipe(train__rounds=1, **MLP)))
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from landscape.analyze.catalog import pass_options\n"
        "from landscape.analyze.scheduler import run_analysis\n"
        "from landscape.analyze.settings import AnalysisSettings\n"
        "from landscape.config import overrides as recipe_overrides\n"
        "from landscape.train import loop\n"
        "run = Path(sys.argv[2])\n"
        "loop.start_run(recipe_overrides.build(sys.argv[1]), run, progress=False)\n"
        "run_analysis(run, passes=['loss'], settings=AnalysisSettings(device='cpu', analysis_samples=100),\n"
        "             options={'loss': pass_options('loss', {})}, progress=False)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('tensorboard', 'wandb')\n"
        "             or m.startswith('torch.utils.tensorboard')), flush=True)\n"
        "import os; os._exit(0)  # printed: the interpreter's teardown tells nothing\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code, str(recipe_file), str(tmp_path / "run")], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
    assert not (tmp_path / "run" / "tensorboard").exists() and not (tmp_path / "run" / "wandb").exists()


def wandb_history(run: Path) -> list[dict]:
    """The history rows of every offline run under ``<run>/wandb/`` (oldest first), read from its ``.wandb``
    file: records in 32 KiB blocks after a 7-byte header, each a 7-byte header (CRC, length, kind: full,
    first, middle, last) and a protobuf ``Record``."""
    from wandb.proto import wandb_internal_pb2

    rows = []
    for path in sorted((run / "wandb").glob("offline-run-*/run-*.wandb")):
        data, pos, parts = path.read_bytes(), 7, b""
        assert data[:4] == b":W&B"
        while pos + 7 <= len(data):
            if 32768 - pos % 32768 < 7:
                pos += 32768 - pos % 32768
                continue
            _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
            body, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
            parts = body if kind in (1, 2) else parts + body
            if kind in (1, 4):
                record = wandb_internal_pb2.Record()
                record.ParseFromString(parts)
                if record.WhichOneof("record_type") == "history":
                    items = {item.key or "/".join(item.nested_key): item.value_json
                             for item in record.history.item}
                    rows.append({k: json.loads(v) for k, v in items.items() if not k.startswith("_")})
    return rows


def test_wandb_offline_run_holds_the_history(tmp_path):
    if importlib.util.find_spec("wandb") is None:
        pytest.skip("wandb is not installed (the optional extra: pip install '.[wandb]')")
    run = tmp_path / "run"
    recipe = tiny_recipe(train__log=["wandb"], train__rounds=2, name="tracked", **MLP)
    loop.start_run(recipe, run, progress=False)
    analyse(run)
    assert len(list((run / "wandb").glob("offline-run-*"))) == 2  # the training's and the analysis's
    assert {p.name.rsplit("-", 1)[1] for p in (run / "wandb").glob("offline-run-*")} == \
        {(run / "wandb" / "run-id").read_text().strip()}  # one run id: synced as one run
    history = wandb_history(run)
    rows = RunDir(run).read_metrics()
    assert history[:2] == [{"round": r["round"], **{k: float(v) for k, v in r.items() if k != "round" and
                                                       isinstance(v, (int, float))}} for r in rows]
    summaries = result_summaries(run)
    assert {(r["round"], k, v) for r in history[2:] for k, v in r.items() if k != "round"} == \
        {(step, tag, value) for tag, steps in summaries.items() for step, value in steps}


# ----------------------------------------------------------------------------------------------------------
# a tracker that cannot start: missing, a broken install, a folder that cannot be written - one line before
# any work, naming the way out (a received run's: its recipe.toml's train.log)


def _with_log(run: Path, names: list[str]) -> Path:
    """``run`` with its recipe.toml's ``train.log`` set to ``names`` (as a received run may ask)."""
    text, count = re.subn(r"(?m)^log = \[.*\]$", f"log = {json.dumps(names)}", (run / "recipe.toml").read_text())
    assert count == 1
    (run / "recipe.toml").write_text(text)
    return run


def _break(tracker: str, fault: str, tmp_path: Path, monkeypatch) -> None:
    """Tracker ``tracker`` made missing, or installed but raising ``fault`` when imported (a fake package first
    on the path, as a broken install is)."""
    if fault == "missing":
        real = importlib.util.find_spec
        monkeypatch.setattr(importlib.util, "find_spec",
                            lambda name, *a: None if name == tracker else real(name, *a))
        return
    fake = tmp_path / "fake" / tracker
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(f"raise {fault}('broken {tracker} install')\n")
    monkeypatch.syspath_prepend(str(fake.parent))
    for name in [m for m in sys.modules if m.split(".")[0] == tracker or m.startswith("torch.utils.tensorboard")]:
        monkeypatch.delitem(sys.modules, name)


@pytest.mark.parametrize("tracker", ["tensorboard", "wandb"])
@pytest.mark.parametrize("fault", ["missing", "ImportError", "RuntimeError"])
@pytest.mark.parametrize("how", ["train", "analyze", "resume"])
def test_a_tracker_that_is_missing_or_broken_is_one_line_before_anything_is_written(
        one_round_run, tmp_path, monkeypatch, tracker, fault, how):
    if how == "train":
        args, out = ["train", "--log", tracker, "--quiet", "-o", tmp_path / "new"], tmp_path / "new"
        way_out = f"leave {tracker} out of train.log / --log"
    else:
        out = _with_log(Path(shutil.copytree(one_round_run, tmp_path / "received")), [tracker])
        args = ["analyze", out, "--passes", "loss", "--quiet"] if how == "analyze" else \
            ["train", "--resume", out, "--rounds", "2", "--quiet"]
        way_out = (f"leave {tracker} out of train.log in {out / 'recipe.toml'}: a run's train.log may be edited, "
                   "it changes no number")
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} if out.exists() else None
    _break(tracker, fault, tmp_path, monkeypatch)

    line = one_line_error(invoke(*args))
    if fault == "missing":
        assert line.startswith(f"error: train.log asks for {tracker}, which is not installed: pip install '")
        assert line.endswith(f"[{tracker}]' (or {way_out})")
    else:
        assert line == (f"error: train.log asks for {tracker}, which is installed but does not import ({fault}: "
                        f"broken {tracker} install): repair it (pip install --force-reinstall {tracker}), or "
                        f"{way_out}")
    after = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} if out.exists() else None
    assert after == before  # nothing written: no run folder made, a received run left as it was
    if how == "resume":  # the way out named is one: with the tracker left out of train.log, the run resumes
        _with_log(out, [])
        monkeypatch.undo()
        assert invoke("train", "--resume", out, "--rounds", "2", "--quiet").exit_code == 0
        assert RunDir(out).rounds() == [0, 1, 2]


@pytest.fixture(scope="module")
def tracked_run(tmp_path_factory) -> Path:
    """A 2-round run logged to TensorBoard, trained once for this module. Read-only: tests copy it."""
    run = tmp_path_factory.mktemp("tracked") / "run"
    loop.start_run(tiny_recipe(train__log=["tensorboard"], train__rounds=2, **MLP), run, progress=False)
    return run


def _unwritable(folder: Path, fault: str, monkeypatch) -> None:
    """Files made in ``folder`` fail as on a read-only mount (EROFS: every file) or a full disk (ENOSPC:
    TensorBoard's event files; a small file still fits). Patched, as chmod stops no root."""
    code = errno.EROFS if fault == "read-only" else errno.ENOSPC
    real_os_open, real_io_open = os.open, io.open

    def refused(path, writing: bool) -> bool:
        path = Path(os.fsdecode(path))
        return writing and path.parent == folder and (fault == "read-only" or "tfevents" in path.name)

    def os_open(path, flags, *args, **kwargs):
        if refused(path, bool(flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT))):
            raise OSError(code, os.strerror(code))
        return real_os_open(path, flags, *args, **kwargs)

    def io_open(file, mode="r", *args, **kwargs):
        if isinstance(file, (str, bytes, os.PathLike)) and refused(file, any(c in mode for c in "wax+")):
            raise OSError(code, os.strerror(code))
        return real_io_open(file, mode, *args, **kwargs)

    monkeypatch.setattr(os, "open", os_open)
    monkeypatch.setattr(io, "open", io_open)


@pytest.mark.parametrize("fault", ["read-only", "disk full"])
@pytest.mark.parametrize("how", ["analyze", "resume"])
def test_a_tracker_folder_that_cannot_be_written_is_one_line_and_no_result_goes_unlogged(
        tracked_run, tmp_path, monkeypatch, fault, how):
    run = Path(shutil.copytree(tracked_run, tmp_path / "run"))
    folder = run / "tensorboard"
    logged_before = tensorboard_logs(run)
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    thread_errors = []  # what tensorboard's writer thread would print (30 lines): nothing
    monkeypatch.setattr(threading, "excepthook", thread_errors.append)
    _unwritable(folder, fault, monkeypatch)
    args = ["analyze", run, "--passes", "loss", "--quiet"] if how == "analyze" else \
        ["train", "--resume", run, "--rounds", "3", "--quiet"]
    line = one_line_error(invoke(*args))
    monkeypatch.undo()
    assert thread_errors == []
    reason = "[Errno 30] Read-only file system" if fault == "read-only" else "[Errno 28] No space left on device"
    if fault == "read-only":  # found before any work: nothing written, nothing left unlogged
        assert line == (f"error: cannot write TensorBoard logs in {folder}: {reason}; make it writable, or leave "
                         f"tensorboard out of train.log in {run / 'recipe.toml'}: a run's train.log may be edited, "
                         "it changes no number")
        assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before
        return
    assert line.startswith(f"error: cannot write TensorBoard logs in {folder}: {reason}")
    if how == "analyze":  # the result written just before: the message says how it is logged, and it is
        [(result, _)] = stored_results(run / "analysis" / "round-0002")
        assert line.endswith(f"; the result analysis/round-0002/{result.name} is written but not logged: once "
                             "the logs can be written, analyse it again with --force to log it")
        assert "loss/loss" not in tensorboard_logs(run)
        assert invoke("analyze", run, "--passes", "loss", "--force", "--quiet").exit_code == 0
        assert tensorboard_logs(run) == {**logged_before, **as_float32(result_summaries(run))}
    else:  # the rounds trained meanwhile are logged when the resume runs again
        assert invoke("train", "--resume", run, "--rounds", "3", "--quiet").exit_code == 0
        logged = {tag: sorted(steps) for tag, steps in tensorboard_logs(run).items()}  # files read in name order
        assert logged == as_float32(metrics_scalars(run))
        assert [step for step, _ in logged["train_loss"]] == [1, 2, 3]
