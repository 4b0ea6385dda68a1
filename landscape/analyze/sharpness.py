"""rho-ball sharpness S_rho(x) = max_{||e|| <= rho} F(x + e) - F(x), plain and adaptive (ASAM), global and local.

The maximum is estimated by ``steps`` steps of normalised gradient ascent projected onto the ball (docs/metrics.md
"Sharpness"). The ascent runs in the coordinates u = e / T in which the ball is Euclidean (T = 1 for plain
sharpness, T = |x| + eta for adaptive sharpness):

    u_0 = 0;   u_k = Proj_rho(u_{k-1} + rho * T g_{k-1} / ||T g_{k-1}||),   g_{k-1} = grad F(x + T u_{k-1}),
    e_k = T u_k,   Proj_rho(u) = u * min(1, rho / ||u||).

Every step has length rho (the radius itself) before the projection, so step 1 is exactly the SAM perturbation
e_1 = rho g / ||g|| (Foret et al. 2021) and, adaptive, ASAM's e_1 = rho T^2 g / ||T g|| (Kwon et al. 2021,
T from x). On a quadratic the later steps act like a power iteration on the sphere and converge to the
top eigenvector. The estimate is the best value found, over the centre and the iterates:

    S = max(0, max_{k=1..steps} F(x + e_k) - F(x)),   e* = the maximising e_k (0 when no iterate beats x),

a lower bound of the true maximum that never decreases with ``steps``. Where a gradient T g vanishes exactly
(x at a stationary point) the step takes a fixed unit direction drawn from ``seed`` instead.

Adaptive sharpness (ASAM): the ball {e : ||e / T|| <= rho} with T = |x| + eta element-wise, T fixed at x
(ASAM's T_w = |w| + eta, eta = 0.01 in Kwon et al.). By default every coordinate is rescaled (the paper's
element-wise operator); ``weight_mask`` (see ``asam_weight_mask``) rescales only weight tensors and keeps
T = 1 on biases, the rule of the reference code that FedASAM training uses.

All values are full-batch: F (or F_i) over the objective's whole data. The functions only call
``objective.loss(w)`` and ``objective.loss_and_grad(w)``, so any object with those two methods works.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from landscape import perturb
from landscape.errors import LandscapeError
from landscape.flat import FlatModel

DEFAULT_ETA = 0.01  # ASAM's eta (Kwon et al. 2021)


@dataclass(frozen=True)
class SharpnessResult:
    """S_rho at one point for one radius (all losses full-batch)."""

    rho: float
    steps: int
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
    best_step: int  # k of e* = e_k; 0 when no iterate beat the centre (e* = 0)
    ascent_values: np.ndarray  # [steps] F(x + e_k) - F(x), k = 1..steps; entry 0 is the SAM estimate
    gradient_evaluations: int  # full-data gradients taken (plus one loss per rho)


@dataclass(frozen=True)
class SharpnessProfile:
    """S_rho for each rho of a list at one point; arrays indexed like ``rhos``."""

    steps: int
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
    best_step: np.ndarray
    ascent_values: np.ndarray  # [len(rhos), steps]
    gradient_evaluations: int


@dataclass(frozen=True)
class LocalSharpnessResult:
    """Local sharpness S_rho on each client's F_i against global sharpness S_rho on F, at the same x."""

    rho: float
    steps: int
    adaptive: bool
    eta: float
    seed: int
    clients: list[int]  # ascending; arrays below are indexed like this list
    global_loss: float  # F(x)
    global_sharpness: float  # S_rho on F
    global_perturbation_norm: float
    client_loss: np.ndarray  # F_i(x)
    client_perturbed_loss: np.ndarray  # F_i(x + e_i*)
    client_sharpness: np.ndarray  # S_rho on F_i
    client_perturbation_norm: np.ndarray
    client_gap: np.ndarray  # S_rho(F_i) - S_rho(F)
    mean_local_sharpness: float  # mean_i S_rho(F_i)
    mean_local_sharpness_se: float  # std over clients / sqrt(N) (NaN for one client)
    gap: float  # mean_i S_rho(F_i) - S_rho(F)


