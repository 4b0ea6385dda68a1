"""FedProx, SCAFFOLD, FedGAMMA and FedACG: float64 rounds against the equations of ALGORITHMS.md (evaluated
here with the hand-written gradient), their reductions and option checks."""

import pytest
import torch
from support.algorithm_checks import (
    DIM,
    assert_close,
    client_batches,
    grad,
    linear_trainer,
    loss_and_grad,
    run_rounds,
)
from support.helpers import tiny_recipe

from landscape.core.errors import LandscapeError
from landscape.train import schedule
from landscape.train.algorithms import build_algorithm
from landscape.train.state import TrainerState

LR, WD = 0.3, 0.01  # the trainer's constant client lr and weight decay in every equation test
REDUCTION = {"clients": 4, "participation": 0.5, "server_lr": 0.8}  # the reduction runs: 3 rounds of these


def clip(d: torch.Tensor, clip_norm: float) -> torch.Tensor:
    """clip(d) = d * min(1, c / (||d|| + 1e-12)); no clipping when c = 0."""
    if clip_norm == 0:
        return d
    return d * min(1.0, clip_norm / (d.norm().item() + 1e-12))


def local_steps(trainer, client: int, t: int, start: torch.Tensor, direction, clip_norm: float = 0.0):
    """y_{k+1} = y_k - eta * (clip(d(y_k, B_k)) + wd * y_k) over the client's batches of round t.

    Returns (y_K, mean loss at the descent points, whether clipping changed any d)."""
    y, losses, clipped = start.clone(), [], False
    for batch in client_batches(trainer, client, t):
        loss, d = direction(y, batch)
        clipped |= clip_norm > 0 and d.norm().item() > clip_norm
        y = y - LR * (clip(d, clip_norm) + WD * y)
        losses.append(loss)
    return y, torch.stack(losses).mean(), clipped


def final_x(name: str, options: dict, tmp_path, rounds: int = 3, **kw) -> TrainerState:
    return run_rounds(linear_trainer(tmp_path / name, name, options, **kw), rounds)[-1][1]


# ----------------------------------------------------------------------------------------------------------
# FedProx


@pytest.mark.parametrize("clip_norm", [0.0, 2.0])
def test_fedprox_rounds_match_the_equations(tmp_path, clip_norm):
    mu, server_lr = 0.1, 0.8
    trainer = linear_trainer(tmp_path, "fedprox", {"mu": mu}, lr=LR, weight_decay=WD, server_lr=server_lr,
                             clip_norm=clip_norm)
    history = run_rounds(trainer, 2)
    x = history[0][0].x.clone()
    any_clipped = False
    for t, (_, after, results) in enumerate(history):
        finals = []
        for client, result in zip((0, 1), results):
            def direction(y, batch, x=x):
                loss, g = loss_and_grad(y, batch)
                return loss, g + mu * (y - x)  # FedProx: d = g(y_k) + mu (y_k - x^t)

            y, loss, clipped = local_steps(trainer, client, t, x, direction, clip_norm)
            any_clipped |= clipped
            finals.append(y)
            assert result.client == client
            assert_close(result.model, y)
            assert_close(result.upload.model, y)
            assert result.uplink_floats == DIM and result.state is None
            assert float(result.train_loss) == pytest.approx(float(loss), rel=1e-12)
        x = x + server_lr * (torch.stack(finals).mean(0) - x)  # server: FedAvg
        assert_close(after.x, x)
    assert any_clipped == (clip_norm > 0)  # the clipped case really clips d (proximal term included)


def test_fedprox_with_mu_zero_is_fedavg(tmp_path):
    # Same arithmetic: mu * (y - x) = 0 exactly, g + 0 = g, and the server is FedAvg's: bit for bit.
    a = final_x("fedprox", {"mu": 0.0}, tmp_path, **REDUCTION).x
    b = final_x("fedavg", {}, tmp_path, **REDUCTION).x
    assert_close(a, b)
    assert torch.equal(a, b)


