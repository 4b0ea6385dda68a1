"""Reliability and safety: crash-safe runs, safe checkpoints, bad input never hurts (issue 8).

Kills are real: child processes SIGKILL themselves at chosen points (inside a round, while a checkpoint or a
metrics line is being written, while analysis results are written); the run is then resumed and compared,
tensor by tensor and row by row, with an uninterrupted run.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from conftest import one_line_error, tiny_recipe
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.configuration import set_hypothesis_home_dir

import landscape
from landscape import lifecycle
from landscape import recipe as recipes
from landscape.analyze.catalog import pass_options
from landscape.analyze.context import AnalysisSettings
from landscape.analyze.scheduler import run_analysis
from landscape.cli import cli
from landscape.errors import LandscapeError
from landscape.runs import CHECKPOINT_FORMAT, RunDir, RunLock, load_checkpoint
from landscape.train import loop

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
# LANDSCAPE_FUZZ_EXAMPLES=2000 fuzzes deeper. No example database, and hypothesis's caches go to the temporary
# folder, not into the repository.
set_hypothesis_home_dir(os.environ.get("HYPOTHESIS_STORAGE_DIRECTORY")
                        or os.path.join(tempfile.gettempdir(), "landscape-hypothesis"))
FUZZ = settings(max_examples=int(os.environ.get("LANDSCAPE_FUZZ_EXAMPLES", "60")), deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])


def recipe6() -> dict:
    """Six fast rounds (a small MLP), checkpoints every 2 rounds, the clients' models kept."""
    return tiny_recipe(model__name="mlp", model__hidden=[16], train__rounds=6, train__checkpoint_every=2,
                       train__keep_clients=True)


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])



def snapshot(path: Path) -> dict[str, bytes]:
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in sorted(Path(path).rglob("*")) if p.is_file()}


def assert_same_values(a, b, where: str = "") -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for k in a:
            assert_same_values(a[k], b[k], f"{where}.{k}")
    else:
        assert a == b, where


def metrics_without_time(path: Path) -> list[dict]:
    return [{k: v for k, v in row.items() if k != "seconds"} for row in RunDir(path).read_metrics()]


def assert_same_run(whole: Path, other: Path, extra: set[str] = frozenset()) -> None:
    """Bit-identical checkpoints (model, server and client state, kept client models), the same metrics rows
    (less their timing) and the same files: no temporary or lock file left."""
    a, b = RunDir(whole), RunDir(other)
    assert a.rounds() == b.rounds()
    for r in a.rounds():
        assert_same_values(load_checkpoint(a.checkpoint(r)), load_checkpoint(b.checkpoint(r)), f"round {r}")
        if a.clients_checkpoint(r).exists():
            assert_same_values(load_checkpoint(a.clients_checkpoint(r)), load_checkpoint(b.clients_checkpoint(r)))
    assert metrics_without_time(whole) == metrics_without_time(other)
    assert set(snapshot(other)) - set(extra) == set(snapshot(whole))


@pytest.fixture(scope="module")
def whole(tmp_path_factory) -> Path:
    """The uninterrupted reference run."""
    out = tmp_path_factory.mktemp("whole") / "run"
    loop.start_run(recipe6(), out, progress=False)
    return out


@pytest.fixture
def whole_copy(whole, tmp_path) -> Path:
    shutil.copytree(whole, tmp_path / "run")
    return tmp_path / "run"


# ----------------------------------------------------------------------------------------------------------
# kill -9 during training and analysis
#
# One child process imports landscape and loads the data once, then forks one process per kill point (so
# the kills run in parallel and pay the import once). Each forked process patches itself to SIGKILL itself
# at its point; the child reports how each one ended.

