"""Checkpoint files: whose a checkpoint is and what it may hold. A checkpoint of another run, recipe, model or
seed is refused by resume and analyze; a payload that would run code (torch.save or a plain pickle, protocol
0 or 4) is refused by the safe loader, never runs and is not set aside; values of the wrong kind and damaged
or odd clients files are one line naming the file. Checkpoints that load but hold NaN or inf (issue 20) are
refused where they are loaded, with one line naming the file and the first non-finite tensor, by ``train
--resume`` (nothing changes), by every analysis pass, for a run's checkpoint and a plain state_dict alike; and
training never saves such a state (a non-finite server or client state is divergence, like a non-finite
model). Short and junk files are damage, set aside by resume (tests/train/test_crash_resume.py)."""

from __future__ import annotations

import os
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from support.helpers import analyze_args, invoke, one_line_error, recipe6, snapshot, tiny_recipe

import landscape
from landscape.config import recipe as recipes
from landscape.core.errors import LandscapeError
from landscape.data.datasets import load_dataset
from landscape.models import build_model
from landscape.store.checkpoints import CHECKPOINT_FORMAT, load_checkpoint
from landscape.store.directory import RunDir
from landscape.train import loop


def recipe() -> dict:
    """Three rounds of SCAFFOLD (a server state c and client states c_i) with server SWA from the first round
    and the clients' models kept: every kind of tensor a checkpoint holds."""
    return tiny_recipe(model__name="mlp", model__hidden=[16], algorithm__name="scaffold", train__swa=True,
                       train__swa_start=0.0, train__swa_cycle=1, train__keep_clients=True)


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("health") / "run"
    loop.start_run(recipe(), out, progress=False)
    return out


@pytest.fixture
def run(trained, tmp_path) -> Path:
    shutil.copytree(trained, tmp_path / "run")
    return tmp_path / "run"


def poison(payload: dict, where: str, value: float) -> str:
    """Put ``value`` into one entry of the table ``where`` names; returns the name of the tensor."""
    tables = {"model": payload["model"], "SWA model": payload.get("swa_model"),
              "server state": payload.get("server_state"), "client 1's state": payload.get("client_states", {}).get("1"),
              "client 2's model": payload.get("clients", {}).get("2")}
    name, tensor = next(iter(tables[where].items()))
    tensor.view(-1)[3] = value
    return name


# (table, value, what the message says of it)
RESUME_CASES = {
    "NaN weight": ("model", float("nan"), "model tensor 'fc1.weight': 1 NaN of 1,024 values"),
    "-inf weight": ("model", float("-inf"), "model tensor 'fc1.weight': 1 inf of 1,024 values"),
    "NaN in the SWA average": ("SWA model", float("nan"), "SWA model tensor 'fc1.weight': 1 NaN of 1,024 values"),
    "inf server state": ("server state", float("inf"), "server state 'c': 1 inf of 1,210 values"),
    "NaN client state": ("client 1's state", float("nan"), "client 1's state 'c_i': 1 NaN of 1,210 values"),
}


@pytest.mark.parametrize("case", list(RESUME_CASES))
def test_resume_refuses_a_newest_checkpoint_holding_nan_or_inf_and_changes_nothing(run, case):
    where, value, named = RESUME_CASES[case]
    newest = RunDir(run).checkpoint(3)
    payload = load_checkpoint(newest)
    poison(payload, where, value)
    torch.save(payload, newest)
    before = snapshot(run)
    line = one_line_error(invoke("train", "--resume", run, "--rounds", "5", "--quiet"))
    assert line == (f"error: cannot resume {run}: checkpoints/round-0003.pt: it holds non-finite values ({named}): "
                    "the run diverged by round 3, and --resume cannot continue from it (nothing was changed); to "
                    "train its rounds again from an earlier checkpoint, which gives the same values unless the file "
                    "was damaged after it was written, move it away")
    assert "good" not in line
    assert snapshot(run) == before  # not moved aside, not trained from, no event row


