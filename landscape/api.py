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
once into memory, a DataLoader in index order whatever its shuffling, and then used in fixed batches, so every
number is deterministic), and returns a frozen result. Data and arguments are checked where they enter: a bad
one is a one-line ``LandscapeError`` naming it (``data: class 57 is outside 0..9 ...``, ``k must be a whole
number >= 1 (got 1.5)``). ``loss`` is the cross-entropy unless named (``"mse"``) or given as a callable ``(outputs, targets) ->
mean loss``. The model's device and dtype are used unless ``device`` / ``dtype`` say otherwise. Only the
trainable parameters (``requires_grad=True``) are analysed: the flat vector w, the Hessian's dimension and every
direction are theirs; frozen parameters are constants at their values (``Problem.flat.dim``,
``Problem.flat.frozen_dim``: the two counts).

``landscape analyze`` runs the same computations (``landscape.analyze.functions``, which these functions
call after checking their arguments): its passes build one ``Problem`` per checkpoint (the model at the
checkpoint's weights, the analysis data, the BN mode) and call them on it.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from landscape.analyze import functions
from landscape.analyze.analysis_data import as_data
from landscape.analyze.density import DensityResult
from landscape.analyze.directions import random_plane
from landscape.analyze.flatness import FlatnessDistanceResult
from landscape.analyze.lanczos import EigenResult
from landscape.analyze.objective import LossFn, Objective, Problem
from landscape.analyze.operator import Progress
from landscape.analyze.sharpness import SharpnessProfile
from landscape.analyze.trace import DEFAULT_TRACE_METHOD, TraceResult
from landscape.core.errors import LandscapeError, shown
from landscape.core.flat import FlatModel

__all__ = ["Problem", "Surface", "as_data", "density", "flatness_distance", "hessian_eigs", "problem", "sharpness",
           "surface", "trace"]


# The settings every function passes on to ``problem`` (besides its own arguments).
SETTINGS = ("loss", "bn_mode", "batch_size", "device", "dtype")
SEED_MAX = 2**32 - 1


def _whole(name: str, value: Any, low: int = 1) -> int:
    """``value`` as an int when it is a whole number >= ``low`` (not a bool, a float or a string)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
        raise LandscapeError(f"{name} must be a whole number >= {low} (got {shown(repr(value))})")
    return int(value)


def _seed(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not 0 <= value <= SEED_MAX:
        raise LandscapeError(f"seed must be a whole number in 0..2**32-1 (got {shown(repr(value))})")
    return int(value)


def _finite(name: str, value: Any, *, positive: bool = True) -> float:
    """``value`` as a float when it is a finite number > 0 (``positive``) or >= 0."""
    ok = not isinstance(value, bool) and isinstance(value, numbers.Real) and math.isfinite(value)
    if not ok or (value <= 0 if positive else value < 0):
        raise LandscapeError(f"{name} must be a finite number {'>' if positive else '>='} 0 (got "
                             f"{shown(repr(value))})")
    return float(value)


def _progress(progress: Any) -> Progress | None:
    if progress is not None and not callable(progress):
        raise LandscapeError(f"progress must be a callable (done, total) or None (got "
                             f"{shown(repr(progress))})")
    return progress


def _device(device: Any, own: torch.device) -> torch.device:
    """The analysis device: the model's own (``device`` None), or the one named, which must exist here."""
    chosen, name = _chosen_device(device, own)
    if chosen.type == "meta":
        raise LandscapeError("device 'meta' holds no data (it is for shapes only): analyse on cpu or cuda")
    _check_device_here(chosen, name)
    return chosen


def _chosen_device(device: Any, own: torch.device) -> tuple[torch.device, str]:
    """(the device, its name as given): the model's own when ``device`` is None (never 'meta'), else the one
    ``device`` names."""
    if device is None:
        if own.type == "meta":
            raise LandscapeError("the model's parameters are on device 'meta', which holds no data: load its "
                                 "weights first (module.to_empty(device='cpu'), then load_state_dict)")
        return own, str(own)
    if not isinstance(device, (str, torch.device)):
        raise LandscapeError(f"device must be a device name (cpu, cuda, cuda:N) or a torch.device, not "
                             f"{shown(repr(device))}")
    name = str(device)
    try:
        return torch.device(device), name
    except RuntimeError:
        raise LandscapeError(f"unknown device {shown(repr(name))}; use cpu, cuda or cuda:N") from None


def _check_device_here(chosen: torch.device, name: str) -> None:
    """A CUDA or MPS device must be available here (a CUDA index must exist); any other type than cpu, cuda
    and mps is refused."""
    if chosen.type == "cuda":
        if not torch.cuda.is_available():
            raise LandscapeError(f"device '{name}' asked for, but no CUDA device is available here")
        if chosen.index is not None and chosen.index >= torch.cuda.device_count():
            raise LandscapeError(f"device '{name}' does not exist: this machine has "
                                 f"{torch.cuda.device_count()} CUDA device(s), cuda:0..")
    elif chosen.type == "mps":
        if not torch.backends.mps.is_available():
            raise LandscapeError(f"device '{name}' asked for, but MPS is not available here")
    elif chosen.type != "cpu":
        raise LandscapeError(f"unsupported device '{name}'; use cpu, cuda or cuda:N")


def _dtype(dtype: Any, own: torch.dtype) -> torch.dtype:
    """The analysis dtype: the model's own (None), a floating torch dtype, or its name (``"float64"``)."""
    if dtype is None:
        return own
    resolved = getattr(torch, dtype, None) if isinstance(dtype, str) else dtype
    if not isinstance(resolved, torch.dtype) or not resolved.is_floating_point:
        raise LandscapeError(f"dtype must be a floating-point dtype (torch.float32, torch.float64 or its "
                             f"name), not {shown(repr(dtype))}")
    return resolved


def _placement(model: nn.Module, device: Any, dtype: Any) -> tuple[torch.device, torch.dtype]:
    first = next(iter(model.parameters()), None)
    if first is None:
        raise LandscapeError("the model has no parameters to analyse")
    return _device(device, first.device), _dtype(dtype, first.dtype)


def problem(model: nn.Module | Problem, data: Any = None, *, loss: str | LossFn | None = None,
            bn_mode: str = "eval", batch_size: int | None = None, device: str | torch.device | None = None,
            dtype: torch.dtype | str | None = None) -> Problem:
    """F of ``model`` on ``data`` at the model's own weights (see the module docstring). The data is checked
    where it enters (``as_data``) and against the model and the loss at the first forward pass
    (``Objective``): one LandscapeError naming ``data`` or ``loss``. ``device``: a name or torch.device that
    exists here (None: the model's); ``dtype``: a floating torch dtype or its name (None: the model's). A
    ``Problem`` is returned as it is (its data, loss, BN mode, batch size, device and dtype are its own:
    giving any of them is refused)."""
    if isinstance(model, Problem):
        given = [key for key, value in (("data", data), ("loss", loss), ("batch_size", batch_size),
                                        ("device", device), ("dtype", dtype)) if value is not None]
        given += ["bn_mode"] if bn_mode != "eval" else []
        if given:
            raise LandscapeError(f"a Problem carries its data, loss, BN mode, batch size, device and dtype: "
                                 f"give none of them with it (got {', '.join(given)})")
        return model
    if not isinstance(model, nn.Module):
        raise LandscapeError(f"model must be a torch nn.Module, not {type(model).__name__}")
    if data is None:
        raise LandscapeError("give the data to analyse the model on")
    device, dtype = _placement(model, device, dtype)
    data = as_data(data, batch_size)
    # A copy on the analysis device and dtype: the caller's module is never moved or changed.
    module = _copy_module(model).to(device, dtype)
    flat = FlatModel(module)
    objective = Objective(flat, flat.buffers(), data.place(device, dtype), bn_mode, loss=loss)
    return Problem(objective, flat.vector())


def _problem_of(function: str, model: Any, data: Any, settings: dict[str, Any]) -> Problem:
    unknown = [key for key in settings if key not in SETTINGS]
    if unknown:
        raise LandscapeError(f"{function} got an unknown argument {shown(repr(unknown[0]))}; its settings "
                             f"besides its own arguments are {', '.join(SETTINGS)}")
    return problem(model, data, **settings)


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
    k, tol, seed, progress = _whole("k", k), _finite("tol", tol), _seed(seed), _progress(progress)
    p = _problem_of("hessian_eigs", model, data, settings)
    return functions.hessian_eigs(p, k, tol=tol, seed=seed, hvp=hvp, progress=progress)


def trace(model: nn.Module | Problem, data: Any = None, *, hvps: int = 60, method: str = DEFAULT_TRACE_METHOD,
          seed: int = 0, hvp: str = "double-backward", progress: Progress | None = None, **settings: Any) -> TraceResult:
    """tr(grad^2 F) by a randomised estimator with ``hvps`` Hessian-vector products (``estimate``,
    ``stderr``); ``method``: xtrace (default), hutch++ or hutchinson."""
    hvps, seed, progress = _whole("hvps", hvps), _seed(seed), _progress(progress)
    p = _problem_of("trace", model, data, settings)
    return functions.trace(p, hvps=hvps, method=method, seed=seed, hvp=hvp, progress=progress)


def density(model: nn.Module | Problem, data: Any = None, *, runs: int = 4, steps: int = 40, seed: int = 0,
            hvp: str = "double-backward", progress: Progress | None = None, **settings: Any) -> DensityResult:
    """The Hessian's spectral density by stochastic Lanczos quadrature (``runs`` x ``steps`` products; the
    trace it implies has a standard error with ``runs`` - 1 degrees of freedom, as the hessian pass's default)."""
    runs, steps = _whole("runs", runs), _whole("steps", steps)
    seed, progress = _seed(seed), _progress(progress)
    p = _problem_of("density", model, data, settings)
    return functions.density(p, runs=runs, steps=steps, seed=seed, hvp=hvp, progress=progress)


def sharpness(model: nn.Module | Problem, data: Any = None, rho: float | Sequence[float] = 0.05, *, steps: int = 50,
              tol: float = 1e-3, starts: int = 8, adaptive: bool = False, eta: float = 0.01, seed: int = 0,
              **settings: Any) -> SharpnessProfile:
    """S_rho = max_{||e|| <= rho} F(w + e) - F(w) for each radius: the best of ``starts`` Armijo projected
    ascents (from w and from seeded random points on the sphere), each at most ``steps`` trial points and
    stopped when the estimated remaining gain is below ``tol`` * S_rho (``converged``, ``steps_used``,
    ``last_gain``, ``ball_fraction`` per radius); ``steps = starts = 1`` is the SAM estimate. ``adaptive``:
    the ASAM ball ||e / (|w| + eta)|| <= rho (weights only)."""
    rhos = _radii(rho)
    steps, starts, seed = _whole("steps", steps), _whole("starts", starts), _seed(seed)
    tol, eta = _finite("tol", tol), _finite("eta", eta, positive=False)
    if not isinstance(adaptive, (bool, np.bool_)):
        raise LandscapeError(f"adaptive must be True or False (got {shown(repr(adaptive))})")
    p = _problem_of("sharpness", model, data, settings)
    return functions.sharpness(p, rhos, steps=steps, tol=tol, starts=starts, adaptive=bool(adaptive), eta=eta,
                               seed=seed)


def _radii(rho: Any) -> list[float]:
    """A radius or a list of radii (each checked finite and > 0 by ``sharpness_profile``)."""
    def number(r: Any) -> bool:
        return isinstance(r, numbers.Real) and not isinstance(r, bool)

    if number(rho):
        return [float(rho)]
    if isinstance(rho, (list, tuple, np.ndarray)) and all(number(r) for r in rho):
        return [float(r) for r in rho]
    raise LandscapeError(f"rho must be a radius or a list of radii (numbers), not {shown(repr(rho))}")


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
    coordinates zero), or on ``directions`` (finite, non-zero flat vectors of the model's trainable parameter
    count): a ``dims``-D grid of ``grid`` points per axis (odd, at least 3, so that w is a grid point) over
    ``span`` = (-s, s) in each direction; a span that takes w + span * direction out of the dtype's range is
    refused."""
    from landscape.analyze.surface_evaluation import evaluate_surface
    from landscape.analyze.surface_grid import make_axis

    if isinstance(dims, bool) or dims not in (1, 2):
        raise LandscapeError(f"dims must be 1 or 2 (got {shown(repr(dims))})")
    sizes = _grid(grid)
    lo, hi = _span(span)
    seed = _seed(seed)
    p = _problem_of("surface", model, data, settings)
    if directions is None:
        plane = random_plane(p.flat, p.w, seed)
        chosen, kind = [plane.d1, plane.d2][:dims], "random"
    else:
        chosen, kind = _directions(directions, dims, p.w), "given"
    reach = p.w.abs() + hi * sum(d.abs() for d in chosen)
    if not bool(torch.isfinite(reach).all()):
        raise LandscapeError(f"span (-{hi:g}, {hi:g}) takes the model out of the {p.w.dtype} range "
                             "(w + span * direction is not finite): choose a smaller span")
    xs = make_axis(sizes[0], lo, hi)
    ys = make_axis(sizes[1], lo, hi) if dims == 2 else None
    result = evaluate_surface(p.objective, p.w, chosen[0], chosen[1] if dims == 2 else None, xs, ys)
    return Surface(result.x_coords, result.y_coords, result.loss, result.accuracy, kind, seed)


def _grid(grid: Any) -> tuple[int, int]:
    """Points per axis: an odd whole number >= 3, or one per axis."""
    sizes = (grid, grid) if not isinstance(grid, (tuple, list)) else tuple(grid)
    def odd(n: Any) -> bool:
        return isinstance(n, numbers.Integral) and not isinstance(n, bool) and n >= 3 and n % 2 == 1

    if len(sizes) != 2 or not all(odd(n) for n in sizes):
        raise LandscapeError(f"grid must be an odd number of points per axis, at least 3 (got "
                             f"{shown(repr(grid))})")
    return int(sizes[0]), int(sizes[1])


def _span(span: Any) -> tuple[float, float]:
    """(low, high): two finite numbers, symmetric around the model (low = -high < 0)."""
    pair = tuple(span) if isinstance(span, (tuple, list, np.ndarray)) else ()
    def finite(v: Any) -> bool:
        return isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)

    if len(pair) != 2 or not all(finite(v) for v in pair) or not pair[0] < pair[1]:
        raise LandscapeError(f"span must be (low, high), two finite numbers with low < high (got "
                             f"{shown(repr(span))})")
    lo, hi = float(pair[0]), float(pair[1])
    if lo != -hi:
        raise LandscapeError(f"span must be symmetric around the model, (-s, s) with s > 0 (got "
                             f"{shown(repr(span))})")
    return lo, hi


def _directions(directions: Any, dims: int, w: Tensor) -> list[Tensor]:
    """The given directions as flat vectors like w: finite, not all zeros."""
    if not isinstance(directions, (tuple, list)):
        raise LandscapeError(f"directions must be a tuple of {dims} flat vector(s), not "
                             f"{type(directions).__name__}")
    if len(directions) != dims:
        raise LandscapeError(f"give {dims} direction(s) for a {dims}-D surface (got {len(directions)})")
    chosen = []
    for i, d in enumerate(directions, start=1):
        try:
            vector = torch.as_tensor(d).to(w)
        except (TypeError, ValueError, RuntimeError):
            raise LandscapeError(f"direction {i} is {type(d).__name__}, not a vector") from None
        if vector.shape != w.shape:
            raise LandscapeError(f"direction {i} has shape {tuple(vector.shape)}, w has {tuple(w.shape)} "
                                 "(the model's trainable parameters)")
        if not bool(torch.isfinite(vector).all()):
            raise LandscapeError(f"direction {i} is not finite (NaN or inf)")
        if not bool(vector.any()):
            raise LandscapeError(f"direction {i} is all zeros: the surface along it would be flat")
        chosen.append(vector)
    return chosen


def _flat_vector(model: nn.Module | Tensor | Mapping[str, Tensor], reference: FlatModel | None,
                 what: str) -> Tensor:
    if isinstance(model, Tensor):
        vector = model.detach().reshape(-1)
    elif isinstance(model, nn.Module):
        vector = FlatModel(model).vector()
    elif isinstance(model, Mapping) and reference is not None:
        vector = reference.from_state_dict(dict(model))[0]
    else:
        raise LandscapeError("models must be nn.Modules, flat parameter tensors, or state_dicts next to an "
                             "nn.Module")
    return functions.checked_vector(vector, what)


def flatness_distance(global_model: nn.Module | Tensor,
                      client_models: Sequence[nn.Module | Tensor | Mapping[str, Tensor]]
                      | Mapping[int, nn.Module | Tensor | Mapping[str, Tensor]]) -> FlatnessDistanceResult:
    """Delta_D = mean_i ||y_i - ybar||^2 of the clients' local models y_i around their mean ybar (the FedNSAM
    paper's flatness distance) and its normalised form; the result also holds ``distance_to_global`` =
    mean_i ||y_i - x||^2 to the global model x. From modules, flat parameter vectors or state_dicts (then
    ``global_model`` must be a module); ``client_models`` a list or a {client number: model} mapping; every
    vector must be finite."""
    if not isinstance(global_model, (nn.Module, Tensor)):
        raise LandscapeError(f"global_model must be an nn.Module or a flat parameter tensor, not "
                             f"{type(global_model).__name__}")
    if isinstance(client_models, Mapping):
        items = list(client_models.items())
        for i, _ in items:
            _whole("client_models keys (client numbers)", i, low=0)
    elif isinstance(client_models, (list, tuple)):
        items = list(enumerate(client_models))
    else:
        raise LandscapeError(f"client_models must be a list of models (nn.Modules, flat parameter tensors "
                             f"or state_dicts) or a {{client: model}} mapping, not "
                             f"{type(client_models).__name__}")
    reference = FlatModel(global_model) if isinstance(global_model, nn.Module) else None
    x = _flat_vector(global_model, reference, "global_model")
    clients = {int(i): _flat_vector(m, reference, f"client {int(i)}'s model").to(x) for i, m in items}
    if not clients:
        raise LandscapeError("give at least one client model")
    return functions.flatness_distance(x, clients)