CHILD = r"""
import io, json, os, re, signal, sys, traceback
from pathlib import Path

from landscape import recipe as recipes
from landscape import runs, setup
from landscape.analyze import catalog, scheduler
from landscape.analyze.context import AnalysisSettings
from landscape.train import loop


def die():
    os.kill(os.getpid(), signal.SIGKILL)


def kill_in_atomic_write(module, pattern, n, whole):
    # Die while the n-th file whose name matches is written: its temporary file holds half of the bytes (all
    # of them, not yet renamed, when whole).
    real, seen = runs.atomic_write, [0]

    def atomic_write(path, write, *args, **kwargs):
        if re.fullmatch(pattern, Path(path).name):
            seen[0] += 1
            if seen[0] == n:
                def cut(f):
                    buffer = io.BytesIO() if "b" in kwargs.get("mode", "wb") else io.StringIO()
                    write(buffer)
                    data = buffer.getvalue()
                    f.write(data if whole else data[: len(data) // 2])
                    f.flush()
                    os.fsync(f.fileno())
                    die()
                return real(path, cut, *args, **kwargs)
        return real(path, write, *args, **kwargs)

    module.atomic_write = atomic_write


def train(mode, n, recipe_file, out):
    if mode == "checkpoint":
        kill_in_atomic_write(runs, r"round-\d{4}\.pt", n, whole=False)
    elif mode == "checkpoint-unrenamed":
        kill_in_atomic_write(runs, r"round-\d{4}\.pt", n, whole=True)
    elif mode == "clients":
        kill_in_atomic_write(runs, r"round-\d{4}\.clients\.pt", n, whole=False)
    elif mode == "mid-round":  # die in round n when its second client starts: the first one's work is done
        real_problem, calls = loop.Trainer.local_problem, [0]

        def local_problem(self, client, round, lr, buffers):
            if round == n:
                calls[0] += 1
                if calls[0] == 2:
                    die()
            return real_problem(self, client, round, lr, buffers)

        loop.Trainer.local_problem = local_problem
    elif mode == "metrics":  # die while the metrics line of round n is written: half a line gets there
        real_append = runs.RunDir.append_metrics

        def append_metrics(self, row):
            if row.get("round") == n:
                with open(self.metrics, "a") as f:
                    f.write(json.dumps(row)[:25])
                    f.flush()
                    os.fsync(f.fileno())
                die()
            real_append(self, row)

        runs.RunDir.append_metrics = append_metrics
    loop.start_run(recipes.resolve(recipes.read_toml(recipe_file)), out, progress=False)


def analyze(n, path, spec):
    # passes.write_text -> runs.write_text -> runs.atomic_write: die while the n-th result JSON is written
    kill_in_atomic_write(runs, r".+\.json", n, whole=False)
    options = {name: catalog.pass_options(name, spec["options"].get(name, {})) for name in spec["passes"]}
    scheduler.run_analysis(path, rounds="all", passes=spec["passes"], settings=AnalysisSettings(**spec["settings"]),
                        options=options, progress=False)


jobs = json.loads(sys.argv[1])
setup.prepare_data(recipes.resolve(recipes.read_toml(jobs[0][3])))  # warm: imports and the data set
pids = {}
for i, (kind, mode, n, *args) in enumerate(jobs):
    pid = os.fork()
    if pid == 0:
        try:
            train(mode, n, *args) if kind == "train" else analyze(n, *args)
            print(f"job {i} ran to its end", file=sys.stderr)
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(3)
    pids[pid] = i
ends = {}
for _ in jobs:
    pid, status = os.wait()
    ends[pids[pid]] = "SIGKILL" if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL else status
print(json.dumps([ends[i] for i in range(len(jobs))]))
"""

# (mode, n): where the process dies, and the checkpointed rounds it leaves behind.
KILLS = {
    ("checkpoint", 3): [0, 2],  # half of round-0004.pt written
    ("checkpoint-unrenamed", 2): [0],  # all of round-0002.pt written, not yet renamed
    ("checkpoint", 1): [],  # half of round-0000.pt: nothing saved yet
    ("clients", 3): [0, 2, 4],  # half of round-0006.clients.pt
    ("mid-round", 3): [0, 2],  # inside round 4
    ("metrics", 5): [0, 2, 4],  # half the metrics line of round 5
}
ANALYSIS = {"passes": ["loss", "sharpness"], "options": {"sharpness": {"rhos": [0.05], "steps": 1, "adaptive": False}},
            "settings": {"device": "cpu", "analysis_samples": 300}}
ANALYSIS_KILLED_AT = 5  # the 5th of 8 result files (4 rounds x 2 passes)


