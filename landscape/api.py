"""Analysis as plain functions: no run directory, your own model and data.

```
import landscape
eigs = landscape.hessian_eigs(model, (x, y), k=5)          # or a DataLoader, a Dataset
landscape.trace(model, loader).estimate
landscape.sharpness(model, loader, rho=[0.01, 0.05]).sharpness
landscape.surface(model, loader, grid=21, span=(-1, 1)).loss
landscape.flatness_distance(global_model, [client_a, client_b]).distance
```

Each function takes the model (an ``nn.Module``: it is never modified, its parameters and buffers are read
once) and the data (a ``(inputs, targets)`` pair of tensors, a map-style ``Dataset`` or a ``DataLoader``: read
once into memory and then used in fixed batches, so every number is deterministic), and returns a frozen
result. ``loss`` is the cross-entropy unless named (``"mse"``) or given as a callable ``(outputs, targets) ->
mean loss``. The model's device and dtype are used unless ``device`` / ``dtype`` say otherwise. Only the
trainable parameters (``requires_grad=True``) are analysed: the flat vector w, the Hessian's dimension and every
direction are theirs; frozen parameters are constants at their values (``Problem.flat.dim``,
``Problem.flat.frozen_dim``: the two counts).

``landscape analyze`` runs the same functions: its passes build one ``Problem`` per checkpoint (the model at
the checkpoint's weights, the analysis data, the BN mode) and pass it where a model goes, with no data.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from landscape.analyze.directions import random_plane
from landscape.analyze.flatness import FlatnessDistanceResult
from landscape.analyze.flatness import flatness_distance as _flatness_distance
from landscape.analyze.objective import LossFn, Objective, Problem, as_data
from landscape.analyze.operator import HessianOperator, Progress
from landscape.analyze.sharpness import SharpnessProfile, asam_weight_mask, sharpness_profile
from landscape.analyze.spectrum import (
    DEFAULT_TRACE_METHOD,
    DensityResult,
    EigenResult,
    TraceResult,
    lanczos_topk,
    slq_density,
    trace_estimate,
)
from landscape.errors import LandscapeError
from landscape.flat import FlatModel

__all__ = ["Problem", "Surface", "as_data", "density", "flatness_distance", "hessian_eigs", "problem", "sharpness",
           "surface", "trace"]


def _placement(model: nn.Module, device: str | torch.device | None, dtype: torch.dtype | None
               ) -> tuple[torch.device, torch.dtype]:
    first = next(iter(model.parameters()), None)
    if first is None:
        raise LandscapeError("the model has no parameters to analyse")
    return torch.device(device) if device is not None else first.device, dtype or first.dtype


def problem(model: nn.Module | Problem, data: Any = None, *, loss: str | LossFn | None = None,
            bn_mode: str = "eval", batch_size: int | None = None, device: str | torch.device | None = None,
            dtype: torch.dtype | None = None) -> Problem:
    """F of ``model`` on ``data`` at the model's own weights (see the module docstring). A ``Problem`` is
    returned as it is (its data, loss and BN mode are its own)."""
    if isinstance(model, Problem):
        if data is not None:
            raise LandscapeError("a Problem carries its data: give no data with it")
        return model
    if not isinstance(model, nn.Module):
        raise LandscapeError(f"model must be a torch nn.Module, not {type(model).__name__}")
    if data is None:
        raise LandscapeError("give the data to analyse the model on")
    device, dtype = _placement(model, device, dtype)
    if not dtype.is_floating_point:
        raise LandscapeError(f"dtype must be a floating-point dtype, not {dtype}")
    # A copy on the analysis device and dtype: the caller's module is never moved or changed.
    module = _copy_module(model).to(device, dtype)
    flat = FlatModel(module)
    objective = Objective(flat, flat.buffers(), as_data(data, batch_size).place(device, dtype), bn_mode, loss=loss)
    return Problem(objective, flat.vector())


def _copy_module(model: nn.Module) -> nn.Module:
    import copy

    try:
        return copy.deepcopy(model)
    except (TypeError, RuntimeError, AttributeError, ValueError) as e:  # holds something uncopyable (a lock)
        raise LandscapeError(f"the model cannot be copied for analysis ({type(e).__name__}: {e})") from None


def hessian_eigs(model: nn.Module | Problem, data: Any = None, k: int = 5, *, tol: float = 1e-3, seed: int = 0,
                 hvp: str = "double-backward", progress: Progress | None = None, **settings: Any) -> EigenResult:
    """The k largest eigenvalues of the Hessian of F by Lanczos (``values`` descending, ``residuals``: the true
    ||Hv - lambda v|| from the recorded products, ``converged``, ``hvp_count``). A determinism probe (two
    products) runs first: dropout or batch statistics that change between products are refused."""
    p = problem(model, data, **settings)
    op = HessianOperator(p.objective, p.w, backend=hvp, progress=progress)
    op.check_determinism(seed)
    return lanczos_topk(op, k, tol=tol, seed=seed)


def trace(model: nn.Module | Problem, data: Any = None, *, hvps: int = 60, method: str = DEFAULT_TRACE_METHOD,
          seed: int = 0, hvp: str = "double-backward", progress: Progress | None = None, **settings: Any) -> TraceResult:
    """tr(grad^2 F) by a randomised estimator with ``hvps`` Hessian-vector products (``estimate``,
    ``stderr``); ``method``: xtrace (default), hutch++ or hutchinson."""
    p = problem(model, data, **settings)
    op = HessianOperator(p.objective, p.w, backend=hvp, progress=progress)
    return trace_estimate(op, hvps=hvps, method=method, seed=seed)


def density(model: nn.Module | Problem, data: Any = None, *, runs: int = 4, steps: int = 40, seed: int = 0,
            hvp: str = "double-backward", progress: Progress | None = None, **settings: Any) -> DensityResult:
    """The Hessian's spectral density by stochastic Lanczos quadrature (``runs`` x ``steps`` products; the
    trace it implies has a standard error with ``runs`` - 1 degrees of freedom, as the hessian pass's default)."""
    p = problem(model, data, **settings)
    op = HessianOperator(p.objective, p.w, backend=hvp, progress=progress)
    return slq_density(op, runs=runs, steps=steps, seed=seed)


