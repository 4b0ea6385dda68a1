"""landscape.RunWriter: a plain PyTorch federated loop (FedAvg, FedSAM; no landscape.train) records its runs, every
federated pass runs on them, and the values equal an independent float64 recomputation from the recorded models
and the clients' data; every refusal is one line."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from support.helpers import invoke, one_line_error, result_file, tiny_recipe
from support.plain_fl import BATCH, LR, RHO, ROUNDS, forget_lab, partition_of, train, write_lab
from torch.func import functional_call

import landscape
from landscape.config import recipe as recipes
from landscape.core.errors import LandscapeError
from landscape.measure.flatness import client_minibatch_indices
from landscape.store.checkpoints import load_checkpoint
from landscape.train import loop


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """The package ``rwlab`` (a model and a data factory) importable for the module's tests."""
    root = tmp_path_factory.mktemp("lab")
    write_lab(root)
    yield root
    forget_lab(root)


@pytest.fixture(scope="module")
def runs(lab, tmp_path_factory):
    root = tmp_path_factory.mktemp("recorded")
    for name, sam in (("fedavg", False), ("fedsam", True)):
        train(root / name, sam)
        result = invoke("analyze", root / name, "--trust-imports", "--device", "cpu", "--quiet", "--checkpoints",
                        "2,3", "--passes", "flatness,alignment,incompatibility", "--set", "alignment.batches=3",
                        "--set", "incompatibility.batches=3")
        assert result.exit_code == 0, result.output
    return root


def _flat(state: dict, names: list[str]) -> torch.Tensor:
    return torch.cat([state[n].reshape(-1).double() for n in names])


def _record(run, round_, name):
    return json.loads(result_file(run / "analysis" / f"round-{round_:04d}", name).read_text())["result"]


@pytest.mark.parametrize("name", ["fedavg", "fedsam"])
def test_every_federated_pass_equals_an_independent_recomputation(runs, name):
    from rwlab.data import make_train_set
    from rwlab.nets import make_net

    run = runs / name
    net = make_net()
    names = [n for n, _ in net.named_parameters()]
    x, y = make_train_set()
    parts = partition_of(y)
    for t in (2, 3):
        kept = load_checkpoint(run / "checkpoints" / f"round-{t:04d}.clients.pt")
        clients = {int(c): _flat(s, names) for c, s in kept["clients"].items()}
        models = torch.stack([clients[c] for c in sorted(clients)])
        # Delta_D = mean_i ||y_i - ybar||^2 (docs/metrics.md), from the saved client models
        delta_d = float(((models - models.mean(0)) ** 2).sum(1).mean())
        assert _record(run, t, "flatness")["distance"] == pytest.approx(delta_d, rel=1e-12, abs=0)
        # update cosines cos(Delta_i, Delta_j), Delta_i = y_i - s^t with s^t the recorded broadcast point
        deltas = (models - _flat(kept["start"], names)).numpy()
        unit = deltas / np.linalg.norm(deltas, axis=1, keepdims=True)
        updates = _record(run, t, "alignment")["updates"]
        np.testing.assert_allclose(updates["cosine_matrix"], unit @ unit.T, rtol=0, atol=1e-12)
        # Delta_FI = mean_i E_B ||e_i^B - e*||^2 at x^t, from the clients' data and the run's batch size
        w = _flat(load_checkpoint(run / "checkpoints" / f"round-{t:04d}.pt")["model"], names)
        assert _record(run, t, "incompatibility")["incompatibility"] == pytest.approx(
            _incompatibility(net, names, w, x.double(), y, parts), rel=1e-12, abs=0)


def _incompatibility(net, names, w, x, y, parts) -> float:
    shapes = [p.shape for p in net.parameters()]

    def grad(xb, yb):
        v = w.clone().requires_grad_(True)
        params = dict(zip(names, (t.reshape(s) for t, s in zip(v.split([s.numel() for s in shapes]), shapes))))
        (g,) = torch.autograd.grad(F.cross_entropy(functional_call(net, params, (xb,)), yb), v)
        return g

    union = np.sort(np.concatenate([parts[i] for i in parts]))
    g = grad(x[union], y[union])
    e_star = RHO * g / g.norm()
    terms = []
    for client, idx in parts.items():
        xc, yc = x[idx], y[idx]
        for b in client_minibatch_indices(len(idx), BATCH, 3, seed=0, client=client):
            g_b = grad(xc[b], yc[b])
            terms.append(float(((RHO * g_b / g_b.norm() - e_star) ** 2).sum()))
    return float(np.mean(terms))


