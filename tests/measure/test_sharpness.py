"""rho-ball sharpness: exact values on quadratics, the SAM / ASAM first step, the adaptive ball, local vs global."""

import dataclasses

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from support.problems import digits_clients

from landscape.core.errors import LandscapeError
from landscape.core.flat import FlatModel
from landscape.data.datasets import load_dataset
from landscape.measure.analysis_data import AnalysisData
from landscape.measure.gradient_cache import GradientCache
from landscape.measure.objective import Objective
from landscape.measure.sharpness import (
    asam_weight_mask,
    local_sharpness,
    rho_sharpness,
    sharpness_profile,
)
from landscape.models import build_model


class Quadratic:
    """F(w) = 0.5 w^T A w + b^T w, exactly: the Objective methods the sharpness functions use."""

    def __init__(self, a: torch.Tensor, b: torch.Tensor) -> None:
        self.a, self.b = a, b

    def loss(self, w):
        return (0.5 * w @ self.a @ w + self.b @ w).double()

    def loss_and_grad(self, w):
        return self.loss(w), self.a @ w + self.b


def _spd(eigenvalues, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(len(eigenvalues), len(eigenvalues), generator=g, dtype=torch.float64))
    return q @ torch.diag(torch.tensor(eigenvalues, dtype=torch.float64)) @ q.T


def _trust_region_max(a, g, rho):
    """max_{||e|| <= rho} 0.5 e^T A e + g^T e, independently: e = (mu I - A)^{-1} g with ||e|| = rho, mu > lambda_max
    (bisection on the secular equation; A positive definite, so the maximum lies on the sphere)."""
    lam, v = torch.linalg.eigh(a)
    c = v.T @ g

    def norm(mu):
        return float(torch.sqrt(((c / (mu - lam)) ** 2).sum()))

    lo, hi = float(lam[-1]) + 1e-14, float(lam[-1]) + float(g.norm()) / rho + 1.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if norm(mid) > rho else (lo, mid)
    e = v @ (c / (0.5 * (lo + hi) - lam))
    return float(0.5 * e @ a @ e + g @ e)


def test_quadratic_at_the_minimum_gives_rho_squared_lambda_max_over_two():
    a = _spd([4.0, 2.0, 1.0, 0.5, 0.25, 0.1])
    b = torch.linspace(-1, 1, 6, dtype=torch.float64)
    quad = Quadratic(a, b)
    w_min = -torch.linalg.solve(a, b)
    for rho in (0.01, 0.1, 1.0):
        exact = rho**2 * 4.0 / 2
        r = rho_sharpness(quad, w_min, rho, starts=1)
        assert r.sharpness == pytest.approx(exact, rel=1e-3) and r.ascent_converged and not r.stalled
        assert r.sharpness <= exact * (1 + 1e-9)  # a lower bound of the true maximum
        assert r.perturbation_norm == pytest.approx(rho, rel=1e-12) and r.ball_fraction == pytest.approx(1.0)
        assert r.steps_used < 50  # the stop came early
        # the centre's gradient, and each trial's loss or loss and gradient (the eager Quadratic computes every
        # gradient, but one is only counted where the ascent used it)
        assert r.gradient_evaluations + r.loss_evaluations == r.steps_used + 1


def test_zero_gradient_takes_the_seeded_direction_and_still_converges():
    a = _spd([3.0, 1.0, 0.5])
    quad = Quadratic(a, torch.zeros(3, dtype=torch.float64))
    w = torch.zeros(3, dtype=torch.float64)  # the exact minimum: grad F = 0 exactly
    r1 = rho_sharpness(quad, w, 0.2, steps=1, starts=1, seed=3)
    assert r1.gradient_norm == 0.0 and r1.perturbation_norm == pytest.approx(0.2, rel=1e-12)
    assert r1.sharpness > 0
    r = rho_sharpness(quad, w, 0.2, starts=1, seed=3)
    assert r.sharpness == pytest.approx(0.2**2 * 3.0 / 2, rel=1e-3)
    one = rho_sharpness(quad, w, 0.2, steps=1, starts=1, seed=3)
    assert one.sharpness == r1.sharpness and one.perturbed_loss == r1.perturbed_loss  # deterministic given the seed
    assert rho_sharpness(quad, w, 0.2, steps=1, starts=1, seed=4).sharpness != r1.sharpness


