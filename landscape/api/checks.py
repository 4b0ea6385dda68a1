"""The argument checks of the notebook API (``landscape.api``): each argument checked where it enters, a bad
one a one-line ``LandscapeError`` naming it; and the CPU thread count a call runs with (``threads``).
"""

from __future__ import annotations

import contextlib
import math
import numbers
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from landscape.config.setup import using_threads
from landscape.core.errors import LandscapeError, shown
from landscape.core.flat import FlatModel
from landscape.core.memory_format import choose_memory_format
from landscape.core.reading import first_line
from landscape.measure.objective import Objective, evaluation_mode
from landscape.measure.operator import Progress

SEED_MAX = 2**32 - 1
# The CPU threads an API call runs with unless told: the CLI's default (`--threads 1`), for the same numbers
# and speed as `landscape analyze`; 0: every core this process may use.
DEFAULT_THREADS = 1


@contextlib.contextmanager
def threads(count: Any) -> Iterator[int]:
    """torch's CPU threads set to ``count`` (a whole number >= 0; 0: every core) for the call, then set back
    (``config.setup.using_threads``, the helper training and ``landscape analyze`` use)."""
    with using_threads(whole("threads", count, low=0)) as used:
        yield used


def whole(name: str, value: Any, low: int = 1) -> int:
    """``value`` as an int when it is a whole number >= ``low`` (not a bool, a float or a string)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
        raise LandscapeError(f"{name} must be a whole number >= {low} (got {shown(repr(value))})")
    return int(value)


def flag(name: str, value: Any) -> bool:
    """``value`` as a bool when it is True or False (numpy's too), not a number or a string."""
    if not isinstance(value, (bool, np.bool_)):
        raise LandscapeError(f"{name} must be True or False (got {shown(repr(value))})")
    return bool(value)


def copy_module(model: nn.Module) -> nn.Module:
    """A deep copy of ``model`` to analyse: the caller's module is never moved or changed."""
    import copy

    try:
        return copy.deepcopy(model)
    except (TypeError, RuntimeError, AttributeError, ValueError) as e:  # holds something uncopyable (a lock)
        raise LandscapeError(f"the model cannot be copied for analysis ({type(e).__name__}: {e})") from None


def analysis_model(model: nn.Module, device: torch.device, dtype: torch.dtype, bn_mode: str) -> FlatModel:
    """The model as the API analyses it: a copy (``copy_module``) on ``device`` in ``dtype``, laid out and in
    the training flag as ``landscape analyze`` lays out and sets its own model, by the same rules: the memory
    layout of ``analyze.memory_format = "auto"`` (``choose_memory_format``: channels-last on the CPU for a model
    with 2-D convolutions, from the model and the device alone; issue 47, the API ran such models contiguous,
    1.35-1.49x a channels-last gradient, and its numbers differed from the CLI's in the last bits), and every
    module's flag the BN mode's once (``evaluation_mode``: no flag switched per evaluation)."""
    module = copy_module(model).to(device, dtype)
    module.train(evaluation_mode(bn_mode))
    flat = FlatModel(module)
    flat.channels_last = choose_memory_format("auto", flat, device, name="the memory format").channels_last
    return flat


def seed(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not 0 <= value <= SEED_MAX:
        raise LandscapeError(f"seed must be a whole number in 0..2**32-1 (got {shown(repr(value))})")
    return int(value)


def finite(name: str, value: Any, *, positive: bool = True) -> float:
    """``value`` as a float when it is a finite number > 0 (``positive``) or >= 0."""
    ok = not isinstance(value, bool) and isinstance(value, numbers.Real) and math.isfinite(value)
    if not ok or (value <= 0 if positive else value < 0):
        raise LandscapeError(f"{name} must be a finite number {'>' if positive else '>='} 0 (got "
                             f"{shown(repr(value))})")
    return float(value)


def progress(progress: Any) -> Progress | None:
    if progress is not None and not callable(progress):
        raise LandscapeError(f"progress must be a callable (done, total) or None (got "
                             f"{shown(repr(progress))})")
    return progress


def analysis_device(device: Any, own: torch.device) -> torch.device:
    """The analysis device: the model's own (``device`` None), or the one named, which must exist here."""
    chosen, name = chosen_device(device, own)
    if chosen.type == "meta":
        raise LandscapeError("device 'meta' holds no data (it is for shapes only): analyse on cpu or cuda")
    check_device_here(chosen, name)
    return chosen


def chosen_device(device: Any, own: torch.device) -> tuple[torch.device, str]:
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


def check_device_here(chosen: torch.device, name: str) -> None:
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


def analysis_dtype(dtype: Any, own: torch.dtype) -> torch.dtype:
    """The analysis dtype: the model's own (None), a floating torch dtype, or its name (``"float64"``)."""
    if dtype is None:
        return own
    resolved = getattr(torch, dtype, None) if isinstance(dtype, str) else dtype
    if not isinstance(resolved, torch.dtype) or not resolved.is_floating_point:
        raise LandscapeError(f"dtype must be a floating-point dtype (torch.float32, torch.float64 or its "
                             f"name), not {shown(repr(dtype))}")
    return resolved


def placement(model: nn.Module, device: Any, dtype: Any) -> tuple[torch.device, torch.dtype]:
    first = next(iter(model.parameters()), None)
    if first is None:
        raise LandscapeError("the model has no parameters to analyse")
    return analysis_device(device, first.device), analysis_dtype(dtype, first.dtype)


def radii(rho: Any) -> list[float]:
    """A radius or a list of radii (each checked finite and > 0 by ``sharpness_profile``)."""
    def number(r: Any) -> bool:
        return isinstance(r, numbers.Real) and not isinstance(r, bool)

    if number(rho):
        return [float(rho)]
    if isinstance(rho, (list, tuple, np.ndarray)) and all(number(r) for r in rho):
        return [float(r) for r in rho]
    raise LandscapeError(f"rho must be a radius or a list of radii (numbers), not {shown(repr(rho))}")


def grid(grid: Any) -> tuple[int, int]:
    """Points per axis: an odd whole number >= 3, or one per axis."""
    sizes = (grid, grid) if not isinstance(grid, (tuple, list)) else tuple(grid)
    def odd(n: Any) -> bool:
        return isinstance(n, numbers.Integral) and not isinstance(n, bool) and n >= 3 and n % 2 == 1

    if len(sizes) != 2 or not all(odd(n) for n in sizes):
        raise LandscapeError(f"grid must be an odd number of points per axis, at least 3 (got "
                             f"{shown(repr(grid))})")
    return int(sizes[0]), int(sizes[1])


def span(span: Any) -> tuple[float, float]:
    """(low, high): two finite numbers, symmetric around the model (low = -high < 0)."""
    pair = tuple(span) if isinstance(span, (tuple, list, np.ndarray)) else ()
    def is_finite(v: Any) -> bool:
        return isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)

    if len(pair) != 2 or not all(is_finite(v) for v in pair) or not pair[0] < pair[1]:
        raise LandscapeError(f"span must be (low, high), two finite numbers with low < high (got "
                             f"{shown(repr(span))})")
    lo, hi = float(pair[0]), float(pair[1])
    if lo != -hi:
        raise LandscapeError(f"span must be symmetric around the model, (-s, s) with s > 0 (got "
                             f"{shown(repr(span))})")
    return lo, hi


def directions(directions: Any, dims: int, w: Tensor) -> list[Tensor]:
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


def batch_statistics(objective: Objective) -> None:
    """With ``bn_mode="train-batch-stats"`` BatchNorm normalises every batch by its own mean and variance,
    which a batch of one sample lacks (one value per channel): the smallest batch of the data goes through the
    model in that mode once, and a failure is one line naming the batch and the ways out."""
    if objective.bn_mode != "train-batch-stats" or not objective.has_batchnorm:
        return
    ranges = objective.data.batch_ranges()
    start, stop = min(ranges, key=lambda r: r[1] - r[0])
    w = objective.flat.vector()
    try:
        with torch.no_grad():
            objective.batch_loss(w, objective.data.batch(start, stop))
    except LandscapeError:
        raise
    except Exception as e:  # noqa: BLE001 - torch's BatchNorm refuses the batch: one line naming it
        n, size, batch = len(objective.data), objective.data.batch_size, stop - start
        one = ("; BatchNorm needs at least 2 samples per batch in this mode: give more data, a batch_size that "
               "leaves no batch of 1, or bn_mode='eval'") if batch == 1 else ""
        raise LandscapeError(
            f"bn_mode='train-batch-stats' normalises each batch by its own statistics, and the model's forward "
            f"pass in that mode fails on a batch of {batch} sample{'s' if batch > 1 else ''} "
            f"({objective.data.name}: {n} sample{'s' if n > 1 else ''} in batches of {size}): {first_line(e)}"
            + one) from None