def test_the_recorded_run_reads_as_a_run(runs):
    run = landscape.open_run(runs / "fedavg", trust_imports=True)
    assert run.rounds() == [0, 1, 2, 3]
    assert run.recipe.model.name == "factory" and run.recipe.partition.name == "recorded"
    assert run.recipe.train.lr == LR and run.recipe.algorithm.name == "fedavg" and run.recipe.train.dtype == "float64"
    rows = run.metrics()
    assert [r["round"] for r in rows] == [1, 2, 3] and rows[-1]["local_epochs_done"] == 3
    assert len(run.client_data(0)) == 60 and len(run.data()[1]) == 60
    assert isinstance(run.model(3), torch.nn.Module)


def test_a_loop_run_again_records_nothing_twice_and_a_changed_round_is_refused(lab, tmp_path):
    path = tmp_path / "again"
    train(path, sam=False)
    before = {p.name: p.read_bytes() for p in (path / "checkpoints").iterdir()}
    train(path, sam=False)  # the same loop from its start: every round is already recorded
    assert {p.name: p.read_bytes() for p in (path / "checkpoints").iterdir()} == before
    assert len((path / "metrics.jsonl").read_text().splitlines()) == ROUNDS
    assert landscape.open_run(path).recipe.train.rounds == ROUNDS  # a run continued keeps what it recorded
    from rwlab.nets import make_net

    with landscape.RunWriter(path, model="rwlab.nets:make_net", data="rwlab.data:make_train_set",
                             test_data="rwlab.data:make_test_set", partition=partition_of(lab_labels()),
                             algorithm="fedavg", hyperparameters={"lr": LR, "batch_size": BATCH,
                                                                  "local_epochs": 1}) as w:
        with pytest.raises(LandscapeError, match="round 2 is already recorded .* with other models"):
            w.round(2, end=make_net())
    assert {p.name: p.read_bytes() for p in (path / "checkpoints").iterdir()} == before


def lab_labels() -> torch.Tensor:
    from rwlab.data import make_train_set

    return make_train_set()[1]


def _writer(path, **changes):
    args = {"model": "rwlab.nets:make_net", "data": "rwlab.data:make_train_set",
            "partition": partition_of(lab_labels())}
    args.update(changes)
    return landscape.RunWriter(path, **args)


@pytest.mark.parametrize(("changes", "message"), [
    ({"partition": {0: [0, 1], 2: [3]}}, "clients must be the whole numbers 0..N-1"),
    # a sample listed twice is a partition's (dirichlet-client-reuse repeats samples): only a bad index is refused
    ({"partition": {0: [-1, 1], 1: [1, 2]}}, "client 0 has sample -1, outside the 240 samples"),
    ({"partition": {0: [0, 1], 1: [240]}}, "client 1 has sample 240, outside the 240 samples"),
    ({"partition": {0: [], 1: [1]}}, "client 0 has no samples"),
    ({"model": "__main__:make_net"}, "in the script being run .__main__."),
    ({"model": "rwlab.nets:nothing"}, "module 'rwlab.nets' has no 'nothing'"),
    ({"test_data": "rwlab.data:make_test_set", "data": "digits"}, "test_data goes with a data factory"),
    ({"hyperparameters": {"lr": float("nan")}}, "hyperparameters must hold only"),
])
def test_what_does_not_fit_is_refused_in_one_line_before_anything_is_written(lab, tmp_path, changes, message):
    with pytest.raises(LandscapeError, match=message) as error:
        _writer(tmp_path / "run", **changes)
    assert "\n" not in str(error.value)
    assert not (tmp_path / "run").exists()


def test_rounds_that_do_not_fit_are_refused_in_one_line(lab, tmp_path):
    from rwlab.nets import make_net, make_wide_net

    net = make_net()
    with _writer(tmp_path / "run") as w:
        w.round(0, end=net)  # the first model recorded sets the run's dtype (float64)
        for call, message in [
            (lambda: w.round(1, end=make_wide_net()), r"'0.weight' has shape \[9, 64\] there, \[8, 64\] in this"),
            (lambda: w.round(1, end=net, clients={0: net}), "has client models but no start"),
            (lambda: w.round(1, start=net, end=net, clients={7: net}), "client 7, which is not in the partition"),
            (lambda: w.round(1, end=net.float()), "holds float32, the run trains in float64"),
            (lambda: w.round(-1, end=net), "whole number >= 0"),
            (lambda: w.round(1, end={"x": 1}), "must be a state_dict"),
        ]:
            net = make_net()
            with pytest.raises(LandscapeError, match=message) as error:
                call()
            assert "\n" not in str(error.value)
    assert landscape.open_run(tmp_path / "run").rounds() == [0]