def test_fedprox_options():
    with pytest.raises(LandscapeError, match=r"algorithm.mu must be >= 0 \(got -0.5\)"):
        tiny_recipe(algorithm__name="fedprox", algorithm__mu=-0.5)
    assert build_algorithm(tiny_recipe(algorithm__name="fedprox"), None).options.mu == 0.01


# ----------------------------------------------------------------------------------------------------------
# SCAFFOLD and FedGAMMA (SAM + SCAFFOLD control variates)


@pytest.mark.parametrize("name, rho", [("scaffold", None), ("fedgamma", 0.05)])
def test_control_variate_rounds_match_the_equations(tmp_path, name, rho):
    clients, server_lr, rounds = 4, 0.8, 3
    trainer = linear_trainer(tmp_path, name, {} if rho is None else {"rho": rho}, clients=clients,
                             participation=0.5, lr=LR, weight_decay=WD, server_lr=server_lr)
    history = run_rounds(trainer, rounds)
    x = history[0][0].x.clone()
    c = torch.zeros_like(x)  # server control variate, 0 at the start
    c_clients: dict[int, torch.Tensor] = {}  # c_i of the clients that took part before
    with_state, without_state = 0, 0
    for t, (_, after, results) in enumerate(history):
        sampled = schedule.sample_clients(trainer.recipe.seed, t, clients, 2)
        assert [r.client for r in results] == sampled
        finals, dcs = [], []
        for client, result in zip(sampled, results):
            if client in c_clients:
                with_state += 1
            else:
                without_state += 1
            c_i = c_clients.get(client, torch.zeros_like(x))

            def direction(y, batch, c=c, c_i=c_i):
                loss, g = loss_and_grad(y, batch)
                if rho is None:
                    d = g  # SCAFFOLD: g(y_k)
                else:
                    e = rho * g / g.norm()  # FedGAMMA: e = rho g / ||g|| from the local gradient
                    d = grad(y + e, batch)  # g(y_k + e), same batch
                return loss, d - c_i + c  # d = ... - c_i + c

            y, loss, _ = local_steps(trainer, client, t, x, direction)
            k = len(client_batches(trainer, client, t))
            c_i_new = c_i - c + (x - y) / (k * LR)  # option II: c_i+ = c_i - c + (x^t - y_K) / (K eta)
            assert_close(result.model, y)
            assert_close(result.upload.model, y)
            assert_close(result.upload.dc, c_i_new - c_i)
            assert_close(result.state.c_i, c_i_new)
            assert result.uplink_floats == 2 * DIM  # y_{i,K} and c_i+ - c_i
            assert float(result.train_loss) == pytest.approx(float(loss), rel=1e-12)
            finals.append(y)
            dcs.append(c_i_new - c_i)
            c_clients[client] = c_i_new
        x = x + server_lr * (torch.stack(finals).mean(0) - x)  # x += eta_g Delta_bar
        c = c + torch.stack(dcs).sum(0) / clients  # c += (1/N) sum_S (c_i+ - c_i), N = all clients
        assert_close(after.x, x)
        assert_close(after.server_state.c, c)
        assert sorted(after.client_states) == sorted(c_clients)  # non-sampled clients keep theirs
        for i, c_i in c_clients.items():
            assert_close(after.client_states[i].c_i, c_i)
    assert with_state > 0 and without_state > 0  # both first participations and returning clients occurred


def test_fedgamma_with_rho_zero_is_scaffold(tmp_path):
    # Same arithmetic: e = 0 * g/||g|| = 0 exactly, g(y + 0) = g(y), same correction and server: bit for bit.
    a = final_x("fedgamma", {"rho": 0.0}, tmp_path, **REDUCTION)
    b = final_x("scaffold", {}, tmp_path, **REDUCTION)
    assert_close(a.x, b.x)
    assert torch.equal(a.x, b.x)
    assert torch.equal(a.server_state.c, b.server_state.c)
    assert a.client_states.keys() == b.client_states.keys()
    assert all(torch.equal(a.client_states[i].c_i, b.client_states[i].c_i) for i in a.client_states)


