"""A result is valid only while what made it is unchanged (issue 46, W6 and W7): every reader (``results()``,
report, compare) leaves out a stored result whose folder is not its round, whose checkpoint is gone, or whose
checkpoint's SHA-256 is not the one it records, and one line per run says so and names the way out;
``landscape analyze`` says which such results it leaves as they are."""

from __future__ import annotations

import csv
import json
import os
import shutil
import warnings
from pathlib import Path

import pytest
import torch
from support.helpers import analyze_args, invoke, shared_analysed_run

import landscape
from landscape.store.checkpoints import load_checkpoint
from landscape.store.results.validity import StaleResultWarning

PASSES = ("--checkpoints", "4,6", "--passes", "flatness,loss")


@pytest.fixture(scope="module")
def analysed(six_round_run, tmp_path_factory) -> Path:
    """The six-round run with its rounds 4 and 6 analysed (the flatness and loss passes)."""
    return shared_analysed_run(tmp_path_factory, six_round_run, "validity-analysed", *PASSES)


@pytest.fixture
def run(analysed, tmp_path) -> Path:
    shutil.copytree(analysed, tmp_path / "run")
    return tmp_path / "run"


def _change_weight(checkpoint: Path) -> None:
    """Add 1e-3 to one weight of the global model, in place (the file keeps its name and size)."""
    payload = load_checkpoint(checkpoint)
    name = next(iter(payload["model"]))
    payload["model"][name].view(-1)[0] += 1e-3
    torch.save(payload, checkpoint)


def _make_stale(run: Path, case: str) -> tuple[int, str]:
    """Make the results of one round not current as ``case`` says; (that round, the reason readers give)."""
    if case == "copied round folder":  # cp -r analysis/round-0006 analysis/round-0099
        shutil.copytree(run / "analysis" / "round-0006", run / "analysis" / "round-0099")
        return 99, "its record says round 6 and there is no checkpoint for round 99"
    if case == "removed checkpoint":  # the run replaced by a shorter one (train --overwrite) or pruned
        (run / "checkpoints" / "round-0006.pt").unlink()
        return 6, "no checkpoint for round 6"
    _change_weight(run / "checkpoints" / "round-0006.pt")
    return 6, "checkpoint changed since analysed"


CASES = ["copied round folder", "removed checkpoint", "changed checkpoint"]


@pytest.mark.parametrize("case", CASES)
def test_results_leave_out_what_is_not_current_and_warn_once(run, case):
    stale_round, reason = _make_stale(run, case)
    opened = landscape.open_run(run)
    with pytest.warns(StaleResultWarning) as caught:
        table = opened.results()
        opened.records()
        landscape.results(run)  # another reader call: its own line
    assert len(caught) == 2, [str(w.message) for w in caught]  # one line per run per reader, not per result
    line = str(caught[0].message)
    assert f"run run: 2 analysis results left out, not current: round {stale_round} (flatness, loss: {reason})" \
        in line, line
    assert "\n" not in line
    if case == "changed checkpoint":
        assert "--checkpoints 6 --passes flatness,loss --force` recomputes them" in line, line
    else:  # no checkpoint for the folder's round: nothing to recompute
        assert f"remove {run / 'analysis' / f'round-{stale_round:04d}'} (the run has no checkpoint for it)" in line
    assert stale_round not in set(table["round"]) and 4 in set(table["round"])
    assert stale_round not in opened.records()
    stale = opened.stale_results()
    assert [(why, round_, pass_name) for _, why, round_, pass_name in stale] == [
        (reason, stale_round, "flatness"), (reason, stale_round, "loss")]
    assert all(path.parent.name == f"round-{stale_round:04d}" and path.suffix == ".json" for path, *_ in stale)


@pytest.mark.parametrize("case", CASES)
def test_report_leaves_out_what_is_not_current_with_one_note(run, tmp_path, case):
    stale_round, reason = _make_stale(run, case)
    result = invoke("report", run, "-o", tmp_path / "r.html")
    assert result.exit_code == 0, result.output
    notes = [line for line in result.output.splitlines() if line.startswith("note: ")]
    assert len(notes) == 1 and f"round {stale_round} (flatness, loss: {reason})" in notes[0], result.output
    page = (tmp_path / "r.html").read_text()
    assert f"round {stale_round} (flatness, loss: {reason})" in page  # the page says it too, under the comparison table