def test_quadratic_away_from_the_minimum_matches_the_trust_region_solution():
    a = _spd([5.0, 2.0, 1.0, 0.3], seed=1)
    b = torch.tensor([0.3, -0.2, 0.5, 0.1], dtype=torch.float64)
    quad = Quadratic(a, b)
    w = torch.tensor([0.2, 0.1, -0.4, 0.3], dtype=torch.float64)
    g = a @ w + b
    for rho in (0.05, 0.3, 1.0):
        exact = _trust_region_max(a, g, rho)
        r = rho_sharpness(quad, w, rho)
        assert r.sharpness == pytest.approx(exact, rel=1e-3) and r.ascent_converged
        assert r.sharpness <= exact * (1 + 1e-9)


def test_quadratic_profile_is_non_negative_and_non_decreasing():
    a = _spd([2.0, 1.0, 0.5, 0.1], seed=2)
    quad = Quadratic(a, torch.tensor([0.1, 0.0, -0.3, 0.2], dtype=torch.float64))
    w = torch.tensor([0.5, -0.5, 0.2, 0.0], dtype=torch.float64)
    p = sharpness_profile(quad, w, [0.0125, 0.025, 0.05, 0.1, 0.2, 0.4], steps=20, starts=3)
    assert (p.sharpness > 0).all()
    assert (np.diff(p.sharpness) > 0).all()
    assert p.ascent_values.shape == (6, 3, 20) and p.start_sharpness.shape == (6, 3)
    used = (~np.isnan(p.ascent_values)).sum(axis=2)  # trial points of each ascent
    capped = (used == 20).sum()  # an ascent that ran to the cap takes a loss only at its last trial
    assert p.gradient_evaluations + p.loss_evaluations == 1 + 6 * 2 + used.sum()  # centre, 2 random starts each
    assert p.loss_evaluations >= capped  # a capped ascent's last trial, and every rejected trial


def test_progress_counts_every_trial_and_the_budget_an_ascent_leaves_or_takes_from_the_cache():
    """``advance`` hears 1 per trial point evaluated and, for an ascent stopped early, the trials it left; an
    ascent taken from the cache counts its whole budget: the count always ends at rhos x starts x steps."""
    quad = Quadratic(_spd([2.0, 1.0, 0.5, 0.1], seed=2), torch.tensor([0.1, 0.0, -0.3, 0.2], dtype=torch.float64))
    w = torch.tensor([0.5, -0.5, 0.2, 0.0], dtype=torch.float64)
    rhos, starts, steps = [0.05, 0.1, 0.4], 3, 20
    heard: list[int] = []
    p = sharpness_profile(quad, w, rhos, steps=steps, starts=starts, advance=heard.append)
    trials = int((~np.isnan(p.ascent_values)).sum())
    assert sum(heard) == len(rhos) * starts * steps and heard.count(1) == trials
    assert trials < len(rhos) * starts * steps  # some ascents stopped early (converged), their rest counted
    uncounted = sharpness_profile(quad, w, rhos, steps=steps, starts=starts)
    assert np.array_equal(uncounted.sharpness, p.sharpness)  # counting changes no number
    cache = GradientCache(w)
    first: list[int] = []
    sharpness_profile(quad, w, rhos, steps=steps, starts=starts, gradients=cache, advance=first.append)
    again: list[int] = []
    sharpness_profile(quad, w, rhos, steps=steps, starts=starts, gradients=cache, advance=again.append)
    assert first == heard and again == [starts * steps] * len(rhos)


def test_estimate_keeps_the_best_iterate_and_never_drops_below_the_centre():
    # Concave quadratic: every move away from the maximum at w lowers F, so S_rho = 0 with e* = 0.
    quad = Quadratic(-_spd([1.0, 2.0]), torch.zeros(2, dtype=torch.float64))
    r = rho_sharpness(quad, torch.zeros(2, dtype=torch.float64), 0.5, steps=3, starts=1)
    assert (r.ascent_values < 0).all()
    assert r.sharpness == 0.0 and r.best_step == 0 and r.perturbation_norm == 0.0
    assert r.perturbed_loss == r.loss


