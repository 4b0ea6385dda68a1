"""rho-ball sharpness S_rho(x) = max_{||e|| <= rho} F(x + e) - F(x), plain and adaptive (ASAM), global and local.

The maximum is estimated by projected gradient ascent with Armijo backtracking along the projection arc
(Bertsekas 1976), stopped when the estimated remaining gain is below a relative tolerance (docs/metrics.md
"Sharpness"). The ascent runs in the coordinates u = e / T in which the ball is Euclidean (T = 1 for plain
sharpness, T = |x| + eta for adaptive sharpness); d(u) = T grad F(x + T u) is the gradient in u. From the
current iterate u_j (u_0 = 0) each trial point is

    u' = Proj_rho(u_j + s rho d_j / ||d_j||),   Proj_rho(u) = u * min(1, rho / ||u||),   e' = T u',

with step factor s (s = 1 at the first trial, so trial 1 is exactly the SAM perturbation e = rho g / ||g||,
Foret et al. 2021, or ASAM's e = rho T^2 g / ||T g||, Kwon et al. 2021). The trial is accepted when it passes
Armijo's sufficient-increase test F(x + e') >= F(x + e_j) + c d_j^T (u' - u_j), c = ARMIJO_C: then
u_{j+1} = u' and s doubles (at most S_MAX); else s halves and the next trial starts from u_j again. Every
trial costs one loss and gradient (the last allowed trial a loss only). Accepted iterates never lower F, and
the limit points of the iterates are stationary points of the ball problem (KKT points: on the sphere with
grad F parallel to e, or inside with grad F = 0); a local, not necessarily the global, maximum.

Stopping, after accepted step j >= 2 with gain Delta_j = F(x + e_j) - F(x + e_{j-1}) and
S_j = F(x + e_j) - F(x): the relative gain gamma_j = Delta_j / S_j and the geometric tail estimate
R_j = Delta_j r / (1 - r), r = Delta_j / Delta_{j-1} (infinite when r >= 1), of what all further steps would
add. The ascent is *converged* when the iterate is on the sphere (||u_j|| >= (1 - 1e-4) rho), gamma_j <= tol and
R_j <= tol S_j; or *stalled* when s falls below S_MIN (no step of length >= S_MIN rho passes the test: the
iterate is stationary to that resolution), which also counts as converged. Otherwise it stops after ``steps``
trials, not converged. ``tol = 0`` never stops early.

Multi-start: the ball problem has several local maxima (on BatchNorm nets and near a minimum the one the SAM
direction leads to can be far below the best), so ``starts`` ascents run: start 0 from the centre u_0 = 0
(its trial 1 is SAM's step) and start i = 1..starts-1 from u_0 = rho v_i on the sphere, v_i seeded unit
Gaussian directions (the same for every radius). The estimate is the best value found, over the centre and
every start point and trial point of every start:

    S = max(0, max_{i,k} F(x + e_{i,k}) - F(x)),   e* = the maximising e_{i,k} (0 when none beats x),

a lower bound of the true maximum; ``steps = 1, starts = 1`` is the SAM (ASAM) estimate. The convergence
record reported is the one of the start that found e*; ``starts_at_best`` counts the starts within ``tol`` of
S. Where d vanishes exactly (x at a stationary point) the step takes a fixed unit direction drawn from
``seed`` instead (the first seeded direction; the start directions are the next ones).

Adaptive sharpness (ASAM): the ball {e : ||e / T|| <= rho} with T = |x| + eta element-wise, T fixed at x
(ASAM's T_w = |w| + eta, eta = 0.01 in Kwon et al.). By default every coordinate is rescaled (the paper's
element-wise operator); ``weight_mask`` (see ``asam_weight_mask``) rescales only weight tensors and keeps
T = 1 on biases, the rule of the reference code that FedASAM training uses.

All values are full-batch: F (or F_i) over the objective's whole data. The functions only call
``objective.loss(w)`` and ``objective.loss_and_grad(w)``, so any object with those two methods works.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from landscape.core import perturb
from landscape.core.errors import LandscapeError
from landscape.core.flat import FlatModel

DEFAULT_ETA = 0.01  # ASAM's eta (Kwon et al. 2021)
DEFAULT_STEPS = 50  # the most trial points per radius
DEFAULT_TOL = 1e-3  # relative: gamma_j <= tol and R_j <= tol S_j
DEFAULT_STARTS = 8  # the centre (SAM's first step) and 7 seeded random points on the sphere
ARMIJO_C = 1e-4  # sufficient-increase constant of the Armijo test
S_MAX = 1024.0  # largest step factor s (steps of length s rho before the projection)
S_MIN = 2.0**-20  # smallest step factor: below it the ascent has stalled
ON_BALL = 1 - 1e-4  # ||u|| >= ON_BALL rho counts as on the sphere


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
    starts_at_best: int  # starts whose value is within tol of S (how often the maximum was found)
    ascent_values: np.ndarray  # [starts, steps] F(x + e_k) - F(x), trial k (NaN after the stop); [0, 0]: SAM
    # the convergence record of the best start's ascent:
    steps_used: int  # trial points evaluated
    last_gain: float  # gamma of the last accepted step (1 when only the first; NaN when none accepted)
    remaining_gain: float  # R / S of the last accepted step (NaN before the second, inf when not shrinking)
    ball_fraction: float  # ||u|| / rho of the final iterate (u = e / T; 1 = on the sphere)
    converged: bool  # the stopping test passed (or stalled)
    stalled: bool  # stopped because no step of factor >= S_MIN passed the Armijo test
    gradient_evaluations: int  # full-data loss-and-gradient evaluations (centre included)
    loss_evaluations: int  # full-data loss-only evaluations (the last allowed trial)


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
    starts_at_best: np.ndarray
    ascent_values: np.ndarray  # [len(rhos), starts, steps], NaN after each ascent's stop
    steps_used: np.ndarray  # this and the four below: the best start's ascent
    last_gain: np.ndarray
    remaining_gain: np.ndarray
    ball_fraction: np.ndarray
    converged: np.ndarray  # bool
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
    global_converged: bool
    client_loss: np.ndarray  # F_i(x)
    client_perturbed_loss: np.ndarray  # F_i(x + e_i*)
    client_sharpness: np.ndarray  # S_rho on F_i
    client_perturbation_norm: np.ndarray
    client_gap: np.ndarray  # S_rho(F_i) - S_rho(F)
    client_steps_used: np.ndarray
    client_converged: np.ndarray  # bool
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


def _scale(w: Tensor, adaptive: bool, eta: float, weight_mask: Tensor | None) -> tuple[Tensor | None, int]:
    """T = |x| + eta (where the mask is 1), 1 elsewhere; None when not adaptive."""
    if not adaptive:
        return None, 0
    t = w.detach().abs() + eta
    if weight_mask is None:
        return t, int(w.numel())
    if weight_mask.shape != w.shape:
        raise LandscapeError(f"weight_mask has shape {tuple(weight_mask.shape)}, the parameters {tuple(w.shape)}")
    keep = weight_mask.to(w.device).bool()
    return torch.where(keep, t, torch.ones_like(t)), int(keep.sum())


def _unit_directions(w: Tensor, seed: int, count: int) -> list[Tensor]:
    """``count`` unit vectors, Gaussian from ``torch.Generator().manual_seed(seed)`` in order, normalised: the
    first is the step direction where T g vanishes exactly, the others the directions of the random starts."""
    generator = torch.Generator().manual_seed(int(seed))
    out = []
    for _ in range(count):
        v = torch.randn(w.numel(), generator=generator, dtype=torch.float64)
        out.append((v / v.norm()).to(w.device, w.dtype))
    return out


def _loss64(value: Any) -> float:
    return float(torch.as_tensor(value).detach().to(torch.float64))


def _unit(direction: Tensor, fallback: Tensor) -> Tensor:
    norm = direction.norm()
    return direction / norm if float(norm) > 0 else fallback


def _stop_test(gains: list[float], value: float, tol: float) -> tuple[float, float, bool]:
    """(gamma_j, R_j / S_j, passed) from the accepted gains Delta_1..Delta_j and S_j (module docstring)."""
    gamma = gains[-1] / value if value > 0 else math.nan
    if len(gains) < 2:
        return gamma, math.nan, False
    r = gains[-1] / gains[-2] if gains[-2] > 0 else math.inf
    tail = gains[-1] * r / (1 - r) if r < 1 else math.inf
    remaining = tail / value if value > 0 else math.nan
    return gamma, remaining, bool(value > 0 and gamma <= tol and remaining <= tol)


@dataclass(frozen=True)
class _Ball:
    """One radius's ascent problem: F (``objective``) around w, the ball of radius rho (scaled by T = ``scale``
    for the adaptive ball), F(w) = ``loss0``, and the ascent's step budget and tolerance."""

    objective: Any
    w: Tensor
    rho: float
    steps: int
    tol: float
    scale: Tensor | None
    loss0: float