@pytest.mark.parametrize("case", CASES)
def test_compare_reads_the_latest_current_round_with_one_note(run, analysed, tmp_path, case):
    stale_round, reason = _make_stale(run, case)
    shutil.copytree(analysed, tmp_path / "other")  # a run whose results are all current: no note of it
    result = invoke("compare", run, tmp_path / "other", "--out", tmp_path / "cmp", "--settings",
                    "analysis_samples=200", "--quiet")
    assert result.exit_code == 0, result.output
    notes = [line for line in result.output.splitlines() if line.startswith("note: ")]
    assert len(notes) == 1 and f"run run: 2 analysis results left out, not current: round {stale_round} (flatness, " \
        f"loss: {reason})" in notes[0], result.output
    with open(tmp_path / "cmp" / "compare.csv") as f:
        rows = {row["directory"]: row for row in csv.DictReader(f)}
    latest = "6" if case == "copied round folder" else "4"  # the stale round (99, or 6) is not the latest analysed
    assert rows["run"]["Delta_D round"] == latest, rows
    assert rows["other"]["Delta_D round"] == "6", rows


def test_a_checkpoint_that_cannot_be_read_leaves_its_results_out_in_one_line(run):
    checkpoint = run / "checkpoints" / "round-0006.pt"
    checkpoint.unlink()
    os.mkfifo(checkpoint)  # never a hang: the file is not opened for hashing
    with pytest.warns(StaleResultWarning) as caught:
        assert 6 not in landscape.open_run(run).records()
    line = str(caught[0].message)
    assert "round 6 (flatness, loss: its checkpoint cannot be read (cannot read" in line, line
    assert f"it is a FIFO (named pipe), not a regular file)); replace {checkpoint} by a checkpoint, or move it away" \
        in line, line


def test_a_current_run_reads_without_a_warning_and_hashes_each_checkpoint_once(run, monkeypatch):
    def no_torch_load(*args, **kwargs):
        raise AssertionError("a checkpoint was loaded with torch to check a result")

    opened = landscape.open_run(run)
    monkeypatch.setattr(torch, "load", no_torch_load)
    with warnings.catch_warnings():
        warnings.simplefilter("error", StaleResultWarning)
        opened.results()
        opened.records()
        assert opened.stale_results() == []
    assert opened._hashes.hashed == 4  # rounds 4 and 6 and their kept client models (flatness read them), once


def test_a_record_without_a_checkpoint_hash_is_current_while_its_checkpoint_is_there(run):
    """A result written before results recorded their checkpoint's SHA-256 cannot tell a changed checkpoint:
    it counts as current while its round and checkpoint exist."""
    for path in (run / "analysis" / "round-0006").glob("*.json"):
        record = json.loads(path.read_text())
        del record["checkpoint_sha256"]
        path.write_text(json.dumps(record))
    _change_weight(run / "checkpoints" / "round-0006.pt")
    assert landscape.open_run(run).stale_results() == []
    (run / "checkpoints" / "round-0006.pt").unlink()
    with pytest.warns(StaleResultWarning, match="no checkpoint for round 6"):
        assert 6 not in landscape.open_run(run).records()