def test_another_run_or_a_folder_of_other_files_is_never_written_into(lab, tmp_path, six_round_run):
    import shutil

    run = tmp_path / "trained"
    shutil.copytree(six_round_run, run)
    with pytest.raises(LandscapeError, match="holds another run"):
        _writer(run)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    with pytest.raises(LandscapeError, match="already exists and is not empty"):
        _writer(tmp_path / "mine")
    assert [p.name for p in (tmp_path / "mine").iterdir()] == ["notes.txt"]


def test_reading_a_recorded_run_runs_none_of_its_code_unless_trusted(runs, monkeypatch):
    for name in [m for m in sys.modules if m == "rwlab" or m.startswith("rwlab.")]:
        monkeypatch.delitem(sys.modules, name)  # as in a new process: nothing of the run's code imported
    result = invoke("analyze", runs / "fedavg", "--device", "cpu", "--quiet", "--checkpoints", "1", "--passes",
                    "flatness")
    line = one_line_error(result)
    assert "model factory 'rwlab.nets:make_net'" in line and "--trust-imports" in line


def test_a_recipe_to_train_cannot_name_the_recordedpartition_of():
    from landscape.config.setup import prepare_data

    with pytest.raises(LandscapeError, match="partition 'recorded' is the clients' split recorded in a run"):
        raw = tiny_recipe().to_dict()
        raw["partition"] = {"name": "recorded", "clients": 4}
        prepare_data(recipes.resolve(raw))


def test_the_trainer_records_the_clients_start_point_and_the_analysis_reads_it(tmp_path):
    """fednsam-code's clients start from the look-ahead x^{t-1} + lam m: the recorded start equals the point
    rebuilt from the algorithm's rule, bit for bit, and the analysis needs no algorithm to find it."""
    from landscape.analyze.context import CheckpointContext
    from landscape.analyze.settings import AnalysisSettings
    from landscape.analyze.source import find_sources

    recipe = tiny_recipe(algorithm__name="fednsam-code", train__rounds=2, train__keep_clients=True,
                         train__checkpoint_every=1, model__name="mlp", model__hidden=[8])
    loop.start_run(recipe, tmp_path / "run", progress=False)
    kept = load_checkpoint(tmp_path / "run" / "checkpoints" / "round-0002.clients.pt")
    previous = load_checkpoint(tmp_path / "run" / "checkpoints" / "round-0001.pt")["model"]
    assert any(not torch.equal(kept["start"][k], previous[k]) for k in previous)  # a look-ahead, not x^{t-1}
    (source,), _ = find_sources(tmp_path / "run")
    ctx = CheckpointContext(source, 2, AnalysisSettings(device="cpu"))
    assert torch.equal(ctx.broadcast_start(), ctx.rebuilt_start())


