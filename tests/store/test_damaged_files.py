"""Damaged, special and hostile files in a run (issue 46, rows T4, T5, U2, U3, U8): every reader (``results()``,
report, compare, analyze) answers one line naming the file, never a traceback, a hang or a silent wrong number;
a damaged result, or one whose arrays are missing or cut, is computed again by the next ``landscape analyze``."""

from __future__ import annotations

import io
import json
import os
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest
from support.helpers import (
    analyze_args,
    invoke,
    no_traceback,
    one_line_error,
    shared_analysed_run,
)

import landscape
from landscape.core.errors import LandscapeError
from landscape.store.results.files import read_arrays, read_record

ANALYSE = ("--checkpoints", "6", "--passes", "loss,hessian", "--set", "hessian.top_k=2", "--set",
           "hessian.trace_hvps=6", "--set", "hessian.density_steps=4", "--set", "hessian.density_runs=1",
           "--set", "hessian.clients=0")
SETTINGS = ("--settings", "analysis_samples=200")


@pytest.fixture(scope="session")
def analysed_run(six_round_run, tmp_path_factory) -> Path:
    """The six-round run with its round 6 analysed (loss, and a hessian whose record lists arrays in an NPZ)."""
    return shared_analysed_run(tmp_path_factory, six_round_run, "damaged-analysed", *ANALYSE)


@pytest.fixture
def run(analysed_run, tmp_path) -> Path:
    shutil.copytree(analysed_run, tmp_path / "run")
    return tmp_path / "run"


def _result(run: Path, pass_name: str, suffix: str) -> Path:
    (path,) = (run / "analysis" / "round-0006").glob(f"{pass_name}@*{suffix}")
    return path


def _huge_npz(path: Path) -> None:
    """The NPZ with each array's header replaced by one declaring 10^11 float64 values (745 GiB)."""
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f8", "fortran_order": False, "shape": (10**11,)})
    with np.load(path) as f:
        names = list(f.files)
    with zipfile.ZipFile(path, "w") as archive:
        for name in names:
            archive.writestr(f"{name}.npy", header.getvalue() + bytes(64))


