"""Crash safety and resume: kill -9 during training and analysis, damaged newest checkpoints, divergence,
non-finite parameters, failed writes and rewrites, and damaged or cut metrics rows, each repaired by resume.

Kills are real: child processes SIGKILL themselves at chosen points (inside a round, while a checkpoint or a
metrics line is being written, while analysis results are written); the run is then resumed and compared,
tensor by tensor and row by row, with the uninterrupted run (``six_round_run``).
"""

from __future__ import annotations

import errno
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from support.helpers import (
    assert_same_values,
    invoke,
    metrics_without_time,
    one_line_error,
    recipe6,
    snapshot,
    tiny_recipe,
)

import landscape
from landscape.analyze.catalog import pass_options
from landscape.analyze.scheduler import run_analysis
from landscape.analyze.settings import AnalysisSettings
from landscape.config import recipe as recipes
from landscape.core.errors import LandscapeError
from landscape.store import lifecycle
from landscape.store.checkpoints import load_checkpoint
from landscape.store.directory import RunDir
from landscape.train import loop

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}


def assert_same_run(whole: Path, other: Path, extra: set[str] = frozenset()) -> None:
    """Bit-identical checkpoints (model, server and client state, kept client models), the same metrics rows
    (less their timing) and the same files: no temporary or lock file left."""
    a, b = RunDir(whole), RunDir(other)
    assert a.rounds() == b.rounds()
    for r in a.rounds():
        assert_same_values(load_checkpoint(a.checkpoint(r)), load_checkpoint(b.checkpoint(r)), f"round {r}")
        if a.clients_checkpoint(r).exists():
            assert_same_values(load_checkpoint(a.clients_checkpoint(r)),
                               load_checkpoint(b.clients_checkpoint(r)))
    assert metrics_without_time(whole) == metrics_without_time(other)
    assert set(snapshot(other)) - set(extra) == set(snapshot(whole))


# ----------------------------------------------------------------------------------------------------------
# kill -9 during training and analysis
#
# One child process imports landscape and loads the data once, then forks one process per kill point (so
# the kills run in parallel and pay the import once). Each forked process patches itself to SIGKILL itself
# at its point; the child reports how each one ended.

