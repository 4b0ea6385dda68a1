"""The ascent that estimates rho-ball sharpness max_{||e|| <= rho} F(x + e) - F(x) (``sharpness``), from the
centre of the ball and from seeded points on its sphere (``multistart``).

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
trial costs one loss; the gradient d_{j+1} is computed only where a next trial needs it (the trial accepted,
the ascent not stopped, a trial left: ``deferred_loss_and_grad``), so on data of one batch a rejected trial,
about half of them, never pays a backward pass (on several batches: see ``Objective.loss_and_deferred_grad``;
a trial after an accepted one, mostly accepted too, computes its gradient at once, one after a rejected one,
mostly rejected too, its loss first). The values are those of computing every gradient, bit for bit.
Accepted iterates never lower F, and the limit points of the iterates are stationary points of the ball
problem (KKT points: on the sphere with grad F parallel to e, or inside with grad F = 0); a local, not
necessarily the global, maximum.

Stopping, after accepted step j >= 2 with gain Delta_j = F(x + e_j) - F(x + e_{j-1}) and
S_j = F(x + e_j) - F(x): the relative gain gamma_j = Delta_j / S_j and the geometric tail estimate
R_j = Delta_j r / (1 - r), r = Delta_j / Delta_{j-1} (infinite when r >= 1), of what all further steps would
add. The ascent is *converged* when the iterate is on the sphere (||u_j|| >= (1 - 1e-4) rho), gamma_j <= tol
and R_j <= tol S_j; or *stalled* when s falls below S_MIN (no step of length >= S_MIN rho passes the test: the
iterate is stationary to that resolution), which also counts as converged. Otherwise it stops after ``steps``
trials, not converged. ``tol = 0`` never stops early. Converged is said of one ascent: its own local maximum.

Multi-start: the ball problem has several local maxima (on BatchNorm nets and near a minimum the one the SAM
direction leads to can be far below the best), so ``starts`` ascents run: start 0 from the centre u_0 = 0
(its trial 1 is SAM's step) and start i = 1..starts-1 from u_0 = rho v_i on the sphere, v_i seeded unit
Gaussian directions (the same for every radius). The estimate is the best value found, over the centre and
every start point and trial point of every start:

    S = max(0, max_{i,k} F(x + e_{i,k}) - F(x)),   e* = the maximising e_{i,k} (0 when none beats x),

a lower bound of the true maximum; ``steps = 1, starts = 1`` is the SAM (ASAM) estimate. The convergence
record reported is the one of the start that found e* (``ascent_converged``: that ascent met its stopping
test, which says nothing of the other maxima). What the search says of the maximum: each start's best value
S_i, ``starts_at_best`` = #{i : S_i >= (1 - tol) S} (all starts where S = 0), ``maximum_agreed`` = at least
two starts there (one start alone is no evidence that no higher maximum exists), and ``start_spread`` =
(S - min_i S_i) / S (0 where S = 0), how far apart the starts' maxima lie. Where d vanishes exactly (x at a
stationary point) the step takes a fixed unit direction drawn from ``seed`` instead (the first seeded
direction; the start directions are the next ones).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from landscape.core.errors import LandscapeError

ARMIJO_C = 1e-4  # sufficient-increase constant of the Armijo test
S_MAX = 1024.0  # largest step factor s (steps of length s rho before the projection)
S_MIN = 2.0**-20  # smallest step factor: below it the ascent has stalled
ON_BALL = 1 - 1e-4  # ||u|| >= ON_BALL rho counts as on the sphere


def ball_scale(w: Tensor, adaptive: bool, eta: float, weight_mask: Tensor | None) -> tuple[Tensor | None, int]:
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


def unit_directions(w: Tensor, seed: int, count: int) -> list[Tensor]:
    """``count`` unit vectors, Gaussian from ``torch.Generator().manual_seed(seed)`` in order, normalised: the
    first is the step direction where T g vanishes exactly, the others the directions of the random starts."""
    generator = torch.Generator().manual_seed(int(seed))
    out = []
    for _ in range(count):
        v = torch.randn(w.numel(), generator=generator, dtype=torch.float64)
        out.append((v / v.norm()).to(w.device, w.dtype))
    return out


def loss64(value: Any) -> float:
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
class Ball:
    """One radius's ascent problem: F (``objective``) around w, the ball of radius rho (scaled by T = ``scale``
    for the adaptive ball), F(w) = ``loss0``, and the ascent's step budget and tolerance."""

    objective: Any
    w: Tensor
    rho: float
    steps: int
    tol: float
    scale: Tensor | None
    loss0: float
    # progress: called with 1 after each trial point, and with the trials left of the budget when the ascent
    # stops early (so that its ``steps`` trials are always counted: ``core.progress.Budget.advance``)
    advance: Callable[[int], None] | None = None


def deferred_loss_and_grad(objective: Any, w: Tensor,
                           expect_gradient: bool) -> tuple[Tensor, Callable[[], Tensor]]:
    """(F(w), a function returning grad F(w)): the objective's ``loss_and_deferred_grad`` where it has one (the
    backward pass only when asked; ``expect_gradient``: it most likely will be), else ``loss_and_grad`` (any
    object with ``loss`` and ``loss_and_grad``)."""
    deferred = getattr(objective, "loss_and_deferred_grad", None)
    if deferred is not None:
        return deferred(w, expect_gradient)
    loss, grad = objective.loss_and_grad(w)
    return loss, lambda: grad


