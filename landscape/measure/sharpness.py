"""rho-ball sharpness S_rho(x) = max_{||e|| <= rho} F(x + e) - F(x), plain and adaptive (ASAM), global and local.

The maximum is estimated by the Armijo projected ascent of ``ascent`` (its docstring; docs/metrics.md
"Sharpness"), from the centre (its first trial is SAM's step) and from seeded points on the sphere; the
estimate is the best value found, a lower bound of the true maximum. The result says what the search found:
each start's value, their spread, how many starts reached the best (``maximum_agreed``: at least two) and
whether the best start's ascent converged (``ascent_converged``, a statement about that ascent alone).

Adaptive sharpness (ASAM): the ball {e : ||e / T|| <= rho} with T = |x| + eta element-wise, T fixed at x
(ASAM's T_w = |w| + eta, eta = 0.01 in Kwon et al.). By default every coordinate is rescaled (the paper's
element-wise operator); ``weight_mask`` (see ``asam_weight_mask``) rescales only weight tensors and keeps
T = 1 on biases, the rule of the reference code that FedASAM training uses.

All values are full-batch: F (or F_i) over the objective's whole data. The functions only call
``objective.loss(w)`` and ``objective.loss_and_grad(w)`` (and ``objective.loss_and_deferred_grad(w)`` where
it has one: ``ascent.deferred_loss_and_grad``), so any object with the first two methods works.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from landscape.core import perturb
from landscape.core.errors import LandscapeError
from landscape.core.flat import FlatModel
from landscape.measure.ascent import Ball, ball_scale, loss64, multistart, unit_directions
from landscape.measure.gradient_cache import GradientCache, full_gradient

DEFAULT_ETA = 0.01  # ASAM's eta (Kwon et al. 2021)
DEFAULT_STEPS = 50  # the most trial points per radius
DEFAULT_TOL = 1e-3  # relative: gamma_j <= tol and R_j <= tol S_j
DEFAULT_STARTS = 8  # the centre (SAM's first step) and 7 seeded random points on the sphere


@dataclass(frozen=True)
class SharpnessResult:
    """S_rho at one point for one radius (all losses full-batch)."""

    rho: float
    steps: int  # the most trial points per start (1 = the SAM estimate)
    tol: float  # relative tolerance of the stopping test (0: no early stop)
    starts: int  # ascents: from the centre (start 0, trial 1 = SAM) and from starts - 1 random points
    adaptive: bool
    eta: float  # ASAM's eta in T = |x| + eta (recorded even when not adaptive)
    seed: int  # only used where a gradient vanishes exactly
    scaled_parameters: int  # coordinates with T = |x| + eta (0 when not adaptive)
    loss: float  # F(x)
    gradient_norm: float  # ||grad F(x)||
    perturbed_loss: float  # F(x + e*)
    sharpness: float  # S_rho = F(x + e*) - F(x) >= 0
    perturbation_norm: float  # ||e*||
    adaptive_norm: float  # ||e* / T|| <= rho (equals perturbation_norm when not adaptive)
    best_start: int  # the start whose ascent found e* (0: from the centre)
    best_step: int  # k of e* = e_k (trial k of that start); 0: its start point (the centre for start 0: e* = 0)
    start_sharpness: np.ndarray  # [starts] the best value of each start's ascent
    start_converged: np.ndarray  # [starts] bool: each start's ascent met its stopping test
    starts_at_best: int  # starts whose value is within tol of S (how often the maximum was found)
    maximum_agreed: bool  # starts_at_best >= 2: another start reached S (else S may be a lower local maximum)
    start_spread: float  # (S - min over starts) / S (0 where S = 0): how far apart the starts' maxima lie
    ascent_values: np.ndarray  # [starts, steps] F(x + e_k) - F(x), trial k (NaN after the stop); [0, 0]: SAM
    # the convergence record of the best start's ascent:
    steps_used: int  # trial points evaluated
    last_gain: float  # gamma of the last accepted step (1 when only the first; NaN when none accepted)
    remaining_gain: float  # R / S of the last accepted step (NaN before the second, inf when not shrinking)
    ball_fraction: float  # ||u|| / rho of the final iterate (u = e / T; 1 = on the sphere)
    ascent_converged: bool  # the best start's ascent passed its stopping test (or stalled); not the maximum's
    stalled: bool  # stopped because no step of factor >= S_MIN passed the Armijo test
    gradient_evaluations: int  # full-data gradients used: the centre, the start points, accepted trials
    loss_evaluations: int  # trial points evaluated for their full-data loss alone (rejected, the last allowed)


@dataclass(frozen=True)
class SharpnessProfile:
    """S_rho for each rho of a list at one point; arrays indexed like ``rhos``."""

    steps: int
    tol: float
    starts: int
    adaptive: bool
    eta: float
    seed: int
    scaled_parameters: int
    loss: float  # F(x)
    gradient_norm: float
    rhos: np.ndarray
    sharpness: np.ndarray
    perturbed_loss: np.ndarray
    perturbation_norm: np.ndarray
    adaptive_norm: np.ndarray
    best_start: np.ndarray
    best_step: np.ndarray
    start_sharpness: np.ndarray  # [len(rhos), starts]
    start_converged: np.ndarray  # [len(rhos), starts] bool
    starts_at_best: np.ndarray
    maximum_agreed: np.ndarray  # bool
    start_spread: np.ndarray
    ascent_values: np.ndarray  # [len(rhos), starts, steps], NaN after each ascent's stop
    steps_used: np.ndarray  # this and the four below: the best start's ascent
    last_gain: np.ndarray
    remaining_gain: np.ndarray
    ball_fraction: np.ndarray
    ascent_converged: np.ndarray  # bool
    stalled: np.ndarray  # bool
    gradient_evaluations: int  # all radii together, the shared centre once
    loss_evaluations: int


@dataclass(frozen=True)
class LocalSharpnessResult:
    """Local sharpness S_rho on each client's F_i against global sharpness S_rho on F, at the same x."""

    rho: float
    steps: int
    tol: float
    starts: int
    adaptive: bool
    eta: float
    seed: int
    clients: list[int]  # ascending; arrays below are indexed like this list
    global_loss: float  # F(x)
    global_sharpness: float  # S_rho on F
    global_perturbation_norm: float
    global_ascent_converged: bool
    global_maximum_agreed: bool
    client_loss: np.ndarray  # F_i(x)
    client_perturbed_loss: np.ndarray  # F_i(x + e_i*)
    client_sharpness: np.ndarray  # S_rho on F_i
    client_perturbation_norm: np.ndarray
    client_gap: np.ndarray  # S_rho(F_i) - S_rho(F)
    client_steps_used: np.ndarray
    client_ascent_converged: np.ndarray  # bool
    client_maximum_agreed: np.ndarray  # bool
    client_start_spread: np.ndarray
    mean_local_sharpness: float  # mean_i S_rho(F_i)
    mean_local_sharpness_se: float  # std over clients / sqrt(N) (NaN for one client)
    gap: float  # mean_i S_rho(F_i) - S_rho(F)
    gradient_evaluations: int  # global and all clients together


