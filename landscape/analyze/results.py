"""Analysis results on disk: ``analysis/round-NNNN/<name>.json`` (scalars, the schema version, the settings
that produced them, the checkpoint's SHA-256, the seconds taken) and ``<name>.npz`` (arrays).

The JSON is written last: its presence marks a result as complete. A result whose JSON records the same
settings and checkpoint is not computed again.
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from landscape.runs import atomic_write, write_text

SCHEMA_VERSION = 1


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


def settings_record(settings: Any, options: Any) -> dict:
    """What a result records of the settings that produced it: the shared analysis settings and the pass's."""
    return {"analysis": settings.record(), "pass": to_plain(options) if options is not None else {}}


def read_result(out_dir: Path, name: str) -> dict | None:
    path = out_dir / f"{name}.json"
    return json.loads(path.read_text()) if path.is_file() else None


def is_current(out_dir: Path, name: str, settings: dict, digest: str) -> bool:
    """Whether ``<name>.json`` holds a result of these settings on the checkpoint with this SHA-256."""
    path = out_dir / f"{name}.json"
    if not path.is_file():
        return False
    try:
        recorded = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        return False
    return (
        isinstance(recorded, dict)
        and recorded.get("schema_version") == SCHEMA_VERSION
        and recorded.get("settings") == settings
        and recorded.get("checkpoint_sha256") == digest
    )


def write_result(out_dir: Path, name: str, record: dict, arrays: dict[str, np.ndarray]) -> None:
    """``<name>.npz`` (when there are arrays), then ``<name>.json`` (the record, with the schema version)."""
    record = {"schema_version": SCHEMA_VERSION, **record, "arrays": sorted(arrays)}
    if arrays:
        buffer = io.BytesIO()
        np.savez_compressed(buffer, **arrays)
        atomic_write(out_dir / f"{name}.npz", lambda f: f.write(buffer.getvalue()))
    # The JSON is written last: its presence marks the result as complete.
    write_text(out_dir / f"{name}.json", json.dumps(json_ready(record), indent=1) + "\n")
