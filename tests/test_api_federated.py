"""The federated functions of the notebook API (landscape.incompatibility, landscape.alignment): a run's model and
clients' data through them give the numbers of the incompatibility and alignment passes; the update cosines
equal a direct float64 computation; every bad input is a one-line LandscapeError."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch
from support.helpers import tiny_recipe
from torch import nn

import landscape
from landscape.analyze.context import CheckpointContext
from landscape.analyze.passes.alignment import AlignmentOptions, alignment_pass
from landscape.analyze.passes.incompatibility import IncompatibilityOptions, incompatibility_pass
from landscape.analyze.settings import AnalysisSettings
from landscape.analyze.source import find_sources
from landscape.core.errors import LandscapeError
from landscape.store.results.serial import split_result
from landscape.train import loop

# The pass and the function do the same float64 arithmetic except F's data: the pass's analysis set is the union
# of the clients' data in sample-index order, the function's the clients' data one after the other, so sums
# over F's samples are added in another order (a few units of the last place of float64).
RTOL = 1e-12


@pytest.fixture(autouse=True)
def one_thread():
    """The passes on one CPU thread, as the functions run by default (tiny tensors: several times faster on a
    busy machine)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _pass_context(path, round_):
    (source,), _ = find_sources(path)
    return CheckpointContext(source, round_, AnalysisSettings(device="cpu", dtype="float64"))


def _clients(run):
    """Every client's training data, as (inputs, targets) tensors, from the run's public read model."""
    return [(d.x, d.y) for d in (run.client_data(i) for i in range(len(run.partition())))]


def _differences(ours, theirs, where=""):
    """The largest |a - b| / max(1, |b|) over two nested results (dicts, lists, arrays, numbers); booleans,
    strings and integers must be equal."""
    if isinstance(theirs, dict):
        assert isinstance(ours, dict) and ours.keys() == theirs.keys(), where
        return max([_differences(ours[k], theirs[k], f"{where}.{k}") for k in theirs], default=0.0)
    a, b = np.asarray(ours), np.asarray(theirs)
    assert a.shape == b.shape, where
    if a.dtype.kind in "biuUSO" or b.dtype.kind in "biuUSO":
        assert np.array_equal(a, b), where
        return 0.0
    assert np.array_equal(np.isnan(a), np.isnan(b)), where
    a, b = np.nan_to_num(a.astype(float)), np.nan_to_num(b.astype(float))
    return float(np.max(np.abs(a - b) / np.maximum(1.0, np.abs(b)), initial=0.0))


def _flat(scalars, arrays):
    """A pass's JSON part and NPZ part as one nested dict (NPZ keys are dotted paths)."""
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in scalars.items()}
    for key, value in arrays.items():
        *parents, leaf = key.split(".")
        node = out
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return out


@pytest.mark.parametrize("objective", ["client-mean", "size-weighted"])
def test_incompatibility_equals_the_pass(six_round_run, objective):
    ctx = _pass_context(six_round_run, 2)
    expected = incompatibility_pass(ctx, IncompatibilityOptions(batches=3, global_objective=objective))
    run = landscape.open_run(six_round_run)
    got = landscape.incompatibility(run.model(2), _clients(run), global_objective=objective, rho=0.05, batches=3,
                                    minibatch_size=run.recipe.train.batch_size, dtype=torch.float64,
                                    algorithm=run.recipe.algorithm.name)
    assert got.incompatibility == pytest.approx(expected.summary["Delta_FI"], rel=RTOL)
    assert got.clients == [0, 1, 2, 3] and got.friendly_pairs == 4 * 3 * 2 and math.isfinite(got.loss_gap)
    assert got.applied_note == "fedavg applies no perturbation" and "Delta_FI_applied" not in expected.summary
    assert _differences(_flat(*split_result(got)), _flat(expected.scalars, expected.arrays)) < RTOL


