"""Gradient, minibatch and update alignment against direct cosine computations."""

import shutil

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from support.helpers import tiny_recipe
from support.problems import digits_clients

from landscape.analyze.context import CheckpointContext
from landscape.analyze.passes.alignment import AlignmentOptions, alignment_pass
from landscape.analyze.settings import AnalysisSettings
from landscape.analyze.source import find_sources
from landscape.config import recipe as recipes
from landscape.config import setup
from landscape.core.errors import LandscapeError
from landscape.core.flat import FlatModel
from landscape.measure.alignment import (
    cosine_matrix,
    gradient_alignment,
    minibatch_alignment,
    update_alignment,
)
from landscape.measure.flatness import client_minibatch_indices, client_models
from landscape.store.checkpoints import load_checkpoint
from landscape.store.directory import RunDir
from landscape.train import loop


@pytest.fixture(scope="module")
def digits():
    return digits_clients()


def _grad(flat, x, y, w):
    w = w.detach().clone().requires_grad_(True)
    (g,) = torch.autograd.grad(F.cross_entropy(flat.logits(w, x, {}), y), w)
    return g


def _cos(a, b):
    return float(F.cosine_similarity(a, b, dim=0))


def _check_cosine_matrix(c, n):
    assert c.shape == (n, n)
    np.testing.assert_array_equal(c, c.T)
    np.testing.assert_array_equal(np.diag(c), np.ones(n))
    assert (np.abs(c) <= 1).all()


def test_gradient_alignment_matches_direct_cosines(digits):
    flat, glob, clients, w = digits
    r = gradient_alignment(glob, clients, w)
    _check_cosine_matrix(r.cosine_matrix, 4)
    grads = [_grad(flat, clients[c].data.x, clients[c].data.y, w) for c in r.clients]
    grad = _grad(flat, glob.data.x, glob.data.y, w)
    for i in range(4):
        assert r.global_cosine[i] == pytest.approx(_cos(grads[i], grad), abs=1e-12)
        assert r.client_gradient_norm[i] == pytest.approx(float(grads[i].norm()), rel=1e-12)
        for j in range(4):
            assert r.cosine_matrix[i, j] == pytest.approx(_cos(grads[i], grads[j]), abs=1e-12)
    off = [_cos(grads[i], grads[j]) for i in range(4) for j in range(4) if i != j]
    assert r.mean_off_diagonal == pytest.approx(np.mean(off), abs=1e-12)
    assert r.mean_global_cosine == pytest.approx(np.mean(r.global_cosine), abs=1e-15)
    assert r.mean_off_diagonal < 0.9  # non-IID clients disagree


def test_gradient_alignment_two_clients_and_identical_clients(digits):
    flat, glob, clients, w = digits
    two = gradient_alignment(glob, {3: clients[3], 1: clients[1]}, w)
    assert two.clients == [1, 3]
    g1 = _grad(flat, clients[1].data.x, clients[1].data.y, w)
    g3 = _grad(flat, clients[3].data.x, clients[3].data.y, w)
    assert two.cosine_matrix[0, 1] == pytest.approx(_cos(g1, g3), abs=1e-12)
    assert two.mean_off_diagonal == two.cosine_matrix[0, 1]
    shared = glob.with_data(clients[0].data)
    same = gradient_alignment(shared, {k: shared.with_data(clients[0].data) for k in range(3)}, w)
    np.testing.assert_allclose(same.cosine_matrix, np.ones((3, 3)), atol=1e-14)
    np.testing.assert_allclose(same.global_cosine, np.ones(3), atol=1e-14)


