"""Reliability, round 2 (issue 13): nothing lost, nothing silently wrong, same numbers on any thread count.

Each test is one case a hostile user found: a folder of the user's replaced by --overwrite, a symlinked lock
file, a damaged metrics line, a checkpoint of another run analysed silently, tracebacks on damaged or odd
files, a tampered partition.json, rounds without kept client models, results that changed with the number of
threads, and unclear messages.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from conftest import one_line_error, tiny_recipe

import landscape
from landscape import recipe as recipes
from landscape.analyze.catalog import pass_options
from landscape.analyze.context import AnalysisSettings
from landscape.analyze.scheduler import run_analysis
from landscape.cli import cli
from landscape.errors import LandscapeError
from landscape.runs import CHECKPOINT_FORMAT, RunDir, load_checkpoint
from landscape.train import loop


def recipe6(**changes) -> recipes.Recipe:
    """Six fast rounds (a small MLP), checkpoints every 2 rounds, the clients' models kept."""
    values = {"model__name": "mlp", "model__hidden": [16], "train__rounds": 6, "train__checkpoint_every": 2,
              "train__keep_clients": True}
    values.update(changes)
    return tiny_recipe(**values)


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])



def no_traceback(result) -> None:
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output, result.output


def snapshot(path: Path) -> dict[str, bytes]:
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in sorted(Path(path).rglob("*"))
            if p.is_file() and not p.is_symlink()}


def metrics_without_time(path: Path) -> list[dict]:
    return [{k: v for k, v in row.items() if k != "seconds"} for row in RunDir(path).read_metrics()]


def same_values(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same_values(a[k], b[k]) for k in a)
    return a == b