def test_incompatibility_samples_the_loss_level_as_the_pass_does(six_round_run):
    """``loss_level_pairs`` = K: the same seeded sample of K (client, draw) pairs as the pass's option; the API's
    default (0) evaluates every pair, the N M = 12 here."""
    ctx = _pass_context(six_round_run, 2)
    expected = incompatibility_pass(ctx, IncompatibilityOptions(batches=3, loss_level_pairs=5))
    run = landscape.open_run(six_round_run)
    got = landscape.incompatibility(run.model(2), _clients(run), rho=0.05, batches=3, loss_level_pairs=5,
                                    minibatch_size=run.recipe.train.batch_size, dtype=torch.float64,
                                    algorithm=run.recipe.algorithm.name)
    assert got.loss_level_pairs == 5 and int(np.isnan(got.perturbed_loss_samples).sum()) == 12 - 5
    assert _differences(_flat(*split_result(got)), _flat(expected.scalars, expected.arrays)) < RTOL


@pytest.fixture(scope="module")
def fedsmoo_run(tmp_path_factory):
    """Four FedSMOO rounds of the tiny MLP: a server state (s, H) and client states (mu_i, h_i) to perturb from."""
    path = tmp_path_factory.mktemp("fedsmoo") / "run"
    loop.start_run(tiny_recipe(model__name="mlp", model__hidden=[16], algorithm__name="fedsmoo",
                               algorithm__rho=0.05, train__rounds=4, train__checkpoint_every=2), path,
                   progress=False)
    return path


def test_the_applied_perturbation_from_a_checkpoints_states_equals_the_pass(fedsmoo_run):
    from landscape.store.checkpoints import load_checkpoint

    ctx = _pass_context(fedsmoo_run, 4)
    expected = incompatibility_pass(ctx, IncompatibilityOptions(batches=3))
    run = landscape.open_run(fedsmoo_run)
    payload = load_checkpoint(fedsmoo_run / "checkpoints" / "round-0004.pt")
    assert payload["client_states"]  # clients that took part hold mu_i, h_i
    got = landscape.incompatibility(run.model(4), _clients(run), rho=0.05, batches=3,
                                    minibatch_size=run.recipe.train.batch_size, dtype=torch.float64,
                                    algorithm="fedsmoo", algorithm_options=dict(run.recipe.algorithm.options),
                                    server_state=payload["server_state"],
                                    client_states={int(c): t for c, t in payload["client_states"].items()})
    assert got.applied_rule == "fedsmoo" and got.applied_note == ""
    assert got.applied_incompatibility == pytest.approx(expected.summary["Delta_FI_applied"], rel=RTOL)
    assert abs(got.applied_incompatibility - got.incompatibility) > 1e-3 * got.incompatibility  # mu_i + s moved it
    assert _differences(_flat(*split_result(got)), _flat(expected.scalars, expected.arrays)) < RTOL


def test_alignment_equals_the_pass_and_a_mapping_keeps_the_client_numbers(six_round_run):
    """A sample of two clients: the mapping {client number: data} draws each client's minibatches as the pass
    does, and data= gives F's data (the union of all clients'). The update cosines from the round's kept client
    models and the start point recorded beside them (state_dicts). Round 1 has no checkpoint, so the server's
    step (from x^1) is not known: it is left out here, and the pass reports it so (NaN)."""
    ctx = _pass_context(six_round_run, 2)
    expected = alignment_pass(ctx, AlignmentOptions(clients=2, batches=3))
    sampled = ctx.sample_clients(2)
    run = landscape.open_run(six_round_run)
    clients = _clients(run)
    union = tuple(torch.cat(parts) for parts in zip(*clients))
    kept = torch.load(six_round_run / "checkpoints" / "round-0002.clients.pt", weights_only=True)
    updates = {} if kept.get("start") is None else {  # recorded since run format 2
        "start": kept["start"], "client_models": {int(k): v for k, v in kept["clients"].items()}}
    got = landscape.alignment(run.model(2), {i: clients[i] for i in sampled}, data=union, batches=3,
                              minibatch_size=run.recipe.train.batch_size, dtype=torch.float64, **updates)
    assert got.gradients.clients == sampled and len(sampled) == 2
    ours = {"gradients": _flat(*split_result(got.gradients)), "minibatch": _flat(*split_result(got.minibatch))}
    theirs = _flat(expected.scalars, expected.arrays)
    if updates:
        assert got.updates.clients == sorted(updates["client_models"]) and np.isnan(got.updates.server_cosine).all()
        ours["updates"] = _flat(*split_result(got.updates))
        # start_offset_norm = ||start - x^1||: 0 here (previous_global not given: the clients started from it);
        # the pass, which cannot know x^1, reports NaN
        keys = set(ours["updates"]) - {"start_offset_norm"}
        for side in (ours, theirs):
            side["updates"] = {k: v for k, v in side["updates"].items() if k in keys}
    else:
        assert got.updates is None and theirs["updates"]["available"] is False
        ours["updates"] = theirs["updates"]
    assert _differences(ours, theirs) < RTOL