def asam_weight_mask(flat: FlatModel) -> Tensor:
    """1 on the coordinates of weight tensors (T = |x| + eta), 0 on biases (T = 1): FedASAM's rule."""
    ref = next(flat.module.parameters())
    parts = [
        torch.full((n,), float(perturb.is_weight(name, tuple(shape))), dtype=ref.dtype, device=ref.device)
        for name, shape, n in zip(flat.names, flat.shapes, flat.numels)
    ]
    return torch.cat(parts)


def _check_settings(rho: float, steps: int, eta: float, tol: float, starts: int) -> None:
    if not (rho > 0 and math.isfinite(rho)):
        raise LandscapeError(f"rho must be a finite number > 0 (got {rho})")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise LandscapeError(f"steps must be an integer >= 1 (got {steps!r})")
    if not eta >= 0:
        raise LandscapeError(f"eta must be >= 0 (got {eta})")
    if not (tol >= 0 and math.isfinite(tol)):
        raise LandscapeError(f"tol must be a finite number >= 0 (got {tol})")
    if isinstance(starts, bool) or not isinstance(starts, int) or starts < 1:
        raise LandscapeError(f"starts must be an integer >= 1 (got {starts!r})")


def sharpness_profile(
    objective: Any,
    w: Tensor,
    rhos: Sequence[float],
    *,
    steps: int = DEFAULT_STEPS,
    tol: float = DEFAULT_TOL,
    starts: int = DEFAULT_STARTS,
    adaptive: bool = False,
    eta: float = DEFAULT_ETA,
    weight_mask: Tensor | None = None,
    seed: int = 0,
    gradients: GradientCache | None = None,
    advance: Callable[[int], None] | None = None,
) -> SharpnessProfile:
    """S_rho(x) for every rho in ``rhos`` (F(x) and grad F(x) computed once and shared): the best of the
    ascents from ``starts`` starting points, the centre (trial 1 = SAM) and ``starts - 1`` seeded random points
    on the sphere, each at most ``steps`` trials, stopped at relative tolerance ``tol`` (``ascent``).

    ``advance`` (progress, ``core.progress.Budget.advance``): ``len(rhos) x starts x steps`` trials in all, each
    counted as it is evaluated; an ascent's trials left when it stops early, and a radius's whole budget when its
    ascent comes from ``gradients``, are counted too.

    ``gradients`` (``gradient_cache``): F(x) and grad F(x) from it, the seeded start directions, and each
    radius's ascent kept there, so that a later request for the same ascent (``local_sharpness``'s global
    S_rho at a radius of the profile) is not run again, nor the directions drawn again for another profile or
    client; the numbers are those of the uncached call."""
    rhos = [float(r) for r in rhos]
    if not rhos:
        raise LandscapeError("rhos is empty: give at least one radius")
    for rho in rhos:
        _check_settings(rho, steps, eta, tol, starts)
    w = w.detach()
    scale, scaled = ball_scale(w, adaptive, eta, weight_mask)
    loss0, grad0 = full_gradient(objective, w, gradients)
    loss0 = loss64(loss0)
    if not (math.isfinite(loss0) and bool(torch.isfinite(grad0).all())):
        raise LandscapeError(f"F(x) = {loss0:g} or its gradient is not finite (a weight or an input is nan or inf): "
                             "no sharpness can be measured there")
    if gradients is None:
        directions = unit_directions(w, seed, starts)
    else:  # the same for every radius, profile and client of the checkpoint
        directions = gradients.remember(("start directions", int(seed), int(starts)), w,
                                        lambda: unit_directions(w, seed, starts))

    ran: list[float] = []  # the radii whose ascent ran here (not taken from ``gradients``)

    def ascent(rho: float) -> dict[str, Any]:
        ran.append(rho)
        return multistart(Ball(objective, w, rho, steps, float(tol), scale, loss0, advance), grad0, directions)

    if gradients is None:
        runs = [ascent(rho) for rho in rhos]
    else:  # the ascent is a function of these settings and the mask (by identity) alone
        runs = []
        for rho in rhos:
            ran.clear()
            runs.append(gradients.remember(("sharpness ascent", objective, rho, int(steps), float(tol), int(starts),
                                            bool(adaptive), float(eta), weight_mask, int(seed)), w,
                                           lambda rho=rho: ascent(rho)))
            if advance is not None and not ran:  # from the cache: its trials count as done
                advance(starts * steps)

    def column(key: str, dtype: Any = np.float64) -> np.ndarray:
        return np.array([r[key] for r in runs], dtype=dtype)

    return SharpnessProfile(
        steps=steps,
        tol=float(tol),
        starts=starts,
        adaptive=bool(adaptive),
        eta=float(eta),
        seed=int(seed),
        scaled_parameters=scaled,
        loss=loss0,
        gradient_norm=float(grad0.norm()),
        rhos=np.asarray(rhos, dtype=np.float64),
        sharpness=column("sharpness"),
        perturbed_loss=column("perturbed_loss"),
        perturbation_norm=column("perturbation_norm"),
        adaptive_norm=column("adaptive_norm"),
        best_start=column("best_start", np.int64),
        best_step=column("best_step", np.int64),
        start_sharpness=np.stack([r["start_sharpness"] for r in runs]),
        start_converged=np.stack([r["start_converged"] for r in runs]),
        starts_at_best=column("starts_at_best", np.int64),
        maximum_agreed=column("maximum_agreed", bool),
        start_spread=column("start_spread"),
        ascent_values=np.stack([r["values"] for r in runs]),
        steps_used=column("steps_used", np.int64),
        last_gain=column("last_gain"),
        remaining_gain=column("remaining_gain"),
        ball_fraction=column("ball_fraction"),
        ascent_converged=column("ascent_converged", bool),
        stalled=column("stalled", bool),
        gradient_evaluations=1 + sum(r["gradients"] for r in runs),
        loss_evaluations=sum(r["losses"] for r in runs),
    )


