"""Run directories: the lock (two processes never train into one run), run names and swept values that would
make a path outside --out, the .landscape-run marker and what --overwrite may replace, and symbolic links in
place of the lock or metrics file (never followed for files the tool writes)."""

from __future__ import annotations

import fcntl
import os
import shutil

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.helpers import FUZZ, invoke, one_line_error, recipe6, snapshot

from landscape.analyze.catalog import pass_options
from landscape.analyze.scheduler import run_analysis
from landscape.analyze.settings import AnalysisSettings
from landscape.config import overrides as recipe_overrides
from landscape.config import recipe as recipes
from landscape.core.errors import LandscapeError
from landscape.store.directory import RunDir
from landscape.store.fileio import RunLock
from landscape.train import loop

# ----------------------------------------------------------------------------------------------------------
# two processes, one run directory


def test_a_second_process_cannot_train_into_a_locked_run(six_round_copy):
    stale = six_round_copy / "checkpoints" / ".round-0008.pt.abcd1234.tmp"
    stale.write_bytes(b"left by a killed process")
    holder = RunLock(RunDir(six_round_copy))  # another open file of the lock: flock refuses it like a process
    holder.acquire()
    try:
        before = snapshot(six_round_copy)
        message = (f"{six_round_copy} is in use by another landscape process (pid {os.getpid()}): two "
                   "processes never train into one run directory; wait for it to finish")
        line = one_line_error(invoke("train", "--resume", six_round_copy, "--rounds", "8", "--quiet"))
        assert line == f"error: {message}"
        with pytest.raises(LandscapeError, match="is in use by another landscape process"):
            loop.start_run(recipe6(), six_round_copy, overwrite=True, progress=False)
        assert snapshot(six_round_copy) == before  # nothing changed: not even the stale temporary file
        # analysis only adds files under analysis/ and takes no lock
        report = run_analysis(six_round_copy, rounds="last", passes=["loss"], progress=False,
                              settings=AnalysisSettings(device="cpu", analysis_samples=300),
                              options={"loss": pass_options("loss", {})})
        assert report.computed == 1
    finally:
        holder.release()
    assert not (six_round_copy / ".lock").exists()
    assert loop.resume_run(six_round_copy, rounds=8, progress=False).round == 8
    assert not stale.exists() and not (six_round_copy / ".lock").exists()


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
        recipe_overrides.build(None, [("name", name)])
    assert "\n" not in str(caught.value)


def test_plain_names_are_accepted():
    assert recipe_overrides.build(None, [("name", "fedsam-v1.2_b")]).name == "fedsam-v1.2_b"
    assert recipe_overrides.build(None, []).name == ""


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
    recipe, swept = recipe_overrides.build_sweep(None, [], {"dataset.root": [value]})[0]
    try:
        name = recipe_overrides.sweep_run_name(recipe, swept)
    except LandscapeError as e:
        assert "\n" not in str(e) and "dataset.root" in str(e)
        return
    out = tmp_path / "out"
    assert name not in (".", "..") and (out / name).resolve().parent == out.resolve()


# ----------------------------------------------------------------------------------------------------------
# --overwrite replaces only a folder this tool made


def test_a_new_run_directory_carries_the_marker(six_round_run):
    assert (six_round_run / ".landscape-run").is_file()


def test_overwrite_refuses_a_folder_that_merely_holds_a_recipe_toml(tmp_path):
    out, mine = tmp_path / "mine", ["--out", tmp_path, "--name", "mine"]
    out.mkdir()
    (out / "recipe.toml").write_text(recipes.to_toml(recipe6()))
    (out / "thesis.tex").write_text("two years of work")
    (out / "data").mkdir()
    (out / "data" / "measurements.csv").write_text("1,2,3\n")
    before = snapshot(out)
    line = one_line_error(invoke("train", "--rounds", "1", *mine, "--overwrite", "--quiet"))
    assert str(out) in line and "thesis.tex" in line and "--overwrite" in line
    assert snapshot(out) == before
    # a recipe.toml alone is no run either: it may be the user's own recipe
    (out / "thesis.tex").unlink()
    shutil.rmtree(out / "data")
    before = snapshot(out)
    line = one_line_error(invoke("train", "--rounds", "1", *mine, "--overwrite", "--quiet"))
    assert "no run files" in line
    assert snapshot(out) == before