@pytest.fixture(scope="module")
def kept_run(tmp_path_factory):
    """Two FedAvg rounds of the tiny MLP, every round checkpointed, the clients' models kept (a fraction of a
    second): round 2's update cosines then have the server's step x^2 - x^1, which six_round_run's lack."""
    path = tmp_path_factory.mktemp("kept") / "run"
    loop.start_run(tiny_recipe(model__name="mlp", model__hidden=[16], train__rounds=2, train__keep_clients=True),
                   path, progress=False)
    return path


def test_update_cosines_with_the_server_step_equal_the_pass(kept_run):
    """start, new_global and previous_global as the run's models (FedAvg: the clients start from x^1)."""
    expected = alignment_pass(_pass_context(kept_run, 2), AlignmentOptions(batches=2))
    run = landscape.open_run(kept_run)
    kept = torch.load(kept_run / "checkpoints" / "round-0002.clients.pt", weights_only=True)["clients"]
    got = landscape.alignment(run.model(2), _clients(run), start=run.model(1),
                              client_models={int(k): state for k, state in kept.items()}, new_global=run.model(2),
                              previous_global=run.model(1), batches=2, minibatch_size=run.recipe.train.batch_size,
                              dtype=torch.float64)
    assert got.updates.clients == sorted(int(k) for k in kept) and np.isfinite(got.updates.server_cosine).all()
    ours = {name: _flat(*split_result(getattr(got, name))) for name in ("gradients", "minibatch", "updates")}
    assert _differences(ours, _flat(expected.scalars, expected.arrays)) < RTOL


def _net(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 3)).double()


def _numpy(module):
    return np.concatenate([p.detach().numpy().ravel() for p in module.parameters()]).astype(np.float64)


def _cos(a, b):
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_update_cosines_equal_a_direct_float64_computation():
    """Delta_i = y_i - start by hand in numpy: cos(Delta_i, Delta_j), cos(Delta_i, mean Delta), and the server's
    step x^t - previous_global; the client models as a module, a flat vector and a state_dict."""
    model, start, previous, new = _net(0), _net(1), _net(2), _net(3)
    ys = [_net(4), _net(5), _net(6)]
    x, y = torch.randn(30, 4, dtype=torch.float64), torch.randint(0, 3, (30,))
    clients = [(x[:10], y[:10]), (x[10:], y[10:])]
    given = [ys[0], torch.as_tensor(_numpy(ys[1])), ys[2].state_dict()]
    got = landscape.alignment(model, clients, start=start, client_models=given, new_global=new,
                              previous_global=previous, batches=2, minibatch_size=4).updates
    deltas = [_numpy(m) - _numpy(start) for m in ys]
    mean = np.mean(deltas, axis=0)
    step = _numpy(new) - _numpy(previous)
    for i, d in enumerate(deltas):
        assert got.mean_cosine[i] == pytest.approx(_cos(d, mean), abs=1e-12)
        assert got.server_cosine[i] == pytest.approx(_cos(d, step), abs=1e-12)
        assert got.update_norm[i] == pytest.approx(np.linalg.norm(d), rel=1e-12)
        for j, e in enumerate(deltas):
            assert got.cosine_matrix[i, j] == pytest.approx(_cos(d, e), abs=1e-12)
    off = [_cos(d, e) for i, d in enumerate(deltas) for j, e in enumerate(deltas) if i != j]
    assert got.mean_off_diagonal == pytest.approx(np.mean(off), abs=1e-12)
    assert got.server_mean_cosine == pytest.approx(_cos(mean, step), abs=1e-12)
    assert got.start_offset_norm == pytest.approx(np.linalg.norm(_numpy(start) - _numpy(previous)), rel=1e-12)
    without = landscape.alignment(model, clients, start=start, client_models=given, batches=2, minibatch_size=4)
    assert np.isnan(without.updates.server_cosine).all() and without.updates.start_offset_norm == 0.0
    np.testing.assert_array_equal(without.updates.cosine_matrix, got.cosine_matrix)