def _ascent(ball: _Ball, start: tuple[Tensor, float, Tensor], fallback: Tensor) -> dict[str, Any]:
    """The Armijo projected ascent of the module docstring for one radius from ``start`` = (u_0, F(x + T u_0),
    grad F(x + T u_0)); S and e* over this start's trial points (and u_0 itself)."""
    objective, w, rho, steps, tol, scale, loss0 = (ball.objective, ball.w, ball.rho, ball.steps, ball.tol,
                                                   ball.scale, ball.loss0)
    u, f, grad = start  # the current iterate u_j and F there
    d = grad if scale is None else scale * grad  # gradient in u at u_j
    s = 1.0
    gains: list[float] = []  # accepted Delta_1, Delta_2, ...
    values = np.full(steps, np.nan)
    best = {"value": 0.0, "loss": loss0, "u": torch.zeros_like(w), "step": 0}
    if f - loss0 > 0:
        best = {"value": f - loss0, "loss": f, "u": u, "step": 0}
    gamma, remaining, converged, stalled = math.nan, math.nan, False, False
    passed_before = False  # the stopping test at the previous accepted step
    grads = 0
    for k in range(1, steps + 1):
        trial = u + (s * rho) * _unit(d, fallback)
        length = float(trial.norm())
        if not math.isfinite(length):  # the ball's points overflow the dtype: no maximum can be measured
            raise LandscapeError(f"rho = {rho:g} overflows the parameters' dtype: the loss is not finite on the "
                                 "ball (a smaller rho measures it)")
        trial = trial * min(1.0, rho / length)  # Proj_rho
        e = trial if scale is None else scale * trial
        if k < steps:
            loss, grad = objective.loss_and_grad(w + e)
            grads += 1
        else:
            loss, grad = objective.loss(w + e), None
        loss = _loss64(loss)
        if not math.isfinite(loss):  # an ascent point where F overflows: the maximum is not measured
            raise LandscapeError(f"F(x + e) = {loss:g} at the radius rho = {rho:g}: the loss is not finite on the "
                                 "ball (a smaller rho measures it)")
        values[k - 1] = loss - loss0
        if loss - loss0 > best["value"]:
            best = {"value": loss - loss0, "loss": loss, "u": trial, "step": k}
        if loss >= f + ARMIJO_C * float(d @ (trial - u)) and loss > f:  # Armijo's sufficient increase
            gains.append(loss - f)
            u, f, s = trial, loss, min(2 * s, S_MAX)
            if grad is not None:
                d = grad if scale is None else scale * grad
            on_ball = float(u.norm()) >= ON_BALL * rho
            gamma, remaining, passed = _stop_test(gains, f - loss0, tol)
            if passed and passed_before and on_ball:  # two in a row: one short step is no proof
                converged = True
                break
            passed_before = passed
        else:
            s /= 2
            if s < S_MIN:
                converged = stalled = True
                break
    best_e = best["u"] if scale is None else scale * best["u"]
    return {
        "values": values,
        "sharpness": best["value"],
        "perturbed_loss": best["loss"],
        "perturbation_norm": float(best_e.norm()),
        "adaptive_norm": float(best["u"].norm()),
        "best_step": best["step"],
        "steps_used": k,
        "last_gain": 1.0 if len(gains) == 1 else gamma,
        "remaining_gain": remaining,
        "ball_fraction": float(u.norm()) / rho,
        "converged": converged,
        "stalled": stalled,
        "gradients": grads,
        "losses": k - grads,
    }