def test_minibatch_alignment_matches_direct_cosines(digits):
    flat, _, clients, w = digits
    r = minibatch_alignment(clients, w, batch_size=16, batches=5, seed=2)
    assert r.cosine_matrices.shape == (4, 5, 5)
    for k, c in enumerate(r.clients):
        _check_cosine_matrix(r.cosine_matrices[k], 5)
        data = clients[c].data
        grads = [_grad(flat, data.x[i], data.y[i], w) for i in client_minibatch_indices(len(data), 16, 5, 2, c)]
        pairs = [_cos(grads[a], grads[b]) for a in range(5) for b in range(5) if a != b]
        assert r.client_mean_cosine[k] == pytest.approx(np.mean(pairs), abs=1e-12)
        assert r.client_mean_cosine_se[k] > 0
    assert r.mean_cosine == pytest.approx(r.client_mean_cosine.mean(), abs=1e-15)
    assert r.mean_cosine_se == pytest.approx(np.sqrt((r.client_mean_cosine_se**2).sum()) / 4, rel=1e-12)
    again = minibatch_alignment(clients, w, batch_size=16, batches=5, seed=2)
    np.testing.assert_array_equal(again.cosine_matrices, r.cosine_matrices)


def test_minibatch_alignment_of_whole_data_draws_is_one(digits):
    _, _, clients, w = digits
    r = minibatch_alignment({0: clients[0]}, w, batch_size=10_000, batches=3, seed=0)
    np.testing.assert_allclose(r.cosine_matrices[0], np.ones((3, 3)), atol=1e-12)
    assert r.mean_cosine == pytest.approx(1.0, abs=1e-12)


def test_update_alignment_direct_and_identical():
    x = torch.tensor([1.0, 1.0, 1.0], dtype=torch.float64)
    ys = {0: x + torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64), 5: x + torch.tensor([1.0, 1.0, 0.0], dtype=torch.float64)}
    r = update_alignment(x, ys)
    _check_cosine_matrix(r.cosine_matrix, 2)
    assert r.cosine_matrix[0, 1] == pytest.approx(1 / np.sqrt(2), abs=1e-15)
    bar = torch.tensor([1.0, 0.5, 0.0], dtype=torch.float64)
    assert r.mean_cosine[0] == pytest.approx(1 / float(bar.norm()), abs=1e-15)
    assert r.mean_update_norm == pytest.approx(float(bar.norm()), abs=1e-15)
    np.testing.assert_allclose(r.update_norm, [1.0, np.sqrt(2)])
    assert np.isnan(r.server_cosine).all() and np.isnan(r.server_update_norm)
    same = update_alignment(x, {k: x + 0.3 for k in range(3)})
    np.testing.assert_allclose(same.cosine_matrix, np.ones((3, 3)), atol=1e-15)
    np.testing.assert_allclose(same.mean_cosine, np.ones(3), atol=1e-15)
    with pytest.raises(LandscapeError, match="at least one client model"):
        update_alignment(x, {})
    with pytest.raises(LandscapeError, match="the new global model has 2 parameters"):
        update_alignment(x, ys, torch.zeros(2))


def test_update_alignment_from_a_saved_round(tmp_path):
    recipe = tiny_recipe(train__keep_clients=True, train__dtype="float64", train__rounds=3,
                         train__participation=0.75)
    loop.start_run(recipe, tmp_path / "run", progress=False)
    run = RunDir(tmp_path / "run")
    flat = FlatModel(setup.build_module(recipe, setup.prepare_data(recipe).bundle).double())
    start = flat.from_state_dict(load_checkpoint(run.checkpoint(2))["model"])[0]  # x^2: where round 3 began
    new = flat.from_state_dict(load_checkpoint(run.checkpoint(3))["model"])[0]  # x^3, after aggregation
    ys = client_models(flat, load_checkpoint(run.clients_checkpoint(3)))
    r = update_alignment(start, ys, new)
    assert len(r.clients) == 3
    _check_cosine_matrix(r.cosine_matrix, 3)
    deltas = [ys[c] - start for c in r.clients]
    for i in range(3):
        for j in range(3):
            assert r.cosine_matrix[i, j] == pytest.approx(_cos(deltas[i], deltas[j]), abs=1e-12)
    # FedAvg with server_lr 1: x^3 - x^2 = Delta_bar, so the server step is the mean client update.
    np.testing.assert_allclose(r.server_cosine, r.mean_cosine, atol=1e-12)
    assert r.server_update_norm == pytest.approx(r.mean_update_norm, rel=1e-12)