def test_the_model_is_untouched_and_tensors_datasets_and_loaders_agree():
    model = _net(0).train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x, y = torch.randn(30, 4, dtype=torch.float64), torch.randint(0, 3, (30,))
    pairs = [(x[:12], y[:12]), (x[12:], y[12:])]
    loaders = [torch.utils.data.DataLoader(torch.utils.data.TensorDataset(*p), batch_size=7, shuffle=True)
               for p in pairs]
    a = landscape.incompatibility(model, pairs, batches=3, minibatch_size=5)
    b = landscape.incompatibility(model, [torch.utils.data.TensorDataset(*p) for p in pairs], batches=3,
                                  minibatch_size=5)
    c = landscape.incompatibility(model, loaders, batches=3, minibatch_size=5)
    assert a.incompatibility == b.incompatibility and abs(a.incompatibility - c.incompatibility) < 1e-14
    assert model.training and all(p.grad is None for p in model.parameters())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_bad_input_is_a_one_line_error():
    model = _net(0)
    x, y = torch.randn(20, 4, dtype=torch.float64), torch.randint(0, 3, (20,))
    clients = [(x[:10], y[:10]), (x[10:], y[10:])]
    state = model.state_dict()

    def inc(**kw):
        return landscape.incompatibility(kw.pop("model", model), kw.pop("clients", clients),
                                         **{"batches": 2, "minibatch_size": 4, **kw})

    def ali(**kw):
        return landscape.alignment(model, clients, batches=2, minibatch_size=4, **kw)

    cases = [
        (lambda: inc(model="net"), r"^model must be a torch nn\.Module, not str$"),
        (lambda: landscape.alignment(state, clients), r"^model must be a torch nn\.Module, not OrderedDict$"),
        (lambda: inc(clients=torch.utils.data.TensorDataset(x, y)), r"^clients_data must be a list of the "),
        (lambda: inc(clients=[]), r"^clients_data is empty: give the clients' data of at least one client$"),
        (lambda: inc(clients=(x, y)), r"^clients_data is one \(inputs, targets\) pair of tensors: give a list "),
        (lambda: inc(clients={-1: clients[0]}), r"^clients_data keys \(client numbers\) must be a whole number "
                                                r">= 0 \(got -1\)$"),
        (lambda: inc(clients={"a": clients[0]}), r"^clients_data keys \(client numbers\) must be a whole number"),
        (lambda: inc(clients=[clients[0], [1, 2]]), r"^clients_data\[1\] must be \(inputs, targets\) tensors"),
        (lambda: inc(clients=[clients[0], (x[:5], y[:4])]), r"^clients_data\[1\]: "),
        (lambda: inc(clients=[clients[0], (x[:4], torch.full((4,), 7))]), r"^clients_data\[1\]: class 7 is outside"),
        (lambda: inc(clients=[clients[0], (x[:4, :3], y[:4])], global_objective="size-weighted"),
         r"^clients_data\[1\] holds inputs \[3\] .* they have no union to be F's data; give it as data=$"),
        (lambda: inc(global_objective="union"), r"^global_objective must be one of 'client-mean', 'size-weighted' "
                                                r"\(got 'union'\)$"),
        (lambda: inc(global_objective="client-mean", data=clients[0]), r"^data is F's data itself: give "),
        (lambda: inc(algorithm=3), r"^algorithm must be the name of a registered algorithm, not int$"),
        (lambda: inc(algorithm="fedsam2"), r"^unknown algorithm 'fedsam2'; choose from: "),
        (lambda: inc(algorithm="fedsam", algorithm_options=[1]), r"^algorithm_options must be a mapping"),
        (lambda: inc(algorithm="fedsam", algorithm_options={"rh": 1}), r"rh"),
        (lambda: inc(algorithm="fedvssam", server_state={"h": 1.0}), r"^server_state must be a table of named "),
        (lambda: inc(algorithm="fedvssam", server_state={"m": torch.zeros(43)}), r"^a state fedvssam does not keep"),
        (lambda: inc(algorithm="fedsmoo", client_states=[{"mu": 1}]), r"^client_states\[0\] must be a table of "),
        (lambda: inc(data=[1, 2]), r"^data must be \(inputs, targets\) tensors"),
        (lambda: inc(rho=0), r"^rho must be a finite number > 0 \(got 0\)$"),
        (lambda: inc(rho=float("nan")), r"^rho must be a finite number > 0"),
        (lambda: inc(rho=[0.05]), r"^rho must be a finite number > 0"),
        (lambda: inc(batches=1), r"^batches must be a whole number >= 2 \(got 1\)$"),
        (lambda: inc(minibatch_size=0), r"^minibatch_size must be a whole number >= 1 \(got 0\)$"),
        (lambda: inc(minibatch_size=2.5), r"^minibatch_size must be a whole number >= 1 \(got 2\.5\)$"),
        (lambda: inc(seed=-1), r"^seed must be a whole number in 0\.\.2\*\*32-1 \(got -1\)$"),
        (lambda: inc(loss_level="yes"), r"^loss_level must be True or False \(got 'yes'\)$"),
        (lambda: inc(loss_level_pairs=-1), r"^loss_level_pairs must be an integer >= 0 \(0: every pair\) \(got -1\)$"),
        (lambda: inc(loss_level_pairs=2.5), r"^loss_level_pairs must be an integer >= 0"),
        (lambda: inc(loss="hinge"), r"unknown loss"),
        (lambda: inc(bn_mode="frozen"), r"^unknown BN mode 'frozen'"),
        (lambda: inc(batch_size=0), r"^batch_size must be a whole number >= 1 \(got 0\)$"),
        (lambda: inc(device="tpu"), r"unsupported device 'tpu'|unknown device 'tpu'"),
        (lambda: inc(dtype="int64"), r"^dtype must be a floating-point dtype"),
        (lambda: inc(threads=-1), r"^threads must be a whole number >= 0 \(got -1\)$"),
        (lambda: ali(start=model), r"^the update cosines need start and client_models: give client_models "),
        (lambda: ali(client_models=[model]), r"^the update cosines need start and client_models: give start "),
        (lambda: ali(new_global=model), r"^new_global and previous_global are for the update cosines: give "),
        (lambda: ali(start=model, client_models=model), r"^client_models must be a list of the clients' models, "),
        (lambda: ali(start=model, client_models={}), r"^client_models is empty: give the clients' models of at "),
        (lambda: ali(start="x", client_models=[model]), r"^start must be an nn\.Module, a flat parameter tensor or "
                                                        r"a state_dict, not str$"),
        (lambda: ali(start=torch.zeros(3), client_models=[model]), r"^start has 3 parameters, the model 43 "),
        (lambda: ali(start=model, client_models=[torch.full((43,), float("nan"))]),
         r"^client_models\[0\] is not finite \(NaN or inf\)"),
        (lambda: ali(start=model, client_models=[{**state, "0.weight": torch.zeros(4, 5)}]),
         r"^client_models\[0\]: the state_dict has shape \[4, 5\] for the model's parameter '0\.weight' "
         r"\(shape \[5, 4\]\)$"),
        (lambda: ali(start={k: v for k, v in state.items() if k != "2.bias"}, client_models=[model]),
         r"^start: the state_dict has no tensor for the model's parameter '2\.bias'"),
        (lambda: ali(start=model, client_models=[nn.Linear(42, 1).double()]),
         r"^client_models\[0\] is a module of other trainable parameters than the model's$"),
        (lambda: ali(start=model, client_models=[model], new_global=torch.zeros(43, dtype=torch.int64)),
         r"^new_global is not finite \(NaN or inf\) or not floating point"),
    ]
    for call, pattern in cases:
        with pytest.raises(LandscapeError) as caught:
            call()
        message = str(caught.value)
        assert "\n" not in message, message
        assert re.search(pattern, message), (pattern, message)


def test_both_run_on_the_cli_thread_default_and_restore_the_count(monkeypatch):
    from landscape.api import federated

    inside = []
    for name in ("flatness_incompatibility", "gradient_alignment"):
        real = getattr(federated, name)
        monkeypatch.setattr(federated, name, lambda *a, real=real, **k: inside.append(torch.get_num_threads())
                            or real(*a, **k))
    model = _net(0)
    x, y = torch.randn(20, 4, dtype=torch.float64), torch.randint(0, 3, (20,))
    clients = [(x[:10], y[:10]), (x[10:], y[10:])]
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(3)
        landscape.incompatibility(model, clients, batches=2, minibatch_size=4, loss_level=False)
        landscape.alignment(model, clients, batches=2, minibatch_size=4, threads=2)
        assert inside == [1, 2] and torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)
