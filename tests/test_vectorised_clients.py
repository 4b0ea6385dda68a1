"""train.vectorize: a round's clients trained together (landscape.train.vectorised) give the sequential loop's
numbers for every algorithm, to 1e-9 relative in float64 (a batched matrix product rounds differently, so not
bit for bit), on a Dirichlet partition where clients take different numbers of steps and end epochs on short
batches; the vmapped oracle equals a plain nn.Module backward per client; the lockstep answers every waiting
client together and lets finished ones go; a failing client's error comes out as it is, with no thread left;
BatchNorm models fall back (said once); the choice is a place key and recorded in every checkpoint."""

from __future__ import annotations

import copy
import threading

import pytest
import torch
import torch.nn.functional as F
from support.helpers import tiny_recipe
from torch import nn

from landscape.config import overrides as recipe_overrides
from landscape.config import recipe as recipes
from landscape.config.setup import using_threads
from landscape.core.errors import LandscapeError
from landscape.core.flat import FlatModel
from landscape.store import lifecycle
from landscape.store.checkpoints import load_checkpoint
from landscape.store.directory import RunDir
from landscape.train import loop, vectorised
from landscape.train.algorithms import ALGORITHMS

RTOL = 1e-9  # relative, in the global L2 norm, float64
# Options that make the later rounds use each rule's state (dynsam past its warm-up).
OPTIONS = {"fedacg": {"beta": 0.01}, "fedgamma": {"rho": 0.05}, "mofedsam": {"alpha": 0.5},
           "fedlesam": {"rho": 0.1}, "dynsam": {"warmup": 1, "history": 3}}


def trainer(tmp_path, algorithm: str, vectorize: str, **changes) -> loop.Trainer:
    """Four digits clients of a per-class Dirichlet(0.5) partition (clients of unequal sizes), all in every round,
    one local epoch of batch 48 (so clients take different numbers of steps and each epoch ends on a short
    batch), float64 MLP."""
    values = {"algorithm__name": algorithm, "partition__name": "dirichlet", "partition__clients": 4, "train__participation": 1.0,
              "train__local_steps": 0, "train__local_epochs": 1, "train__batch_size": 48,
              "train__lr": 0.1, "train__weight_decay": 1e-3, "train__dtype": "float64", "model__name": "mlp",
              "model__hidden": [8], "train__vectorize": vectorize}
    values.update({f"algorithm__{k}": v for k, v in OPTIONS.get(algorithm, {}).items()})
    if "model__name" in changes:  # another model: its own options
        del values["model__hidden"]
    values.update(changes)
    return loop.Trainer(tiny_recipe(**values), RunDir(tmp_path / f"{algorithm}-{vectorize}"))


def rounds(t: loop.Trainer, count: int) -> tuple[list, list[list], list[dict]]:
    state, states, results, rows = t.initial_state(), [], [], []
    for _ in range(count):
        state, got, row = t.run_round(state)
        states.append(state)
        results.append(got)
        rows.append(row)
    return states, results, rows


def assert_close(actual: torch.Tensor, expected: torch.Tensor, where: str) -> None:
    if not expected.is_floating_point():
        assert torch.equal(actual, expected), where
        return
    scale = max(expected.double().norm().item(), 1e-300)
    assert (actual - expected).double().norm().item() <= RTOL * scale, where


@pytest.fixture(autouse=True)
def one_thread():
    """One torch thread, as training sets by default (train.threads = 1; run_round alone does not set it)."""
    with using_threads(1):
        yield


@pytest.fixture
def stacked_calls(monkeypatch) -> list[int]:
    """The number of clients of each vmapped pass."""
    calls: list[int] = []
    original = vectorised.StackedOracle.__call__

    def counted(self, w, x, y, constants):
        calls.append(len(w))
        return original(self, w, x, y, constants)

    monkeypatch.setattr(vectorised.StackedOracle, "__call__", counted)
    return calls