def _damage(run: Path, kind: str) -> Path:
    """Damage one result file of round 6 as ``kind`` says; the damaged file."""
    loss, hessian = _result(run, "loss", ".json"), _result(run, "hessian", ".json")
    npz = hessian.with_suffix(".npz")
    if kind == "deep":
        loss.write_text("[" * 200_000 + "]" * 200_000)
        return loss
    if kind == "directory":
        loss.unlink()
        loss.mkdir()
        return loss
    if kind == "fifo":
        loss.unlink()
        os.mkfifo(loss)
        return loss
    if kind in ("strings", "round"):
        record = json.loads(hessian.read_text())
        changes = {"summary": "x", "result": "y"} if kind == "strings" else {"round": "three"}
        hessian.write_text(json.dumps({**record, **changes}))
        return hessian
    if kind == "cut":
        os.truncate(npz, npz.stat().st_size // 2)
    elif kind == "huge":
        _huge_npz(npz)
    elif kind == "missing":
        npz.unlink()
    return npz


JSON_DAMAGE = ["deep", "directory", "fifo", "strings", "round"]
NPZ_DAMAGE = ["cut", "huge", "missing"]


def _read(reader: str, run: Path, tmp_path: Path, other: Path):
    """(exit code, one-line answer or '') of ``reader`` on the damaged run."""
    if reader == "results":
        try:
            landscape.open_run(run).results()
        except LandscapeError as e:
            assert "\n" not in str(e)
            return 1, f"error: {e}"
        return 0, ""
    if reader == "report":
        result = invoke("report", run, *SETTINGS, "-o", tmp_path / "r.html")
    else:
        shutil.copytree(other, tmp_path / "other")  # a second run, undamaged
        result = invoke("compare", run, tmp_path / "other", *SETTINGS, "--out", tmp_path / "cmp")
    no_traceback(result)
    return (result.exit_code, one_line_error(result)) if result.exit_code else (0, "")


@pytest.mark.parametrize("reader", ["results", "report", "compare"])
@pytest.mark.parametrize("kind", JSON_DAMAGE + NPZ_DAMAGE)
def test_a_damaged_result_is_one_line_naming_it(run, analysed_run, tmp_path, kind, reader):
    """T4, U2, U3: a result JSON nested 200,000 deep, a directory or FIFO in its place, its "summary" and
    "result" strings, a "round" that is text; its NPZ cut in half, declaring 10^11 values or missing. Every reader that reads the file
    answers one line naming it (the NPZ is read by the report only: the table and compare read the JSON)."""
    damaged = _damage(run, kind)
    code, line = _read(reader, run, tmp_path, analysed_run)
    if kind in JSON_DAMAGE or reader == "report":
        assert code == 1 and damaged.name in line, line
    else:
        assert code == 0


@pytest.mark.parametrize("kind", [kind for kind in JSON_DAMAGE + NPZ_DAMAGE if kind != "directory"])
def test_the_next_analyze_computes_a_damaged_result_again(run, tmp_path, kind):
    """U3, T4: ``landscape analyze`` takes a damaged result (or one whose arrays are missing or cut) for not done
    and computes it again (never "already done", never the summary table's traceback); the report then reads it.
    A directory in its place is named instead (the next test)."""
    damaged = _damage(run, kind)
    result = invoke(*analyze_args(run, *ANALYSE))
    no_traceback(result)
    assert result.exit_code == 0 and "1 computed, 1 already done" in result.output, result.output
    if damaged.suffix == ".npz":
        assert read_arrays(damaged, read_record(damaged.with_suffix(".json"))["arrays"])
    else:
        assert isinstance(read_record(damaged)["summary"], dict)
    assert invoke("report", run, *SETTINGS, "-o", tmp_path / "r.html").exit_code == 0


def test_a_directory_in_place_of_a_result_is_named_by_analyze(run):
    _damage(run, "directory")
    line = one_line_error(invoke(*analyze_args(run, *ANALYSE)))
    assert "is a directory, not a result file; remove it" in line


def test_a_round_folder_that_is_a_file_is_named(run):
    """U8: analysis/round-0006 a regular file: the message names it as the cause (not 'File exists')."""
    folder = run / "analysis" / "round-0006"
    shutil.rmtree(folder)
    folder.write_text("x")
    line = one_line_error(invoke(*analyze_args(run, *ANALYSE)))
    assert f"{folder} is a file, not a folder" in line and "File exists" not in line


@pytest.mark.parametrize("value", ["high", None, [1, 2]])
@pytest.mark.parametrize("reader", ["report", "compare"])
def test_a_metrics_value_that_is_not_a_number_is_one_line(run, analysed_run, tmp_path, value, reader):
    """T5: a metrics.jsonl row with "test_acc": "high" (null, a list): one line naming the file, the line and
    the key."""
    lines = (run / "metrics.jsonl").read_text().splitlines()
    row = json.loads(lines[2])
    lines[2] = json.dumps({**row, "test_acc": value})
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    code, line = _read(reader, run, tmp_path, analysed_run)
    assert code == 1 and "metrics.jsonl, line 3: test_acc is" in line and "not a number" in line, line


def test_a_fifo_in_place_of_a_checkpoint_never_hangs(run):
    """U2: checkpoints/round-0006.pt a FIFO: analyze, ``open_run(...).model()`` and ``--resume`` answer one line
    naming it (they hung in open())."""
    checkpoint = run / "checkpoints" / "round-0006.pt"
    checkpoint.unlink()
    os.mkfifo(checkpoint)
    line = one_line_error(invoke(*analyze_args(run, *ANALYSE)))
    assert "round-0006.pt" in line and "it is a FIFO (named pipe), not a regular file" in line
    with pytest.raises(LandscapeError, match="round-0006.pt.*FIFO"):
        landscape.open_run(run).model(6)
    result = invoke("train", "--resume", run, "--rounds", "7")
    no_traceback(result)
    assert result.exit_code != 0 and "round-0006.pt" in result.output, result.output


def test_a_fifo_in_place_of_the_recipe_is_named(run, tmp_path):
    """U2: recipe.toml a FIFO: it is named as what it is, not 'no recipe.toml'."""
    (run / "recipe.toml").unlink()
    os.mkfifo(run / "recipe.toml")
    with pytest.raises(LandscapeError, match="recipe.toml is a FIFO"):
        landscape.open_run(run)
    assert "recipe.toml is a FIFO" in one_line_error(invoke("report", run, "-o", tmp_path / "r.html"))


def _hostile_json(path: Path, kind: str) -> None:
    if kind == "deep":
        path.write_text("[" * 200_000 + "]" * 200_000)
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        path.mkdir()


@pytest.mark.parametrize("kind", ["deep", "fifo", "directory"])
@pytest.mark.parametrize("reader", ["partition", "claims.json", "tracker ledger"])
def test_other_json_files_a_run_or_a_command_reads_are_one_line(tmp_path, kind, reader):
    """The JSON read besides results: a partition file given to `landscape import`, a claims.json given to
    `claims --compare-with`, a tracker's ledger in a run (read again on resume: unreadable is logged again)."""
    from landscape.claims.table import read_verdicts
    from landscape.store.tracking import _Ledger
    from landscape.workflows.importing import read_partition_file

    name = {"partition": "partition.json", "claims.json": "claims.json", "tracker ledger": "logged-results.json"}
    path = tmp_path / name[reader]
    _hostile_json(path, kind)
    if reader == "tracker ledger":
        assert _Ledger(path, {"results": []}).data == {"results": []}
        return
    with pytest.raises(LandscapeError) as e:
        read_partition_file(path) if reader == "partition" else read_verdicts(tmp_path)
    assert str(e.value).count("\n") == 0 and str(path) in str(e.value), str(e.value)