ALL_PASSES = ["loss", "hessian", "sharpness", "surface", "flatness", "incompatibility", "alignment"]
PASS_ARGS = {"surface": ["--grid", "3"], "hessian": ["--set", "hessian.top_k=1"]}
STATE_DICT_PASSES = ["loss", "hessian", "sharpness", "surface"]  # the passes that run on a plain state_dict
ANALYSIS_CASES = ([("checkpoint", p) for p in ALL_PASSES] + [("clients file", "flatness"), ("loose folder", "loss")]
                  + [("state_dict", p) for p in STATE_DICT_PASSES] + [("float64 beyond float32", "loss")])


def digits_mlp_state() -> dict[str, torch.Tensor]:
    """The state_dict of the registered mlp (default options) for the digits data."""
    bundle = load_dataset("digits", root="data", download=False, augment=False, num_clients=1, seed=0, options={})
    torch.manual_seed(0)
    return build_model("mlp", bundle.input_shape, bundle.num_classes, {}).state_dict()


@pytest.mark.parametrize(("source", "pass_name"), ANALYSIS_CASES, ids=[f"{s}-{p}" for s, p in ANALYSIS_CASES])
def test_every_pass_refuses_a_model_holding_nan_or_inf_naming_the_file_and_tensor(run, tmp_path, source, pass_name):
    args = ["--passes", pass_name, *PASS_ARGS.get(pass_name, []), "--quiet", "--device", "cpu",
            "--analysis-samples", "100"]
    base = tmp_path / "loose" if source == "loose folder" else run  # loose: checkpoints copied away from the run
    if source != "state_dict" and not source.startswith("float64"):
        if source == "loose folder":
            shutil.copytree(run / "checkpoints", base)
        path = base / "round-0003.pt" if source == "loose folder" else RunDir(run).checkpoint(3)
        path = RunDir(run).clients_checkpoint(3) if source == "clients file" else path
        payload = load_checkpoint(path)
        where = "client 2's model" if source == "clients file" else "SWA model"  # SWA: the model analysis uses
        poison(payload, where, float("nan"))
        torch.save(payload, path)
        line = one_line_error(invoke("analyze", base, *args))
        assert line.startswith(f"error: {path} holds non-finite values ({where} tensor 'fc1.weight': 1 NaN of "
                               "1,024 values): the state of a diverged run")
        if source == "checkpoint":  # the notebook API loads it the same way
            with pytest.raises(LandscapeError, match=r"holds non-finite values \(SWA model tensor 'fc1.weight'"):
                landscape.open_run(run).model()
        if source == "loose folder":  # its earlier rounds still analyse (the recipe is read from the newest)
            assert invoke("analyze", base, *args, "--checkpoints", "2").exit_code == 0
            assert list(base.rglob("analysis/round-0002/*.json"))
    else:
        state = digits_mlp_state()
        if source == "state_dict":
            state["fc1.bias"][2] = float("inf")
        else:  # finite in the file, not in the analysis dtype
            state = {k: v.double() for k, v in state.items()}
            state["fc1.weight"][0, 5] = 1e300
            args += ["--dtype", "float32"]
        path = tmp_path / "mine.pt"
        torch.save(state, path)
        line = one_line_error(invoke("analyze", path, "--model", "mlp", "--dataset", "digits", *args))
        if source == "state_dict":  # (a folder of state_dicts adds which files were analysed)
            assert line.startswith(f"error: {path} holds non-finite weights ('fc1.bias': 1 inf of 200 values): a "
                                   "model with NaN or inf weights has no loss landscape to analyse")
        else:
            assert line.startswith(f"error: {path} holds weights beyond the range of float32, the analysis dtype "
                                   "('fc1.weight': 1 inf of 12,800 values once converted): analyse it in float64 "
                                   "(--dtype float64)")
    refused = [*tmp_path.rglob("analysis/round-0003/*.json"), *tmp_path.rglob("analysis/mine/*.json")]
    assert not refused  # no result of the refused model