@pytest.mark.parametrize("algorithm", ALGORITHMS.names())
def test_vectorised_rounds_equal_the_sequential_loop(tmp_path, algorithm, stacked_calls):
    off, on = trainer(tmp_path, algorithm, "off"), trainer(tmp_path, algorithm, "on")
    sizes = [len(ix) for ix in on.client_idx]
    assert len(set(sizes)) == 4 and all(n % 48 for n in sizes)  # unequal clients, short last batches
    expected, expected_results, expected_rows = rounds(off, 3)
    assert stacked_calls == []
    got, got_results, got_rows = rounds(on, 3)
    assert max(stacked_calls) == 4 and min(stacked_calls) < 4  # all together, then without the finished
    assert on.clients.choice.used and not off.clients.choice.used
    for r, (a, b) in enumerate(zip(got, expected)):
        assert_close(a.x, b.x, f"x after round {r + 1}")
        for name, tensor in b.server_state.named().items():
            assert_close(a.server_state.named()[name], tensor, f"server {name}")
        assert sorted(a.client_states) == sorted(b.client_states)
        for client, client_state in b.client_states.items():
            for name, tensor in client_state.named().items():
                assert_close(a.client_states[client].named()[name], tensor, f"client {client} {name}")
    for a_results, b_results in zip(got_results, expected_results):
        assert [r.client for r in a_results] == [r.client for r in b_results]  # client order
        assert [r.num_steps for r in a_results] == [r.num_steps for r in b_results]
        assert len({r.num_steps for r in b_results}) > 1
        for a, b in zip(a_results, b_results):
            assert_close(a.model, b.model, f"client {b.client}'s model")
    for a, b in zip(got_rows, expected_rows):
        assert a.keys() == b.keys()
        for key in set(b) - {"seconds", "clients"}:
            assert a[key] == pytest.approx(b[key], rel=RTOL, abs=1e-12), key


def test_the_vmapped_oracle_equals_a_plain_module_backward_per_client():
    torch.manual_seed(0)
    module = nn.Sequential(nn.Conv2d(1, 3, 3, padding=1), nn.GroupNorm(1, 3), nn.ReLU(), nn.MaxPool2d(2),
                           nn.Flatten(), nn.Linear(3 * 4 * 4, 5)).double()
    flat = FlatModel(module)
    ws = flat.vector() + 0.1 * torch.randn(3, flat.dim, dtype=torch.float64)
    xs, ys = torch.randn(3, 6, 1, 8, 8, dtype=torch.float64), torch.randint(0, 5, (3, 6))
    answers = vectorised.StackedOracle(flat)(ws, xs, ys, {})
    for w, x, y, (loss, grad) in zip(ws, xs, ys, answers):
        reference = copy.deepcopy(module)  # a plain module holding this client's w
        with torch.no_grad():
            for p, t in zip(reference.parameters(), w.split(flat.numels)):
                p.copy_(t.view_as(p))
        reference.zero_grad()
        expected = F.cross_entropy(reference(x), y)
        expected.backward()
        assert loss.item() == pytest.approx(expected.item(), rel=1e-12)
        assert_close(grad, torch.cat([p.grad.reshape(-1) for p in reference.parameters()]), "gradient")
        assert grad.untyped_storage().nbytes() == grad.numel() * 8  # its own tensor, not a view of the stack


def test_requests_are_grouped_by_batch_shape():
    torch.manual_seed(1)
    flat = FlatModel(nn.Sequential(nn.Flatten(), nn.Linear(16, 4)).double())
    shapes = [5, 3, 5, 5]  # three full batches and one short one
    requests = {slot: vectorised.Request(flat.vector() + torch.randn(flat.dim, dtype=torch.float64),
                                         torch.randn(n, 1, 4, 4, dtype=torch.float64),
                                         torch.randint(0, 4, (n,)), {}) for slot, n in enumerate(shapes)}
    answers = vectorised.answer_requests(flat, vectorised.StackedOracle(flat), requests)
    assert sorted(answers) == [0, 1, 2, 3]
    for slot, r in requests.items():
        loss, grad = flat.loss_and_grad(r.w, r.x, r.y, {})
        assert answers[slot][0].item() == pytest.approx(loss.item(), rel=1e-12)
        assert_close(answers[slot][1], grad, f"request {slot}")


def test_the_lockstep_answers_all_waiting_clients_together_and_lets_finished_ones_go():
    groups: list[list[int]] = []

    def compute(requests):
        groups.append(list(requests))
        return {slot: (r.w * 0 + slot, r.w + 1) for slot, r in requests.items()}

    lockstep = vectorised.Lockstep(compute)

    def job(slot: int, asks: int):
        oracle = lockstep.oracle(slot, {})
        w = torch.zeros(2)
        for _ in range(asks):
            seen, w = oracle(w, (torch.zeros(1), torch.zeros(1)), True)
            assert torch.equal(seen, torch.full((2,), float(slot)))
        return slot, w

    results = lockstep.run([lambda: job(0, 3), lambda: job(1, 1), lambda: job(2, 2)])
    assert groups == [[0, 1, 2], [0, 2], [0]]
    assert [(s, w.tolist()) for s, w in results] == [(0, [3.0, 3.0]), (1, [1.0, 1.0]), (2, [2.0, 2.0])]


