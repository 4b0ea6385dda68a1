"""Analysis as plain functions: no run directory, your own model and data.

```
import landscape
eigs = landscape.hessian_eigs(model, (x, y), k=5)          # or a DataLoader, a Dataset
landscape.trace(model, loader).estimate
landscape.sharpness(model, loader, rho=[0.01, 0.05]).sharpness
landscape.surface(model, loader, grid=21, span=(-1, 1)).loss
landscape.flatness_distance(global_model, [client_a, client_b]).distance
landscape.incompatibility(model, [data_0, data_1], rho=0.05).incompatibility      # Delta_FI over the clients
landscape.alignment(model, [data_0, data_1], start=x_prev, client_models=[y_0, y_1]).updates
landscape.plot_surface(landscape.surface(model, loader), "surface.png")              # figures: landscape.api.plots
```

Each function takes the model (an ``nn.Module``: it is never modified, its parameters and buffers are read
once) and the data (a ``(inputs, targets)`` pair of tensors, a map-style ``Dataset`` or a ``DataLoader``: read
once into memory, a DataLoader in index order whatever its shuffling, and then used in fixed batches, so every
number is deterministic), and returns a frozen result whose numbers are numpy, wherever the model ran: arrays of
measurements are float64 numpy arrays on the host, flags numpy bool arrays, counts numpy int arrays, single
values Python floats and ints (only the eigenvectors a solver is asked to keep stay torch tensors: parameter
vectors, as directions are); ``landscape.plot_surface``, ``landscape.plot_spectrum`` and
``landscape.plot_sharpness`` draw them (``landscape.api.plots``). Data and arguments are checked where they
enter: a bad one is a one-line ``LandscapeError`` naming it (``data: class 57 is outside 0..9 ...``, ``k must be a whole
number >= 1 (got 1.5)``). ``loss`` is the cross-entropy unless named (``"mse"``) or given as a callable
``(outputs, targets) -> mean loss``. The model's device and dtype are used unless ``device`` / ``dtype`` say otherwise.
The copy analysed is laid out as ``landscape analyze`` lays out its model (``analyze.memory_format = "auto"``, by
the same rule: channels-last on the CPU for a model with 2-D convolutions, contiguous otherwise;
``Problem.flat.channels_last``), so a function gives the CLI's numbers bit for bit on the same data, at its speed. Only the
trainable parameters (``requires_grad=True``) are analysed: the flat vector w, the Hessian's dimension and every
direction are theirs; frozen parameters are constants at their values (``Problem.flat.dim``,
``Problem.flat.frozen_dim``: the two counts). Each function runs with ``threads`` CPU threads: 1 unless told,
as ``landscape analyze --threads`` (on a busy machine one thread is often the fastest, and the last bits of a
CPU result depend on the count); 0 is every core. The count is set for the call and set back after it.

``landscape analyze`` runs the same computations (``landscape.measure.functions``, which these functions
call after checking their arguments): its passes build one ``Problem`` per checkpoint (the model at the
checkpoint's weights, the analysis data, the BN mode) and call them on it. ``incompatibility`` and
``alignment`` (``landscape.api.federated``) take the clients' data besides the model, one entry per client, and
call what the incompatibility and alignment passes call on a checkpoint's model and its clients.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from landscape.api import checks
from landscape.api.checks import DEFAULT_THREADS
from landscape.api.federated import Alignment, alignment, incompatibility
from landscape.core.errors import LandscapeError, shown
from landscape.core.flat import FlatModel
from landscape.measure import functions
from landscape.measure.analysis_data import as_data
from landscape.measure.density import DensityResult
from landscape.measure.directions import random_plane
from landscape.measure.flatness import FlatnessDistanceResult
from landscape.measure.lanczos import EigenResult
from landscape.measure.objective import LossFn, Objective, Problem
from landscape.measure.operator import Progress
from landscape.measure.sharpness import SharpnessProfile
from landscape.measure.trace import DEFAULT_TRACE_METHOD, TraceResult

__all__ = ["DEFAULT_THREADS", "Alignment", "Problem", "Surface", "alignment", "as_data", "density",
           "flatness_distance", "hessian_eigs", "incompatibility", "problem", "sharpness", "surface", "trace"]


# The settings every function passes on to ``problem`` (besides its own arguments).
SETTINGS = ("loss", "bn_mode", "batch_size", "device", "dtype")


def problem(model: nn.Module | Problem, data: Any = None, *, loss: str | LossFn | None = None,
            bn_mode: str = "eval", batch_size: int | None = None, device: str | torch.device | None = None,
            dtype: torch.dtype | str | None = None, threads: int = DEFAULT_THREADS) -> Problem:
    """F of ``model`` on ``data`` at the model's own weights (see the module docstring). The data is checked
    where it enters (``as_data``) and against the model and the loss at the first forward pass
    (``Objective``): one LandscapeError naming ``data`` or ``loss``. ``device``: a name or torch.device that
    exists here (None: the model's); ``dtype``: a floating torch dtype or its name (None: the model's). A
    ``Problem`` is returned as it is (its data, loss, BN mode, batch size, device and dtype are its own:
    giving any of them is refused)."""
    with checks.threads(threads):
        return _problem(model, data, loss=loss, bn_mode=bn_mode, batch_size=batch_size, device=device,
                        dtype=dtype)


def _problem(model: Any, data: Any, *, loss: Any = None, bn_mode: str = "eval", batch_size: Any = None,
             device: Any = None, dtype: Any = None) -> Problem:
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
    device, dtype = checks.placement(model, device, dtype)
    data = as_data(data, batch_size)
    # A copy on the analysis device and dtype, laid out as `landscape analyze` lays out its model: the caller's
    # module is never moved or changed.
    flat = checks.analysis_model(model, device, dtype, bn_mode)
    objective = Objective(flat, flat.buffers(), data.place(device, dtype), bn_mode, loss=loss)
    checks.batch_statistics(objective)
    return Problem(objective, flat.vector())


def _problem_of(function: str, model: Any, data: Any, settings: dict[str, Any]) -> Problem:
    unknown = [key for key in settings if key not in SETTINGS]
    if unknown:
        raise LandscapeError(f"{function} got an unknown argument {shown(repr(unknown[0]))}; its settings "
                             f"besides its own arguments are {', '.join(SETTINGS)}")
    return _problem(model, data, **settings)


def hessian_eigs(model: nn.Module | Problem, data: Any = None, k: int = 5, *, tol: float = 1e-3, seed: int = 0,
                 hvp: str = "auto", progress: Progress | None = None, threads: int = DEFAULT_THREADS,
                 **settings: Any) -> EigenResult:
    """The k largest eigenvalues of the Hessian of F by Lanczos (``values`` descending, ``residuals``: the true
    ||Hv - lambda v|| from the recorded products, float64 numpy arrays; ``converged``, a bool one;
    ``hvp_count``). A determinism probe (two
    products) runs first: dropout or batch statistics that change between products are refused."""
    k, tol, seed, progress = checks.whole("k", k), checks.finite("tol", tol), checks.seed(seed), \
        checks.progress(progress)
    with checks.threads(threads):
        p = _problem_of("hessian_eigs", model, data, settings)
        return functions.hessian_eigs(p, k, tol=tol, seed=seed, hvp=hvp, progress=progress)


def trace(model: nn.Module | Problem, data: Any = None, *, hvps: int = 60, method: str = DEFAULT_TRACE_METHOD,
          seed: int = 0, hvp: str = "auto", progress: Progress | None = None,
          threads: int = DEFAULT_THREADS, **settings: Any) -> TraceResult:
    """tr(grad^2 F) by a randomised estimator with ``hvps`` Hessian-vector products (``estimate``,
    ``stderr``); ``method``: xtrace (default), hutch++ or hutchinson."""
    hvps, seed, progress = checks.whole("hvps", hvps), checks.seed(seed), checks.progress(progress)
    with checks.threads(threads):
        p = _problem_of("trace", model, data, settings)
        return functions.trace(p, hvps=hvps, method=method, seed=seed, hvp=hvp, progress=progress)


def density(model: nn.Module | Problem, data: Any = None, *, runs: int = 4, steps: int = 40, seed: int = 0,
            hvp: str = "auto", progress: Progress | None = None, threads: int = DEFAULT_THREADS,
            **settings: Any) -> DensityResult:
    """The Hessian's spectral density by stochastic Lanczos quadrature (``grid``, ``density`` and the
    quadrature's ``nodes`` and ``weights`` [runs, steps]: float64 numpy arrays; ``runs`` x ``steps`` products; the
    trace it implies has a standard error with ``runs`` - 1 degrees of freedom, as the hessian pass's default)."""
    runs, steps = checks.whole("runs", runs), checks.whole("steps", steps)
    seed, progress = checks.seed(seed), checks.progress(progress)
    with checks.threads(threads):
        p = _problem_of("density", model, data, settings)
        return functions.density(p, runs=runs, steps=steps, seed=seed, hvp=hvp, progress=progress)