@pytest.mark.parametrize("where", ["server state", "client state"])
def test_training_stops_before_it_would_save_a_non_finite_server_or_client_state(tmp_path, monkeypatch, where):
    original = loop.Trainer.run_round
    poisoned_client = []

    def poisoned(self, state):
        new_state, results, row = original(self, state)
        if new_state.round == 2:  # the model, the loss and the update stay finite (lr: swa_lr, SWA from round 1)
            if where == "server state":
                new_state.server_state.c[7] = float("nan")
            else:
                poisoned_client.append(row["clients"][0])
                new_state.client_states[row["clients"][0]].c_i[7] = float("inf")
        return new_state, results, row

    monkeypatch.setattr(loop.Trainer, "run_round", poisoned)
    with pytest.raises(LandscapeError) as caught:
        loop.start_run(recipe(), tmp_path / "run", progress=False)
    run = RunDir(tmp_path / "run")
    what = "server state c" if where == "server state" else f"state c_i of client {poisoned_client[0]}"
    assert str(caught.value).startswith(f"training diverged in round 2 (scaffold, lr 0.001): non-finite {what}; "
                                        "stopped without saving that state, the last good checkpoint "
                                        "checkpoints/round-0001.pt is kept")
    assert run.rounds() == [0, 1]
    for r in run.rounds():
        load_checkpoint(run.checkpoint(r))  # every saved checkpoint is finite (it loads)