@pytest.fixture(scope="module")
def whole(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("whole") / "run"
    loop.start_run(recipe6(), out, progress=False)
    return out


@pytest.fixture
def run_copy(whole, tmp_path) -> Path:
    shutil.copytree(whole, tmp_path / "run")
    return tmp_path / "run"


def analyze_args(path, *more):
    return ["analyze", path, "--device", "cpu", "--quiet", "--analysis-samples", "200", *more]


# ----------------------------------------------------------------------------------------------------------
# --overwrite replaces only a folder this tool made


def test_a_new_run_directory_carries_the_marker(whole):
    assert (whole / ".landscape-run").is_file()


def test_overwrite_refuses_a_folder_that_merely_holds_a_recipe_toml(tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "recipe.toml").write_text(recipes.to_toml(recipe6()))
    (out / "thesis.tex").write_text("two years of work")
    (out / "data").mkdir()
    (out / "data" / "measurements.csv").write_text("1,2,3\n")
    before = snapshot(out)
    line = one_line_error(invoke("train", "--rounds", "1", "--out", out, "--overwrite", "--quiet"))
    assert str(out) in line and "thesis.tex" in line and "--overwrite" in line
    assert snapshot(out) == before
    # a recipe.toml alone is no run either: it may be the user's own recipe
    (out / "thesis.tex").unlink()
    shutil.rmtree(out / "data")
    before = snapshot(out)
    line = one_line_error(invoke("train", "--rounds", "1", "--out", out, "--overwrite", "--quiet"))
    assert "no run files" in line
    assert snapshot(out) == before


def test_overwrite_replaces_a_run_made_before_the_marker_when_it_holds_only_run_files(whole, tmp_path):
    old = tmp_path / "old"
    shutil.copytree(whole, old)
    (old / ".landscape-run").unlink()  # made before the marker existed
    (old / "analysis" / "round-0006").mkdir(parents=True)
    (old / "analysis" / "round-0006" / "loss.json").write_text("{}")
    loop.start_run(recipe6(train__rounds=2), old, overwrite=True, progress=False)
    assert RunDir(old).rounds() == [0, 2] and (old / ".landscape-run").is_file()
    assert not (old / "analysis").exists()

    # the same run with a file of the user's in it, or in its checkpoints/, is left alone
    for where in ("notes.md", "checkpoints/my-model.pt"):
        legacy = tmp_path / f"legacy-{where.replace('/', '-')}"
        shutil.copytree(whole, legacy)
        (legacy / ".landscape-run").unlink()
        (legacy / where).write_text("mine")
        before = snapshot(legacy)
        with pytest.raises(LandscapeError, match="--overwrite replaces only") as caught:
            loop.start_run(recipe6(), legacy, overwrite=True, progress=False)
        assert where.split("/")[-1] in str(caught.value) and "\n" not in str(caught.value)
        assert snapshot(legacy) == before


# ----------------------------------------------------------------------------------------------------------
# symbolic links are never followed for files the tool writes


def test_a_symlinked_lock_file_is_refused_and_its_target_untouched(run_copy, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (run_copy / ".lock").symlink_to(victim)
    line = one_line_error(invoke("train", "--resume", run_copy, "--rounds", "8", "--quiet"))
    assert ".lock" in line and "symbolic link" in line
    assert victim.read_text() == "precious"
    assert RunDir(run_copy).rounds() == [0, 2, 4, 6]
    # a dangling link is not created through either
    (run_copy / ".lock").unlink()
    (run_copy / ".lock").symlink_to(tmp_path / "created-through-the-link")
    with pytest.raises(LandscapeError, match="symbolic link"):
        loop.resume_run(run_copy, rounds=8, progress=False)
    assert not (tmp_path / "created-through-the-link").exists()


def test_a_symlinked_metrics_file_is_replaced_not_written_through(run_copy, tmp_path):
    victim = tmp_path / "victim.jsonl"
    victim.write_bytes((run_copy / "metrics.jsonl").read_bytes())
    before = victim.read_bytes()
    (run_copy / "metrics.jsonl").unlink()
    (run_copy / "metrics.jsonl").symlink_to(victim)
    loop.resume_run(run_copy, rounds=8, progress=False)
    assert victim.read_bytes() == before
    assert not (run_copy / "metrics.jsonl").is_symlink()
    assert [r["round"] for r in RunDir(run_copy).read_metrics()] == list(range(1, 9))


def test_appending_a_metrics_row_never_follows_a_link(run_copy, tmp_path):
    victim = tmp_path / "victim.jsonl"
    victim.write_text("")
    (run_copy / "metrics.jsonl").unlink()
    (run_copy / "metrics.jsonl").symlink_to(victim)
    with pytest.raises(LandscapeError, match="symbolic link"):
        RunDir(run_copy).append_metrics({"round": 7})
    assert victim.read_text() == ""


# ----------------------------------------------------------------------------------------------------------
# metrics.jsonl: intact rows are kept, damaged lines set aside, missing rows recomputed


def _lines(path: Path) -> list[str]:
    return (path / "metrics.jsonl").read_text().splitlines(keepends=True)


def test_a_damaged_line_in_the_middle_of_metrics_keeps_every_other_row(whole, run_copy):
    lines = _lines(run_copy)
    lines[2] = '{"round": 3, "lr": 0.1, "tr\x00\x00garbage\n'  # round 3's row
    (run_copy / "metrics.jsonl").write_text("".join(lines))
    assert [r["round"] for r in RunDir(run_copy).read_metrics()] == [1, 2, 4, 5, 6]  # later rows still read

    notes: list[str] = []
    loop.resume_run(run_copy, rounds=8, progress=False, warn=notes.append)
    assert any("metrics.jsonl line 3 is damaged" in n and "metrics.jsonl.damaged" in n for n in notes), notes
    assert any("round 3" in n and "recomputed" in n and "round-0002.pt" in n for n in notes), notes
    assert (run_copy / "metrics.jsonl.damaged").read_text() == lines[2]
    rows = metrics_without_time(run_copy)
    assert [r["round"] for r in rows] == list(range(1, 9))
    assert rows[:6] == metrics_without_time(whole)  # the recomputed row is the one the run wrote
    original = [json.loads(line) for i, line in enumerate(_lines(whole)) if i != 2]
    kept = [json.loads(line) for line in _lines(run_copy)[:6]]
    assert [r for r in kept if r["round"] != 3] == original  # intact rows kept as they were (timing too)


def test_a_cut_last_row_whose_round_has_a_checkpoint_is_recomputed(whole, run_copy):
    text = (run_copy / "metrics.jsonl").read_text()
    (run_copy / "metrics.jsonl").write_text(text[: len(text) - 40])  # round 6's row cut; round-0006.pt exists
    notes: list[str] = []
    loop.resume_run(run_copy, progress=False, warn=notes.append)
    assert len(notes) == 1 and "round 6" in notes[0] and "round-0004.pt" in notes[0], notes
    assert metrics_without_time(run_copy) == metrics_without_time(whole)
    for r in RunDir(whole).rounds():  # the checkpoints are untouched
        assert (RunDir(run_copy).checkpoint(r)).read_bytes() == RunDir(whole).checkpoint(r).read_bytes()
    assert not (run_copy / "metrics.jsonl.damaged").exists()  # a cut last line is what a kill leaves


# ----------------------------------------------------------------------------------------------------------
# analyze checks the recipe a checkpoint carries


def test_analyze_refuses_a_checkpoint_of_another_seed(run_copy, tmp_path):
    other = tmp_path / "other"
    loop.start_run(recipe6(seed=1, train__rounds=2), other, progress=False)
    newest = RunDir(run_copy).checkpoint(6)
    shutil.copy(RunDir(other).checkpoint(2), newest)
    line = one_line_error(invoke(*analyze_args(run_copy, "--passes", "loss")))
    assert str(newest) in line and "seed is 1 there, 0 in recipe.toml" in line
    assert not (run_copy / "analysis").exists() or not list((run_copy / "analysis").rglob("*.json"))


# ----------------------------------------------------------------------------------------------------------
# no tracebacks: damaged, odd or unsafe files


class _Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


CLIENT_FILES = {
    "empty": lambda state, marker, path: path.write_bytes(b""),
    "truncated": lambda state, marker, path: path.write_bytes(path.read_bytes()[:300]),
    "a global checkpoint": lambda state, marker, path: shutil.copy(path.with_name("round-0006.pt"), path),
    "a client that does not exist": lambda state, marker, path: torch.save(
        {"format": CHECKPOINT_FORMAT, "round": 6, "model": {}, "clients": {"0": state, "99": state}}, path),
    "half precision": lambda state, marker, path: torch.save(
        {"format": CHECKPOINT_FORMAT, "round": 6, "model": {},
         "clients": {"0": {k: v.half() for k, v in state.items()}, "1": state}}, path),
    "code (torch.save)": lambda state, marker, path: torch.save(
        {"format": CHECKPOINT_FORMAT, "round": 6, "model": {}, "clients": {"0": _Payload(marker)}}, path),
    "code (pickle protocol 0)": lambda state, marker, path: path.write_bytes(pickle.dumps(
        {"format": CHECKPOINT_FORMAT, "clients": _Payload(marker)}, protocol=0)),
}


@pytest.mark.parametrize("damage", list(CLIENT_FILES))
@pytest.mark.parametrize("passes", [["--passes", "flatness"],
                                    ["--passes", "surface", "--directions", "clients", "--grid", "3"]],
                         ids=["flatness", "client-surface"])
def test_a_damaged_or_odd_clients_file_is_one_line(run_copy, tmp_path, damage, passes):
    marker = tmp_path / "PWNED"
    path = RunDir(run_copy).clients_checkpoint(6)
    state = next(iter(load_checkpoint(path)["clients"].values()))
    CLIENT_FILES[damage](state, marker, path)
    line = one_line_error(invoke(*analyze_args(run_copy, *passes)))
    assert str(path) in line
    assert "weights_only=False" not in line and "weights_only` set to `False" not in line
    if damage.startswith("code"):
        assert "would run code" in line
    if damage == "a client that does not exist":
        assert "client 99" in line
    if damage == "half precision":
        assert "float16" in line and "float32" in line
    assert not marker.exists()


def test_a_checkpoint_in_pickle_protocol_0_carrying_code_is_refused_not_set_aside(run_copy, tmp_path):
    marker = tmp_path / "PWNED"
    newest = RunDir(run_copy).checkpoint(6)
    newest.write_bytes(pickle.dumps({"format": CHECKPOINT_FORMAT, "round": 6, "model": _Payload(marker)}, protocol=0))
    before = snapshot(run_copy)
    line = one_line_error(invoke("train", "--resume", run_copy, "--quiet"))
    assert "would run code" in line and "round-0006.pt" in line
    assert snapshot(run_copy) == before  # not moved to .damaged
    line = one_line_error(invoke(*analyze_args(run_copy, "--passes", "loss")))
    assert "would run code" in line
    assert not marker.exists()


@pytest.mark.parametrize("change", ["server state of floats", "client states of floats", "half precision model",
                                    "round is text", "round of another file"])
def test_a_checkpoint_with_values_of_the_wrong_kind_is_one_line(run_copy, change):
    newest = RunDir(run_copy).checkpoint(6)
    ckpt = load_checkpoint(newest)
    if change == "server state of floats":
        ckpt["server_state"] = {"x": 0.5}
    elif change == "client states of floats":
        ckpt["client_states"] = {"0": 1.0}
    elif change == "half precision model":
        ckpt["model"] = {k: v.half() for k, v in ckpt["model"].items()}
    elif change == "round is text":
        ckpt["round"] = "6"
    else:
        ckpt["round"] = 2
    torch.save(ckpt, newest)
    before = snapshot(run_copy)
    line = one_line_error(invoke("train", "--resume", run_copy, "--rounds", "8", "--quiet"))
    assert str(newest) in line or "round-0006.pt" in line
    assert snapshot(run_copy) == before
    if change == "half precision model":
        line = one_line_error(invoke(*analyze_args(run_copy, "--passes", "loss")))
        assert "float16" in line


def test_a_grid_of_one_point_is_refused(run_copy):
    line = one_line_error(invoke(*analyze_args(run_copy, "--passes", "surface", "--grid", "1")))
    assert "at least 3" in line


def test_a_one_point_surface_on_disk_does_not_break_compare(run_copy, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(run_copy, other)
    for run in (run_copy, other):
        assert invoke(*analyze_args(run, "--passes", "surface", "--grid", "3")).exit_code == 0
    # a one-point grid written by hand (or by an older version)
    import numpy as np

    npz = next((run_copy / "analysis" / "round-0006").glob("surface*.npz"))
    with np.load(npz) as f:
        arrays = {k: f[k] for k in f.files}
    arrays.update(loss=np.ones((1, 1)), accuracy=np.ones((1, 1)), x_coords=np.zeros(1), y_coords=np.zeros(1))
    np.savez(npz, **arrays)
    result = invoke("compare", run_copy, other, "--out", tmp_path / "cmp")
    no_traceback(result)


def test_a_huge_grid_is_refused_before_memory_is_allocated(run_copy):
    line = one_line_error(invoke(*analyze_args(run_copy, "--passes", "surface", "--grid", "100001")))
    assert "100001" in line and "memory" in line


@pytest.mark.parametrize("content", ["[]", "null", "7", '{"summary": [], "settings": [], "result": []}'])
def test_an_analysis_json_of_another_shape_is_recomputed_and_read_without_traceback(run_copy, tmp_path, content):
    other = tmp_path / "other"
    shutil.copytree(run_copy, other)
    args = ("--passes", "loss,surface", "--grid", "3")
    for run in (run_copy, other):
        assert invoke(*analyze_args(run, *args)).exit_code == 0
    for path in (run_copy / "analysis").rglob("*.json"):
        path.write_text(content)
    for command in (["compare", run_copy, other, "--out", tmp_path / "cmp"],
                    ["report", run_copy, other, "-o", tmp_path / "report.html"]):
        no_traceback(invoke(*command))
    result = invoke(*analyze_args(run_copy, *args))
    assert result.exit_code == 0, result.output
    assert "2 computed" in result.output
    for path in (run_copy / "analysis").rglob("*.json"):
        assert isinstance(json.loads(path.read_text()), dict)


# ----------------------------------------------------------------------------------------------------------
# partition.json is validated


PARTITION_DAMAGE = {
    "not JSON": lambda rec: "{not json",
    "index out of range": lambda rec: _with(rec, 0, [10**6]),
    "negative index": lambda rec: _with(rec, 0, [-1]),
    "duplicate sample": lambda rec: _with(rec, 1, rec["clients"][1]["indices"] + rec["clients"][0]["indices"][:1]),
    "not an integer": lambda rec: _with(rec, 0, ["x"]),
    "a client missing": lambda rec: json.dumps({**rec, "clients": rec["clients"][:-1]}),
    "no clients list": lambda rec: json.dumps({"clients": 5}),
}


def _with(record: dict, client: int, indices: list) -> str:
    clients = [dict(c) for c in record["clients"]]
    clients[client]["indices"] = indices
    return json.dumps({**record, "clients": clients})


@pytest.mark.parametrize("damage", list(PARTITION_DAMAGE))
def test_a_tampered_partition_json_is_named_in_one_line(run_copy, damage):
    path = run_copy / "partition.json"
    original = path.read_text()
    path.write_text(PARTITION_DAMAGE[damage](json.loads(original)))
    run = landscape.open_run(run_copy)
    with pytest.raises(LandscapeError) as caught:
        run.client_data(0)
    assert "partition.json" in str(caught.value) and "\n" not in str(caught.value)
    with pytest.raises(LandscapeError):
        run.partition()


def test_resume_sets_a_tampered_partition_json_aside_and_writes_it_again(whole, run_copy):
    path = run_copy / "partition.json"
    path.write_text(_with(json.loads(path.read_text()), 0, [10**6]))
    tampered = path.read_text()
    notes: list[str] = []
    loop.resume_run(run_copy, progress=False, warn=notes.append)
    assert len(notes) == 1 and "partition.json" in notes[0] and "partition.json.damaged" in notes[0]
    assert path.read_bytes() == (whole / "partition.json").read_bytes()
    assert (run_copy / "partition.json.damaged").read_text() == tampered


def test_analyze_says_when_partition_json_is_not_the_run_s_partition(run_copy):
    path = run_copy / "partition.json"
    path.write_text(_with(json.loads(path.read_text()), 0, [0, 1, 2]))
    result = invoke(*analyze_args(run_copy, "--passes", "loss"))
    assert result.exit_code == 0, result.output
    notes = [line for line in result.output.splitlines() if "partition.json" in line]
    assert len(notes) == 1 and notes[0].startswith(("note:", "warning:"))


# ----------------------------------------------------------------------------------------------------------
# rounds without kept client models


def test_analyze_all_rounds_of_flatness_skips_rounds_without_kept_clients_with_one_note(run_copy):
    args = [a for a in analyze_args(run_copy, "--checkpoints", "all", "--passes", "flatness") if a != "--quiet"]
    result = invoke(*args)  # without --quiet, which drops notes
    assert result.exit_code == 0, result.output
    notes = [line for line in result.output.splitlines() if line.startswith("note:")]
    assert len(notes) == 1 and "round 0" in notes[0] and "flatness" in notes[0], result.output
    assert "3 computed" in result.output
    for r in (2, 4, 6):
        assert list((run_copy / "analysis" / f"round-{r:04d}").glob("flatness*.json"))


def test_flatness_of_a_run_without_kept_clients_still_says_how_to_keep_them(tmp_path):
    out = tmp_path / "run"
    loop.start_run(recipe6(train__keep_clients=False, train__rounds=2), out, progress=False)
    line = one_line_error(invoke(*analyze_args(out, "--checkpoints", "all", "--passes", "flatness")))
    assert "--keep-clients" in line


# ----------------------------------------------------------------------------------------------------------
# threads


def test_train_threads_is_a_recipe_key_recorded_in_the_run(tmp_path):
    recipe = recipe6(train__rounds=2)
    assert recipe.train.threads == 1
    assert "threads = 1" in recipes.to_toml(recipe)
    result = invoke("train", "--rounds", "1", "--threads", "2", "--out", tmp_path / "run", "--quiet")
    assert result.exit_code == 0, result.output
    assert recipes.read_recipe(tmp_path / "run" / "recipe.toml").train.threads == 2
    assert load_checkpoint(RunDir(tmp_path / "run").checkpoint(1))["threads"] == 2
    with pytest.raises(LandscapeError, match="train.threads"):
        recipes.build(None, [("train.threads", -1)])


def test_training_and_analysis_use_their_thread_count_whatever_the_process_has(tmp_path, monkeypatch):
    seen: list[int] = []
    original_round = loop.Trainer.run_round

    def run_round(self, state):
        seen.append(torch.get_num_threads())
        return original_round(self, state)

    monkeypatch.setattr(loop.Trainer, "run_round", run_round)
    ambient = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        loop.start_run(recipe6(train__rounds=2), tmp_path / "run", progress=False)
        assert seen == [1, 1] and torch.get_num_threads() == 2  # restored afterwards
        import dataclasses

        from landscape.analyze.catalog import load_passes

        counts: list[int] = []
        entry = load_passes().get("loss")

        def loss_pass(ctx, opts):
            counts.append(torch.get_num_threads())
            return entry.factory(ctx, opts)

        monkeypatch.setitem(load_passes()._entries, "loss", dataclasses.replace(entry, factory=loss_pass))
        settings = AnalysisSettings(device="cpu", analysis_samples=100)
        run_analysis(tmp_path / "run", passes=["loss"], settings=settings, options={"loss": pass_options("loss", {})},
                     progress=False)
        assert counts == [1] and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(ambient)


def test_resume_with_another_thread_count_warns(run_copy):
    result = invoke("train", "--resume", run_copy, "--rounds", "7", "--threads", "2", "--quiet")
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.output.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "with 1 CPU thread, this resume uses 2" in warnings[0], result.output
    assert recipes.read_recipe(run_copy / "recipe.toml").train.threads == 2
    result = invoke("train", "--resume", run_copy, "--rounds", "8", "--quiet")
    assert result.exit_code == 0 and "warning" not in result.output, result.output


def test_analysis_numbers_do_not_depend_on_the_process_thread_count(whole, tmp_path):
    """The cause of the flaky kill-during-analyze test: its forked child analysed with one thread
    (OMP_NUM_THREADS=1), the test process with the machine's default, and the per-client sharpness differed in
    the last bits. The analysis now sets its own thread count."""
    options = {"sharpness": pass_options("sharpness", {"rhos": [0.05], "steps": 1, "adaptive": False})}
    results = []
    ambient = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            copy = tmp_path / f"t{n}"
            shutil.copytree(whole, copy)
            run_analysis(copy, rounds="all", passes=["sharpness"], options=options, progress=False,
                         settings=AnalysisSettings(device="cpu", analysis_samples=300))
            results.append({p.relative_to(copy).as_posix(): json.loads(p.read_text())["result"]
                            for p in sorted((copy / "analysis").rglob("*.json"))})
    finally:
        torch.set_num_threads(ambient)
    assert results[0] == results[1]


# ----------------------------------------------------------------------------------------------------------
# clear messages


def test_a_recipe_with_a_utf8_byte_order_mark_reads(tmp_path):
    path = tmp_path / "bom.toml"
    path.write_bytes("\ufeff[train]\nrounds = 2\n".encode())
    assert recipes.read_recipe(path).train.rounds == 2


def test_a_recipe_that_is_not_a_regular_file_says_so():
    line = one_line_error(invoke("train", "/dev/zero", "--dry-run"))
    assert line == "error: /dev/zero is not a regular file (a recipe is a TOML file)"


def test_a_huge_unknown_key_is_not_echoed_in_full(tmp_path):
    key = "k" * (5 << 20)
    path = tmp_path / "big.toml"
    path.write_text(f"[train]\n{key} = 1\n")
    line = one_line_error(invoke("train", path, "--dry-run"))
    assert len(line) < 1000 and "unknown recipe key" in line and "5,242,886 characters" in line
    line = one_line_error(invoke("train", "--set", f"train.{'x' * 100_000}=1", "--dry-run"))
    assert len(line) < 1000


def test_an_empty_recipe_says_so(tmp_path, run_copy):
    path = tmp_path / "empty.toml"
    path.write_text("\n  \n")
    line = one_line_error(invoke("train", path, "--dry-run"))
    assert line == f"error: {path} is empty (no recipe keys)"
    (run_copy / "recipe.toml").write_text("")
    line = one_line_error(invoke("train", "--resume", run_copy, "--quiet"))
    assert f"{run_copy / 'recipe.toml'} is empty" in line
    line = one_line_error(invoke(*analyze_args(run_copy, "--passes", "loss")))
    assert f"{run_copy / 'recipe.toml'} is empty" in line