CHILD = r"""
import io, json, os, re, signal, sys, traceback
from pathlib import Path

from landscape.config import recipe as recipes
from landscape.core import schema
from landscape.store import checkpoints
from landscape.store import fileio
from landscape.store import directory as runs
from landscape.config import setup
from landscape.analyze import catalog, scheduler
from landscape.analyze.settings import AnalysisSettings
from landscape.train import loop


def die():
    os.kill(os.getpid(), signal.SIGKILL)


def kill_in_atomic_write(module, pattern, n, whole):
    # Die while the n-th file whose name matches is written: its temporary file holds half of the bytes (all
    # of them, not yet renamed, when whole).
    real, seen = fileio.atomic_write, [0]

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
        kill_in_atomic_write(checkpoints, r"round-\d{4}\.pt", n, whole=False)
    elif mode == "checkpoint-unrenamed":
        kill_in_atomic_write(checkpoints, r"round-\d{4}\.pt", n, whole=True)
    elif mode == "clients":
        kill_in_atomic_write(checkpoints, r"round-\d{4}\.clients\.pt", n, whole=False)
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
    loop.start_run(recipes.resolve(schema.read_toml(recipe_file)), out, progress=False)


def analyze(n, path, spec):
    # passes.write_text -> fileio.write_text -> fileio.atomic_write: die while the n-th result JSON is written
    kill_in_atomic_write(fileio, r".+\.json", n, whole=False)
    options = {name: catalog.pass_options(name, spec["options"].get(name, {})) for name in spec["passes"]}
    scheduler.run_analysis(path, rounds="all", passes=spec["passes"],
                           settings=AnalysisSettings(**spec["settings"]), options=options, progress=False)


jobs = json.loads(sys.argv[1])
setup.prepare_data(recipes.resolve(schema.read_toml(jobs[0][3])))  # warm: imports and the data set
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
    killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    ends[pids[pid]] = "SIGKILL" if killed else status
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
ANALYSIS = {"passes": ["loss", "sharpness"],
            "options": {"sharpness": {"rhos": [0.05], "steps": 1, "adaptive": False}},
            "settings": {"device": "cpu", "analysis_samples": 300}}
ANALYSIS_KILLED_AT = 5  # the 5th of 8 result files (4 rounds x 2 passes)


@pytest.fixture(scope="module")
def killed(six_round_run, tmp_path_factory) -> dict:
    """Run directories left by processes that SIGKILLed themselves: one per KILLS entry, and 'analysis' (a
    copy of six_round_run whose analysis was killed)."""
    root = tmp_path_factory.mktemp("killed")
    recipe_file = root / "recipe.toml"
    recipe_file.write_text(recipes.to_toml(recipe6()))
    outs = {kill: root / f"{kill[0]}-{kill[1]}" for kill in KILLS}
    jobs = [["train", mode, n, str(recipe_file), str(outs[mode, n])] for mode, n in KILLS]
    shutil.copytree(six_round_run, root / "analysis")
    jobs.append(["analyze", "", ANALYSIS_KILLED_AT, str(root / "analysis"), ANALYSIS])
    env = {**ENV, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}  # one thread: safe to fork, no contention
    child = subprocess.run([sys.executable, "-c", CHILD, json.dumps(jobs)], capture_output=True, text=True,
                           env=env, timeout=600, check=False)
    assert child.returncode == 0, child.stderr
    assert json.loads(child.stdout) == ["SIGKILL"] * len(jobs), child.stderr
    return {**outs, "analysis": root / "analysis"}


@pytest.mark.parametrize("kill", list(KILLS), ids=[f"{m}-{n}" for m, n in KILLS])
def test_kill_9_then_resume_is_bit_identical(killed, six_round_run, kill):
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
        assert notes == [(f"{cut} has no checkpoint yet (its first process stopped early); starting again "
                          "from the initial model (round 0)")]
    assert not any(p.exists() for p in temps)  # temporary files of the killed process are cleaned up
    assert_same_run(six_round_run, cut)


def test_a_run_killed_before_its_partition_and_first_checkpoint_resumes(six_round_run, tmp_path):
    cut = tmp_path / "run"
    cut.mkdir()
    shutil.copy(six_round_run / ".landscape-run", cut / ".landscape-run")  # the marker is written first
    shutil.copy(six_round_run / "recipe.toml", cut / "recipe.toml")  # killed right after writing recipe.toml
    (cut / ".lock").write_text("")
    (cut / ".partition.json.abcd1234.tmp").write_text('{"settings": ')
    assert lifecycle.sweep_status(recipe6(), cut, overwrite=False) == "resume"
    elsewhere = recipe6().with_values({"train.threads": 2, "train.vectorize": "off",
                                       "train.memory_format": "contiguous"})  # how a round is computed
    assert lifecycle.sweep_status(elsewhere, cut, overwrite=False) == "resume"
    notes: list[str] = []
    loop.resume_run(cut, progress=False, warn=notes.append)
    assert len(notes) == 1 and "has no checkpoint yet" in notes[0]
    assert_same_run(six_round_run, cut)
    assert (cut / "partition.json").read_bytes() == (six_round_run / "partition.json").read_bytes()


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


def test_kill_9_during_analyze_then_rerun_computes_only_what_is_missing(killed, six_round_run, tmp_path):
    cut = killed["analysis"]
    done = sorted((cut / "analysis").rglob("*.json"))
    assert len(done) == ANALYSIS_KILLED_AT - 1  # the 5th died half written, in a temporary file
    assert len(list((cut / "analysis").rglob(".*.tmp"))) == 1

    report = analyze_in_process(cut)
    assert (report.computed, report.skipped) == (8 - len(done), len(done))
    shutil.copytree(six_round_run, tmp_path / "full")
    full = analyze_in_process(tmp_path / "full")
    assert (full.computed, full.skipped) == (8, 0)
    for path in sorted((tmp_path / "full" / "analysis").rglob("*.json")):
        a = json.loads(path.read_text())
        b = json.loads((cut / path.relative_to(tmp_path / "full")).read_text())
        assert a["result"] == b["result"] and a["summary"] == b["summary"], path
    assert [{**row, "run": "-"} for row in report.rows] == [{**row, "run": "-"} for row in full.rows]


# ----------------------------------------------------------------------------------------------------------
# a damaged newest checkpoint is set aside


# Short or junk files whose first record runs past their end (torch.load raised struct.error: issue 20).
SHORT_JUNK = {"junk": b"junk", "G": b"GGGGGGG", "J": b"J", "X": b"X\x02\x00\x00", "j": b"jj\x01",
              "r": b"r\x05\x06\x07"}


@pytest.mark.parametrize("damage", ["truncated", "zeroed", "empty", *SHORT_JUNK])
def test_a_damaged_newest_checkpoint_is_set_aside_and_the_run_resumes_from_the_previous(
        six_round_run, six_round_copy, damage):
    newest = RunDir(six_round_copy).checkpoint(6)
    data = newest.read_bytes()
    bad = {"truncated": data[: len(data) // 3], "zeroed": data[:100] + bytes(len(data) - 100), "empty": b"",
           **SHORT_JUNK}[damage]
    newest.write_bytes(bad)

    # analyze names the file in one line, given the file or the run
    for target in (newest, six_round_copy):
        line = one_line_error(invoke("analyze", target, "--passes", "loss", "--quiet", "--device", "cpu"))
        assert line.startswith(f"error: cannot load checkpoint {newest}: ")

    # resume says which checkpoint it takes, keeps the damaged file aside, and ends as the uninterrupted run
    result = invoke("train", "--resume", six_round_copy, "--quiet")
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.output.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1
    assert warnings[0].startswith("warning: checkpoints/round-0006.pt is damaged (")
    assert warnings[0].endswith("); moved to round-0006.pt.damaged; resuming from round-0004.pt")
    assert (newest.parent / "round-0006.pt.damaged").read_bytes() == bad
    assert_same_run(six_round_run, six_round_copy, extra={"checkpoints/round-0006.pt.damaged"})


# ----------------------------------------------------------------------------------------------------------
# divergence


def test_divergence_stops_names_round_and_algorithm_and_keeps_the_last_good_checkpoint(tmp_path):
    out = tmp_path / "run"
    recipe_file = tmp_path / "r.toml"
    recipe_file.write_text(recipes.to_toml(tiny_recipe(model__name="mlp", model__hidden=[16], train__rounds=4,
                                                       train__lr=1e6, train__checkpoint_every=1)))
    line = one_line_error(invoke("train", recipe_file, "--out", tmp_path, "--name", "run", "--quiet"))
    assert line.startswith("error: training diverged in round 2 (fedavg, lr 1e+06): ")
    assert "the last good checkpoint checkpoints/round-0001.pt is kept" in line
    run = RunDir(out)
    assert run.rounds() == [0, 1]  # the diverged state is never saved
    assert [r["round"] for r in run.read_metrics()] == [1]
    [event] = run.read_events()
    assert event["event"] == "diverged" and event["round"] == 2 and event["algorithm"] == "fedavg"
    assert event["last_checkpoint"] == "checkpoints/round-0001.pt" and event["problems"]
    logged = (event["train_loss"], event["update_norm"])
    assert "nan" in logged or "inf" in logged
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
    assert str(caught.value).startswith("training diverged in round 3 (fedprox, lr 0.1): "
                                        "1 non-finite parameters;")
    run = RunDir(tmp_path / "run")
    assert run.rounds() == [0, 1, 2]
    assert all(torch.isfinite(t).all() for t in load_checkpoint(run.checkpoint(2))["model"].values())
    assert run.read_events()[0]["problems"] == ["1 non-finite parameters"]


# ----------------------------------------------------------------------------------------------------------
# failed writes


def _enospc(*_args, **_kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


class _FullAfter(io.RawIOBase):
    """A file that takes ``room`` bytes, then fails every write as a full disk does (ENOSPC)."""

    def __init__(self, f, room: int) -> None:
        self.f, self.room = f, room

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        if len(data) > self.room:
            _enospc()
        self.room -= len(data)
        return self.f.write(data)

    def flush(self) -> None:
        self.f.flush()


@pytest.mark.parametrize("fault", ["disk full while writing", "disk full inside torch's zip writer",
                                   "read-only at rename", "disk full on metrics"])
def test_a_failed_write_says_why_keeps_the_previous_checkpoint_and_leaves_no_temp_file(
        six_round_run, tmp_path, monkeypatch, fault):
    out = tmp_path / "run"
    recipe_file = tmp_path / "r.toml"
    recipe_file.write_text(recipes.to_toml(recipe6()))
    target = out / "checkpoints" / "round-0004.pt"
    full_checkpoint = fault in ("disk full while writing", "disk full inside torch's zip writer")
    if full_checkpoint:
        # inside torch's own writer the full disk is met mid-file and torch fails again closing the archive
        # (RuntimeError: ... unexpected pos ...): the line names the full disk, never torch's second error
        real_save = torch.save
        inside = fault == "disk full inside torch's zip writer"

        def save(obj, f, *args, **kwargs):
            if isinstance(obj, dict) and obj.get("round") == 4 and "clients" not in obj:
                f = _FullAfter(f, 4096) if inside else f.write(b"partial bytes") and _enospc()
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

        monkeypatch.setattr("landscape.store.directory.open", open_, raising=False)
        expected = f"error: cannot write {out / 'metrics.jsonl'}: [Errno 28] No space left on device"
    assert one_line_error(invoke("train", recipe_file, "--out", tmp_path, "--name", "run", "--quiet")) == expected
    if full_checkpoint:  # resumed while the disk is still full: the same line
        assert one_line_error(invoke("train", "--resume", out, "--quiet")) == expected
    monkeypatch.undo()

    run = RunDir(out)
    assert run.rounds() == [0, 2]
    assert_same_values(load_checkpoint(run.checkpoint(2)),
                       load_checkpoint(RunDir(six_round_run).checkpoint(2)))
    assert run.stale_temp_files() == [] and not (out / ".lock").exists()
    loop.resume_run(out, progress=False)
    assert_same_run(six_round_run, out)


def test_a_failed_rewrite_keeps_the_old_file(six_round_copy, monkeypatch):
    run = RunDir(six_round_copy)
    shutil.move(run.checkpoint(6), run.checkpoints / "elsewhere")  # rows 5, 6 must now be dropped on resume
    before = run.metrics.read_bytes()
    real_replace = os.replace

    def replace(src, dst, *args, **kwargs):
        if Path(dst).name == "metrics.jsonl":
            _enospc()
        real_replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(LandscapeError,
                       match=r"cannot write .*metrics.jsonl: \[Errno 28\] No space left on device"):
        loop.resume_run(six_round_copy, progress=False)
    assert run.metrics.read_bytes() == before and run.stale_temp_files() == []


# ----------------------------------------------------------------------------------------------------------
# metrics.jsonl: intact rows are kept, damaged lines set aside, missing rows recomputed


def _lines(path: Path) -> list[str]:
    return (path / "metrics.jsonl").read_text().splitlines(keepends=True)


def test_a_damaged_line_in_the_middle_of_metrics_keeps_every_other_row(six_round_run, six_round_copy):
    lines = _lines(six_round_copy)
    lines[2] = '{"round": 3, "lr": 0.1, "tr\x00\x00garbage\n'  # round 3's row
    (six_round_copy / "metrics.jsonl").write_text("".join(lines))
    rounds = [r["round"] for r in RunDir(six_round_copy).read_metrics()]
    assert rounds == [1, 2, 4, 5, 6]  # later rows still read

    notes: list[str] = []
    loop.resume_run(six_round_copy, rounds=8, progress=False, warn=notes.append)
    assert any("metrics.jsonl line 3 is damaged" in n and "metrics.jsonl.damaged" in n for n in notes), notes
    assert any("round 3" in n and "recomputed" in n and "round-0002.pt" in n for n in notes), notes
    assert (six_round_copy / "metrics.jsonl.damaged").read_text() == lines[2]
    rows = metrics_without_time(six_round_copy)
    assert [r["round"] for r in rows] == list(range(1, 9))
    assert rows[:6] == metrics_without_time(six_round_run)  # the recomputed row is the one the run wrote
    original = [json.loads(line) for i, line in enumerate(_lines(six_round_run)) if i != 2]
    kept = [json.loads(line) for line in _lines(six_round_copy)[:6]]
    assert [r for r in kept if r["round"] != 3] == original  # intact rows kept as they were (timing too)


def test_a_cut_last_row_whose_round_has_a_checkpoint_is_recomputed(six_round_run, six_round_copy):
    text = (six_round_copy / "metrics.jsonl").read_text()
    # round 6's row cut; round-0006.pt exists
    (six_round_copy / "metrics.jsonl").write_text(text[: len(text) - 40])
    notes: list[str] = []
    loop.resume_run(six_round_copy, progress=False, warn=notes.append)
    assert len(notes) == 1 and "round 6" in notes[0] and "round-0004.pt" in notes[0], notes
    assert metrics_without_time(six_round_copy) == metrics_without_time(six_round_run)
    for r in RunDir(six_round_run).rounds():  # the checkpoints are untouched
        assert (RunDir(six_round_copy).checkpoint(r).read_bytes()
                == RunDir(six_round_run).checkpoint(r).read_bytes())
    assert not (six_round_copy / "metrics.jsonl.damaged").exists()  # a cut last line is what a kill leaves