@pytest.fixture(scope="module")
def saved_rounds(tmp_path_factory):
    """Three-round float64 runs keeping every round's clients, checkpointed every round: {algorithm: run dir}."""
    root = tmp_path_factory.mktemp("update-alignment")
    runs = {}
    for name in ("fedacg", "fednsam-code", "fedavg"):
        recipe = tiny_recipe(algorithm__name=name, model__name="mlp", train__keep_clients=True, train__rounds=3,
                             train__dtype="float64", train__participation=0.75, train__local_steps=4)
        loop.start_run(recipe, root / name, progress=False)
        runs[name] = root / name
    return runs


def _pass_updates(run_path, round):
    """The ``updates`` scalars of the alignment pass on ``round`` of the run."""
    (source,), _ = find_sources(run_path)
    ctx = CheckpointContext(source, round, AnalysisSettings(device="cpu"))
    return alignment_pass(ctx, AlignmentOptions(batches=2)).scalars["updates"]


def _saved_round(run_path, round):
    """(recipe, x^{t-1}, its checkpoint, x^t, the round's client models y_i) read from the run's files."""
    run = RunDir(run_path)
    resolved = recipes.read_recipe(run.recipe)
    flat = FlatModel(setup.build_module(resolved, setup.prepare_data(resolved).bundle).double())
    previous = load_checkpoint(run.checkpoint(round - 1))
    x_prev = flat.from_state_dict(previous["model"])[0]
    x_new = flat.from_state_dict(load_checkpoint(run.checkpoint(round))["model"])[0]
    return resolved, x_prev, previous, x_new, client_models(flat, load_checkpoint(run.clients_checkpoint(round)))


def _check_update_cosines(r, start, ys, x_prev, x_new):
    """The pass's update cosines against cosines of Delta_i = y_i - start computed here."""
    clients = r["clients"]
    deltas = [ys[c] - start for c in clients]
    bar = torch.stack(deltas).mean(dim=0)
    for i in range(len(clients)):
        for j in range(len(clients)):
            assert r["cosine_matrix"][i][j] == pytest.approx(1.0 if i == j else _cos(deltas[i], deltas[j]),
                                                             abs=1e-12)
        assert r["mean_cosine"][i] == pytest.approx(_cos(deltas[i], bar), abs=1e-12)
        assert r["update_norm"][i] == pytest.approx(float(deltas[i].norm()), rel=1e-12)
        assert r["server_cosine"][i] == pytest.approx(_cos(deltas[i], x_new - x_prev), abs=1e-12)
    assert r["mean_update_norm"] == pytest.approx(float(bar.norm()), rel=1e-12)
    assert r["server_mean_cosine"] == pytest.approx(_cos(bar, x_new - x_prev), abs=1e-12)
    assert r["server_update_norm"] == pytest.approx(float((x_new - x_prev).norm()), rel=1e-12)
    assert r["start_offset_norm"] == pytest.approx(float((start - x_prev).norm()), rel=1e-12, abs=1e-300)
    return deltas


@pytest.mark.parametrize("name", ["fedacg", "fednsam-code"])
def test_update_cosines_are_measured_from_the_look_ahead_the_clients_started_at(saved_rounds, name):
    recipe, x_prev, previous, x_new, ys = _saved_round(saved_rounds[name], 3)
    lam = recipe.algorithm.options["lam"]
    m = previous["server_state"]["m"].double()  # the server momentum after round 2, a flat vector like x
    start = x_prev + lam * m  # x~ = x^2 + lam m, the look-ahead both rules send their clients from
    assert float(m.norm()) > 0
    r = _pass_updates(saved_rounds[name], 3)
    deltas = _check_update_cosines(r, start, ys, x_prev, x_new)
    # The server's rules, from the same start: x^3 = x~ + Delta_bar (eta_g = 1), so x~ is where clients began.
    torch.testing.assert_close(x_new, start + torch.stack(deltas).mean(dim=0), rtol=0, atol=1e-12)
    assert r["start_offset_norm"] == pytest.approx(lam * float(m.norm()), rel=1e-12)
    # Measured from x^2 instead, the shared offset lam m pulls every cosine up: not what the clients did.
    from_global = [ys[c] - x_prev for c in r["clients"]]
    old = np.mean([_cos(a, b) for k, a in enumerate(from_global) for b in from_global[k + 1:]])
    assert old - r["mean_off_diagonal"] > 0.05


