"""Plain state_dicts through `landscape analyze --model --dataset`: an option that asks for clients is refused, a
file is labelled by its name (a round only where its name carries one, never its place among the files),
--checkpoints picks files, a PCA plane of files is refused, and a data factory's data is recorded as what it is."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest
import torch
from support.helpers import invoke, one_line_error, result_file, write_user_module

from landscape.analyze.state_dict_source import file_round

MODULE = textwrap.dedent('''
    import torch
    from torch import nn


    def make_net():
        torch.manual_seed(3)
        return nn.Sequential(nn.Flatten(), nn.Linear(16, 6), nn.Tanh(), nn.Linear(6, 3))


    def make_data():
        g = torch.Generator().manual_seed(5)
        return torch.randn(24, 16, generator=g), torch.randint(0, 3, (24,), generator=g)
''')


@pytest.fixture
def lab(tmp_path, monkeypatch):
    """A user's module (make_net, make_data) in the current folder: the spec of its factories."""
    name = write_user_module(tmp_path, monkeypatch, "sdlab", MODULE)
    yield name
    sys.modules.pop(name, None)


def _states(folder, names, module):
    """A state_dict file of the user's model per name, each with other weights."""
    folder.mkdir(exist_ok=True)
    for i, name in enumerate(names):
        net = module.make_net()
        with torch.no_grad():
            for p in net.parameters():
                p.add_(0.1 * i)
        torch.save(net.state_dict(), folder / name)
    return folder


def _analyze(path, lab, *extra):
    return invoke("analyze", path, "--model", f"{lab}:make_net", "--dataset", f"{lab}:make_data", "--quiet", *extra)