def asam_weight_mask(flat: FlatModel) -> Tensor:
    """1 on the coordinates of weight tensors (T = |x| + eta), 0 on biases (T = 1): FedASAM's rule."""
    ref = next(flat.module.parameters())
    parts = [
        torch.full((n,), float(perturb.is_weight(name, tuple(shape))), dtype=ref.dtype, device=ref.device)
        for name, shape, n in zip(flat.names, flat.shapes, flat.numels)
    ]
    return torch.cat(parts)


def _check_settings(rho: float, steps: int, eta: float) -> None:
    if not rho > 0:
        raise LandscapeError(f"rho must be > 0 (got {rho})")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise LandscapeError(f"steps must be an integer >= 1 (got {steps!r})")
    if not eta >= 0:
        raise LandscapeError(f"eta must be >= 0 (got {eta})")


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


def _fallback_direction(w: Tensor, seed: int) -> Tensor:
    """A fixed unit vector from ``seed``: the step direction where T g vanishes exactly."""
    generator = torch.Generator().manual_seed(int(seed))
    v = torch.randn(w.numel(), generator=generator, dtype=torch.float64)
    return (v / v.norm()).to(w.device, w.dtype)


def _loss64(value: Any) -> Tensor:
    return torch.as_tensor(value).detach().to(torch.float64)


def _ascent(
    objective: Any,
    w: Tensor,
    rho: float,
    steps: int,
    scale: Tensor | None,
    loss0: Tensor,
    grad0: Tensor,
    fallback: Tensor,
) -> dict[str, Tensor]:
    """The projected normalised ascent of the module docstring; tensors only (one host sync by the caller)."""
    u = torch.zeros_like(w)
    best_u = torch.zeros_like(w)
    best_value = torch.zeros((), dtype=torch.float64, device=w.device)
    best_loss = loss0.clone()
    best_step = torch.zeros((), dtype=torch.long, device=w.device)
    values = []
    g = grad0
    for k in range(1, steps + 1):
        direction = g if scale is None else scale * g
        norm = direction.norm()
        unit = torch.where(norm > 0, direction / torch.where(norm > 0, norm, torch.ones_like(norm)), fallback)
        u = u + rho * unit
        u = u * torch.clamp(rho / u.norm(), max=1.0)  # projection onto ||u|| <= rho
        e = u if scale is None else scale * u
        if k < steps:
            loss, g = objective.loss_and_grad(w + e)
        else:
            loss = objective.loss(w + e)
        loss = _loss64(loss)
        value = loss - loss0
        values.append(value)
        better = value > best_value
        best_value = torch.where(better, value, best_value)
        best_loss = torch.where(better, loss, best_loss)
        best_u = torch.where(better, u, best_u)
        best_step = torch.where(better, torch.full_like(best_step, k), best_step)
    best_e = best_u if scale is None else scale * best_u
    return {
        "values": torch.stack(values),
        "sharpness": best_value,
        "perturbed_loss": best_loss,
        "perturbation_norm": best_e.norm().double(),
        "adaptive_norm": best_u.norm().double(),
        "best_step": best_step,
    }


