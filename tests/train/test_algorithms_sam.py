"""FedASAM, MoFedSAM, FedLESAM and dynamic-radius SAM: float64 rounds against the equations of ALGORITHMS.md
(evaluated here with the hand-written gradient), the reductions and option validation."""

import math

import pytest
import torch
from support.algorithm_checks import (
    CLASSES,
    FEATURES,
    assert_close,
    client_batches,
    grad,
    linear_trainer,
    loss_and_grad,
    run_rounds,
)
from support.helpers import tiny_recipe

from landscape.core.errors import LandscapeError
from landscape.train.algorithms import build_algorithm

# ----------------------------------------------------------------------------------------------------------
# FedASAM


def test_fedasam_rounds_match_the_equations(tmp_path):
    lr, wd, rho, eta_a, server_lr = 0.3, 0.01, 0.4, 0.1, 0.8
    trainer = linear_trainer(tmp_path, "fedasam", {"rho": rho, "eta_a": eta_a}, lr=lr, weight_decay=wd,
                             server_lr=server_lr)
    weights = CLASSES * FEATURES  # the linear model is [W (a weight: T = |W| + eta_a), b (a bias: T = 1)]
    for t, (before, after, results) in enumerate(run_rounds(trainer, 2)):
        x = before.x
        finals = []
        for client, result in zip((0, 1), results):
            y = x.clone()
            losses = []
            for batch in client_batches(trainer, client, t):
                loss, g = loss_and_grad(y, batch)
                T = torch.cat([y[:weights].abs() + eta_a, torch.ones(CLASSES, dtype=y.dtype)])
                e = rho * T**2 * g / (T * g).norm()  # ASAM: e = rho T^2 g / ||T g||
                d = grad(y + e, batch)  # d = g(y + e), same batch
                y = y - lr * (d + wd * y)
                losses.append(loss)
            finals.append(y)
            assert_close(result.model, y)
            assert float(result.train_loss) == pytest.approx(float(torch.stack(losses).mean()), rel=1e-12)
            assert result.uplink_floats == x.numel() and result.state is None
        assert_close(after.x, x + server_lr * (torch.stack(finals).mean(0) - x))  # FedAvg server


def test_fedasam_with_rho_zero_is_fedavg(tmp_path):
    # Same arithmetic: e = 0 * T * (T g / ||T g||) = 0 exactly, so g(y + e) = g(y): bit for bit.
    a = run_rounds(linear_trainer(tmp_path, "fedasam", {"rho": 0.0}, clients=3, participation=0.67), 3)
    b = run_rounds(linear_trainer(tmp_path, "fedavg", clients=3, participation=0.67), 3)
    assert torch.equal(a[-1][1].x, b[-1][1].x)


# ----------------------------------------------------------------------------------------------------------
# MoFedSAM


def test_mofedsam_rounds_match_the_equations(tmp_path):
    lr, wd, rho, alpha, server_lr = 0.3, 0.01, 0.05, 0.3, 0.8
    trainer = linear_trainer(tmp_path, "mofedsam", {"rho": rho, "alpha": alpha}, lr=lr, weight_decay=wd,
                             server_lr=server_lr)
    m = torch.zeros_like(trainer.initial_state().x)  # m = 0 at round 0
    for t, (before, after, results) in enumerate(run_rounds(trainer, 3)):
        x = before.x
        torch.testing.assert_close(before.server_state.m, m, rtol=1e-10, atol=1e-12)
        finals = []
        for client, result in zip((0, 1), results):
            y = x.clone()
            losses = []
            for batch in client_batches(trainer, client, t):
                loss, g = loss_and_grad(y, batch)
                e = rho * g / g.norm()  # e = rho g / ||g||
                d = alpha * grad(y + e, batch) + (1 - alpha) * m  # d = alpha g(y + e) + (1 - alpha) m
                y = y - lr * (d + wd * y)
                losses.append(loss)
            finals.append(y)
            assert_close(result.model, y)
            assert float(result.train_loss) == pytest.approx(float(torch.stack(losses).mean()), rel=1e-12)
            assert result.uplink_floats == x.numel()
        deltas = torch.stack(finals) - x
        assert_close(after.x, x + server_lr * deltas.mean(0))  # FedAvg server
        m = -deltas.mean(0) / (2 * lr)  # m = -Delta_bar / (K eta), K = 2 steps
        assert_close(after.server_state.m, m)
    assert m.norm() > 0