# ----------------------------------------------------------------------------------------------------------
# a real model: an MLP on digits (float64), a few clients


@pytest.fixture(scope="module")
def digits():
    return digits_clients(clients=3, alpha=0.5)


def _direct_loss_and_grad(flat, data, w):
    w = w.detach().clone().requires_grad_(True)
    loss = F.cross_entropy(flat.logits(w, data.x, {}), data.y)
    (g,) = torch.autograd.grad(loss, w)
    return loss.detach().double(), g


def test_one_step_is_the_sam_formula(digits):
    flat, glob, _, w = digits
    rho = 0.05
    f0, g = _direct_loss_and_grad(flat, glob.data, w)
    e = rho * g / g.norm()
    expected = F.cross_entropy(flat.logits(w + e, glob.data.x, {}), glob.data.y).double() - f0
    r = rho_sharpness(glob, w, rho, steps=1, starts=1)
    assert r.ascent_values[0, 0] == pytest.approx(float(expected), rel=1e-10)
    assert r.sharpness == pytest.approx(float(expected), rel=1e-10) and r.best_step == 1
    assert r.loss == pytest.approx(float(f0), rel=1e-12)
    assert r.perturbation_norm == pytest.approx(rho, rel=1e-12)


def test_real_model_sharpness_is_positive_and_rises_with_rho(digits):
    _, glob, _, w = digits
    p = sharpness_profile(glob, w, [0.01, 0.05, 0.2, 0.5], steps=5, starts=1)
    assert (p.ascent_values[:, 0, 0] > 0).all()  # the SAM step itself raises the loss at every radius
    assert (p.sharpness > 0).all() and (np.diff(p.sharpness) > 0).all()
    assert (p.best_step >= 1).all()
    one = sharpness_profile(glob, w, [0.01, 0.05, 0.2, 0.5], steps=1, starts=1)
    assert (p.sharpness >= one.sharpness - 1e-15).all()  # more steps never lower the estimate
    np.testing.assert_allclose(p.perturbation_norm, p.rhos, rtol=1e-10)


def test_adaptive_step_is_asam_and_stays_in_the_scaled_ball(digits):
    flat, glob, _, w = digits
    rho, eta = 0.5, 0.01
    t = w.abs() + eta
    f0, g = _direct_loss_and_grad(flat, glob.data, w)
    e = rho * t * t * g / (t * g).norm()  # ASAM (Kwon et al. 2021): e = rho T^2 g / ||T g||
    expected = F.cross_entropy(flat.logits(w + e, glob.data.x, {}), glob.data.y).double() - f0
    r = rho_sharpness(glob, w, rho, steps=1, starts=1, adaptive=True, eta=eta)
    assert r.sharpness == pytest.approx(float(expected), rel=1e-10)
    assert r.perturbation_norm == pytest.approx(float(e.norm()), rel=1e-10)
    assert r.adaptive_norm == pytest.approx(rho, rel=1e-12) and r.scaled_parameters == w.numel()
    for steps in (1, 4):
        r = rho_sharpness(glob, w, rho, steps=steps, starts=2, adaptive=True, eta=eta)
        assert r.adaptive_norm <= rho * (1 + 1e-12)
        assert r.perturbation_norm <= rho * float(t.max()) * (1 + 1e-12)


def test_adaptive_with_large_eta_is_plain_sharpness_on_a_scaled_ball(digits):
    # T = |x| + eta ~ eta for eta >> |x|, so {||e / T|| <= rho / eta} ~ {||e|| <= rho}.
    _, glob, _, w = digits
    eta = 1e7
    plain = rho_sharpness(glob, w, 0.1, steps=3, starts=2)
    scaled = rho_sharpness(glob, w, 0.1 / eta, steps=3, starts=2, adaptive=True, eta=eta)
    assert scaled.sharpness == pytest.approx(plain.sharpness, rel=1e-5)
    assert scaled.perturbation_norm == pytest.approx(plain.perturbation_norm, rel=1e-5)