def _documented_keys(marker: str) -> dict[str, str]:
    """key -> "written by" of the table under ``<!-- keys of MARKER -->`` in docs/reference/run-format.md."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "reference" / "run-format.md").read_text()
    table = text.split(f"<!-- keys of {marker} -->", 1)[1].split("\n\n", 1)[0]
    rows = [line.split("|") for line in table.splitlines() if line.startswith("| `")]
    return {row[1].strip().strip("`"): row[2].strip() for row in rows}


def test_the_run_format_page_names_every_key_the_trainer_and_the_writer_write(runs, six_round_run):
    from pathlib import Path

    from landscape.store.writer import RUN_FORMAT

    page = (Path(__file__).resolve().parents[2] / "docs" / "reference" / "run-format.md").read_text()
    assert page.startswith(f"# Run format (version {RUN_FORMAT})")
    for marker, name in (("round-NNNN.pt", "round-0002.pt"), ("round-NNNN.clients.pt", "round-0002.clients.pt")):
        documented = _documented_keys(marker)
        written = {"RunWriter": set(load_checkpoint(runs / "fedsam" / "checkpoints" / name)),
                   "trainer": set(load_checkpoint(six_round_run / "checkpoints" / name))}
        for who, keys in written.items():
            assert keys <= set(documented), f"{who} writes {keys - set(documented)} into {marker}: document them"
            # a key written only sometimes says when in brackets: "both (RunWriter: when given)"
            always = {k for k, by in documented.items() if by.startswith(("both", who)) and "(" not in by}
            assert always <= keys, f"{marker}: the page says {who} writes {always - keys}"


def test_compare_and_report_read_recorded_runs_without_their_code(runs, tmp_path, monkeypatch):
    for name in [m for m in sys.modules if m == "rwlab" or m.startswith("rwlab.")]:
        monkeypatch.delitem(sys.modules, name)  # reading results needs no code of the run
    compared = invoke("compare", runs / "fedavg", runs / "fedsam", "--out", tmp_path / "cmp", "--quiet")
    assert compared.exit_code == 0, compared.output
    table = (tmp_path / "cmp" / "compare.csv").read_text()
    assert "fedavg" in table and "fedsam" in table
    delta_d = _record(runs / "fedsam", 3, "flatness")["distance"]
    assert f"{delta_d:.4g}" in compared.output
    reported = invoke("report", runs / "fedavg", runs / "fedsam", "-o", tmp_path / "report.html")
    assert reported.exit_code == 0, reported.output
    assert "FedSAM" in (tmp_path / "report.html").read_text()


def test_a_registered_model_data_set_and_partition_are_recorded_by_name(tmp_path):
    """model, data and partition named as a recipe names them: the partition drawn from the seed, as training
    draws it, and the run analysed as a trained one (no code of the user's)."""
    from landscape.config.setup import build_module, prepare_data

    path = tmp_path / "named"
    with landscape.RunWriter(path, model="mlp", model_options={"hidden": [8]}, data="digits", partition="iid",
                             partition_options={"clients": 3}, seed=4) as w:
        recipe = w.recipe
        net = build_module(recipe, prepare_data(recipe).bundle)
        w.round(0, end=net)
        clients = {}
        for i in range(3):
            clients[i] = {k: v + 0.01 * (i + 1) for k, v in net.state_dict().items()}
        w.round(1, start=net, clients=clients, end=net)
    run = landscape.open_run(path)
    drawn = prepare_data(recipe).client_indices
    assert all(np.array_equal(a, b) for a, b in zip(run.partition(), drawn)) and len(drawn) == 3
    result = invoke("analyze", path, "--device", "cpu", "--quiet", "--checkpoints", "1", "--passes", "flatness")
    assert result.exit_code == 0, result.output
    names = [n for n, _ in net.named_parameters()]
    models = torch.stack([_flat(clients[i], names) for i in range(3)])
    expected = float(((models - models.mean(0)) ** 2).sum(1).mean())
    assert _record(path, 1, "flatness")["distance"] == pytest.approx(expected, rel=1e-6)


def test_every_pass_and_every_surface_runs_on_a_recorded_run(runs):
    small = ["--set", "hessian.top_k=2", "--set", "hessian.trace_hvps=6", "--set", "hessian.density_runs=1", "--set",
             "hessian.density_steps=4", "--set", "hessian.clients=2", "--set", "sharpness.rhos=[0.05]", "--set",
             "sharpness.steps=2", "--set", "sharpness.starts=1", "--set", "sharpness.clients=2", "--set",
             "loss.clients=2", "--set", "alignment.batches=3", "--set", "incompatibility.batches=3"]
    done = invoke("analyze", runs / "fedsam", "--trust-imports", "--device", "cpu", "--quiet", "--checkpoints", "3",
                  *small)
    assert done.exit_code == 0, done.output
    for args in (["--directions", "random"], ["--directions", "pca", "--checkpoints", "all"],
                 ["--directions", "clients"], ["--directions", "interpolate"], ["--data", "client:1"]):
        surface = invoke("analyze", runs / "fedsam", "--trust-imports", "--device", "cpu", "--quiet", "--grid", "5",
                         "--checkpoints", "3", *args)
        assert surface.exit_code == 0, (args, surface.output)
    folder = runs / "fedsam" / "analysis" / "round-0003"
    assert {json.loads(p.read_text())["pass"] for p in folder.glob("*.json")} == {
        "loss", "hessian", "sharpness", "flatness", "incompatibility", "alignment", "surface"}