@pytest.fixture(scope="module")
def killed(whole, tmp_path_factory) -> dict:
    """Run directories left by processes that SIGKILLed themselves: one per KILLS entry, and 'analysis' (a
    copy of the whole run whose analysis was killed)."""
    root = tmp_path_factory.mktemp("killed")
    recipe_file = root / "recipe.toml"
    recipe_file.write_text(recipes.to_toml(recipe6()))
    outs = {kill: root / f"{kill[0]}-{kill[1]}" for kill in KILLS}
    jobs = [["train", mode, n, str(recipe_file), str(outs[mode, n])] for mode, n in KILLS]
    shutil.copytree(whole, root / "analysis")
    jobs.append(["analyze", "", ANALYSIS_KILLED_AT, str(root / "analysis"), ANALYSIS])
    env = {**ENV, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}  # one thread: safe to fork, no contention
    child = subprocess.run([sys.executable, "-c", CHILD, json.dumps(jobs)], capture_output=True, text=True,
                           env=env, timeout=600, check=False)
    assert child.returncode == 0, child.stderr
    assert json.loads(child.stdout) == ["SIGKILL"] * len(jobs), child.stderr
    return {**outs, "analysis": root / "analysis"}


@pytest.mark.parametrize("kill", list(KILLS), ids=[f"{m}-{n}" for m, n in KILLS])
def test_kill_9_then_resume_is_bit_identical(killed, whole, kill):
    cut = killed[kill]
    run = RunDir(cut)
    # No half-written file is taken for a checkpoint: only complete, renamed files count.
    assert run.rounds() == KILLS[kill]
    temps = run.stale_temp_files()
    assert bool(temps) == (kill[0] in ("checkpoint", "checkpoint-unrenamed", "clients"))
    for r in run.rounds():
        load_checkpoint(run.checkpoint(r))
    if kill[0] == "metrics":
        assert not run.metrics.read_text().endswith("\n")  # the cut line
        assert [row["round"] for row in run.read_metrics()] == [1, 2, 3, 4]
    assert (cut / ".lock").exists()  # the killed process held the lock; it died with the process

    notes: list[str] = []
    if kill[0] == "mid-round":  # through the command line
        result = invoke("train", "--resume", cut, "--quiet")
        assert result.exit_code == 0, result.output
        assert f"run {cut}: 6 rounds" in result.output
    else:
        assert loop.resume_run(cut, progress=False, warn=notes.append).round == 6
    if KILLS[kill]:
        assert notes == []
    else:
        assert notes == [(f"{cut} has no checkpoint yet (its first process stopped early); starting again from "
                          "the initial model (round 0)")]
    assert not any(p.exists() for p in temps)  # temporary files of the killed process are cleaned up
    assert_same_run(whole, cut)


def test_a_run_killed_before_its_partition_and_first_checkpoint_resumes(whole, tmp_path):
    cut = tmp_path / "run"
    cut.mkdir()
    shutil.copy(whole / ".landscape-run", cut / ".landscape-run")  # the marker is written first
    shutil.copy(whole / "recipe.toml", cut / "recipe.toml")  # killed right after recipe.toml was written
    (cut / ".lock").write_text("")
    (cut / ".partition.json.abcd1234.tmp").write_text('{"settings": ')
    assert lifecycle.sweep_status(recipe6(), cut, overwrite=False) == "resume"
    notes: list[str] = []
    loop.resume_run(cut, progress=False, warn=notes.append)
    assert len(notes) == 1 and "has no checkpoint yet" in notes[0]
    assert_same_run(whole, cut)
    assert (cut / "partition.json").read_bytes() == (whole / "partition.json").read_bytes()


def test_a_folder_left_before_recipe_toml_was_written_counts_as_empty(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / ".lock").write_text("")
    (out / ".recipe.toml.abcd1234.tmp").write_text("seed = ")
    lifecycle.check_out_dir(RunDir(out), overwrite=False)  # no error: a new run may start here
    assert lifecycle.sweep_status(recipe6(), out, overwrite=False) == "new"
    (out / "notes.txt").write_text("mine")
    with pytest.raises(LandscapeError, match="already exists and is not empty"):
        lifecycle.check_out_dir(RunDir(out), overwrite=False)


def analyze_in_process(path: Path, rounds: str = "all", passes: list[str] = ANALYSIS["passes"]):
    options = {name: pass_options(name, ANALYSIS["options"].get(name, {})) for name in passes}
    return run_analysis(path, rounds=rounds, passes=passes, settings=AnalysisSettings(**ANALYSIS["settings"]),
                        options=options, progress=False)


