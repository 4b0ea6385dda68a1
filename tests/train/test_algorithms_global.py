"""Rules with a global direction: FedNSAM (paper rule and the public code's rule), FedVSSAM and FedSMOO.

Every round is recomputed here from ALGORITHMS.md with the closed-form gradient of the float64 linear softmax
model; the reductions of the sheet are run side by side (resume: tests/train/test_algorithm_contract.py).
"""

import pytest
import torch
from support.algorithm_checks import (
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

LR, WD = 0.3, 0.01  # the clients' constant lr (linear_trainer's default) and the weight decay used here


def fedsam_step(y, batch, rho):
    """One FedSAM step: e = rho g / ||g||, d = g(y + e), y - eta (d + wd y); and the loss at y."""
    loss, g = loss_and_grad(y, batch)
    d = grad(y + rho * g / g.norm(), batch)
    return y - LR * (d + WD * y), loss


# ----------------------------------------------------------------------------------------------------------
# FedNSAM, the paper's rule


def test_fednsam_rounds_match_the_equations(tmp_path):
    lam, rho, server_lr = 0.5, 0.05, 0.8
    trainer = linear_trainer(tmp_path, "fednsam", {"lam": lam, "rho": rho}, server_lr=server_lr,
                             weight_decay=WD)
    m = torch.zeros(trainer.flat.dim, dtype=torch.float64)  # m^{-1} = 0
    for t, (before, after, results) in enumerate(run_rounds(trainer, 3)):
        x = before.x
        finals = []
        for client, result in zip((0, 1), results):
            y, losses = x.clone(), []
            for batch in client_batches(trainer, client, t):
                if t == 0:  # m = 0: plain FedSAM step
                    y, loss = fedsam_step(y, batch, rho)
                else:
                    y_look = y + lam * m  # y' = y_k + lam m
                    e = -rho * m / m.norm()  # e = -rho m / ||m||
                    loss, d = loss_and_grad(y_look + e, batch)  # d = g(y' + e)
                    y = y - LR * (d + WD * y)  # y_{k+1} = y_k - eta (d + wd y_k)
                losses.append(loss)
            finals.append(y)
            assert_close(result.model, y)
            assert float(result.train_loss) == pytest.approx(float(torch.stack(losses).mean()), rel=1e-12)
            assert result.uplink_floats == x.numel()  # y_{i,K} only
        m = lam * m + (torch.stack(finals).mean(0) - x)  # m^t = lam m^{t-1} + Delta_bar^t (relative to x^t)
        assert_close(after.server_state.m, m)
        assert_close(after.x, x + server_lr * m)  # x^{t+1} = x^t + eta_g m^t (the sheet's rule at eta_g = 1)
        assert after.client_states == {}


def test_fednsam_with_zero_momentum_and_radius_is_fedavg(tmp_path):
    # Same arithmetic: lam m = 0 and e = 0 exactly, so every gradient is g(y_k); the server's
    # 0 * m + Delta_bar is Delta_bar: the runs agree bit for bit.
    a = run_rounds(linear_trainer(tmp_path, "fednsam", {"lam": 0.0, "rho": 0.0}, clients=3,
                                  participation=0.67, server_lr=0.9), 3)
    b = run_rounds(linear_trainer(tmp_path, "fedavg", clients=3, participation=0.67, server_lr=0.9), 3)
    assert torch.equal(a[-1][1].x, b[-1][1].x)
    assert a[1][1].server_state.m.norm() > 0  # rounds 1 and 2 took the momentum branch


def test_fednsam_falls_back_to_fedsam_whenever_the_momentum_is_zero(tmp_path):
    trainer = linear_trainer(tmp_path, "fednsam", {"lam": 0.5, "rho": 0.05}, weight_decay=WD)
    state = trainer.initial_state()
    state.round = 1  # a later round whose momentum is exactly zero
    _, results, _ = trainer.run_round(state)
    for client, result in zip((0, 1), results):
        y = state.x.clone()
        for batch in client_batches(trainer, client, 1):
            y, _ = fedsam_step(y, batch, 0.05)
        assert_close(result.model, y)


def test_fednsam_options_are_checked():
    with pytest.raises(LandscapeError, match=r"algorithm.rho must be >= 0 \(got -0.1\)"):
        tiny_recipe(algorithm__name="fednsam", algorithm__rho=-0.1)
    with pytest.raises(LandscapeError, match=r"algorithm.lam must be in \[0, 1\) \(got 1.0\)"):
        tiny_recipe(algorithm__name="fednsam", algorithm__lam=1.0)
    options = build_algorithm(tiny_recipe(algorithm__name="fednsam"), None).options
    assert (options.lam, options.rho) == (0.85, 0.1)


# ----------------------------------------------------------------------------------------------------------
# FedNSAM as the public code runs it


@pytest.mark.parametrize("server", ["momentum", "latest-revision"])
def test_fednsam_code_rounds_match_the_equations(tmp_path, server):
    lam, rho, server_lr = 0.5, 0.05, 0.8
    trainer = linear_trainer(tmp_path, "fednsam-code", {"lam": lam, "rho": rho, "server": server},
                             server_lr=server_lr, weight_decay=WD)
    m = torch.zeros(trainer.flat.dim, dtype=torch.float64)
    for t, (before, after, results) in enumerate(run_rounds(trainer, 3)):
        x = before.x
        start = x + lam * m  # x~ = x^t + lam m^{t-1}
        finals = []
        for client, result in zip((0, 1), results):
            y, losses = start.clone(), []
            for batch in client_batches(trainer, client, t):
                y, loss = fedsam_step(y, batch, rho)  # local-gradient SAM from x~
                losses.append(loss)
            finals.append(y)
            assert_close(result.model, y)
            assert_close(result.upload.model, y)  # the server forms Delta_i = y - x~
            assert float(result.train_loss) == pytest.approx(float(torch.stack(losses).mean()), rel=1e-12)
        delta_bar = torch.stack(finals).mean(0) - start
        if server == "momentum":
            m = lam * m + delta_bar  # m^t = lam m^{t-1} + Delta_bar^t
        else:
            m = delta_bar if t == 0 else (1 + lam) * delta_bar  # the latest revision's defect
        assert_close(after.server_state.m, m)
        assert_close(after.x, x + server_lr * m)  # x^{t+1} = x^t + eta_g m^t


@pytest.mark.parametrize("server", ["momentum", "latest-revision"])
def test_fednsam_code_without_momentum_is_fedsam(tmp_path, server):
    # Same arithmetic: x~ = x + 0 * m = x, and 0 * m + Delta_bar = (1 + 0) Delta_bar = Delta_bar: bit for bit.
    a = run_rounds(linear_trainer(tmp_path, "fednsam-code", {"lam": 0.0, "rho": 0.05, "server": server},
                                  clients=3, participation=0.67), 3)[-1][1].x
    b = run_rounds(linear_trainer(tmp_path, "fedsam", {"rho": 0.05}, clients=3, participation=0.67), 3)
    b = b[-1][1].x
    assert torch.equal(a, b)


def test_fednsam_code_options_are_checked():
    with pytest.raises(LandscapeError, match=r"algorithm.server must be one of momentum, latest-revision"):
        tiny_recipe(algorithm__name="fednsam-code", algorithm__server="latest")
    with pytest.raises(LandscapeError, match=r"algorithm.rho must be >= 0 \(got -1.0\)"):
        tiny_recipe(algorithm__name="fednsam-code", algorithm__rho=-1.0)
    options = build_algorithm(tiny_recipe(algorithm__name="fednsam-code"), None).options
    assert (options.lam, options.rho, options.server) == (0.85, 0.05, "momentum")


# ----------------------------------------------------------------------------------------------------------
# FedVSSAM


def test_fedvssam_rounds_match_the_equations(tmp_path):
    gamma_l, gamma_g, rho, server_lr = 0.4, 0.6, 0.05, 0.5
    trainer = linear_trainer(tmp_path, "fedvssam", {"gamma_l": gamma_l, "gamma_g": gamma_g, "rho": rho},
                             server_lr=server_lr, weight_decay=WD)
    h = torch.zeros(trainer.flat.dim, dtype=torch.float64)  # h = 0 at t = 0
    for t, (before, after, results) in enumerate(run_rounds(trainer, 3)):
        x = before.x
        finals = []
        for client, result in zip((0, 1), results):
            y, losses = x.clone(), []
            for batch in client_batches(trainer, client, t):
                loss, g = loss_and_grad(y, batch)
                h_i = (1 - gamma_l) * h + gamma_l * g  # LF
                y_tilde = y + rho * h_i / h_i.norm()
                u = (1 - gamma_l) * h + gamma_l * grad(y_tilde, batch)  # LU
                y = y - LR * (u + WD * y)
                losses.append(loss)
            finals.append(y)
            assert_close(result.model, y)
            assert float(result.train_loss) == pytest.approx(float(torch.stack(losses).mean()), rel=1e-12)
            assert result.uplink_floats == x.numel()
        g_new = (x - torch.stack(finals).mean(0)) / (LR * 2)  # g^{t+1} = (x^t - mean_S y_iK) / (eta K)
        h = (1 - gamma_g) * h + gamma_g * g_new  # GU
        assert_close(after.server_state.h, h)
        assert_close(after.x, x - server_lr * h)


def test_fedvssam_averages_per_client_pseudo_gradients_when_step_counts_differ(tmp_path):
    trainer = linear_trainer(tmp_path, "fedvssam", {"gamma_l": 1.0, "gamma_g": 0.6, "rho": 0.05}, steps=0,
                             local_epochs=1, batch=100, server_lr=0.5, partition="dirichlet")
    (before, after, results), = run_rounds(trainer, 1)
    steps = [len(client_batches(trainer, c, 0)) for c in (0, 1)]
    assert steps[0] != steps[1] and [r.num_steps for r in results] == steps
    g_new = torch.stack([(before.x - r.model) / (LR * k) for r, k in zip(results, steps)]).mean(0)
    # h = (1 - gamma_g) 0 + gamma_g mean_S (x - y_i) / (eta K_i)
    assert_close(after.server_state.h, 0.6 * g_new)
    assert_close(after.x, before.x - 0.5 * 0.6 * g_new)


def test_fedvssam_base_with_server_lr_eta_k_is_fedsam(tmp_path):
    # gamma_l = 1 makes every client step a FedSAM step (bit for bit); gamma_g = 1 and eta_g = eta K make the
    # server's x - eta K (x - mean y)/(eta K) = mean y only up to rounding: compared to 1e-10.
    steps = 2
    a = run_rounds(linear_trainer(tmp_path, "fedvssam", {"gamma_l": 1.0, "gamma_g": 1.0, "rho": 0.05},
                                  clients=4, participation=0.5, steps=steps, server_lr=LR * steps,
                                  weight_decay=WD), 3)
    b = run_rounds(linear_trainer(tmp_path, "fedsam", {"rho": 0.05}, clients=4, participation=0.5,
                                  steps=steps, server_lr=1.0, weight_decay=WD), 3)
    assert_close(a[-1][1].x, b[-1][1].x)
    assert not torch.equal(a[-1][1].x, a[0][0].x)


def test_fedvssam_options_are_checked():
    with pytest.raises(LandscapeError, match=r"algorithm.gamma_l must be in \(0, 1\] \(got 0.0\)"):
        tiny_recipe(algorithm__name="fedvssam", algorithm__gamma_l=0.0)
    with pytest.raises(LandscapeError, match=r"algorithm.gamma_g must be in \(0, 1\] \(got 1.5\)"):
        tiny_recipe(algorithm__name="fedvssam", algorithm__gamma_g=1.5)
    with pytest.raises(LandscapeError, match=r"algorithm.rho must be >= 0 \(got -0.05\)"):
        tiny_recipe(algorithm__name="fedvssam", algorithm__rho=-0.05)
    options = build_algorithm(tiny_recipe(algorithm__name="fedvssam"), None).options
    assert (options.gamma_l, options.gamma_g, options.rho) == (0.4, 0.6, 0.05)


# ----------------------------------------------------------------------------------------------------------
# FedSMOO


@pytest.mark.parametrize("server_lr", [1.0, 0.7])
def test_fedsmoo_rounds_match_the_equations(tmp_path, server_lr):
    rho, lam, n = 0.1, 0.1, 4
    trainer = linear_trainer(tmp_path, "fedsmoo", {"rho": rho, "lam": lam}, clients=n, participation=0.5,
                             server_lr=server_lr, weight_decay=WD)
    zeros = torch.zeros(trainer.flat.dim, dtype=torch.float64)
    mu, h, s = {i: zeros for i in range(n)}, {i: zeros for i in range(n)}, zeros
    seen, visits = set(), 0
    for t, (before, after, results) in enumerate(run_rounds(trainer, 3)):
        x = before.x
        finals, mus = [], []
        for result in results:
            i = result.client
            y, mu_i, losses = x.clone(), mu[i], []
            for batch in client_batches(trainer, i, t):
                loss, g = loss_and_grad(y, batch)
                g_dual = g - (mu_i + s)  # g' = g - (mu_i + s)
                e = rho * g_dual / g_dual.norm()
                mu_i = mu_i + e - s  # mu_i += e - s
                d = grad(y + e, batch) + lam * (y - x + h[i]) + WD * y
                y = y - LR * d
                losses.append(loss)
            mu[i], h[i] = mu_i, h[i] + (y - x)  # h_i += Delta_i
            finals.append(y)
            mus.append(mu_i)
            assert_close(result.model, y)
            assert_close(result.state.mu, mu_i)
            assert_close(result.state.h, h[i])
            assert_close(result.upload.mu, mu_i)
            assert result.uplink_floats == 2 * x.numel()  # y_{i,K} and mu_i
            assert float(result.train_loss) == pytest.approx(float(torch.stack(losses).mean()), rel=1e-12)
        visits += len(results)
        seen |= {r.client for r in results}
        mean_mu = torch.stack(mus).mean(0)
        s = rho * mean_mu / mean_mu.norm()  # s = rho mean_S(mu_i) / ||mean_S(mu_i)||
        y_bar = torch.stack(finals).mean(0)
        h_bar = torch.stack([h[i] for i in range(n)]).mean(0)  # mean over all N (zeros: never sampled)
        assert_close(after.x, x + server_lr * (y_bar - x) + h_bar)  # at eta_g = 1: mean_S(y_iK) + mean_N(h_i)
        assert_close(after.server_state.s, s)
        assert_close(after.server_state.h_sum, n * h_bar)
        assert sorted(after.client_states) == sorted(seen)
        for i in seen:
            assert_close(after.client_states[i].mu, mu[i])
            assert_close(after.client_states[i].h, h[i])
    # A client came back with its state (mu_i, h_i) and one was never sampled (h_i = 0 in mean_N).
    assert len(seen) < visits and len(seen) < n


def test_fedsmoo_options_are_checked():
    with pytest.raises(LandscapeError, match=r"algorithm.rho must be >= 0 \(got -0.1\)"):
        tiny_recipe(algorithm__name="fedsmoo", algorithm__rho=-0.1)
    with pytest.raises(LandscapeError, match=r"algorithm.lam must be >= 0 \(got -1.0\)"):
        tiny_recipe(algorithm__name="fedsmoo", algorithm__lam=-1.0)
    options = build_algorithm(tiny_recipe(algorithm__name="fedsmoo"), None).options
    assert (options.rho, options.lam) == (0.1, 0.1)