def rho_sharpness(
    objective: Any,
    w: Tensor,
    rho: float,
    *,
    steps: int = DEFAULT_STEPS,
    tol: float = DEFAULT_TOL,
    starts: int = DEFAULT_STARTS,
    adaptive: bool = False,
    eta: float = DEFAULT_ETA,
    weight_mask: Tensor | None = None,
    seed: int = 0,
    gradients: GradientCache | None = None,
    advance: Callable[[int], None] | None = None,
) -> SharpnessResult:
    """S_rho(x) = max_{||e|| <= rho} F(x + e) - F(x): the best of ``starts`` Armijo projected ascents, each at
    most ``steps`` trial points, stopped at relative tolerance ``tol`` (``ascent``). ``adaptive``: the
    ball {e : ||e / T|| <= rho}, T = |x| + eta (on the coordinates of ``weight_mask`` when given, else on all).
    ``steps = 1, starts = 1`` is the SAM (ASAM) estimate. ``gradients``, ``advance``: as in
    ``sharpness_profile``."""
    p = sharpness_profile(
        objective, w, [rho], steps=steps, tol=tol, starts=starts, adaptive=adaptive, eta=eta,
        weight_mask=weight_mask, seed=seed, gradients=gradients, advance=advance,
    )
    return SharpnessResult(
        rho=float(rho),
        steps=p.steps,
        tol=p.tol,
        starts=p.starts,
        adaptive=p.adaptive,
        eta=p.eta,
        seed=p.seed,
        scaled_parameters=p.scaled_parameters,
        loss=p.loss,
        gradient_norm=p.gradient_norm,
        perturbed_loss=float(p.perturbed_loss[0]),
        sharpness=float(p.sharpness[0]),
        perturbation_norm=float(p.perturbation_norm[0]),
        adaptive_norm=float(p.adaptive_norm[0]),
        best_start=int(p.best_start[0]),
        best_step=int(p.best_step[0]),
        start_sharpness=p.start_sharpness[0],
        start_converged=p.start_converged[0],
        starts_at_best=int(p.starts_at_best[0]),
        maximum_agreed=bool(p.maximum_agreed[0]),
        start_spread=float(p.start_spread[0]),
        ascent_values=p.ascent_values[0],
        steps_used=int(p.steps_used[0]),
        last_gain=float(p.last_gain[0]),
        remaining_gain=float(p.remaining_gain[0]),
        ball_fraction=float(p.ball_fraction[0]),
        ascent_converged=bool(p.ascent_converged[0]),
        stalled=bool(p.stalled[0]),
        gradient_evaluations=p.gradient_evaluations,
        loss_evaluations=p.loss_evaluations,
    )