def _trial(ball: Ball, u: Tensor, d: Tensor, s: float, fallback: Tensor, gradient: bool,
           expect_gradient: bool) -> tuple[Tensor, float, Callable[[], Tensor] | None]:
    """The trial point u' = Proj_rho(u_j + s rho d_j / ||d_j||) and F(x + T u') (a float64 float), with a
    function that returns its gradient unless ``gradient`` is False (the last allowed trial: a loss only);
    ``expect_gradient``: the trial will most likely be accepted. A trial point or a loss that is not finite is
    an error: no maximum can be measured on that ball."""
    rho, scale = ball.rho, ball.scale
    trial = u + (s * rho) * _unit(d, fallback)
    length = float(trial.norm())
    if not math.isfinite(length):  # the ball's points overflow the dtype: no maximum can be measured
        raise LandscapeError(f"rho = {rho:g} overflows the parameters' dtype: the loss is not finite on the "
                             "ball (a smaller rho measures it)")
    trial = trial * min(1.0, rho / length)  # Proj_rho
    e = trial if scale is None else scale * trial
    if gradient:
        loss, grad = deferred_loss_and_grad(ball.objective, ball.w + e, expect_gradient)
    else:
        loss, grad = ball.objective.loss(ball.w + e), None
    loss = loss64(loss)
    if not math.isfinite(loss):  # an ascent point where F overflows: the maximum is not measured
        raise LandscapeError(f"F(x + e) = {loss:g} at the radius rho = {rho:g}: the loss is not finite on the "
                             "ball (a smaller rho measures it)")
    return trial, loss, grad


def _ascent(ball: Ball, start: tuple[Tensor, float, Tensor], fallback: Tensor) -> dict[str, Any]:
    """The Armijo projected ascent of the module docstring for one radius from ``start`` = (u_0, F(x + T u_0),
    grad F(x + T u_0)); S and e* over this start's trial points (and u_0 itself)."""
    w, rho, steps, tol, scale, loss0 = ball.w, ball.rho, ball.steps, ball.tol, ball.scale, ball.loss0
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
    accepted = True  # whether the previous trial was (the first from a start mostly is)
    for k in range(1, steps + 1):
        grad = None  # the previous trial's kept graph goes before this trial's forward pass
        # accepted trials mostly follow accepted ones, rejected ones rejected ones (a halved step is still too
        # long): a trial after an accepted one is expected to need its gradient
        trial, loss, grad = _trial(ball, u, d, s, fallback, gradient=k < steps, expect_gradient=accepted)
        accepted = False
        if ball.advance is not None:
            ball.advance(1)
        values[k - 1] = loss - loss0
        if loss - loss0 > best["value"]:
            best = {"value": loss - loss0, "loss": loss, "u": trial, "step": k}
        if loss >= f + ARMIJO_C * float(d @ (trial - u)) and loss > f:  # Armijo's sufficient increase
            gains.append(loss - f)
            u, f, s, accepted = trial, loss, min(2 * s, S_MAX), True
            on_ball = float(u.norm()) >= ON_BALL * rho
            gamma, remaining, passed = _stop_test(gains, f - loss0, tol)
            if passed and passed_before and on_ball:  # two in a row: one short step is no proof
                converged = True
                break
            passed_before = passed
            if grad is not None:  # the next trial steps along the gradient at u_{j+1}
                g = grad()
                grads += 1
                d = g if scale is None else scale * g
        else:
            s /= 2
            if s < S_MIN:
                converged = stalled = True
                break
    if ball.advance is not None and k < steps:  # stopped early: the rest of its budget
        ball.advance(steps - k)
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
        "ascent_converged": converged,
        "stalled": stalled,
        "gradients": grads,  # accepted trials' gradients
        "losses": k - grads,  # trials evaluated for their loss alone (rejected, or the last allowed)
    }


def multistart(ball: Ball, grad0: Tensor, directions: list[Tensor]) -> dict[str, Any]:
    """The ascent from the centre (trial 1 = SAM) and from rho v_i for each random direction v_i; the best."""
    runs = [_ascent(ball, (torch.zeros_like(ball.w), ball.loss0, grad0), directions[0])]
    for v in directions[1:]:
        u0 = ball.rho * v
        loss, grad = ball.objective.loss_and_grad(ball.w + (u0 if ball.scale is None else ball.scale * u0))
        run = _ascent(ball, (u0, loss64(loss), grad), directions[0])
        run["gradients"] += 1  # the start point
        runs.append(run)
    values = np.array([r["sharpness"] for r in runs])
    best = int(np.argmax(values))  # the first of equal values: the SAM start wins ties
    out = dict(runs[best])
    out.update(
        values=np.stack([r["values"] for r in runs]),
        best_start=best,
        start_sharpness=values,
        start_converged=np.array([r["ascent_converged"] for r in runs], dtype=bool),
        **search_agreement(values, ball.tol),
        gradients=sum(r["gradients"] for r in runs),
        losses=sum(r["losses"] for r in runs),
    )
    return out


def search_agreement(values: np.ndarray, tol: float) -> dict[str, Any]:
    """What the starts' best values S_i say of the maximum S = max_i S_i (module docstring): ``starts_at_best``,
    ``maximum_agreed`` and ``start_spread``."""
    top = float(values.max())
    if top <= 0:  # no start beat the centre: every start agrees on S = 0
        return {"starts_at_best": len(values), "maximum_agreed": len(values) >= 2, "start_spread": 0.0}
    at_best = int((values >= top * (1 - tol)).sum())
    return {"starts_at_best": at_best, "maximum_agreed": at_best >= 2,
            "start_spread": float((top - values.min()) / top)}