def test_update_cosines_of_fedavg_are_those_from_the_previous_global_model(saved_rounds):
    _, x_prev, _, x_new, ys = _saved_round(saved_rounds["fedavg"], 3)
    r = _pass_updates(saved_rounds["fedavg"], 3)
    _check_update_cosines(r, x_prev, ys, x_prev, x_new)
    assert r["start_offset_norm"] == 0.0
    np.testing.assert_allclose(r["server_cosine"], r["mean_cosine"], atol=1e-12)  # x^3 - x^2 = Delta_bar
    direct = update_alignment(x_prev, ys, x_new)
    np.testing.assert_array_equal(np.array(r["cosine_matrix"]), direct.cosine_matrix)


def test_update_cosines_without_the_previous_checkpoint_come_from_the_recorded_start(tmp_path):
    """The clients' start point is recorded beside their models (run format 2): their update cosines need no
    checkpoint of round t - 1; the server's step from x^{t-1} does, and without it is reported as not known."""
    recipe = tiny_recipe(algorithm__name="fedacg", model__name="mlp", train__keep_clients=True, train__rounds=2,
                         train__checkpoint_every=2)
    loop.start_run(recipe, tmp_path / "run", progress=False)
    r = _pass_updates(tmp_path / "run", 2)
    assert r["server_step"] == "not known: round 1 has no checkpoint"
    assert np.isnan(r["server_mean_cosine"]) and np.isnan(r["start_offset_norm"])
    assert np.isnan(r["server_cosine"]).all() and np.isfinite(r["cosine_matrix"]).all()
    kept = load_checkpoint(RunDir(tmp_path / "run").clients_checkpoint(2))
    names = [n for n in kept["start"] if "weight" in n or "bias" in n]
    start = torch.cat([kept["start"][n].reshape(-1).double() for n in names])
    deltas = torch.stack([torch.cat([s[n].reshape(-1).double() for n in names]) - start
                          for _, s in sorted(kept["clients"].items(), key=lambda kv: int(kv[0]))])
    unit = (deltas / deltas.norm(dim=1, keepdim=True)).numpy()
    np.testing.assert_allclose(r["cosine_matrix"], unit @ unit.T, rtol=0, atol=1e-6)


def test_a_previous_checkpoint_without_the_broadcast_state_is_named(saved_rounds, tmp_path):
    shutil.copytree(saved_rounds["fedacg"], tmp_path / "run")
    clients = RunDir(tmp_path / "run").clients_checkpoint(3)  # as a run written before the start was recorded
    kept = load_checkpoint(clients)
    del kept["start"]
    torch.save(kept, clients)
    path = RunDir(tmp_path / "run").checkpoint(2)
    payload = load_checkpoint(path)
    del payload["server_state"]["m"]
    torch.save(payload, path)
    with pytest.raises(LandscapeError, match=r"round-0002.pt lacks the server state 'm' that fedacg broadcasts"):
        _pass_updates(tmp_path / "run", 3)


def test_zero_vectors_have_zero_cosines():
    c = cosine_matrix(torch.tensor([[1.0, 0.0], [0.0, 0.0], [2.0, 2.0]], dtype=torch.float64))
    np.testing.assert_allclose(c, [[1.0, 0.0, 1 / np.sqrt(2)], [0.0, 0.0, 0.0], [1 / np.sqrt(2), 0.0, 1.0]])


def test_bad_settings_are_named(digits):
    _, glob, clients, w = digits
    with pytest.raises(LandscapeError, match="at least one client objective"):
        gradient_alignment(glob, {}, w)
    with pytest.raises(LandscapeError, match="batches must be an integer >= 2"):
        minibatch_alignment(clients, w, batch_size=16, batches=1)