def _table(output: str) -> list[list[str]]:
    """The summary table's lines (header first), split into cells, up to the blank line under it."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("run "))
    end = next((i for i in range(start, len(lines)) if not lines[i].strip()), len(lines))
    return [line.split() for k, line in enumerate(lines[start:end]) if k != 1]  # without the rule


@pytest.mark.parametrize("args, option", [
    (["--passes", "hessian", "--set", "hessian.clients=2"], "hessian.clients=2"),
    (["--passes", "sharpness", "--set", "sharpness.clients=2"], "sharpness.clients=2"),
    (["--passes", "loss", "--set", "loss.clients=2"], "loss.clients=2"),
    (["--passes", "loss", "--set", "loss.clients=1", "--dry-run"], "loss.clients=1"),
    (["--passes", "surface", "--grid", "3", "--set", "surface.clients=3,7"], "surface.clients=3,7"),
])
def test_an_option_asking_for_clients_is_refused_before_anything_is_computed(tmp_path, lab, args, option):
    """`--set hessian.clients=2` on a state_dict exited 0 with a result named hessian@clients-2 of no client."""
    _states(tmp_path, ["mine.pt"], __import__(lab))
    line = one_line_error(_analyze(tmp_path / "mine.pt", lab, *args))
    assert f"{option} asks for clients" in line and "is a plain state_dict: no clients" in line, line
    assert f"leave {option.partition('=')[0]} out" in line
    assert not (tmp_path / "analysis").exists()


def test_a_client_count_on_a_folder_of_state_dicts_is_refused_naming_the_folder(tmp_path, lab):
    folder = _states(tmp_path / "states", ["a.pt", "b.pt"], __import__(lab))
    line = one_line_error(_analyze(folder, lab, "--passes", "loss", "--set", "loss.clients=3"))
    assert f"loss.clients=3 asks for clients, and {folder} is a folder of plain state_dicts: no clients" in line
    assert not (folder / "analysis").exists()


def test_all_clients_or_none_stays_allowed_on_a_state_dict(tmp_path, lab):
    _states(tmp_path, ["mine.pt"], __import__(lab))
    fast = ["--set", "hessian.top_k=1", "--set", "hessian.trace_hvps=6", "--set", "hessian.density_steps=4"]
    for clients in ("0", "-1"):
        result = _analyze(tmp_path / "mine.pt", lab, "--passes", "loss,hessian", "--set", "loss.clients=0",
                          "--set", f"hessian.clients={clients}", *fast)
        assert result.exit_code == 0, result.output
    assert result_file(tmp_path / "analysis" / "mine", "loss").stem == "loss"


@pytest.mark.parametrize("stem, expected", [
    ("round-3", 3), ("mlp-r2", 2), ("epoch_10", 10), ("epoch0", 0), ("step1000", 1000), ("Round_0050", 50),
    ("0050", 50), ("model.ep7", 7), ("resnet50", None), ("resnet-50", None), ("model-v2", None), ("final", None),
    ("mine", None), ("lr-1e5", None), ("xround-3", None),
])
def test_the_round_a_file_name_carries(stem, expected):
    assert file_round(stem) == expected


def test_a_file_is_labelled_by_its_name_and_its_round_is_the_one_its_name_carries(tmp_path, lab):
    """`mlp-r2.pt` showed as round 1 (its place among the files) and its JSON stored that as `round`."""
    folder = _states(tmp_path / "states", ["mlp-r2.pt", "mlp-r10.pt"], __import__(lab))
    result = _analyze(folder, lab, "--passes", "loss")
    assert result.exit_code == 0, result.output
    table = _table(result.output)
    assert table[0][:3] == ["run", "file", "round"]
    assert [row[1:3] for row in table[1:]] == [["mlp-r2", "2"], ["mlp-r10", "10"]]  # in round order
    for stem, round_ in (("mlp-r2", 2), ("mlp-r10", 10)):
        record = json.loads(result_file(folder / "analysis" / stem, "loss").read_text())
        assert record["file"] == stem and record["round"] == round_


def test_files_whose_names_carry_no_round_have_none(tmp_path, lab):
    folder = _states(tmp_path / "states", ["b.pt", "a.pt", "c-r1.pt"], __import__(lab))  # not every name a round
    result = _analyze(folder, lab, "--passes", "loss")
    assert result.exit_code == 0, result.output
    table = _table(result.output)
    assert table[0] == ["run", "file", "loss", "acc"]
    assert [row[1] for row in table[1:]] == ["a", "b", "c-r1"]
    for stem in ("a", "b", "c-r1"):
        record = json.loads(result_file(folder / "analysis" / stem, "loss").read_text())
        assert record["file"] == stem and "round" not in record


@pytest.mark.parametrize("names, spec, analysed", [
    (["mlp-r1.pt", "mlp-r2.pt", "mlp-r10.pt"], None, ["mlp-r1", "mlp-r2", "mlp-r10"]),
    (["mlp-r1.pt", "mlp-r2.pt", "mlp-r10.pt"], "last", ["mlp-r10"]),
    (["mlp-r1.pt", "mlp-r2.pt", "mlp-r10.pt"], "all", ["mlp-r1", "mlp-r2", "mlp-r10"]),
    (["mlp-r1.pt", "mlp-r2.pt", "mlp-r10.pt"], "mlp-r2", ["mlp-r2"]),
    (["mlp-r1.pt", "mlp-r2.pt", "mlp-r10.pt"], "10,mlp-r1.pt", ["mlp-r1", "mlp-r10"]),
    (["mlp-r1.pt", "mlp-r2.pt", "mlp-r10.pt"], "last 2", ["mlp-r2", "mlp-r10"]),
    (["mlp-r1.pt", "mlp-r2.pt", "mlp-r10.pt"], "2, 10", ["mlp-r2", "mlp-r10"]),
    (["b.pt", "a.pt"], "last", ["b"]),
    (["b.pt", "a.pt"], "a", ["a"]),
])
def test_checkpoints_pick_the_files_of_a_folder_of_state_dicts(tmp_path, lab, names, spec, analysed):
    """`--checkpoints last` on a folder of state_dicts analysed every file."""
    folder = _states(tmp_path / "states", names, __import__(lab))
    result = _analyze(folder, lab, "--passes", "loss", *(["--checkpoints", spec] if spec else []))
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in (folder / "analysis").iterdir()) == sorted(analysed)


@pytest.mark.parametrize("names, spec, named", [
    (["mlp-r1.pt", "mlp-r2.pt"], "7", "its files: mlp-r1 (round 1), mlp-r2 (round 2)"),
    (["b.pt", "a.pt"], "1", "its files: a, b (give last, all, or a comma list of their names)"),  # never a place
    (["b.pt", "a.pt"], "a,nosuch", "has no file 'nosuch'"),
    (["b.pt", "a.pt"], "last 3", "--checkpoints last 3 asks for 3 files; its files: a, b (give last, all"),
])
def test_an_unknown_checkpoint_of_state_dicts_is_one_line_naming_the_files(tmp_path, lab, names, spec, named):
    folder = _states(tmp_path / "states", names, __import__(lab))
    line = one_line_error(_analyze(folder, lab, "--passes", "loss", "--checkpoints", spec))
    assert named in line, line
    assert not (folder / "analysis").exists()


@pytest.mark.parametrize("args, said", [
    (["--directions", "pca"], "surface --directions pca needs the trajectory of a training run"),
    (["--set", "surface.normalization=filter-reference", "--set", "surface.reference=round:0"],
     "surface.reference=round:0 names a round of a training run"),
])
def test_a_pca_plane_of_state_dict_files_is_refused_saying_what_to_do(tmp_path, lab, args, said):
    """`--directions pca` on a folder of state_dicts failed with "round-0.pt is not a landscape checkpoint"."""
    folder = _states(tmp_path / "states", ["round-0.pt", "round-1.pt", "round-2.pt"], __import__(lab))
    line = one_line_error(_analyze(folder, lab, "--passes", "surface", "--grid", "3", *args))
    assert said in line and "a folder of plain state_dicts" in line, line
    if "pca" in args:
        assert "landscape.RunWriter" in line and "`landscape import`" in line
    assert not (folder / "analysis").exists()


def test_a_data_factory_is_recorded_and_shown_as_the_data_measured(tmp_path, lab):
    """A state_dict analysed on a data factory's data said "accuracy on the training split (the union of the
    clients' training data)" and recorded split "train"."""
    _states(tmp_path, ["mine.pt"], __import__(lab))
    result = _analyze(tmp_path / "mine.pt", lab, "--passes", "loss")
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert f"acc: accuracy of the checkpoint x on data from {lab}:make_data" in text
    assert "union of the clients" not in text
    record = json.loads(result_file(tmp_path / "analysis" / "mine", "loss").read_text())
    assert record["data"] == f"data from {lab}:make_data"
    assert "split" not in record["settings"]["analysis"] and record["inputs"]["dataset"] == f"{lab}:make_data"
    again = _analyze(tmp_path / "mine.pt", lab, "--passes", "loss", "--split", "test")  # the same data
    assert again.exit_code == 0 and "0 computed, 1 already done" in again.output, again.output
    surface = _analyze(tmp_path / "mine.pt", lab, "--directions", "random", "--grid", "3")
    assert surface.exit_code == 0, surface.output
    drawn = json.loads(result_file(tmp_path / "analysis" / "mine", "surface").read_text())
    assert drawn["result"]["quantity"] == f"loss on data from {lab}:make_data"  # not "training loss (global F)"