def _values(kind: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(7)
    x = torch.randn(5000, generator=g)
    if kind == "finite, its sum overflows float32":
        return torch.full((10,), 3e38)
    if kind == "finite, its sum overflows float16":
        return torch.full((100,), 60000.0, dtype=torch.float16)
    if kind == "NaN, inf and -inf":
        x[torch.randperm(5000, generator=g)[:17]] = float("nan")
        x[torch.randperm(5000, generator=g)[:5]] = float("inf")
        x[4999] = float("-inf")
        return x.double()
    if kind == "complex":
        return torch.tensor([1 + 1j, complex("nan"), complex(0, float("inf"))])
    return torch.empty(0)


@pytest.mark.parametrize("kind", ["finite, its sum overflows float32", "finite, its sum overflows float16",
                                  "NaN, inf and -inf", "complex", "empty"])
def test_the_non_finite_count_of_a_tensor_matches_numpy(kind):
    from landscape.store.checkpoints import non_finite_tensor

    values = _values(kind)
    array = values.numpy()
    nan, bad = int(np.isnan(array).sum()), int((~np.isfinite(array)).sum())
    counts = " and ".join(f"{n:,} {what}" for n, what in ((nan, "NaN"), (bad - nan, "inf")) if n)
    expected = f"'t': {counts} of {array.size:,} values" if bad else None
    assert non_finite_tensor({"ok": torch.zeros(3), "t": values}) == expected


# ----------------------------------------------------------------------------------------------------------
# a checkpoint of another run, recipe, model or seed; code; values of the wrong kind; clients files


def test_a_run_whose_recipe_was_edited_to_another_model_is_refused(six_round_copy):
    recipe_file = six_round_copy / "recipe.toml"
    tables = recipes.tomllib.loads(recipe_file.read_text())
    assert tables["model"]["hidden"] == [16]
    tables["model"]["hidden"] = [8]
    recipe_file.write_text(recipes.to_toml(tables))
    before = snapshot(six_round_copy)
    line = one_line_error(invoke("train", "--resume", six_round_copy, "--quiet"))
    assert line == (f"error: {six_round_copy / 'checkpoints' / 'round-0006.pt'} was written by another "
                    "recipe (model.hidden is [16] there, [8] in recipe.toml); it cannot continue this run")
    assert snapshot(six_round_copy) == before


def test_a_checkpoint_of_another_run_is_refused(six_round_run, tmp_path):
    other = tmp_path / "other"
    loop.start_run(tiny_recipe(model__name="mlp", model__hidden=[16], train__rounds=2, seed=1), other,
                   progress=False)
    run_b = tmp_path / "b"
    shutil.copytree(six_round_run, run_b)
    newest = RunDir(run_b).checkpoint(6)
    shutil.copy(RunDir(other).checkpoint(2), newest)
    before = snapshot(run_b)
    with pytest.raises(LandscapeError) as caught:
        loop.resume_run(run_b, rounds=8, progress=False)
    assert str(caught.value) == (f"{newest} was written by another recipe (seed is 1 there, 0 in "
                                 "recipe.toml); it cannot continue this run")
    assert snapshot(run_b) == before
    # without a recorded recipe, the tensors themselves are checked: a clear line, not a shape traceback
    ckpt = load_checkpoint(RunDir(other).checkpoint(2))
    del ckpt["recipe"]
    ckpt["model"] = {k: torch.zeros(3, *v.shape[1:]) if k == "fc1.weight" else v
                     for k, v in ckpt["model"].items()}
    torch.save(ckpt, newest)
    before = snapshot(run_b)
    line = one_line_error(invoke("train", "--resume", run_b, "--quiet"))
    assert line == (f"error: {newest} does not match the model 'mlp': 'fc1.weight' has shape [3, 64] "
                    "there, [16, 64] in this model")
    assert snapshot(run_b) == before


def test_analyze_refuses_a_checkpoint_of_another_seed(six_round_copy, tmp_path):
    other = tmp_path / "other"
    loop.start_run(recipe6(seed=1, train__rounds=2), other, progress=False)
    newest = RunDir(six_round_copy).checkpoint(6)
    shutil.copy(RunDir(other).checkpoint(2), newest)
    line = one_line_error(invoke(*analyze_args(six_round_copy, "--passes", "loss")))
    assert str(newest) in line and "seed is 1 there, 0 in recipe.toml" in line
    analysis = six_round_copy / "analysis"
    assert not analysis.exists() or not list(analysis.rglob("*.json"))


class _Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("form", ["torch.save", "plain pickle", "pickle protocol 0"])
def test_a_checkpoint_that_would_run_code_is_refused_by_resume_and_analyze(six_round_copy, tmp_path, form):
    marker = tmp_path / "PWNED"
    newest = RunDir(six_round_copy).checkpoint(6)
    evil = {"format": CHECKPOINT_FORMAT, "round": 6, "model": _Payload(marker)}
    if form == "torch.save":
        torch.save(evil, newest)
    else:
        newest.write_bytes(pickle.dumps(evil, protocol=0 if form == "pickle protocol 0" else 4))
    before = snapshot(six_round_copy)

    line = one_line_error(invoke("train", "--resume", six_round_copy, "--quiet"))
    assert line.startswith(f"error: cannot resume {six_round_copy}: checkpoints/round-0006.pt: it would run "
                           "code ")
    assert "(posix.system)" in line or "(os.system)" in line
    assert snapshot(six_round_copy) == before  # nothing moved (not to .damaged), nothing trained
    line = one_line_error(invoke("analyze", six_round_copy, "--passes", "loss", "--quiet", "--device", "cpu"))
    assert line.startswith(f"error: cannot load checkpoint {newest}: it would run code")
    with pytest.raises(LandscapeError, match="refused by the safe loader"):
        landscape.open_run(six_round_copy).model()
    assert not marker.exists()  # the payload never ran


@pytest.mark.parametrize("change", ["server state of floats", "client states of floats",
                                    "half precision model", "round is text", "round of another file"])
def test_a_checkpoint_with_values_of_the_wrong_kind_is_one_line(six_round_copy, change):
    newest = RunDir(six_round_copy).checkpoint(6)
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
    before = snapshot(six_round_copy)
    line = one_line_error(invoke("train", "--resume", six_round_copy, "--rounds", "8", "--quiet"))
    assert str(newest) in line or "round-0006.pt" in line
    assert snapshot(six_round_copy) == before
    if change == "half precision model":
        line = one_line_error(invoke(*analyze_args(six_round_copy, "--passes", "loss")))
        assert "float16" in line


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
def test_a_damaged_or_odd_clients_file_is_one_line(six_round_copy, tmp_path, damage, passes):
    marker = tmp_path / "PWNED"
    path = RunDir(six_round_copy).clients_checkpoint(6)
    state = next(iter(load_checkpoint(path)["clients"].values()))
    CLIENT_FILES[damage](state, marker, path)
    line = one_line_error(invoke(*analyze_args(six_round_copy, *passes)))
    assert str(path) in line
    assert "weights_only=False" not in line and "weights_only` set to `False" not in line
    if damage.startswith("code"):
        assert "would run code" in line
    if damage == "a client that does not exist":
        assert "client 99" in line
    if damage == "half precision":
        assert "float16" in line and "float32" in line
    assert not marker.exists()