def _multistart(ball: _Ball, grad0: Tensor, directions: list[Tensor]) -> dict[str, Any]:
    """The ascent from the centre (trial 1 = SAM) and from rho v_i for each random direction v_i; the best."""
    runs = [_ascent(ball, (torch.zeros_like(ball.w), ball.loss0, grad0), directions[0])]
    for v in directions[1:]:
        u0 = ball.rho * v
        loss, grad = ball.objective.loss_and_grad(ball.w + (u0 if ball.scale is None else ball.scale * u0))
        run = _ascent(ball, (u0, _loss64(loss), grad), directions[0])
        run["gradients"] += 1  # the start point
        runs.append(run)
    values = np.array([r["sharpness"] for r in runs])
    best = int(np.argmax(values))  # the first of equal values: the SAM start wins ties
    out = dict(runs[best])
    out.update(
        values=np.stack([r["values"] for r in runs]),
        best_start=best,
        start_sharpness=values,
        starts_at_best=int((values >= values[best] * (1 - ball.tol)).sum()) if values[best] > 0 else len(runs),
        gradients=sum(r["gradients"] for r in runs),
        losses=sum(r["losses"] for r in runs),
    )
    return out


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
) -> SharpnessProfile:
    """S_rho(x) for every rho in ``rhos`` (F(x) and grad F(x) computed once and shared): the best of the
    ascents from ``starts`` starting points, the centre (trial 1 = SAM) and ``starts - 1`` seeded random points
    on the sphere, each at most ``steps`` trials, stopped at relative tolerance ``tol`` (module docstring)."""
    rhos = [float(r) for r in rhos]
    if not rhos:
        raise LandscapeError("rhos is empty: give at least one radius")
    for rho in rhos:
        _check_settings(rho, steps, eta, tol, starts)
    w = w.detach()
    scale, scaled = _scale(w, adaptive, eta, weight_mask)
    loss0, grad0 = objective.loss_and_grad(w)
    loss0 = _loss64(loss0)
    if not (math.isfinite(loss0) and bool(torch.isfinite(grad0).all())):
        raise LandscapeError(f"F(x) = {loss0:g} or its gradient is not finite (a weight or an input is nan or inf): "
                             "no sharpness can be measured there")
    directions = _unit_directions(w, seed, starts)
    runs = [_multistart(_Ball(objective, w, rho, steps, float(tol), scale, loss0), grad0, directions) for rho in rhos]

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
        starts_at_best=column("starts_at_best", np.int64),
        ascent_values=np.stack([r["values"] for r in runs]),
        steps_used=column("steps_used", np.int64),
        last_gain=column("last_gain"),
        remaining_gain=column("remaining_gain"),
        ball_fraction=column("ball_fraction"),
        converged=column("converged", bool),
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
) -> SharpnessResult:
    """S_rho(x) = max_{||e|| <= rho} F(x + e) - F(x): the best of ``starts`` Armijo projected ascents, each at
    most ``steps`` trial points, stopped at relative tolerance ``tol`` (module docstring). ``adaptive``: the
    ball {e : ||e / T|| <= rho}, T = |x| + eta (on the coordinates of ``weight_mask`` when given, else on all).
    ``steps = 1, starts = 1`` is the SAM (ASAM) estimate."""
    p = sharpness_profile(
        objective, w, [rho], steps=steps, tol=tol, starts=starts, adaptive=adaptive, eta=eta,
        weight_mask=weight_mask, seed=seed,
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
        starts_at_best=int(p.starts_at_best[0]),
        ascent_values=p.ascent_values[0],
        steps_used=int(p.steps_used[0]),
        last_gain=float(p.last_gain[0]),
        remaining_gain=float(p.remaining_gain[0]),
        ball_fraction=float(p.ball_fraction[0]),
        converged=bool(p.converged[0]),
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
) -> LocalSharpnessResult:
    """S_rho on each client's F_i (``objectives``: client -> Objective) and on F, at the same x; their gap."""
    if not objectives:
        raise LandscapeError("local sharpness needs at least one client objective")
    options = {"steps": steps, "tol": tol, "starts": starts, "adaptive": adaptive, "eta": eta,
               "weight_mask": weight_mask, "seed": seed}
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
        global_converged=glob.converged,
        client_loss=np.array([r.loss for r in local]),
        client_perturbed_loss=np.array([r.perturbed_loss for r in local]),
        client_sharpness=s,
        client_perturbation_norm=np.array([r.perturbation_norm for r in local]),
        client_gap=s - glob.sharpness,
        client_steps_used=np.array([r.steps_used for r in local], dtype=np.int64),
        client_converged=np.array([r.converged for r in local], dtype=bool),
        mean_local_sharpness=float(s.mean()),
        mean_local_sharpness_se=se,
        gap=float(s.mean() - glob.sharpness),
        gradient_evaluations=glob.gradient_evaluations + sum(r.gradient_evaluations for r in local),
    )
