"""``landscape import``: the state_dict files a plain federated loop saved become a run; the same models through
``landscape.RunWriter`` and through the import give the same files and the same analysis, bit for bit; rounds come
from the file names; every refusal is one line."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from support.helpers import invoke, one_line_error, result_file
from support.plain_fl import BATCH, LR, forget_lab, train, write_lab

from landscape.store.checkpoints import load_checkpoint

PASSES = ("--passes", "flatness,alignment,incompatibility", "--set", "alignment.batches=2", "--set",
          "incompatibility.batches=2")


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """One FedAvg loop recorded by RunWriter (``writer``) and saved as loose files (``files``)."""
    root = tmp_path_factory.mktemp("import")
    write_lab(root)
    train(root / "writer", sam=False, files=root / "files")
    yield root
    forget_lab(root)


def _import(root, out, *more):
    files = root / "files"
    args = ["import", "-o", out, "--global", f"{files}/global/round-{{round}}.pt", "--clients",
            f"{files}/clients/round-{{round}}/client-{{client}}.pt", "--model", "rwlab.nets:make_net", "--data",
            "rwlab.data:make_train_set", "--test-data", "rwlab.data:make_test_set", "--partition",
            files / "partition.json", "--algorithm", "fedavg", "--set", f"train.lr={LR}", "--set",
            f"train.batch_size={BATCH}", "--set", "train.local_epochs=1", "--quiet", *more]
    return invoke(*args)


def _results(run):
    out = {}
    for name in ("flatness", "alignment", "incompatibility"):
        record = json.loads(result_file(run / "analysis" / "round-0003", name).read_text())
        out[name] = record["result"]
    return out


def test_the_import_is_the_run_the_writer_records_and_analyses_alike(saved):
    result = _import(saved, saved / "imported", "--start", "previous")
    assert result.exit_code == 0, result.output
    assert "imported 4 rounds" in result.output and "(3 with client models)" in result.output
    for run in ("writer", "imported"):
        done = invoke("analyze", saved / run, "--trust-imports", "--device", "cpu", "--quiet", "--checkpoints", "3",
                      *PASSES)
        assert done.exit_code == 0, done.output
    for name in ("round-0002.pt", "round-0002.clients.pt"):
        a, b = (load_checkpoint(saved / run / "checkpoints" / name) for run in ("writer", "imported"))
        for key in ("model", "start"):
            if key in a:
                assert a[key].keys() == b[key].keys() and all(torch.equal(a[key][k], b[key][k]) for k in a[key])
        if "clients" in a:
            assert a["clients"].keys() == b["clients"].keys()
    assert _results(saved / "writer") == _results(saved / "imported")
    recorded = [(saved / run / "recipe.toml").read_text() for run in ("writer", "imported")]
    assert recorded[0] == recorded[1].replace('name = "imported"', 'name = "writer"', 1)


def test_rounds_come_from_the_file_names_and_an_import_again_changes_nothing(saved, tmp_path):
    files = tmp_path / "files"
    shutil.copytree(saved / "files", files)
    (files / "global" / "round-3.pt").rename(files / "global" / "round-003.pt")  # padded or not: round 3
    args = ["import", "-o", tmp_path / "run", "--global", f"{files}/global/round-{{round}}.pt", "--clients",
            f"{files}/clients/round-{{round}}/client-{{client}}.pt", "--start", "previous", "--model",
            "rwlab.nets:make_net", "--data", "rwlab.data:make_train_set", "--partition", files / "partition.json",
            "--quiet"]
    assert invoke(*args).exit_code == 0
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())[-2:] == [
        "round-0003.clients.pt", "round-0003.pt"]
    before = {p.name: p.read_bytes() for p in (tmp_path / "run" / "checkpoints").iterdir()}
    again = invoke(*args)
    assert again.exit_code == 0, again.output
    assert {p.name: p.read_bytes() for p in (tmp_path / "run" / "checkpoints").iterdir()} == before


@pytest.mark.parametrize(("change", "message"), [
    (lambda files: None, "say what the clients of a round started from: --start previous"),
    (lambda files: (files / "global" / "round-1.pt").unlink(), "round 2's clients started from round 1's global"),
    (lambda files: shutil.copy(files / "global" / "round-2.pt", files / "global" / "round-02.pt"),
     "name the same round 2"),
])
def test_what_does_not_fit_is_refused_in_one_line(saved, tmp_path, change, message):
    files = tmp_path / "files"
    shutil.copytree(saved / "files", files)
    change(files)
    start = [] if "say what" in message else ["--start", "previous"]
    result = invoke("import", "-o", tmp_path / "run", "--global", f"{files}/global/round-{{round}}.pt", "--clients",
                    f"{files}/clients/round-{{round}}/client-{{client}}.pt", *start, "--model",
                    "rwlab.nets:make_net", "--data", "rwlab.data:make_train_set", "--partition",
                    files / "partition.json", "--quiet")
    assert message in one_line_error(result)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(("args", "message"), [
    (["--global", "g/round.pt"], "--global 'g/round.pt' must name {round} once each"),
    (["--global", "nothing/round-{round}.pt"], "no file matches --global 'nothing/round-{round}.pt'"),
    (["--global", "g/{round}.pt", "--clients", "c/{round}.pt", "--start", "previous"], "must name {round} and {client}"),
])
def test_patterns_that_name_no_round_or_no_file_are_refused(saved, tmp_path, args, message):
    result = invoke("import", "-o", tmp_path / "run", *args, "--model", "rwlab.nets:make_net", "--data",
                    "rwlab.data:make_train_set", "--partition", saved / "files" / "partition.json")
    assert message in one_line_error(result)