def test_fedgamma_and_scaffold_options():
    with pytest.raises(LandscapeError, match=r"algorithm.rho must be >= 0 \(got -0.01\)"):
        tiny_recipe(algorithm__name="fedgamma", algorithm__rho=-0.01)
    assert build_algorithm(tiny_recipe(algorithm__name="fedgamma"), None).options.rho == 0.01
    with pytest.raises(LandscapeError, match="unknown recipe key 'algorithm.rho'"):
        tiny_recipe(algorithm__name="scaffold", algorithm__rho=0.1)


# ----------------------------------------------------------------------------------------------------------
# FedACG


@pytest.mark.parametrize("server_lr", [1.0, 0.8])
def test_fedacg_rounds_match_the_equations(tmp_path, server_lr):
    lam, beta = 0.85, 0.05
    trainer = linear_trainer(tmp_path, "fedacg", {"lam": lam, "beta": beta}, lr=LR, weight_decay=WD,
                             server_lr=server_lr)
    history = run_rounds(trainer, 3)
    x = history[0][0].x.clone()
    m = torch.zeros_like(x)
    for t, (_, after, results) in enumerate(history):
        x_tilde = x + lam * m  # lookahead broadcast
        finals = []
        for client, result in zip((0, 1), results):
            def direction(y, batch, x_tilde=x_tilde):
                loss, g = loss_and_grad(y, batch)
                return loss, g + 2 * beta * (y - x_tilde)  # grad of f_i(y) + beta ||y - x~||^2

            y, loss, _ = local_steps(trainer, client, t, x_tilde, direction)  # starts at x~
            finals.append(y)
            assert_close(result.model, y)
            assert_close(result.upload.model, y)
            assert result.uplink_floats == DIM and result.state is None
            assert float(result.train_loss) == pytest.approx(float(loss), rel=1e-12)
        delta_bar = torch.stack(finals).mean(0) - x_tilde
        if server_lr == 1.0:  # the sheet: m = lam m + mean_S(y - x~); x^{t+1} = x^t + m
            m = lam * m + delta_bar
        else:  # eta_g scales the fresh update inside the momentum (module docstring)
            m = lam * m + server_lr * delta_bar
        x_next = x + m
        assert_close(after.x, x_next)
        assert_close(after.server_state.m, m)
        assert_close(after.x, x_tilde + server_lr * delta_bar)  # = a FedAvg server step from x~
        x = x_next


def test_fedacg_with_lam_and_beta_zero_is_fedavg(tmp_path):
    # Same arithmetic: x~ = x + 0*m = x, 2*0*(y - x~) = 0, m = 0*m + eta_g*Delta_bar, x + m: bit for bit
    # (with a server lr != 1, which enters as FedAvg's).
    a = final_x("fedacg", {"lam": 0.0, "beta": 0.0}, tmp_path, **REDUCTION).x
    b = final_x("fedavg", {}, tmp_path, **REDUCTION).x
    assert_close(a, b)
    assert torch.equal(a, b)


def test_fedacg_with_lam_zero_is_fedprox_with_mu_two_beta(tmp_path):
    # The factor 2 of d/dy beta ||y - x~||^2: same arithmetic (mu = 2 * beta as the same float), bit for bit.
    a = final_x("fedacg", {"lam": 0.0, "beta": 0.05}, tmp_path, **REDUCTION).x
    b = final_x("fedprox", {"mu": 2 * 0.05}, tmp_path, **REDUCTION).x
    assert_close(a, b)
    assert torch.equal(a, b)


def test_fedacg_options():
    with pytest.raises(LandscapeError, match=r"algorithm.lam must be in \[0, 1\) \(got 1.0\)"):
        tiny_recipe(algorithm__name="fedacg", algorithm__lam=1.0)
    with pytest.raises(LandscapeError, match=r"algorithm.beta must be >= 0 \(got -0.001\)"):
        tiny_recipe(algorithm__name="fedacg", algorithm__beta=-0.001)
    options = build_algorithm(tiny_recipe(algorithm__name="fedacg"), None).options
    assert (options.lam, options.beta) == (0.85, 1e-3)