def test_analyze_says_which_results_it_leaves_stale_without_recomputing_them(run):
    _change_weight(run / "checkpoints" / "round-0006.pt")
    (old,) = (run / "analysis" / "round-0006").glob("loss@*.json")
    before = old.read_bytes()
    result = invoke("analyze", run, "--device", "cpu", "--analysis-samples", "200", "--checkpoints", "4",
                    "--passes", "loss")
    assert result.exit_code == 0, result.output
    notes = [line for line in result.output.splitlines() if line.startswith("note: ")]
    assert len(notes) == 1, result.output
    assert ("2 analysis results left as they are, not current: round 6 (flatness, loss: checkpoint changed since "
            "analysed)" in notes[0]), notes[0]
    assert old.read_bytes() == before  # not recomputed: it was not asked for
    assert "0 computed, 1 already done" in result.output
    result = invoke(*analyze_args(run, "--checkpoints", "6", "--passes", "loss"))  # asked for: recomputed
    assert result.exit_code == 0 and "1 computed" in result.output, result.output
    assert old.read_bytes() != before
    # the pass not asked for stays as it was, left out by the readers
    with pytest.warns(StaleResultWarning):
        stale = landscape.open_run(run).stale_results()
    assert [(why, pass_name) for _, why, _, pass_name in stale] == [("checkpoint changed since analysed", "flatness")]


@pytest.mark.parametrize("change", ["changed", "removed"])
def test_a_result_is_not_current_once_the_client_models_it_read_change(run, change):
    """The flatness pass reads the round's kept client models (``round-0006.clients.pt``): its record holds
    their SHA-256 (``files_sha256``) beside the checkpoint's, and the result is left out once they change or go;
    the loss pass, which never read them, stays. ``landscape analyze`` computes it again (no longer done)."""
    import hashlib

    clients = run / "checkpoints" / "round-0006.clients.pt"
    folder = run / "analysis" / "round-0006"
    (flatness,) = folder.glob("flatness*.json")
    (loss,) = folder.glob("loss*.json")
    digest = hashlib.sha256(clients.read_bytes()).hexdigest()
    assert json.loads(flatness.read_text())["files_sha256"] == {"round-0006.clients.pt": digest}
    assert "files_sha256" not in json.loads(loss.read_text())
    if change == "changed":  # one weight of one client's model, in place (the file keeps its name)
        payload = load_checkpoint(clients)
        state = next(iter(payload["clients"].values()))
        next(iter(state.values())).view(-1)[0] += 1e-3
        torch.save(payload, clients)
    else:
        clients.unlink()
    with pytest.warns(StaleResultWarning) as caught:
        table = landscape.open_run(run).results()
    line = str(caught[0].message)
    assert (f"run run: 1 analysis result left out, not current: round 6 (flatness: round-0006.clients.pt {change} "
            "since analysed)") in line, line
    assert "--checkpoints 6 --passes flatness --force` recomputes them" in line, line
    assert set(table[table["round"] == 6]["pass"]) == {"loss"} and "flatness" in set(table[table["round"] == 4]["pass"])
    if change == "changed":
        result = invoke(*analyze_args(run, "--checkpoints", "6", "--passes", "flatness,loss"))
        assert result.exit_code == 0 and "1 computed, 1 already done" in result.output, result.output
        with warnings.catch_warnings():
            warnings.simplefilter("error", StaleResultWarning)
            assert "flatness" in set(landscape.open_run(run).results().query("round == 6")["pass"])


def test_a_file_outside_the_checkpoints_folder_is_named_by_its_whole_path(tmp_path):
    from landscape.store.results.validity import CheckpointHashes, files_changed, files_label

    checkpoint, beside, elsewhere = tmp_path / "run" / "round-0002.pt", tmp_path / "run" / "round-0001.pt", \
        tmp_path / "other" / "round-0009.pt"
    for path in (checkpoint, beside, elsewhere):
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(path.name.encode())
    hashes = CheckpointHashes()
    files = {files_label(p, checkpoint): hashes.sha256(p) for p in (beside, elsewhere)}
    assert list(files) == ["round-0001.pt", str(elsewhere)]
    assert files_label(os.path.relpath(elsewhere), checkpoint) == str(elsewhere)  # whatever the working folder
    record = {"files_sha256": files}
    assert files_changed(record, checkpoint, hashes) is None and files_changed({}, checkpoint, hashes) is None
    elsewhere.write_bytes(b"another")
    assert files_changed(record, checkpoint, CheckpointHashes()) == f"{elsewhere} changed since analysed"
    beside.unlink()
    assert files_changed(record, checkpoint, CheckpointHashes()) == "round-0001.pt removed since analysed"