def sharpness(model: nn.Module | Problem, data: Any = None, rho: float | Sequence[float] = 0.05, *, steps: int = 50,
              tol: float = 1e-3, starts: int = 8, adaptive: bool = False, eta: float = 0.01, seed: int = 0,
              **settings: Any) -> SharpnessProfile:
    """S_rho = max_{||e|| <= rho} F(w + e) - F(w) for each radius: the best of ``starts`` Armijo projected
    ascents (from w and from seeded random points on the sphere), each at most ``steps`` trial points and
    stopped when the estimated remaining gain is below ``tol`` * S_rho (``converged``, ``steps_used``,
    ``last_gain``, ``ball_fraction`` per radius); ``steps = starts = 1`` is the SAM estimate. ``adaptive``:
    the ASAM ball ||e / (|w| + eta)|| <= rho (weights only)."""
    p = problem(model, data, **settings)
    rhos = [float(rho)] if isinstance(rho, (int, float)) else [float(r) for r in rho]
    mask = asam_weight_mask(p.flat) if adaptive else None
    return sharpness_profile(p.objective, p.w, rhos, steps=steps, tol=tol, starts=starts, adaptive=adaptive,
                             eta=eta, weight_mask=mask, seed=seed)


@dataclass(frozen=True)
class Surface:
    """F (and accuracy, NaN for non-class targets) on a grid around w: ``loss[ix, iy]`` at
    w + x_coords[ix] d1 + y_coords[iy] d2 (1D: ``loss[ix]``, ``y_coords`` None)."""

    x_coords: np.ndarray
    y_coords: np.ndarray | None
    loss: np.ndarray
    accuracy: np.ndarray
    directions: str
    seed: int


def surface(model: nn.Module | Problem, data: Any = None, *, grid: int | tuple[int, int] = 21,
            span: tuple[float, float] = (-1.0, 1.0), dims: int = 2,
            directions: tuple[Tensor, ...] | None = None, seed: int = 0, **settings: Any) -> Surface:
    """The loss surface on filter-normalised random directions (Li et al. 2018; BatchNorm and bias
    coordinates zero), or on ``directions`` (flat vectors of the model's trainable parameter count): a ``dims``-D grid
    of ``grid`` points per axis (odd, so that w is a grid point) over ``span`` in each direction."""
    from landscape.analyze.surface import evaluate_surface, make_axis

    p = problem(model, data, **settings)
    if dims not in (1, 2):
        raise LandscapeError(f"dims must be 1 or 2 (got {dims})")
    sizes = (grid, grid) if isinstance(grid, int) else tuple(grid)
    if len(sizes) != 2 or any(not isinstance(n, int) or n < 3 or n % 2 == 0 for n in sizes):
        raise LandscapeError(f"grid must be an odd number of points per axis, at least 3 (got {grid!r})")
    if directions is None:
        plane = random_plane(p.flat, p.w, seed)
        chosen, kind = [plane.d1, plane.d2][:dims], "random"
    else:
        chosen, kind = [torch.as_tensor(d).to(p.w) for d in directions], "given"
        if len(chosen) != dims:
            raise LandscapeError(f"give {dims} direction(s) for a {dims}-D surface (got {len(chosen)})")
    lo, hi = float(span[0]), float(span[1])
    if not lo < hi:
        raise LandscapeError(f"span must be (low, high) with low < high (got {span!r})")
    xs = make_axis(sizes[0], lo, hi)
    ys = make_axis(sizes[1], lo, hi) if dims == 2 else None
    result = evaluate_surface(p.objective, p.w, chosen[0], chosen[1] if dims == 2 else None, xs, ys)
    return Surface(result.x_coords, result.y_coords, result.loss, result.accuracy, kind, seed)


def _flat_vector(model: nn.Module | Tensor | Mapping[str, Tensor], reference: FlatModel | None) -> Tensor:
    if isinstance(model, Tensor):
        return model.detach().reshape(-1)
    if isinstance(model, nn.Module):
        return FlatModel(model).vector()
    if isinstance(model, Mapping) and reference is not None:
        return reference.from_state_dict(dict(model))[0]
    raise LandscapeError("models must be nn.Modules, flat parameter tensors, or state_dicts next to an nn.Module")


def flatness_distance(global_model: nn.Module | Tensor,
                      client_models: Sequence[nn.Module | Tensor | Mapping[str, Tensor]]
                      | Mapping[int, nn.Module | Tensor | Mapping[str, Tensor]]) -> FlatnessDistanceResult:
    """Delta_D = mean_i ||y_i - ybar||^2 of the clients' local models y_i around their mean ybar (the FedNSAM
    paper's flatness distance) and its normalised form; the result also holds ``distance_to_global`` =
    mean_i ||y_i - x||^2 to the global model x. From modules, flat parameter vectors or state_dicts (then
    ``global_model`` must be a module)."""
    reference = FlatModel(global_model) if isinstance(global_model, nn.Module) else None
    x = _flat_vector(global_model, reference)
    items = client_models.items() if isinstance(client_models, Mapping) else enumerate(client_models)
    clients = {int(i): _flat_vector(m, reference).to(x) for i, m in items}
    if not clients:
        raise LandscapeError("give at least one client model")
    return _flatness_distance(x, clients)