def test_weight_mask_keeps_biases_unscaled(digits):
    flat, glob, _, w = digits
    mask = asam_weight_mask(flat)
    weights = sum(n for name, n in zip(flat.names, flat.numels) if name.endswith("weight"))
    assert int(mask.sum()) == weights < w.numel()
    rho, eta = 0.3, 0.05
    t = torch.where(mask.bool(), w.abs() + eta, torch.ones_like(w))
    f0, g = _direct_loss_and_grad(flat, glob.data, w)
    e = rho * t * t * g / (t * g).norm()
    expected = F.cross_entropy(flat.logits(w + e, glob.data.x, {}), glob.data.y).double() - f0
    r = rho_sharpness(glob, w, rho, steps=1, starts=1, adaptive=True, eta=eta, weight_mask=mask)
    assert r.sharpness == pytest.approx(float(expected), rel=1e-10) and r.scaled_parameters == weights


def test_local_sharpness_per_client_and_gap(digits):
    _, glob, clients, w = digits
    res = local_sharpness(clients, glob, w, 0.05, steps=4, starts=2)
    assert res.clients == [0, 1, 2]
    for k, c in enumerate(res.clients):
        single = rho_sharpness(clients[c], w, 0.05, steps=4, starts=2)
        assert res.client_sharpness[k] == single.sharpness and res.client_loss[k] == single.loss
        assert res.client_ascent_converged[k] == single.ascent_converged
        assert res.client_maximum_agreed[k] == single.maximum_agreed
        assert res.client_start_spread[k] == single.start_spread and res.client_steps_used[k] == single.steps_used
    assert res.global_sharpness == rho_sharpness(glob, w, 0.05, steps=4, starts=2).sharpness
    assert res.gap == pytest.approx(res.client_sharpness.mean() - res.global_sharpness, abs=1e-15)
    np.testing.assert_allclose(res.client_gap, res.client_sharpness - res.global_sharpness, atol=1e-15)
    expected_se = res.client_sharpness.std(ddof=1) / np.sqrt(3)
    assert res.mean_local_sharpness_se == pytest.approx(expected_se, rel=1e-12)
    assert (res.client_sharpness > 0).all()


class Eager:
    """An objective with only ``loss`` and ``loss_and_grad``: every trial's gradient computed at once."""

    def __init__(self, objective):
        self.objective = objective

    def loss(self, w):
        return self.objective.loss(w)

    def loss_and_grad(self, w):
        return self.objective.loss_and_grad(w)


class Deferred(Eager):
    """The objective's deferred gradients too, counting those asked for and the trials."""

    def __init__(self, objective):
        super().__init__(objective)
        self.trials = self.asked = 0

    def loss_and_deferred_grad(self, w, expect_gradient=False):
        self.trials += 1
        loss, gradient = self.objective.loss_and_deferred_grad(w, expect_gradient)

        def counted():
            self.asked += 1
            return gradient()

        return loss, counted


def _same_ascent(a, b):
    """Every field of two results equal bit for bit, but the evaluation counts."""
    for field in dataclasses.fields(a):
        if field.name not in ("gradient_evaluations", "loss_evaluations"):
            x, y = getattr(a, field.name), getattr(b, field.name)
            assert np.array_equal(x, y, equal_nan=True), field.name


def test_deferred_gradients_give_the_eager_ascent_bit_for_bit(digits):
    """Rejected trials skip their backward pass (``Objective.loss_and_deferred_grad``): the same ascent, fewer
    gradients; on data of one batch (the graph kept) and of several (a loss first after a rejected trial)."""
    _, glob, clients, w = digits
    torch.manual_seed(1)
    cnn = FlatModel(build_model("cnn", (1, 8, 8), 10))  # float32, channels-last: one batch
    cnn.channels_last = True
    small = Objective(cnn, {}, AnalysisData(glob.data.x[:40].float(), glob.data.y[:40], 64))
    cases = [(glob, w, {}), (clients[0], w, {"adaptive": True}), (small, cnn.vector(), {"adaptive": True})]
    for objective, x, options in cases:
        ref = rho_sharpness(Eager(objective), x, 0.1, steps=12, starts=3, **options)
        deferred = Deferred(objective)
        got = rho_sharpness(deferred, x, 0.1, steps=12, starts=3, **options)
        _same_ascent(got, ref)
        assert got.gradient_evaluations + got.loss_evaluations == ref.gradient_evaluations + ref.loss_evaluations
        # the centre's and the 2 random start points' gradients, and the trials' asked for: fewer than the trials
        assert got.gradient_evaluations == 3 + deferred.asked and deferred.asked < deferred.trials
    cnn.channels_last = False