def sharpness(model: nn.Module | Problem, data: Any = None, rho: float | Sequence[float] = 0.05, *, steps: int = 50,
              tol: float = 1e-3, starts: int = 8, adaptive: bool = False, eta: float = 0.01, seed: int = 0,
              threads: int = DEFAULT_THREADS, **settings: Any) -> SharpnessProfile:
    """S_rho = max_{||e|| <= rho} F(w + e) - F(w) for each radius: the best of ``starts`` Armijo projected
    ascents (from w and from seeded random points on the sphere), each at most ``steps`` trial points and
    stopped when the estimated remaining gain is below ``tol`` * S_rho (the best start's ``ascent_converged``,
    ``steps_used``, ``last_gain``, ``ball_fraction`` per radius); a lower bound of the maximum, which
    ``start_sharpness``, ``start_spread``, ``starts_at_best`` and ``maximum_agreed`` (a second start reached
    it) qualify; ``steps = starts = 1`` is the SAM estimate. ``adaptive``: the ASAM ball
    ||e / (|w| + eta)|| <= rho (weights only)."""
    rhos = checks.radii(rho)
    steps, starts, seed = checks.whole("steps", steps), checks.whole("starts", starts), checks.seed(seed)
    tol, eta = checks.finite("tol", tol), checks.finite("eta", eta, positive=False)
    if not isinstance(adaptive, (bool, np.bool_)):
        raise LandscapeError(f"adaptive must be True or False (got {shown(repr(adaptive))})")
    with checks.threads(threads):
        p = _problem_of("sharpness", model, data, settings)
        return functions.sharpness(p, rhos, steps=steps, tol=tol, starts=starts, adaptive=bool(adaptive),
                                   eta=eta, seed=seed)


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
            directions: tuple[Tensor, ...] | None = None, seed: int = 0, threads: int = DEFAULT_THREADS,
            **settings: Any) -> Surface:
    """The loss surface on filter-normalised random directions (Li et al. 2018; BatchNorm and bias
    coordinates zero), or on ``directions`` (finite, non-zero flat vectors of the model's trainable parameter
    count): a ``dims``-D grid of ``grid`` points per axis (odd, at least 3, so that w is a grid point) over
    ``span`` = (-s, s) in each direction; a span that takes w + span * direction out of the dtype's range is
    refused."""
    if isinstance(dims, bool) or dims not in (1, 2):
        raise LandscapeError(f"dims must be 1 or 2 (got {shown(repr(dims))})")
    sizes, (lo, hi), seed = checks.grid(grid), checks.span(span), checks.seed(seed)
    with checks.threads(threads):
        return _surface(_problem_of("surface", model, data, settings), sizes, lo, hi, dims, directions, seed)