def test_kill_9_during_analyze_then_rerun_computes_only_what_is_missing(killed, whole, tmp_path):
    cut = killed["analysis"]
    done = sorted((cut / "analysis").rglob("*.json"))
    assert len(done) == ANALYSIS_KILLED_AT - 1  # the 5th died half written, in a temporary file
    assert len(list((cut / "analysis").rglob(".*.tmp"))) == 1

    report = analyze_in_process(cut)
    assert (report.computed, report.skipped) == (8 - len(done), len(done))
    shutil.copytree(whole, tmp_path / "full")
    full = analyze_in_process(tmp_path / "full")
    assert (full.computed, full.skipped) == (8, 0)
    for path in sorted((tmp_path / "full" / "analysis").rglob("*.json")):
        a = json.loads(path.read_text())
        b = json.loads((cut / path.relative_to(tmp_path / "full")).read_text())
        assert a["result"] == b["result"] and a["summary"] == b["summary"], path
    assert [{**row, "run": "-"} for row in report.rows] == [{**row, "run": "-"} for row in full.rows]


# ----------------------------------------------------------------------------------------------------------
# damaged, foreign and unsafe checkpoints


# Short or junk files whose first record runs past their end (torch.load raised struct.error: issue 20).
SHORT_JUNK = {"junk": b"junk", "G": b"GGGGGGG", "J": b"J", "X": b"X\x02\x00\x00", "j": b"jj\x01",
              "r": b"r\x05\x06\x07"}


