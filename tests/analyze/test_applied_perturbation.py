"""Flatness incompatibility with the paper's global objective F = (1/N) sum_i F_i and with each algorithm's own
perturbation (the applied_* figures), against direct float64 computations on a tiny model."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from landscape.analyze.context import registered_algorithm
from landscape.core.errors import LandscapeError
from landscape.core.flat import FlatModel
from landscape.measure.analysis_data import AnalysisData
from landscape.measure.flatness import client_minibatch_indices, flatness_incompatibility
from landscape.measure.incompatibility import ClientMean, algorithm_perturbation
from landscape.measure.objective import Objective
from landscape.train.algorithms import ALGORITHMS

RHO, BATCH, DRAWS, SEED = 0.05, 4, 5, 3
SIZES = (7, 12, 25)  # unequal: the clients' mean F and the size-weighted F differ


@pytest.fixture(scope="module")
def problem():
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3)).double()
    flat = FlatModel(module)
    data = []
    for c, n in enumerate(SIZES):  # each client its own input shift and label mix
        x = torch.randn(n, 5, dtype=torch.float64) + c
        data.append((x, torch.randint(0, 3 if c else 2, (n,))))
    clients = {c: Objective(flat, {}, AnalysisData(x, y, 64)) for c, (x, y) in enumerate(data)}
    union = Objective(flat, {}, AnalysisData(torch.cat([x for x, _ in data]), torch.cat([y for _, y in data]), 64))
    return flat, data, clients, union, flat.vector()


def _grad(flat, x, y, w):
    w = w.detach().clone().requires_grad_(True)
    (g,) = torch.autograd.grad(F.cross_entropy(flat.logits(w, x, {}), y), w)
    return g


def _unit(v):
    n = v.norm()
    return v / n if n > 0 else v


def _direct(flat, data, w, direction=None):
    """Delta_FI and its split at radius RHO from autograd gradients, F = (1/N) sum_i F_i; with ``direction``
    (client, g) -> d the applied perturbations rho d / ||d|| in place of rho g / ||g||."""
    direction = direction or (lambda c, g: g)
    full = [_grad(flat, x, y, w) for x, y in data]
    e_star = RHO * _unit(torch.stack(full).mean(dim=0))
    fi, het, batch, cross = [], [], [], []
    for c, ((x, y), g_i) in enumerate(zip(data, full)):
        a_i = RHO * _unit(direction(c, g_i))
        draws = [RHO * _unit(direction(c, _grad(flat, x[ix], y[ix], w)))
                 for ix in client_minibatch_indices(len(y), BATCH, DRAWS, SEED, c)]
        fi.append(np.mean([float(((a - e_star) ** 2).sum()) for a in draws]))
        het.append(float(((a_i - e_star) ** 2).sum()))
        batch.append(np.mean([float(((a - a_i) ** 2).sum()) for a in draws]))
        cross.append(np.mean([float(torch.dot(a - a_i, a_i - e_star)) for a in draws]))
    return {"incompatibility": np.mean(fi), "heterogeneity": np.mean(het), "batch_part": np.mean(batch),
            "cross": np.mean(cross), "client_incompatibility": np.array(fi), "client_heterogeneity": np.array(het)}


def _measure(problem, applied=None, glob=None, **kw):
    _, _, clients, _, w = problem
    return flatness_incompatibility(glob or ClientMean(clients), clients, w, RHO, batch_size=BATCH, batches=DRAWS,
                                    seed=SEED, applied=applied, **kw)


def _rule(problem, name, server=None, states=None, **options):
    flat, _, clients, _, w = problem
    algorithm = registered_algorithm(name, options, flat, len(clients))
    server = server if server is not None else algorithm.init_server_state(w).named()
    return algorithm_perturbation(algorithm, w, server, states or {}, 1)


def test_the_global_objective_is_the_clients_plain_mean_not_the_size_weighted_union(problem):
    flat, data, clients, union, w = problem
    r = _measure(problem, loss_level=True)
    losses = [float(F.cross_entropy(flat.logits(w, x, {}), y)) for x, y in data]
    assert r.global_loss == pytest.approx(np.mean(losses), rel=1e-13)
    mean_grad = torch.stack([_grad(flat, x, y, w) for x, y in data]).mean(dim=0)
    assert r.global_gradient_norm == pytest.approx(float(mean_grad.norm()), rel=1e-12)
    direct = _direct(flat, data, w)
    for key in ("incompatibility", "heterogeneity", "batch_part", "cross"):
        assert getattr(r, key) == pytest.approx(direct[key], rel=1e-11, abs=1e-16), key
    # the loss level uses the same F: F(x + e*) = (1/N) sum_i F_i(x + e*)
    e_star = RHO * _unit(mean_grad)
    moved = np.mean([float(F.cross_entropy(flat.logits(w + e_star, x, {}), y)) for x, y in data])
    assert r.perturbed_global_loss == pytest.approx(moved, rel=1e-13)
    # the size-weighted F is another quantity: the sizes weight the clients
    weighted = _measure(problem, glob=union)
    size_mean = np.average(losses, weights=SIZES)
    assert weighted.global_loss == pytest.approx(size_mean, rel=1e-13)
    assert abs(weighted.global_loss - r.global_loss) > 1e-3 * r.global_loss
    assert abs(weighted.incompatibility - r.incompatibility) > 1e-6


def test_perturbation_level_heterogeneity_share(problem):
    r = _measure(problem)
    assert r.perturbation_heterogeneity_share == pytest.approx(r.heterogeneity / (r.heterogeneity + r.batch_part),
                                                               rel=1e-15)
    gradient = r.gradient_heterogeneity / (r.gradient_heterogeneity + r.gradient_noise)
    assert r.heterogeneity_share == pytest.approx(gradient, rel=1e-15)  # the gradient-level one keeps its name
    assert r.perturbation_heterogeneity_share != pytest.approx(r.heterogeneity_share, rel=1e-3)


@pytest.mark.parametrize("name", ["fedsam", "mofedsam", "fedgamma", "dynsam", "fednsam-code"])
def test_a_rule_that_perturbs_along_the_local_gradient_gives_the_plain_figures_exactly(problem, name):
    r = _measure(problem, _rule(problem, name))
    assert r.applied_rule == name and r.applied_note == ""
    for key in ("incompatibility", "incompatibility_se", "heterogeneity", "batch_part", "batch_part_se", "cross",
                "cross_se", "perturbation_heterogeneity_share"):
        assert getattr(r, f"applied_{key}") == getattr(r, key), key
    for key in ("incompatibility", "heterogeneity", "batch_part", "cross"):
        np.testing.assert_array_equal(getattr(r, f"client_applied_{key}"), getattr(r, f"client_{key}"))
    np.testing.assert_array_equal(r.applied_incompatibility_samples, r.incompatibility_samples)


def _check_applied(r, direct):
    for key in ("incompatibility", "heterogeneity", "batch_part", "cross"):
        assert getattr(r, f"applied_{key}") == pytest.approx(direct[key], rel=1e-11, abs=1e-16), key
    np.testing.assert_allclose(r.client_applied_incompatibility, direct["client_incompatibility"], rtol=1e-11)
    np.testing.assert_allclose(r.client_applied_heterogeneity, direct["client_heterogeneity"], rtol=1e-11,
                               atol=1e-16)
    assert r.applied_incompatibility == pytest.approx(
        r.applied_heterogeneity + r.applied_batch_part + 2 * r.applied_cross, abs=1e-14)
    assert r.applied_perturbation_heterogeneity_share == pytest.approx(
        r.applied_heterogeneity / (r.applied_heterogeneity + r.applied_batch_part), rel=1e-15)


def test_fedvssam_perturbs_along_the_steered_direction(problem):
    flat, data, _, _, w = problem
    h = 0.3 * torch.randn(w.numel(), generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    r = _measure(problem, _rule(problem, "fedvssam", {"h": h}, gamma_l=0.4))
    _check_applied(r, _direct(flat, data, w, lambda c, g: 0.6 * h + 0.4 * g))  # h_i = (1 - gamma_l) h + gamma_l g
    assert r.applied_incompatibility != pytest.approx(r.incompatibility, rel=1e-3)
    # h = 0 (its first round): FedSAM's direction, scaled by gamma_l, so the plain figures
    first = _measure(problem, _rule(problem, "fedvssam"))
    assert first.applied_incompatibility == pytest.approx(first.incompatibility, rel=1e-14)


def test_fednsam_perturbs_along_minus_the_global_momentum(problem):
    flat, data, _, _, w = problem
    m = torch.randn(w.numel(), generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    r = _measure(problem, _rule(problem, "fednsam", {"m": m}))
    _check_applied(r, _direct(flat, data, w, lambda c, g: -m))
    assert r.applied_batch_part == 0 and r.applied_cross == 0  # one perturbation for every client and draw
    e_star = RHO * _unit(torch.stack([_grad(flat, x, y, w) for x, y in data]).mean(dim=0))
    assert r.applied_incompatibility == pytest.approx(float(((-RHO * _unit(m) - e_star) ** 2).sum()), rel=1e-12)
    plain = _measure(problem, _rule(problem, "fednsam"))  # m = 0: the FedSAM step
    assert plain.applied_incompatibility == plain.incompatibility


def test_fedsmoo_and_fedlesam_read_the_server_and_each_clients_state(problem):
    flat, data, _, _, w = problem
    gen = torch.Generator().manual_seed(3)
    s, mu0, h0 = (0.1 * torch.randn(w.numel(), generator=gen, dtype=torch.float64) for _ in range(3))
    states = {0: {"mu": mu0, "h": h0}}  # clients 1 and 2: first participation, mu_i = 0
    r = _measure(problem, _rule(problem, "fedsmoo", {"s": s, "h_sum": h0}, states))
    _check_applied(r, _direct(flat, data, w, lambda c, g: g - ((mu0 if c == 0 else 0 * g) + s)))
    x_prev, seen = w + 0.2 * torch.randn(w.numel(), generator=gen, dtype=torch.float64), w - 0.1
    r = _measure(problem, _rule(problem, "fedlesam", {"x_prev": x_prev}, {2: {"x_seen": seen}}))
    _check_applied(r, _direct(flat, data, w, lambda c, g: (seen if c == 2 else x_prev) - w))
    assert r.applied_batch_part == 0  # the estimate does not depend on the minibatch


def test_fedasam_perturbs_along_t_squared_g(problem):
    flat, data, _, _, w = problem
    t = torch.cat([(p.abs() + 0.2) if name.endswith("weight") else torch.ones_like(p)  # T on weights, 1 on biases
                   for name, p in zip(flat.names, _split(flat, w))])
    r = _measure(problem, _rule(problem, "fedasam", eta_a=0.2))
    _check_applied(r, _direct(flat, data, w, lambda c, g: t * t * g))


def _split(flat, w):
    out, at = [], 0
    for shape in flat.shapes:
        n = math.prod(shape)
        out.append(w[at:at + n])
        at += n
    return out


@pytest.mark.parametrize("name", ["fedavg", "fedprox", "scaffold", "fedacg"])
def test_a_rule_without_perturbation_has_no_applied_figures_and_says_why(problem, name):
    r = _measure(problem, _rule(problem, name))
    assert r.applied_rule == name and r.applied_note == f"{name} applies no perturbation"
    assert math.isnan(r.applied_incompatibility) and np.isnan(r.client_applied_incompatibility).all()
    assert r.applied_incompatibility_samples.shape == r.incompatibility_samples.shape
    plain = _measure(problem)
    assert plain.applied_rule == "" and "plain SAM" in plain.applied_note and plain.incompatibility == r.incompatibility


def test_every_registered_rule_is_classified():
    """A new algorithm is added to one of the lists above (or a test of its own) with its perturbation."""
    covered = {"fedsam", "mofedsam", "fedgamma", "dynsam", "fednsam-code", "fedvssam", "fednsam", "fedsmoo",
               "fedlesam", "fedasam", "fedavg", "fedprox", "scaffold", "fedacg"}
    assert set(ALGORITHMS.names()) <= covered


def test_states_that_do_not_fit_are_one_line_errors(problem):
    with pytest.raises(LandscapeError, match=r"^a state fedvssam does not keep \('m' is not one of"):
        _rule(problem, "fedvssam", {"m": torch.zeros(3)})
    with pytest.raises(LandscapeError, match=r"^the state lacks 'h', which fedvssam keeps$"):
        _rule(problem, "fedvssam", {})
    with pytest.raises(LandscapeError, match=r"^fedvssam's state does not fit the model: "):
        _measure(problem, _rule(problem, "fedvssam", {"h": torch.zeros(3, dtype=torch.float64)}))
    with pytest.raises(LandscapeError, match=r"^unknown algorithm 'nope'"):
        _rule(problem, "nope")
