"""Figures of the notebook API's results, drawn by the same renderers as the figures of a run directory.

```
surf = landscape.surface(model, data, grid=21)
fig = landscape.plot_surface(surf, "surface.png")            # 2D: contour map (kind="3d": the 3D view); 1D: curve
landscape.plot_spectrum([landscape.hessian_eigs(model, data, k=5), landscape.density(model, data)], "spectrum.pdf")
landscape.plot_sharpness(landscape.sharpness(model, data, rho=[0.01, 0.02, 0.05, 0.1]), "sharpness.png")
```

Each function takes results as the functions of ``landscape.api`` return them, returns the matplotlib
``Figure`` (no pyplot: shown in a notebook cell as its last value, or saved with ``fig.savefig``) and, given
``path``, writes it there: PNG, or PDF / SVG by the name's suffix (``figures.surface.draw.save_figure``). A
result of another type is a one-line ``TypeError`` naming what the function takes. The surfaces are drawn by
``landscape.figures.surface.draw`` (``contour_figure``, ``surface_3d_figure``, ``curve_1d_figure``: the
pictures of the ``surface`` pass), the spectrum and the sharpness profile by ``landscape.figures.curves``
(``spectrum_figure``, on the Hessian figure's density axes, and ``sharpness_profile_figure``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from landscape.api import Surface
from landscape.core.errors import LandscapeError, shown
from landscape.figures.spectrum import sharpness_profile_figure, spectrum_figure
from landscape.figures.surface.data import SurfaceData
from landscape.figures.surface.draw import contour_figure, curve_1d_figure, save_figure, surface_3d_figure
from landscape.measure.density import DensityResult
from landscape.measure.lanczos import EigenResult
from landscape.measure.sharpness import SharpnessProfile

__all__ = ["plot_sharpness", "plot_spectrum", "plot_surface"]

SURFACE_KINDS = ("contour", "3d")


def _finished(fig: Figure, path: str | Path | None) -> Figure:
    """The Figure on the Agg canvas (``fig.savefig`` works), written to ``path`` when given."""
    FigureCanvasAgg(fig)
    if path is not None:
        save_figure(fig, path)
    return fig


def _refuse(function: str, takes: str, got: Any) -> TypeError:
    return TypeError(f"{function} takes {takes}, not {type(got).__name__}")


def surface_data(result: Surface) -> SurfaceData:
    """The figures' ``SurfaceData`` of a ``landscape.surface`` result: its grid and values as they are, its
    directions named as the surface pass names them (random: filter-normalised d1 / d2; given: d1 / d2); the
    accuracy left out where it is NaN everywhere (targets that are not class labels)."""
    accuracy = result.accuracy if np.isfinite(result.accuracy).any() else None
    meta = {"directions": "random"} if result.directions == "random" else {}
    return SurfaceData.from_arrays(result.x_coords, result.loss, result.y_coords, accuracy, meta)


def plot_surface(result: Surface, path: str | Path | None = None, *, kind: str = "contour",
                 quantity: str | None = None, log_levels: bool = False, title: str | None = None) -> Figure:
    """The loss surface of ``landscape.surface``: a 2D one as a contour map (``kind="3d"``: the 3D view), a
    1D one (``dims=1``) as the loss (and accuracy) along the line; the model x marked at the origin.
    ``quantity``: loss (the default) or accuracy (2D); ``log_levels``: log-spaced contour levels or a log z axis (2D)."""
    if not isinstance(result, Surface):
        raise _refuse("plot_surface", "the result of landscape.surface (a landscape.Surface)", result)
    if kind not in SURFACE_KINDS:
        raise LandscapeError(f"kind must be one of {', '.join(SURFACE_KINDS)} (got {shown(repr(kind))})")
    surface = surface_data(result)
    what = ("on a filter-normalised random " + ("plane" if surface.is_2d else "line")
            + f" (seed {result.seed})") if result.directions == "random" else "on the given directions"
    if not surface.is_2d:
        if kind != "contour" or quantity is not None or log_levels:
            raise LandscapeError("a 1D surface is drawn as its loss (and accuracy) along the line: give no "
                                 "kind, quantity or log_levels")
        fig, _ = curve_1d_figure([surface], labels=["F"], marks=((0.0, "x"),), title=title or f"F {what}")
        return _finished(fig, path)
    quantity = quantity or "loss"
    title = title or f"{quantity} {what}"
    if kind == "3d":
        fig, _ = surface_3d_figure(surface, quantity=quantity, log_levels=log_levels, title=title)
    else:
        fig, _ = contour_figure(surface, quantity=quantity, log_levels=log_levels, title=title)
    return _finished(fig, path)


def plot_spectrum(results: EigenResult | DensityResult | Sequence[EigenResult | DensityResult],
                  path: str | Path | None = None, *, title: str | None = None) -> Figure:
    """The Hessian's spectrum from ``landscape.hessian_eigs`` (the top-k eigenvalues with their residuals as
    error bars, hollow where not converged) and / or ``landscape.density`` (the SLQ spectral density on a log
    scale, the top-k eigenvalues as dashed lines on it): one result, or a list of one of each."""
    takes = ("the results of landscape.hessian_eigs (EigenResult) and / or landscape.density (DensityResult): "
             "one, or a list of one of each")
    items = list(results) if isinstance(results, (list, tuple)) else [results]
    eigs = [r for r in items if isinstance(r, EigenResult)]
    dens = [r for r in items if isinstance(r, DensityResult)]
    other = [r for r in items if not isinstance(r, (EigenResult, DensityResult))]
    if other or not items:
        raise _refuse("plot_spectrum", takes, other[0] if other else results)
    if len(eigs) > 1 or len(dens) > 1:
        raise LandscapeError("plot_spectrum draws one model's spectrum: give at most one hessian_eigs and one "
                             "density result")
    top, slq = (eigs or [None])[0], (dens or [None])[0]
    fig = spectrum_figure(
        values=None if top is None else top.values, residuals=None if top is None else top.residuals,
        converged=None if top is None else top.converged, grid=None if slq is None else slq.grid,
        density=None if slq is None else slq.density, title=title)
    return _finished(fig, path)


def plot_sharpness(result: SharpnessProfile, path: str | Path | None = None, *, title: str | None = None) -> Figure:
    """S_rho of ``landscape.sharpness`` over its radii rho (give several: ``rho=[0.01, 0.02, 0.05, 0.1]``),
    each value labelled, hollow where no second ascent start reached that maximum (``maximum_agreed``)."""
    if not isinstance(result, SharpnessProfile):
        raise _refuse("plot_sharpness", "the result of landscape.sharpness (a SharpnessProfile)", result)
    fig = sharpness_profile_figure(result.rhos, result.sharpness, agreed=result.maximum_agreed,
                                   adaptive=result.adaptive, title=title)
    return _finished(fig, path)