def test_bad_settings_are_named():
    quad = Quadratic(_spd([1.0, 2.0]), torch.zeros(2, dtype=torch.float64))
    w = torch.zeros(2, dtype=torch.float64)
    with pytest.raises(LandscapeError, match="rho must be a finite number > 0"):
        rho_sharpness(quad, w, 0.0)
    with pytest.raises(LandscapeError, match="steps must be an integer >= 1"):
        rho_sharpness(quad, w, 0.1, steps=0)
    with pytest.raises(LandscapeError, match="eta must be >= 0"):
        rho_sharpness(quad, w, 0.1, adaptive=True, eta=-1.0)
    with pytest.raises(LandscapeError, match="tol must be a finite number >= 0"):
        rho_sharpness(quad, w, 0.1, tol=-1e-3)
    with pytest.raises(LandscapeError, match="tol must be a finite number >= 0"):
        rho_sharpness(quad, w, 0.1, tol=float("nan"))
    with pytest.raises(LandscapeError, match="starts must be an integer >= 1"):
        rho_sharpness(quad, w, 0.1, starts=0)
    with pytest.raises(LandscapeError, match="rhos is empty"):
        sharpness_profile(quad, w, [])
    with pytest.raises(LandscapeError, match="weight_mask has shape"):
        rho_sharpness(quad, w, 0.1, adaptive=True, weight_mask=torch.ones(3))
    with pytest.raises(LandscapeError, match="at least one client"):
        local_sharpness({}, quad, w, 0.1)


# ----------------------------------------------------------------------------------------------------------
# convergence: the Armijo projected ascent, its stopping test, and multi-start against a long independent ascent


def test_armijo_ascent_converges_where_steps_of_length_rho_oscillate():
    # F(z) = z_1 - (L/2) z_2^2 around x = (0, 0.3): the maximiser on the unit sphere has tangential curvature -L,
    # far below -3 mu (mu = ||grad F|| / rho), where steps of length rho from the sphere oscillate for ever
    # (the old rule: 1.05 against 1.408 after 40 steps).
    lam = 10.0
    quad = Quadratic(torch.diag(torch.tensor([0.0, -lam], dtype=torch.float64)),
                     torch.tensor([1.0, 0.0], dtype=torch.float64))
    w = torch.tensor([0.0, 0.3], dtype=torch.float64)
    theta = torch.linspace(0, 2 * np.pi, 2_000_001, dtype=torch.float64)  # F is concave: the max is on the sphere
    z = w + torch.stack([theta.cos(), theta.sin()], 1)
    exact = float((z[:, 0] - 0.5 * lam * z[:, 1] ** 2).max() - quad.loss(w))
    r = rho_sharpness(quad, w, 1.0, starts=1)
    assert r.ascent_converged and not r.stalled and r.ball_fraction == pytest.approx(1.0)
    assert r.sharpness == pytest.approx(exact, rel=1e-3) and r.sharpness <= exact * (1 + 1e-9)
    accepted = np.maximum.accumulate(np.nan_to_num(r.ascent_values[0], nan=-np.inf))
    assert r.last_gain <= r.tol and r.remaining_gain <= r.tol and accepted[r.steps_used - 1] == r.sharpness


