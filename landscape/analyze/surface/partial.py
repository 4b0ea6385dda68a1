"""Partial surface grids on disk, so that an interrupted surface resumes: ``save_partial`` and
``load_partial`` (docs/metrics.md "Surfaces").

Resumability. ``on_checkpoint(grid)`` is called after every ``save_every`` computed cells (at chunk ends);
the surface pass saves the partial grid there (``save_partial``: NPZ written atomically, NaN for the rest,
with a key of the settings, checkpoint hash and direction hashes) and a rerun loads it (``load_partial``,
only when the key matches) and computes only the missing cells. A cell whose loss comes out NaN (a diverged
far-away point) counts as missing and is computed again on a resume.
"""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from pathlib import Path

import numpy as np
from torch import Tensor

from landscape.measure.surface.grid import SurfaceGrid
from landscape.store.fileio import atomic_write

PARTIAL_SCHEMA = 1  # the version of a partial grid's key (the surface pass writes it into the key)


def tensor_digest(t: Tensor) -> str:
    """SHA-256 of a tensor's float64 CPU bytes (identifies directions in a partial grid's key)."""
    return hashlib.sha256(t.detach().double().cpu().contiguous().numpy().tobytes()).hexdigest()


def _key_text(key: dict) -> str:
    return json.dumps(key, sort_keys=True, default=str)


def save_partial(path: Path, grid: SurfaceGrid, key: dict) -> None:
    """Write the grid so far (NaN = not computed) and its key, atomically."""
    arrays = {"loss": grid.loss, "accuracy": grid.accuracy, "x_coords": grid.x_coords,
              "key": np.array(_key_text(key))}
    if grid.y_coords is not None:
        arrays["y_coords"] = grid.y_coords
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    atomic_write(Path(path), lambda f: f.write(buffer.getvalue()))


def load_partial(path: Path, key: dict, x_coords: np.ndarray,
                 y_coords: np.ndarray | None) -> SurfaceGrid | None:
    """The saved grid when ``path`` holds one for exactly this key and these coordinates; else None
    (missing, unreadable, or from other settings, another checkpoint or other directions)."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as saved:
            if str(saved["key"]) != _key_text(key):
                return None
            loaded = SurfaceGrid(saved["x_coords"], saved.get("y_coords"),
                                 saved["loss"].astype(float), saved["accuracy"].astype(float))
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
        return None
    same_y = (loaded.y_coords is None and y_coords is None) or (
        loaded.y_coords is not None and y_coords is not None and np.array_equal(loaded.y_coords, y_coords))
    if not (np.array_equal(loaded.x_coords, x_coords) and same_y):
        return None
    return loaded