def sharpness_profile(
    objective: Any,
    w: Tensor,
    rhos: Sequence[float],
    *,
    steps: int = 1,
    adaptive: bool = False,
    eta: float = DEFAULT_ETA,
    weight_mask: Tensor | None = None,
    seed: int = 0,
) -> SharpnessProfile:
    """S_rho(x) for every rho in ``rhos`` (F(x) and grad F(x) computed once and shared)."""
    rhos = [float(r) for r in rhos]
    if not rhos:
        raise LandscapeError("rhos is empty: give at least one radius")
    for rho in rhos:
        _check_settings(rho, steps, eta)
    w = w.detach()
    scale, scaled = _scale(w, adaptive, eta, weight_mask)
    loss0, grad0 = objective.loss_and_grad(w)
    loss0 = _loss64(loss0)
    fallback = _fallback_direction(w, seed)
    runs = [_ascent(objective, w, rho, steps, scale, loss0, grad0, fallback) for rho in rhos]
    stacked = {key: torch.stack([r[key] for r in runs]).cpu().numpy() for key in runs[0]}
    return SharpnessProfile(
        steps=steps,
        adaptive=bool(adaptive),
        eta=float(eta),
        seed=int(seed),
        scaled_parameters=scaled,
        loss=float(loss0),
        gradient_norm=float(grad0.norm()),
        rhos=np.asarray(rhos, dtype=np.float64),
        sharpness=stacked["sharpness"],
        perturbed_loss=stacked["perturbed_loss"],
        perturbation_norm=stacked["perturbation_norm"],
        adaptive_norm=stacked["adaptive_norm"],
        best_step=stacked["best_step"],
        ascent_values=stacked["values"],
        gradient_evaluations=1 + len(rhos) * (steps - 1),
    )


def rho_sharpness(
    objective: Any,
    w: Tensor,
    rho: float,
    *,
    steps: int = 1,
    adaptive: bool = False,
    eta: float = DEFAULT_ETA,
    weight_mask: Tensor | None = None,
    seed: int = 0,
) -> SharpnessResult:
    """S_rho(x) = max_{||e|| <= rho} F(x + e) - F(x) by ``steps`` projected normalised ascent steps.

    ``adaptive``: the ball {e : ||e / T|| <= rho}, T = |x| + eta (on the coordinates of ``weight_mask``
    when given, else on all). ``steps = 1`` is the SAM (ASAM) estimate; see the module docstring.
    """
    p = sharpness_profile(
        objective, w, [rho], steps=steps, adaptive=adaptive, eta=eta, weight_mask=weight_mask, seed=seed
    )
    return SharpnessResult(
        rho=float(rho),
        steps=p.steps,
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
        best_step=int(p.best_step[0]),
        ascent_values=p.ascent_values[0],
        gradient_evaluations=p.gradient_evaluations,
    )


def local_sharpness(
    objectives: dict[int, Any],
    global_objective: Any,
    w: Tensor,
    rho: float,
    *,
    steps: int = 1,
    adaptive: bool = False,
    eta: float = DEFAULT_ETA,
    weight_mask: Tensor | None = None,
    seed: int = 0,
) -> LocalSharpnessResult:
    """S_rho on each client's F_i (``objectives``: client -> Objective) and on F, at the same x; their gap."""
    if not objectives:
        raise LandscapeError("local sharpness needs at least one client objective")
    options = {"steps": steps, "adaptive": adaptive, "eta": eta, "weight_mask": weight_mask, "seed": seed}
    glob = rho_sharpness(global_objective, w, rho, **options)
    clients = sorted(objectives)
    local = [rho_sharpness(objectives[c], w, rho, **options) for c in clients]
    s = np.array([r.sharpness for r in local])
    se = float(s.std(ddof=1) / np.sqrt(len(s))) if len(s) > 1 else float("nan")
    return LocalSharpnessResult(
        rho=float(rho),
        steps=steps,
        adaptive=bool(adaptive),
        eta=float(eta),
        seed=int(seed),
        clients=[int(c) for c in clients],
        global_loss=glob.loss,
        global_sharpness=glob.sharpness,
        global_perturbation_norm=glob.perturbation_norm,
        client_loss=np.array([r.loss for r in local]),
        client_perturbed_loss=np.array([r.perturbed_loss for r in local]),
        client_sharpness=s,
        client_perturbation_norm=np.array([r.perturbation_norm for r in local]),
        client_gap=s - glob.sharpness,
        mean_local_sharpness=float(s.mean()),
        mean_local_sharpness_se=se,
        gap=float(s.mean() - glob.sharpness),
    )