def test_overwrite_replaces_a_run_made_before_the_marker_when_it_holds_only_run_files(six_round_run,
                                                                                     tmp_path):
    old = tmp_path / "old"
    shutil.copytree(six_round_run, old)
    (old / ".landscape-run").unlink()  # made before the marker existed
    (old / "analysis" / "round-0006").mkdir(parents=True)
    (old / "analysis" / "round-0006" / "loss.json").write_text("{}")
    loop.start_run(recipe6(train__rounds=2), old, overwrite=True, progress=False)
    assert RunDir(old).rounds() == [0, 2] and (old / ".landscape-run").is_file()
    assert not (old / "analysis").exists()

    # the same run with a file of the user's in it, or in its checkpoints/, is left alone
    for where in ("notes.md", "checkpoints/my-model.pt"):
        legacy = tmp_path / f"legacy-{where.replace('/', '-')}"
        shutil.copytree(six_round_run, legacy)
        (legacy / ".landscape-run").unlink()
        (legacy / where).write_text("mine")
        before = snapshot(legacy)
        with pytest.raises(LandscapeError, match="--overwrite replaces only") as caught:
            loop.start_run(recipe6(), legacy, overwrite=True, progress=False)
        assert where.split("/")[-1] in str(caught.value) and "\n" not in str(caught.value)
        assert snapshot(legacy) == before


# ----------------------------------------------------------------------------------------------------------
# symbolic links are never followed for files the tool writes


def test_a_symlinked_lock_file_is_refused_and_its_target_untouched(six_round_copy, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (six_round_copy / ".lock").symlink_to(victim)
    line = one_line_error(invoke("train", "--resume", six_round_copy, "--rounds", "8", "--quiet"))
    assert ".lock" in line and "symbolic link" in line
    assert victim.read_text() == "precious"
    assert RunDir(six_round_copy).rounds() == [0, 2, 4, 6]
    # a dangling link is not created through either
    (six_round_copy / ".lock").unlink()
    (six_round_copy / ".lock").symlink_to(tmp_path / "created-through-the-link")
    with pytest.raises(LandscapeError, match="symbolic link"):
        loop.resume_run(six_round_copy, rounds=8, progress=False)
    assert not (tmp_path / "created-through-the-link").exists()


def test_a_symlinked_metrics_file_is_replaced_not_written_through(six_round_copy, tmp_path):
    victim = tmp_path / "victim.jsonl"
    victim.write_bytes((six_round_copy / "metrics.jsonl").read_bytes())
    before = victim.read_bytes()
    (six_round_copy / "metrics.jsonl").unlink()
    (six_round_copy / "metrics.jsonl").symlink_to(victim)
    loop.resume_run(six_round_copy, rounds=8, progress=False)
    assert victim.read_bytes() == before
    assert not (six_round_copy / "metrics.jsonl").is_symlink()
    assert [r["round"] for r in RunDir(six_round_copy).read_metrics()] == list(range(1, 9))


def test_appending_a_metrics_row_never_follows_a_link(six_round_copy, tmp_path):
    victim = tmp_path / "victim.jsonl"
    victim.write_text("")
    (six_round_copy / "metrics.jsonl").unlink()
    (six_round_copy / "metrics.jsonl").symlink_to(victim)
    with pytest.raises(LandscapeError, match="symbolic link"):
        RunDir(six_round_copy).append_metrics({"round": 7})
    assert victim.read_text() == ""