def test_mofedsam_momentum_uses_each_clients_own_step_count(tmp_path):
    # Epoch mode: the two clients of the per-class split hold 761 and 676 samples, so K_i = 12 and 11 minibatches
    # of 64.
    lr = 0.2
    trainer = linear_trainer(tmp_path, "mofedsam", lr=lr, steps=0, local_epochs=1, batch=64, partition="dirichlet")
    ((before, after, results),) = run_rounds(trainer, 1)
    steps = [len(client_batches(trainer, client, 0)) for client in (0, 1)]
    assert steps == [12, 11] and [r.num_steps for r in results] == steps
    expected = -torch.stack([(r.model - before.x) / (k * lr) for r, k in zip(results, steps)]).mean(0)
    assert_close(after.server_state.m, expected)  # m = -mean_S(Delta_i / (K_i eta))


def test_mofedsam_with_alpha_one_is_fedsam(tmp_path):
    # Same arithmetic: d = 1.0 * g(y + e) + 0.0 * m = g(y + e) exactly, so the runs agree bit for bit.
    options = {"alpha": 1.0, "rho": 0.05}
    a = run_rounds(linear_trainer(tmp_path, "mofedsam", options, clients=4, participation=0.5), 3)
    b = run_rounds(linear_trainer(tmp_path, "fedsam", {"rho": 0.05}, clients=4, participation=0.5), 3)
    assert torch.equal(a[-1][1].x, b[-1][1].x)


# ----------------------------------------------------------------------------------------------------------
# FedLESAM


def test_fedlesam_rounds_match_the_equations(tmp_path):
    lr, wd, rho, server_lr = 0.3, 0.01, 0.1, 0.8
    trainer = linear_trainer(tmp_path, "fedlesam", {"rho": rho}, clients=4, participation=0.5, lr=lr,
                             weight_decay=wd, server_lr=server_lr)
    last_seen: dict[int, torch.Tensor] = {}  # x^{tau_i}: the global model client i received last time
    x_prev = None  # x^{t-1}
    kinds = set()
    for t, (before, after, results) in enumerate(run_rounds(trainer, 3)):
        x = before.x
        finals = []
        for result in results:
            client = result.client
            if t == 0:
                u = torch.zeros_like(x)  # t = 0: no perturbation
                kinds.add("round 0")
            elif client in last_seen:
                u = last_seen[client] - x  # u = x^{tau_i} - x^t
                kinds.add("older history" if not torch.equal(last_seen[client], x_prev) else "history")
            else:
                u = x_prev - x  # no history: u = x^{t-1} - x^t
                kinds.add("no history")
            e = rho * u / u.norm() if t > 0 else u  # e = rho u / ||u|| (one global norm)
            y = x.clone()
            losses = []
            for batch in client_batches(trainer, client, t):
                loss, d = loss_and_grad(y + e, batch)  # d = g(y + e): the only gradient of the step
                y = y - lr * (d + wd * y)
                losses.append(loss)  # train_loss: the loss at the evaluated point y + e
            finals.append(y)
            assert_close(result.model, y)
            assert float(result.train_loss) == pytest.approx(float(torch.stack(losses).mean()), rel=1e-12)
            assert result.uplink_floats == x.numel()
            last_seen[client] = x
        assert_close(after.x, x + server_lr * (torch.stack(finals).mean(0) - x))  # FedAvg server
        assert torch.equal(after.server_state.x_prev, x)
        assert sorted(after.client_states) == sorted(last_seen)
        for client, seen in last_seen.items():
            assert torch.equal(after.client_states[client].x_seen, seen)
        x_prev = x
    assert kinds == {"round 0", "history", "older history", "no history"}


# ----------------------------------------------------------------------------------------------------------
# Dynamic-radius SAM


