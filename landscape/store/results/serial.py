"""Pass results as files: a result dataclass split into JSON-ready scalars and NumPy arrays (``split_result``),
with NaN and inf kept readable in standard JSON (``json_ready``)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import torch


def to_plain(value: Any) -> Any:
    """JSON-ready: dataclasses -> dicts, tensors/arrays of one value -> numbers, NaN/inf kept as floats."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): to_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_plain(v) for v in value]
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    if isinstance(value, np.ndarray):
        return value.item() if value.ndim == 0 else value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


def split_result(result: Any, prefix: str = "") -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """A result dataclass -> (scalars for JSON, arrays with more than a few values for NPZ)."""
    scalars: dict[str, Any] = {}
    arrays: dict[str, np.ndarray] = {}
    items = (
        {f.name: getattr(result, f.name) for f in dataclasses.fields(result)}
        if dataclasses.is_dataclass(result)
        else dict(result)
    )
    for key, value in items.items():
        name = f"{prefix}{key}"
        if isinstance(value, torch.Tensor):
            value = value.detach().cpu().numpy()
        if isinstance(value, np.ndarray) and value.size > 16:
            arrays[name] = value
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            sub_scalars, sub_arrays = split_result(value, f"{name}.")
            scalars[key] = {k[len(name) + 1 :]: v for k, v in sub_scalars.items()}
            arrays.update(sub_arrays)
        else:
            scalars[key] = to_plain(value)
    return scalars, arrays


def json_ready(value: Any) -> Any:
    """JSON has no NaN/inf: write them as strings so the files stay standard JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: json_ready(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_ready(v) for v in value]
    return value