def local_sharpness(
    objectives: dict[int, Any],
    global_objective: Any,
    w: Tensor,
    rho: float,
    *,
    steps: int = DEFAULT_STEPS,
    tol: float = DEFAULT_TOL,
    starts: int = DEFAULT_STARTS,
    adaptive: bool = False,
    eta: float = DEFAULT_ETA,
    weight_mask: Tensor | None = None,
    seed: int = 0,
    gradients: GradientCache | None = None,
    advance: Callable[[int], None] | None = None,
) -> LocalSharpnessResult:
    """S_rho on each client's F_i (``objectives``: client -> Objective) and on F, at the same x; their gap.
    ``gradients`` (``gradient_cache``): grad F and the grad F_i at x from it, and the global ascent where the
    global profile already ran it (the same radius and settings); the numbers are those of the uncached call.
    ``advance``: progress as in ``sharpness_profile``, ``(clients + 1) x starts x steps`` trials in all."""
    if not objectives:
        raise LandscapeError("local sharpness needs at least one client objective")
    options = {"steps": steps, "tol": tol, "starts": starts, "adaptive": adaptive, "eta": eta,
               "weight_mask": weight_mask, "seed": seed, "gradients": gradients, "advance": advance}
    glob = rho_sharpness(global_objective, w, rho, **options)
    clients = sorted(objectives)
    local = [rho_sharpness(objectives[c], w, rho, **options) for c in clients]
    s = np.array([r.sharpness for r in local])
    se = float(s.std(ddof=1) / np.sqrt(len(s))) if len(s) > 1 else float("nan")
    return LocalSharpnessResult(
        rho=float(rho),
        steps=steps,
        tol=float(tol),
        starts=starts,
        adaptive=bool(adaptive),
        eta=float(eta),
        seed=int(seed),
        clients=[int(c) for c in clients],
        global_loss=glob.loss,
        global_sharpness=glob.sharpness,
        global_perturbation_norm=glob.perturbation_norm,
        global_ascent_converged=glob.ascent_converged,
        global_maximum_agreed=glob.maximum_agreed,
        client_loss=np.array([r.loss for r in local]),
        client_perturbed_loss=np.array([r.perturbed_loss for r in local]),
        client_sharpness=s,
        client_perturbation_norm=np.array([r.perturbation_norm for r in local]),
        client_gap=s - glob.sharpness,
        client_steps_used=np.array([r.steps_used for r in local], dtype=np.int64),
        client_ascent_converged=np.array([r.ascent_converged for r in local], dtype=bool),
        client_maximum_agreed=np.array([r.maximum_agreed for r in local], dtype=bool),
        client_start_spread=np.array([r.start_spread for r in local]),
        mean_local_sharpness=float(s.mean()),
        mean_local_sharpness_se=se,
        gap=float(s.mean() - glob.sharpness),
        gradient_evaluations=glob.gradient_evaluations + sum(r.gradient_evaluations for r in local),
    )
