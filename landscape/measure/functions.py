"""The analyses of a ``Problem`` (F of one model on its data) as plain functions, shared by the notebook API
(``landscape.api`` checks the arguments and builds the Problem, then calls these) and the analysis passes
(which build one Problem per checkpoint): top-k eigenvalues, trace, spectral density and rho-ball sharpness;
and the flatness distance of flat parameter vectors.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch
from torch import Tensor

from landscape.core.errors import LandscapeError
from landscape.measure import flatness
from landscape.measure.density import DensityResult, slq_density
from landscape.measure.gradient_cache import GradientCache
from landscape.measure.lanczos import EigenResult, lanczos_topk
from landscape.measure.objective import Problem
from landscape.measure.operator import HessianOperator, Progress
from landscape.measure.sharpness import SharpnessProfile, asam_weight_mask, sharpness_profile
from landscape.measure.trace import TraceResult, trace_estimate

# The determinism probe ``hessian_eigs`` runs first costs two products (``LinearOperator.check_determinism``),
# counted by the operator but not in the eigenvalues' ``hvp_count``.
PROBE_HVPS = 2


def hessian_operator(p: Problem, *, hvp: str, progress: Progress | None = None) -> HessianOperator:
    """grad^2 F of ``p`` as an operator with the products' backend ``hvp``; one per checkpoint serves every
    solver below (``operator=``), its kept gradient graphs built once."""
    return HessianOperator(p.objective, p.w, backend=hvp, progress=progress)


def hessian_eigs(p: Problem, k: int, *, tol: float, seed: int, hvp: str,
                 progress: Progress | None = None, operator: HessianOperator | None = None) -> EigenResult:
    """The k largest eigenvalues of grad^2 F by Lanczos, after the determinism probe (``PROBE_HVPS``
    products: dropout or batch statistics that change between products are refused); ``operator``: p's
    (``hessian_operator``), else a new one."""
    op = operator or hessian_operator(p, hvp=hvp, progress=progress)
    op.check_determinism(seed)
    return lanczos_topk(op, k, tol=tol, seed=seed)


def trace(p: Problem, *, hvps: int, method: str, seed: int, hvp: str,
          progress: Progress | None = None, operator: HessianOperator | None = None) -> TraceResult:
    """tr(grad^2 F) by the randomised estimator ``method`` with ``hvps`` Hessian-vector products."""
    op = operator or hessian_operator(p, hvp=hvp, progress=progress)
    return trace_estimate(op, hvps=hvps, method=method, seed=seed)


def density(p: Problem, *, runs: int, steps: int, seed: int, hvp: str,
            progress: Progress | None = None, operator: HessianOperator | None = None) -> DensityResult:
    """The spectral density of grad^2 F by stochastic Lanczos quadrature (``runs`` x ``steps`` products)."""
    op = operator or hessian_operator(p, hvp=hvp, progress=progress)
    return slq_density(op, runs=runs, steps=steps, seed=seed)


def sharpness(p: Problem, rhos: Sequence[float], *, steps: int, tol: float, starts: int, adaptive: bool,
              eta: float, seed: int, gradients: GradientCache | None = None,
              advance: Callable[[int], None] | None = None) -> SharpnessProfile:
    """S_rho of F at each radius by multi-start Armijo projected ascent; ``adaptive``: on the ASAM ball
    (weights only, ``asam_weight_mask``). ``gradients``: a checkpoint's cache (F(w), grad F(w) and each
    radius's ascent kept there for the other passes; the same numbers). ``advance``: progress, every trial of
    the ``len(rhos) x starts x steps`` counted (``sharpness_profile``)."""
    mask = asam_weight_mask(p.flat) if adaptive else None
    return sharpness_profile(p.objective, p.w, list(rhos), steps=steps, tol=tol, starts=starts,
                             adaptive=adaptive, eta=eta, weight_mask=mask, seed=seed, gradients=gradients,
                             advance=advance)


def checked_vector(vector: Tensor, what: str) -> Tensor:
    """``vector`` when it is floating point and finite; else a one-line LandscapeError naming ``what``."""
    if not vector.is_floating_point() or not bool(torch.isfinite(vector).all()):
        raise LandscapeError(f"{what} is not finite (NaN or inf) or not floating point ({vector.dtype})")
    return vector


def flatness_distance(global_w: Tensor, client_ws: Mapping[int, Tensor],
                      start: Tensor | None = None) -> flatness.FlatnessDistanceResult:
    """Delta_D of the clients' flat parameter vectors around their mean, their distance to ``global_w`` and,
    given the point ``start`` they started from, Delta_D / their mean squared update
    (``flatness.flatness_distance``), every vector checked finite first (``checked_vector``)."""
    x = checked_vector(global_w, "global_model")
    clients = {i: checked_vector(y, f"client {i}'s model").to(x) for i, y in client_ws.items()}
    s = None if start is None else checked_vector(start, "the clients' start point").to(x)
    return flatness.flatness_distance(x, clients, s)