def _surface(p: Problem, sizes: tuple[int, int], lo: float, hi: float, dims: int, directions: Any,
             seed: int) -> Surface:
    from landscape.measure.surface.evaluation import evaluate_surface
    from landscape.measure.surface.grid import make_axis

    if directions is None:
        plane = random_plane(p.flat, p.w, seed)
        chosen, kind = [plane.d1, plane.d2][:dims], "random"
    else:
        chosen, kind = checks.directions(directions, dims, p.w), "given"
    reach = p.w.abs() + hi * sum(d.abs() for d in chosen)
    if not bool(torch.isfinite(reach).all()):
        raise LandscapeError(f"span (-{hi:g}, {hi:g}) takes the model out of the {p.w.dtype} range "
                             "(w + span * direction is not finite): choose a smaller span")
    xs = make_axis(sizes[0], lo, hi)
    ys = make_axis(sizes[1], lo, hi) if dims == 2 else None
    result = evaluate_surface(p.objective, p.w, chosen[0], chosen[1] if dims == 2 else None, xs, ys)
    return Surface(result.x_coords, result.y_coords, result.loss, result.accuracy, kind, seed)


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
                      | Mapping[int, nn.Module | Tensor | Mapping[str, Tensor]], *,
                      start: nn.Module | Tensor | Mapping[str, Tensor] | None = None,
                      threads: int = DEFAULT_THREADS) -> FlatnessDistanceResult:
    """Delta_D = mean_i ||y_i - ybar||^2 of the clients' local models y_i around their mean ybar (the FedNSAM
    paper's flatness distance) and its normalised form; the result also holds ``distance_to_global`` =
    mean_i ||y_i - x||^2 to the global model x, and, given ``start`` (the model s the clients started their
    round from), their mean squared update ``update_sq`` = mean_i ||y_i - s||^2 and the scale-free
    ``distance_relative`` = Delta_D / update_sq (NaN without ``start``). From modules, flat parameter vectors or
    state_dicts (then ``global_model`` must be a module); ``client_models`` a list or a {client number: model}
    mapping; every vector must be finite."""
    with checks.threads(threads):
        return _flatness_distance(global_model, client_models, start)


def _flatness_distance(global_model: Any, client_models: Any, start: Any = None) -> FlatnessDistanceResult:
    if not isinstance(global_model, (nn.Module, Tensor)):
        raise LandscapeError(f"global_model must be an nn.Module or a flat parameter tensor, not "
                             f"{type(global_model).__name__}")
    if isinstance(client_models, Mapping):
        items = list(client_models.items())
        for i, _ in items:
            checks.whole("client_models keys (client numbers)", i, low=0)
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
    s = None if start is None else _flat_vector(start, reference, "start").to(x)
    return functions.flatness_distance(x, clients, s)