def client_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("landscape-client-") and t.is_alive()]


def raised_by_round(t: loop.Trainer) -> BaseException | None:
    """The exception of one round, run in a guard thread so that a hang fails the test instead of stopping it."""
    caught: list[BaseException] = []

    def go():
        try:
            t.run_round(t.initial_state())
        except BaseException as error:  # noqa: BLE001 - examined by the test
            caught.append(error)

    guard = threading.Thread(target=go, daemon=True)
    guard.start()
    guard.join(120)
    assert not guard.is_alive(), "the round hung"
    return caught[0] if caught else None


def test_an_exception_in_one_clients_rule_comes_out_as_it_is_without_a_hang(tmp_path):
    t = trainer(tmp_path, "fedsam", "on")
    rule = t.algorithm.client_update
    failing = ValueError("client 2 broke")

    def client_update(message, state, problem):
        if problem.client == 2:
            problem.loss_and_grad(message["x"], next(problem.batches()))  # fails after one request
            raise failing
        return rule(message, state, problem)

    t.algorithm.client_update = client_update
    assert raised_by_round(t) is failing
    assert client_threads() == []


def test_an_exception_in_the_vmapped_pass_comes_out_as_it_is(tmp_path, monkeypatch):
    failing = RuntimeError("vmap cannot do that")

    def broken(self, w, x, y, constants):
        raise failing

    monkeypatch.setattr(vectorised.StackedOracle, "__call__", broken)
    assert raised_by_round(trainer(tmp_path, "fedavg", "on")) is failing
    assert client_threads() == []


def test_a_batchnorm_model_trains_one_after_another_and_says_so_once(tmp_path, stacked_calls, capsys):
    changes = {"model__name": "resnet18", "model__norm": "bn", "train__local_steps": 1, "train__batch_size": 4,
               "partition__clients": 2, "train__dtype": "float32", "train__eval_every": 10}
    t = trainer(tmp_path, "fedavg", "on", **changes)
    state = t.initial_state()
    for _ in range(2):
        state = t.run_round(state)[0]
    assert stacked_calls == [] and not t.clients.choice.used
    assert "BatchNorm2d" in t.clients.choice.reason
    err = capsys.readouterr().err
    assert err.count("warning: train.vectorize = \"on\": the model has running statistics") == 1
    assert vectorised.stateful_layers(nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.5))).startswith(
        "the model has dropout")
    assert vectorised.stateful_layers(nn.Sequential(nn.Linear(2, 2), nn.GroupNorm(1, 2))) is None


def test_the_choice_is_a_place_key_recorded_in_every_checkpoint(tmp_path):
    recipe = tiny_recipe(model__name="mlp", model__hidden=[8], train__rounds=1, train__vectorize="on")
    loop.start_run(recipe, tmp_path / "on", progress=False)
    assert recipes.read_recipe(tmp_path / "on" / "recipe.toml").train.vectorize == "on"
    for round_ in (0, 1):
        record = load_checkpoint(RunDir(tmp_path / "on").checkpoint(round_))["vectorized"]
        assert record == {"used": True, "reason": "train.vectorize = \"on\""}
    auto = loop.Trainer(tiny_recipe(), RunDir(tmp_path / "auto"))  # the default, on the CPU
    assert auto.train_cfg.vectorize == "auto"
    assert auto.clients.choice == vectorised.Vectorisation(
        False, "train.vectorize = \"auto\" on cpu: one after another")
    assert {"train.vectorize"} <= lifecycle.PLACE_KEYS & recipes.RESUME_FREE_KEYS
    assert recipes.difference(recipes.to_toml(recipe), tiny_recipe(model__name="mlp", model__hidden=[8],
                                                                   train__rounds=1), lifecycle.PLACE_KEYS) is None
    with pytest.raises(LandscapeError, match="train.vectorize must be one of auto, on, off"):
        recipe_overrides.build(None, [("train.vectorize", "sometimes")])