def test_dynsam_rounds_match_the_equations(tmp_path):
    lr, wd, server_lr = 0.1, 0.01, 0.8
    opts = {"a": 0.1, "b": 0.2, "c": 0.05, "lambda_min": 0.01, "lambda_max": 1.0, "rho_min": 0.001,
            "rho_max": 0.05, "warmup": 3, "history": 3}
    trainer = linear_trainer(tmp_path, "dynsam", opts, lr=lr, weight_decay=wd, server_lr=server_lr)

    def cos(u, v):
        return (u @ v) / (u.norm() * v.norm())

    # What the test keeps per client: every final gradient and the previous participation's statistics.
    finals_g: dict[int, list] = {0: [], 1: []}
    stats: dict[int, tuple] = {}
    used = []
    for t, (before, after, results) in enumerate(run_rounds(trainer, 5)):
        x = before.x
        finals = []
        for client, result in zip((0, 1), results):
            if t < opts["warmup"]:  # participation t (participation 1.0): the first 3 are warm-up
                lam, rho = 0.0, opts["rho_max"]
            else:
                gamma, sigma = stats[client]
                gs = finals_g[client][-opts["history"]:]  # final gradients of the last `history` ones
                angles = torch.stack([torch.arccos(cos(p, q)) for p, q in zip(gs[1:], gs[:-1])])
                tau = angles.std(correction=0)  # std of the angles between consecutive final gradients
                raw = opts["a"] * (1 - gamma) + opts["b"] * sigma + opts["c"] * tau
                lam = min(max(raw, opts["lambda_min"]), opts["lambda_max"])
                rho = max(opts["rho_min"], opts["rho_max"] * math.exp(-lam))
                used.append((lam, rho, len(angles)))
            y = x.clone()
            losses, sharp, grads = [], [], []
            for batch in client_batches(trainer, client, t):
                loss, g = loss_and_grad(y, batch)
                e = rho * g / g.norm()  # e = rho_k g / ||g||
                loss_e, g_e = loss_and_grad(y + e, batch)  # same batch
                d = g + g_e + 2 * lam * (y - x)  # d = g(y) + g(y + e) + 2 lambda_k (y - x^t)
                y = y - lr * (d + wd * y)
                losses.append(loss)
                sharp.append(max(0.0, float(loss_e - loss)))
                grads.append(g)
            finals.append(y)
            assert_close(result.model, y)
            assert float(result.train_loss) == pytest.approx(float(torch.stack(losses).mean()), rel=1e-12)
            assert result.uplink_floats == x.numel()
            # This participation's statistics; gamma = cos(final gradient, gradient at x^t on batch 0).
            gamma = float(cos(grads[-1], grad(x, client_batches(trainer, client, t)[0])))
            sigma = sum(sharp) / len(sharp)
            stats[client] = (gamma, sigma)
            finals_g[client].append(grads[-1])
            state = after.client_states[client]
            assert int(state.count) == t + 1
            assert float(state.gamma) == pytest.approx(gamma, rel=1e-10)
            assert float(state.sigma) == pytest.approx(sigma, rel=1e-10)
            assert_close(state.final_grad, grads[-1])
            gs = finals_g[client][-opts["history"]:]
            kept = [float(torch.arccos(cos(p, q))) for p, q in zip(gs[1:], gs[:-1])]
            newest = state.angles[len(state.angles) - len(kept):]
            assert newest.tolist() == pytest.approx(kept, rel=1e-10)
        assert_close(after.x, x + server_lr * (torch.stack(finals).mean(0) - x))  # FedAvg server
    # Post-warm-up rounds 3 and 4 of both clients used the formula (unclipped, radius above rho_min), with
    # 2 angles each time (history 3: the oldest angle dropped in round 4).
    assert len(used) == 4 and all(opts["lambda_min"] < lam < opts["lambda_max"] for lam, _, _ in used)
    assert all(rho > opts["rho_min"] and n == 2 for _, rho, n in used)


# ----------------------------------------------------------------------------------------------------------
# options and resume


@pytest.mark.parametrize("name, key, value, message", [
    ("fedasam", "rho", -0.1, r"algorithm.rho must be >= 0 \(got -0.1\)"),
    ("fedasam", "eta_a", -1.0, r"algorithm.eta_a must be >= 0 \(got -1.0\)"),
    ("mofedsam", "alpha", 0.0, r"algorithm.alpha must be in \(0, 1\] \(got 0.0\)"),
    ("mofedsam", "rho", -0.1, r"algorithm.rho must be >= 0 \(got -0.1\)"),
    ("fedlesam", "rho", -0.1, r"algorithm.rho must be >= 0 \(got -0.1\)"),
    ("dynsam", "rho_max", 0.0001, r"algorithm.rho_max must be >= rho_min \(0.001\) \(got 0.0001\)"),
    ("dynsam", "lambda_max", 0.001, r"algorithm.lambda_max must be >= lambda_min \(0.01\) \(got 0.001\)"),
    ("dynsam", "b", -0.5, r"algorithm.b must be >= 0 \(got -0.5\)"),
    ("dynsam", "warmup", 0, r"algorithm.warmup must be >= 1 .*\(got 0\)"),
    ("dynsam", "history", 1, r"algorithm.history must be >= 2 .*\(got 1\)"),
])
def test_options_are_validated(name, key, value, message):
    with pytest.raises(LandscapeError, match=message):
        tiny_recipe(algorithm__name=name, **{f"algorithm__{key}": value})


@pytest.mark.parametrize("name, defaults", [
    ("fedasam", {"rho": 0.7, "eta_a": 0.2}),
    ("mofedsam", {"alpha": 0.1, "rho": 0.1}),
    ("fedlesam", {"rho": 0.05}),
    ("dynsam", {"a": 0.4, "b": 0.5, "c": 0.1, "lambda_min": 0.01, "lambda_max": 0.3, "rho_min": 0.001,
                "rho_max": 0.05, "warmup": 3, "history": 5}),
])
def test_reference_defaults(name, defaults):
    options = build_algorithm(tiny_recipe(algorithm__name=name), None).options
    assert {k: getattr(options, k) for k in defaults} == defaults
