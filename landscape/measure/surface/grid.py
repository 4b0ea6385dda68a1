"""Surface grids: the coordinates a loss surface is evaluated on (2D axes, 1D lines) and ``SurfaceGrid``,
the values on them (docs/metrics.md "Surfaces").

Layout. A 2D surface is stored as arrays ``loss[ix, iy]`` and ``accuracy[ix, iy]`` of shape [nx, ny] with
named axes ("ix", "iy"):

    loss[ix, iy] = F(w + x_coords[ix] * d1 + y_coords[iy] * d2)

so the FIRST index walks along d1 (the horizontal axis of every figure) and the second along d2. A 1D
surface (an interpolation line) is stored as ``loss[ix]`` of shape [nx] (no y axis, no d2):
loss[ix] = F(w + x_coords[ix] * d1). NaN marks a cell not yet computed.

Grids. 2D axes are symmetric, odd-sized and put the checkpoint at the centre cell exactly: ``make_axis``
builds hi * k / c for k = -c..c (c = (n - 1) / 2), so the centre coordinate is exactly 0.0 and the axis is
exactly symmetric; even n or a span with lo != -hi is refused. A 1D line (``make_line``) must have grid
points at exactly alpha = 0 (x) and alpha = 1 (the target): its points are k / m for integers k, m.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from landscape.core.errors import LandscapeError

AXES_2D = ("ix", "iy")
AXES_1D = ("ix",)
AUTO_MARGIN = 1.25  # span "auto": half-width = 1.25 x the largest |coordinate| of the points to cover

# -- grids ------------------------------------------------------------------------------------------------


def parse_grid(spec: str, dims: int = 2) -> tuple[int, ...]:
    """"41" -> (41, 41) in 2D or (41,) in 1D; "41x25" -> (41, 25) (nx x ny, 2D only)."""
    text = str(spec).strip().lower()
    parts = text.split("x")
    if dims == 1 and len(parts) != 1:
        raise LandscapeError(f"a 1D surface takes one number of points as its grid (e.g. '41'), got '{spec}'")
    if len(parts) not in (1, 2):
        raise LandscapeError(f"grid must be 'N' or 'NXxNY' (e.g. '41' or '41x25'), got '{spec}'")
    try:
        sizes = [int(p) for p in parts]
    except ValueError:
        raise LandscapeError(f"grid must be 'N' or 'NXxNY' with whole numbers (e.g. '41x25'), "
                             f"got '{spec}'") from None
    if any(n < 1 for n in sizes):
        raise LandscapeError(f"grid sizes must be positive, got '{spec}'")
    if dims == 2 and len(sizes) == 1:
        sizes = sizes * 2
    return tuple(sizes)


def parse_span(spec: str) -> tuple[float, float]:
    """"-1:1" -> (-1.0, 1.0); lo < hi."""
    parts = str(spec).strip().split(":")
    if len(parts) != 2:
        raise LandscapeError(f"span must be 'LO:HI' (e.g. '-1:1'), got '{spec}'")
    try:
        lo, hi = float(parts[0]), float(parts[1])
    except ValueError:
        raise LandscapeError(f"span must be 'LO:HI' with numbers (e.g. '-1:1'), got '{spec}'") from None
    if not (math.isfinite(lo) and math.isfinite(hi)) or not lo < hi:
        raise LandscapeError(f"span LO:HI needs finite LO < HI, got '{spec}'")
    return lo, hi


def make_axis(n: int, lo: float, hi: float) -> np.ndarray:
    """n symmetric coordinates hi * k / c, k = -c..c: the centre is exactly 0.0 (the checkpoint's cell)."""
    if n < 1 or n % 2 == 0:
        raise LandscapeError(f"a 2D surface axis needs an odd number of points so that the checkpoint is the "
                             f"centre cell, got {n}")
    if not (hi > 0 and lo == -hi):
        raise LandscapeError(f"a 2D surface span must be symmetric around the checkpoint (LO = -HI), "
                             f"got {lo:g}:{hi:g}")
    c = (n - 1) // 2
    if c == 0:
        return np.zeros(1)
    return hi * (np.arange(n) - c) / c


def make_line(n: int, lo: float, hi: float) -> np.ndarray:
    """n points k / m (k, m integers) from lo to hi, with alpha = 0 and alpha = 1 exactly on the grid."""
    if not (lo <= 0 and hi >= 1):
        raise LandscapeError(f"an interpolation span must include alpha = 0 and alpha = 1, got {lo:g}:{hi:g}")

    def points_per_unit(count: int) -> int | None:
        if count < 2:
            return None
        m = (count - 1) / (hi - lo)
        k0 = lo * m
        whole = abs(m - round(m)) <= 1e-9 * max(m, 1) and abs(k0 - round(k0)) <= 1e-9 * max(abs(k0), 1)
        if not whole or round(m) < 1:
            return None
        return round(m)

    m = points_per_unit(n)
    if m is None:
        better = next((k for k in range(max(n, 2), n + 10_000) if points_per_unit(k)), None)
        hint = f"; e.g. {better} points" if better else ""
        raise LandscapeError(f"{n} points over {lo:g}:{hi:g} do not put grid points at alpha = 0 and 1 "
                             f"(the step (HI - LO)/(N - 1) must divide both -LO and 1){hint}")
    k0 = round(lo * m)
    return (k0 + np.arange(n)) / m


def auto_half_width(values: np.ndarray) -> float:
    """The half-width of an axis of span "auto": ``AUTO_MARGIN`` x the largest |coordinate| of ``values``."""
    extent = float(np.max(np.abs(values))) if values.size else 0.0
    if extent <= 0:
        raise LandscapeError("span 'auto' has no points to cover along one axis; give the span as LO:HI")
    return AUTO_MARGIN * extent


# -- the grid ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SurfaceGrid:
    """loss and accuracy on the grid (float64, NaN = not computed): [nx, ny] with axes ("ix", "iy"), or
    [nx] with axes ("ix",) for a 1D line (``y_coords`` None)."""

    x_coords: np.ndarray
    y_coords: np.ndarray | None
    loss: np.ndarray
    accuracy: np.ndarray
    cells_evaluated: int = 0  # cells computed by the call that returned this grid

    @classmethod
    def empty(cls, x_coords: np.ndarray, y_coords: np.ndarray | None = None) -> SurfaceGrid:
        shape = (len(x_coords),) if y_coords is None else (len(x_coords), len(y_coords))
        return cls(np.asarray(x_coords, float), None if y_coords is None else np.asarray(y_coords, float),
                   np.full(shape, np.nan), np.full(shape, np.nan))

    @property
    def axes(self) -> tuple[str, ...]:
        return AXES_1D if self.y_coords is None else AXES_2D

    @property
    def shape(self) -> tuple[int, ...]:
        return self.loss.shape

    @property
    def missing_mask(self) -> np.ndarray:
        return np.isnan(self.loss) | np.isnan(self.accuracy)

    @property
    def missing(self) -> int:
        return int(self.missing_mask.sum())

    @property
    def complete(self) -> bool:
        return self.missing == 0


# The specs of the surface pass's options (``passes.surface.SurfaceOptions``), parsed.

DEFAULT_SPANS = {"random": "-1:1", "pca": "auto", "clients": "auto", "interpolate": "-0.5:1.5"}


def parse_data(spec: str) -> int | str:
    """"global" | "test" | "client:<i>" -> the string, or the client id."""
    if spec in ("global", "test"):
        return spec
    if spec.startswith("client:"):
        try:
            client = int(spec.split(":", 1)[1])
        except ValueError:
            client = -1
        if client >= 0:
            return client
    raise LandscapeError(f"surface data must be global, test or client:<i> (e.g. client:3), got '{spec}'")


def parse_clients(spec: str) -> tuple[int, int]:
    """"3,7" -> (3, 7): the two clients of a client plane."""
    try:
        ids = [int(p) for p in spec.split(",")]
    except ValueError:
        ids = []
    if len(ids) != 2 or ids[0] == ids[1] or min(ids) < 0:
        raise LandscapeError(f"surface clients must be two different client ids like '3,7', got '{spec}'")
    return ids[0], ids[1]


def parse_reference_round(spec: str) -> int:
    """"round:<r>" -> r (a checkpointed round of the analysed run)."""
    try:
        value = int(spec.split(":", 1)[1])
    except ValueError:
        value = -1
    if value < 0:
        raise LandscapeError(f"surface reference must be round:<r> (e.g. round:0) or a checkpoint file, "
                             f"got '{spec}'")
    return value