def test_a_registered_data_set_of_a_state_dict_is_its_split_not_the_clients_union(tmp_path):
    from landscape.data.datasets import load_dataset
    from landscape.models import build_model

    bundle = load_dataset("digits", root="data", download=False, augment=False, num_clients=1, seed=0, options={})
    torch.save(build_model("mlp", bundle.input_shape, 10).state_dict(), tmp_path / "net.pt")
    for split, words in (("train", "the training set of digits"), ("test", "the test set of digits")):
        result = invoke("analyze", tmp_path / "net.pt", "--model", "mlp", "--dataset", "digits", "--split", split,
                        "--passes", "loss", "--quiet")
        assert result.exit_code == 0, result.output
        text = " ".join(result.output.split())
        assert f"acc: accuracy of the checkpoint x on {words}" in text and "union of the clients" not in text
        record = next(r for r in (json.loads(p.read_text()) for p in (tmp_path / "analysis" / "net").glob("*.json"))
                      if r["settings"]["analysis"]["split"] == split)
        assert record["data"] == words


def test_two_files_that_differ_only_in_suffix_never_share_a_result(tmp_path, lab):
    """Issue 46: mine.pt and mine.pth beside each other (other weights) were both filed in analysis/mine/, each
    analysis replacing the other's result. Each now has its own folder, by its whole name; a file alone keeps its
    stem."""
    _states(tmp_path, ["mine.pt", "mine.pth", "other.pt"], __import__(lab))
    for name in ("mine.pt", "mine.pth", "other.pt"):
        assert "1 computed, 0 already done" in _analyze(tmp_path / name, lab, "--passes", "loss").output
    for name in ("mine.pt", "mine.pth", "other.pt"):  # nothing evicted: each is done
        assert "0 computed, 1 already done" in _analyze(tmp_path / name, lab, "--passes", "loss").output
    assert sorted(p.name for p in (tmp_path / "analysis").iterdir()) == ["mine.pt", "mine.pth", "other"]
    losses = {name: json.loads(result_file(tmp_path / "analysis" / name, "loss").read_text())["result"]["loss"]
              for name in ("mine.pt", "mine.pth")}
    assert losses["mine.pt"] != losses["mine.pth"]
    folder = _analyze(tmp_path, lab, "--passes", "loss")  # the folder of files: the same results, all done
    assert "0 computed, 3 already done" in folder.output, folder.output