@pytest.mark.parametrize("damage", ["truncated", "zeroed", "empty", *SHORT_JUNK])
def test_a_damaged_newest_checkpoint_is_set_aside_and_the_run_resumes_from_the_previous(whole, whole_copy, damage):
    newest = RunDir(whole_copy).checkpoint(6)
    data = newest.read_bytes()
    bad = {"truncated": data[: len(data) // 3], "zeroed": data[:100] + bytes(len(data) - 100), "empty": b"",
           **SHORT_JUNK}[damage]
    newest.write_bytes(bad)

    # analyze names the file in one line, given the file or the run
    for target in (newest, whole_copy):
        line = one_line_error(invoke("analyze", target, "--passes", "loss", "--quiet", "--device", "cpu"))
        assert line.startswith(f"error: cannot load checkpoint {newest}: ")

    # resume says which checkpoint it takes, keeps the damaged file aside, and ends as the uninterrupted run
    result = invoke("train", "--resume", whole_copy, "--quiet")
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.output.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1
    assert warnings[0].startswith("warning: checkpoints/round-0006.pt is damaged (")
    assert warnings[0].endswith("); moved to round-0006.pt.damaged; resuming from round-0004.pt")
    assert (newest.parent / "round-0006.pt.damaged").read_bytes() == bad
    assert_same_run(whole, whole_copy, extra={"checkpoints/round-0006.pt.damaged"})


def test_a_run_whose_recipe_was_edited_to_another_model_is_refused(whole_copy):
    recipe_file = whole_copy / "recipe.toml"
    recipe_file.write_text(recipe_file.read_text().replace("hidden = [16]", "hidden = [8]"))
    before = snapshot(whole_copy)
    line = one_line_error(invoke("train", "--resume", whole_copy, "--quiet"))
    assert line == (f"error: {whole_copy / 'checkpoints' / 'round-0006.pt'} was written by another recipe "
                    "(model.hidden is [16] there, [8] in recipe.toml); it cannot continue this run")
    assert snapshot(whole_copy) == before


def test_a_checkpoint_of_another_run_is_refused(whole, tmp_path):
    other = tmp_path / "other"
    loop.start_run(tiny_recipe(model__name="mlp", model__hidden=[16], train__rounds=2, seed=1), other, progress=False)
    run_b = tmp_path / "b"
    shutil.copytree(whole, run_b)
    newest = RunDir(run_b).checkpoint(6)
    shutil.copy(RunDir(other).checkpoint(2), newest)
    before = snapshot(run_b)
    with pytest.raises(LandscapeError) as caught:
        loop.resume_run(run_b, rounds=8, progress=False)
    assert str(caught.value) == (f"{newest} was written by another recipe (seed is 1 there, 0 in recipe.toml); "
                                 "it cannot continue this run")
    assert snapshot(run_b) == before
    # without a recorded recipe, the tensors themselves are checked: a clear line, not a shape traceback
    ckpt = load_checkpoint(RunDir(other).checkpoint(2))
    del ckpt["recipe"]
    ckpt["model"] = {k: torch.zeros(3, *v.shape[1:]) if k == "fc1.weight" else v for k, v in ckpt["model"].items()}
    torch.save(ckpt, newest)
    before = snapshot(run_b)
    line = one_line_error(invoke("train", "--resume", run_b, "--quiet"))
    assert line == (f"error: {newest} does not match the model 'mlp': 'fc1.weight' has shape [3, 64] "
                    "there, [16, 64] in this model")
    assert snapshot(run_b) == before


class _Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("form", ["torch.save", "plain pickle"])
def test_a_checkpoint_that_would_run_code_is_refused_by_resume_and_analyze(whole_copy, tmp_path, form):
    marker = tmp_path / "PWNED"
    newest = RunDir(whole_copy).checkpoint(6)
    evil = {"format": CHECKPOINT_FORMAT, "round": 6, "model": _Payload(marker)}
    if form == "torch.save":
        torch.save(evil, newest)
    else:
        newest.write_bytes(pickle.dumps(evil, protocol=4))
    before = snapshot(whole_copy)

    line = one_line_error(invoke("train", "--resume", whole_copy, "--quiet"))
    assert line.startswith(f"error: cannot resume {whole_copy}: checkpoints/round-0006.pt: it would run code ")
    assert "(posix.system)" in line or "(os.system)" in line
    assert snapshot(whole_copy) == before  # nothing moved, nothing trained
    line = one_line_error(invoke("analyze", whole_copy, "--passes", "loss", "--quiet", "--device", "cpu"))
    assert line.startswith(f"error: cannot load checkpoint {newest}: it would run code")
    with pytest.raises(LandscapeError, match="refused by the safe loader"):
        landscape.open_run(whole_copy).model()
    assert not marker.exists()  # the payload never ran


# ----------------------------------------------------------------------------------------------------------
# divergence


def test_divergence_stops_names_round_and_algorithm_and_keeps_the_last_good_checkpoint(tmp_path):
    out = tmp_path / "run"
    recipe_file = tmp_path / "r.toml"
    recipe_file.write_text(recipes.to_toml(tiny_recipe(model__name="mlp", model__hidden=[16], train__rounds=4,
                                                       train__lr=1e6, train__checkpoint_every=1)))
    line = one_line_error(invoke("train", recipe_file, "--out", out, "--quiet"))
    assert line.startswith("error: training diverged in round 2 (fedavg, lr 1e+06): ")
    assert "the last good checkpoint checkpoints/round-0001.pt is kept" in line
    run = RunDir(out)
    assert run.rounds() == [0, 1]  # the diverged state is never saved
    assert [r["round"] for r in run.read_metrics()] == [1]
    [event] = run.read_events()
    assert event["event"] == "diverged" and event["round"] == 2 and event["algorithm"] == "fedavg"
    assert event["last_checkpoint"] == "checkpoints/round-0001.pt" and event["problems"]
    assert "nan" in (event["train_loss"], event["update_norm"]) or "inf" in (event["train_loss"], event["update_norm"])
    assert ", ".join(event["problems"]) in line

    def no_constants(name):
        raise AssertionError(f"{name} is not standard JSON")

    assert all(json.loads(line, parse_constant=no_constants) for line in run.metrics.read_text().splitlines())
    opened = landscape.open_run(out)
    assert [r["round"] for r in opened.metrics()] == [1] and opened.events() == [event]
    assert not (out / ".lock").exists()

    # resuming diverges again in the same round; the history keeps both events
    with pytest.raises(LandscapeError, match="diverged in round 2"):
        loop.resume_run(out, progress=False)
    assert [e["round"] for e in run.read_events()] == [2, 2] and run.rounds() == [0, 1]


def test_non_finite_parameters_alone_are_divergence(tmp_path, monkeypatch):
    original = loop.Trainer.run_round

    def poisoned(self, state):
        new_state, results, row = original(self, state)
        if new_state.round == 3:
            new_state.x[5] = float("inf")  # the loss and the logged update stay finite
        return new_state, results, row

    monkeypatch.setattr(loop.Trainer, "run_round", poisoned)
    recipe = tiny_recipe(model__name="mlp", model__hidden=[16], algorithm__name="fedprox", train__rounds=4)
    with pytest.raises(LandscapeError) as caught:
        loop.start_run(recipe, tmp_path / "run", progress=False)
    assert str(caught.value).startswith("training diverged in round 3 (fedprox, lr 0.1): 1 non-finite parameters;")
    run = RunDir(tmp_path / "run")
    assert run.rounds() == [0, 1, 2]
    assert all(torch.isfinite(t).all() for t in load_checkpoint(run.checkpoint(2))["model"].values())
    assert run.read_events()[0]["problems"] == ["1 non-finite parameters"]


# ----------------------------------------------------------------------------------------------------------
# failed writes


def _enospc(*_args, **_kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.mark.parametrize("fault", ["disk full while writing", "read-only at rename", "disk full on metrics"])
def test_a_failed_write_says_why_keeps_the_previous_checkpoint_and_leaves_no_temp_file(whole, tmp_path,
                                                                                      monkeypatch, fault):
    out = tmp_path / "run"
    recipe_file = tmp_path / "r.toml"
    recipe_file.write_text(recipes.to_toml(recipe6()))
    target = out / "checkpoints" / "round-0004.pt"
    if fault == "disk full while writing":
        real_save = torch.save

        def save(obj, f, *args, **kwargs):
            if isinstance(obj, dict) and obj.get("round") == 4 and "clients" not in obj:
                f.write(b"partial bytes")
                _enospc()
            real_save(obj, f, *args, **kwargs)

        monkeypatch.setattr(torch, "save", save)
        expected = f"error: cannot write {target}: [Errno 28] No space left on device"
    elif fault == "read-only at rename":
        real_replace = os.replace

        def replace(src, dst, *args, **kwargs):
            if Path(dst).name == "round-0004.pt":
                raise OSError(errno.EROFS, os.strerror(errno.EROFS))
            real_replace(src, dst, *args, **kwargs)

        monkeypatch.setattr(os, "replace", replace)
        expected = f"error: cannot write {target}: [Errno 30] Read-only file system"
    else:
        real_open = open

        def open_(file, mode="r", *args, **kwargs):
            if Path(file).name == "metrics.jsonl" and mode == "a" and len(RunDir(out).read_metrics()) == 3:
                _enospc()
            return real_open(file, mode, *args, **kwargs)

        monkeypatch.setattr("landscape.runs.open", open_, raising=False)
        expected = f"error: cannot write {out / 'metrics.jsonl'}: [Errno 28] No space left on device"
    assert one_line_error(invoke("train", recipe_file, "--out", out, "--quiet")) == expected
    monkeypatch.undo()

    run = RunDir(out)
    assert run.rounds() == [0, 2]
    assert_same_values(load_checkpoint(run.checkpoint(2)), load_checkpoint(RunDir(whole).checkpoint(2)))
    assert run.stale_temp_files() == [] and not (out / ".lock").exists()
    loop.resume_run(out, progress=False)
    assert_same_run(whole, out)


def test_a_failed_rewrite_keeps_the_old_file(whole_copy, monkeypatch):
    run = RunDir(whole_copy)
    shutil.move(run.checkpoint(6), run.checkpoints / "elsewhere")  # rows 5, 6 must now be dropped on resume
    before = run.metrics.read_bytes()
    real_replace = os.replace

    def replace(src, dst, *args, **kwargs):
        if Path(dst).name == "metrics.jsonl":
            _enospc()
        real_replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(LandscapeError, match=r"cannot write .*metrics.jsonl: \[Errno 28\] No space left on device"):
        loop.resume_run(whole_copy, progress=False)
    assert run.metrics.read_bytes() == before and run.stale_temp_files() == []


# ----------------------------------------------------------------------------------------------------------
# two processes, one run directory

def test_a_second_process_cannot_train_into_a_locked_run(whole_copy):
    stale = whole_copy / "checkpoints" / ".round-0008.pt.abcd1234.tmp"
    stale.write_bytes(b"left by a killed process")
    holder = RunLock(RunDir(whole_copy))  # another open file of the lock: flock refuses it like a process
    holder.acquire()
    try:
        before = snapshot(whole_copy)
        message = (f"{whole_copy} is in use by another landscape process (pid {os.getpid()}): two processes never "
                   "train into one run directory; wait for it to finish")
        assert one_line_error(invoke("train", "--resume", whole_copy, "--rounds", "8", "--quiet")) == f"error: {message}"
        with pytest.raises(LandscapeError, match="is in use by another landscape process"):
            loop.start_run(recipe6(), whole_copy, overwrite=True, progress=False)
        assert snapshot(whole_copy) == before  # nothing changed: not even the stale temporary file
        # analysis only adds files under analysis/ and takes no lock
        assert analyze_in_process(whole_copy, rounds="last", passes=["loss"]).computed == 1
    finally:
        holder.release()
    assert not (whole_copy / ".lock").exists()
    assert loop.resume_run(whole_copy, rounds=8, progress=False).round == 8
    assert not stale.exists() and not (whole_copy / ".lock").exists()


def test_a_locked_empty_directory_is_not_trained_into(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    with open(out / ".lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(LandscapeError, match=f"^{out} is in use by another landscape process"):
            loop.start_run(recipe6(), out, progress=False)
    assert sorted(p.name for p in out.iterdir()) == [".lock"]


# ----------------------------------------------------------------------------------------------------------
# names and paths cannot escape --out


@pytest.mark.parametrize("name", ["../x", "a/b", "/abs", ".", "..", "a\nb", "x" * 201, "a b", "..\\x"])
def test_the_recipe_name_is_a_plain_folder_name(name):
    with pytest.raises(LandscapeError, match="^name must be a plain folder name") as caught:
        recipes.build(None, [("name", name)])
    assert "\n" not in str(caught.value)


def test_plain_names_are_accepted():
    assert recipes.build(None, [("name", "fedsam-v1.2_b")]).name == "fedsam-v1.2_b"
    assert recipes.build(None, []).name == ""


def test_no_run_directory_outside_the_chosen_folder(tmp_path, monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    line = one_line_error(invoke("train", "--set", "name=../../escape", "--rounds", "1", "--quiet"))
    assert "name must be a plain folder name" in line
    recipe_file = tmp_path / "sweep.toml"
    recipe_file.write_text('[sweep]\n"dataset.root" = ["data", "../../escape"]\n')
    line = one_line_error(invoke("train", recipe_file, "--out", work / "sweep", "--dry-run"))
    assert line == ("error: sweep value '../../escape' of 'dataset.root' cannot be part of a run folder name "
                    "(it holds '/', '\\' or a control character)")
    assert list(work.iterdir()) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["sweep.toml", "work"]


@FUZZ
@given(value=st.text(max_size=30))
def test_swept_values_never_make_a_path_outside_out(tmp_path, value):
    recipe, swept = recipes.build_sweep(None, [], {"dataset.root": [value]})[0]
    try:
        name = recipes.sweep_run_name(recipe, swept)
    except LandscapeError as e:
        assert "\n" not in str(e) and "dataset.root" in str(e)
        return
    out = tmp_path / "out"
    assert name not in (".", "..") and (out / name).resolve().parent == out.resolve()


# ----------------------------------------------------------------------------------------------------------
# property-based fuzzing: recipes and command-line options

SECTION_KEYS = {
    "dataset": ["name", "root", "augment"],
    "partition": ["name", "clients", "alpha", "min_samples", "classes_per_client"],
    "model": ["name", "hidden", "width"],
    "algorithm": ["name", "rho", "mu", "lam"],
    "train": ["rounds", "participation", "local_epochs", "local_steps", "batch_size", "lr", "lr_schedule",
              "weight_decay", "clip_norm", "eval_every", "checkpoint_every", "swa", "swa_start", "dtype", "device"],
}
# Keys and strings without control characters: the recipe module quotes keys as given, so a newline in a
# key would split its message (the command line refuses control characters up front: see below).
TEXT = st.text(st.characters(blacklist_categories=("Cc", "Cs")), max_size=8)
SCALARS = st.one_of(st.booleans(), st.integers(min_value=-(2**70), max_value=2**70), st.floats(), TEXT,
                    st.text(max_size=8), st.sampled_from(["mlp", "cnn", "fedsam", "iid", "cosine", "float64"]))
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(TEXT, inner, max_size=2), max_leaves=5)
TABLES = {section: st.dictionaries(st.sampled_from(keys) | TEXT, VALUES, max_size=4)
          for section, keys in SECTION_KEYS.items()}
RAW = st.fixed_dictionaries({}, optional={
    "name": st.text(max_size=12) | VALUES, "seed": st.integers(min_value=-5, max_value=2**40) | VALUES,
    **{section: table | VALUES for section, table in TABLES.items()},
}) | st.dictionaries(TEXT, VALUES, max_size=3)
DOTTED = st.one_of(
    st.sampled_from([f"{s}.{k}" for s, keys in SECTION_KEYS.items() for k in keys] + ["name", "seed"]),
    st.text(st.characters(blacklist_categories=("Cc", "Cs")), max_size=12),
)


@FUZZ
@given(raw=RAW)
def test_fuzz_recipes_resolve_or_say_why_in_one_line(raw):
    try:
        recipe = recipes.resolve(raw)
    except LandscapeError as e:
        assert str(e) and "\n" not in str(e)
        return
    try:
        lifecycle.check_recipe_writable(recipe)
    except LandscapeError as e:
        assert "\n" not in str(e) and "cannot be written to recipe.toml" in str(e)
        return
    assert recipes.resolve(recipes.tomllib.loads(recipes.to_toml(recipe))) == recipe


@FUZZ
@given(assignments=st.lists(st.tuples(DOTTED, VALUES), max_size=4), texts=st.lists(TEXT, max_size=2))
def test_fuzz_overrides_and_set_assignments(assignments, texts):
    try:
        overrides = assignments + [recipes.parse_assignment(t) for t in texts]
        recipes.build_sweep(None, overrides)
    except LandscapeError as e:
        assert str(e) and "\n" not in str(e)


def _number_text() -> st.SearchStrategy[str]:
    return st.one_of(
        st.text(max_size=10),
        st.integers(min_value=-3, max_value=30).map(str),
        st.floats(min_value=0.05, max_value=1e6).map(repr),
        st.floats(max_value=0.0).map(repr),
        st.sampled_from(["nan", "inf", "-inf", "1e-400", "0.5,0.5", "0.3,", ",", "[1]", '"0.5"', "true", "1_0", "0x10",
                         "2000", "99999999999999999999", "4,x"]),
    )


FLAG_FIELDS = {"--alpha": "alpha", "--clients": "clients", "--participation": "participation"}


@FUZZ
@given(flag=st.sampled_from(list(FLAG_FIELDS)), value=_number_text())
def test_fuzz_cli_numeric_flags(tmp_path, flag, value):
    result = invoke("train", f"{flag}={value}", "--out", tmp_path / "out", "--dry-run")
    assert result.exception is None or isinstance(result.exception, SystemExit), (value, result.exception)
    if result.exit_code != 0:
        line = one_line_error(result)
        assert FLAG_FIELDS[flag] in line, line
    assert not (tmp_path / "out").exists()


@FUZZ
@given(key=DOTTED, value=st.text(max_size=15) | _number_text())
def test_fuzz_cli_set_key_value(tmp_path, key, value):
    if key in ("dataset.name", "dataset.download"):  # data sets that would look for files or a network
        value = "digits" if key == "dataset.name" else "false"
    result = invoke("train", "--set", f"{key}={value}", "--out", tmp_path / "out", "--dry-run")
    assert result.exception is None or isinstance(result.exception, SystemExit), (key, value, result.exception)
    if result.exit_code != 0:
        line = one_line_error(result)
        used = f"{key}={value}".split("=", 1)[0].strip()  # the key as --set splits it
        named = [part for part in used.split(".") if part] or ["recipe key"]
        assert any(part in line for part in named) or "--set" in line, (key, line)
    assert not (tmp_path / "out").exists()


@FUZZ
@given(flag=st.sampled_from(["--alpha", "--clients", "--lr", "--set"]), text=st.text(max_size=10),
       control=st.sampled_from(["\n", "\r", "\t", "\x00", "\x1b", "\x7f"]))
def test_fuzz_cli_control_characters_are_refused_in_one_line(tmp_path, flag, text, control):
    value = f"train.lr={text}{control}" if flag == "--set" else f"{text}{control}"
    line = one_line_error(invoke("train", flag, value, "--out", tmp_path / "out", "--dry-run"))
    assert line == f"error: {flag} must not hold control characters (got {value!r})"