def test_convergence_record_says_how_far_the_ascent_got():
    a = _spd([4.0, 3.5, 3.0, 1.0], seed=4)  # close top eigenvalues: the ascent needs many steps
    quad = Quadratic(a, torch.zeros(4, dtype=torch.float64))
    w = torch.full((4,), 1e-3, dtype=torch.float64)
    short = rho_sharpness(quad, w, 0.5, steps=2, starts=1)
    assert not short.ascent_converged and short.steps_used == 2 and short.loss_evaluations == 1
    assert short.last_gain > short.tol  # the record says it stopped short
    full = rho_sharpness(quad, w, 0.5, starts=1)
    assert full.ascent_converged and full.steps_used < full.steps and full.sharpness > short.sharpness
    assert np.isnan(full.ascent_values[0, full.steps_used:]).all()
    assert not np.isnan(full.ascent_values[0, :full.steps_used]).any()
    exact = _trust_region_max(a, a @ w, 0.5)
    assert exact * (1 - full.tol) <= full.sharpness <= exact * (1 + 1e-9)
    every = rho_sharpness(quad, w, 0.5, steps=30, tol=0.0, starts=1)  # tol = 0: every step (or a stall)
    assert every.steps_used == 30 or every.stalled
    assert every.sharpness >= full.sharpness - 1e-15


def _long_multistart(objective, w, rho, starts=16, steps=200, seed=1):
    """An independent reference: ``starts`` normalised projected ascents from seeded random points on the
    sphere, step length 0.5 rho * 0.97^k (at least 0.01 rho), ``steps`` steps each; the best value seen."""
    f0 = float(objective.loss(w))
    generator = torch.Generator().manual_seed(seed)
    best = 0.0
    for _ in range(starts):
        v = torch.randn(w.numel(), generator=generator, dtype=torch.float64)
        e = rho * v / v.norm()
        for k in range(steps):
            loss, g = objective.loss_and_grad(w + e)
            best = max(best, float(loss) - f0)
            e = e + max(0.5 * 0.97**k, 0.01) * rho * g / g.norm()
            e = e * min(1.0, rho / float(e.norm()))
    return best


def _tiny_trained(name):
    """A few hundred parameters, float64, trained near interpolation on 256 digits (seeded SGD)."""
    from torch import nn

    bundle = load_dataset("digits", root="data", download=False, augment=False, num_clients=3, seed=0, options={})
    x, y = bundle.train.x.double()[:256], bundle.train.y[:256]
    torch.manual_seed(0)
    if name == "bn-mlp":  # 626 parameters; BatchNorm in eval mode (the analysis default)
        model = nn.Sequential(nn.Flatten(), nn.Linear(64, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 10))
        iters = 1500
    else:  # the digits CNN at width 2, hidden 8: 322 parameters
        model, iters = build_model("cnn", (1, 8, 8), 10, {"width": 2, "hidden": 8}), 4000
    model = model.double()
    generator = torch.Generator().manual_seed(0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(iters):
        idx = torch.randint(0, len(x), (32,), generator=generator)
        loss = F.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    import landscape

    p = landscape.problem(model.eval(), (x, y))
    return p.objective, p.w


@pytest.mark.parametrize("name, rhos", [("bn-mlp", (0.05, 0.1)), ("cnn", (0.1,))])
def test_defaults_reach_the_tolerance_of_a_long_multistart_ascent(name, rhos):
    objective, w = _tiny_trained(name)
    p = sharpness_profile(objective, w, list(rhos))
    steps = 200 if name == "bn-mlp" else 100
    reference = np.array([_long_multistart(objective, w, rho, steps=steps) for rho in rhos])
    assert (p.sharpness >= reference * (1 - p.tol)).all(), (p.sharpness, reference)
    assert p.ascent_converged.all() and np.allclose(p.ball_fraction, 1.0)
    np.testing.assert_allclose(p.perturbed_loss - p.loss, p.sharpness, rtol=1e-12)
    assert (p.perturbation_norm <= np.asarray(rhos) * (1 + 1e-12)).all()
    assert (p.start_sharpness.max(axis=1) == p.sharpness).all() and (p.starts_at_best >= 2).all()
    if name == "bn-mlp":  # the SAM start alone ends on a lower local maximum: 28% and 58% short
        sam_start = sharpness_profile(objective, w, list(rhos), starts=1)
        assert (sam_start.sharpness < 0.8 * reference).all() and sam_start.ascent_converged.all()


def test_the_pass_records_the_ascent_settings():
    from dataclasses import asdict

    from landscape.analyze.passes.sharpness import SharpnessOptions

    options = asdict(SharpnessOptions())  # a result's settings: a result under other settings is not reused
    assert options["steps"] == 50 and options["tol"] == 1e-3 and options["starts"] == 8
