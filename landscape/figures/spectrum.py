"""Figures of one model's spectrum and sharpness, from arrays (the notebook API's results: ``landscape.plot_spectrum``,
``landscape.plot_sharpness``), and the spectral-density axes the Hessian figure of runs shares with them
(``density_axes``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import NullFormatter

from landscape.core.errors import LandscapeError
from landscape.figures.over_seeds import density_floor
from landscape.figures.style import new_figure, outside_legend


def density_axes(ax: Any, lines: Sequence[tuple[np.ndarray, np.ndarray, dict[str, Any]]], floor: float) -> None:
    """Spectral densities on a log scale: each (grid, density, line style) drawn with the density clipped at
    ``floor`` (``over_seeds.density_floor``: the scale shows nothing below it), the eigenvalue axis labelled.
    The Hessian figure's panel (c) and ``spectrum_figure``'s density."""
    for grid, density, style in lines:
        ax.semilogy(grid, np.maximum(density, floor), **style)
    ax.set_ylim(bottom=floor)
    ax.set_xlabel(r"eigenvalue $\lambda$")
    ax.set_ylabel("density (log scale)")
    ax.grid(alpha=0.3)


def spectrum_figure(*, values: np.ndarray | None = None, residuals: np.ndarray | None = None,
                    converged: np.ndarray | None = None, grid: np.ndarray | None = None,
                    density: np.ndarray | None = None, title: str | None = None) -> Figure:
    """The Hessian's spectrum of one model: (a) its top-k eigenvalues lambda_1 >= ... >= lambda_k (Lanczos)
    against j, each with its residual ||H v_j - lambda_j v_j|| as an error bar (a true eigenvalue lies within
    it), hollow where it did not converge; (b) the SLQ spectral density on the Hessian figure's log axes
    (``density_axes``), the top-k eigenvalues as dashed lines on it. Either part alone draws one panel."""
    if values is None and density is None:
        raise LandscapeError("a spectrum figure needs the top eigenvalues, the spectral density or both")
    panels = (values is not None) + (density is not None)
    fig = new_figure(6.0 * panels, 4.4)
    axes = list(np.atleast_1d(fig.subplots(1, panels)))
    if values is not None:
        ax = axes.pop(0)
        values = np.asarray(values, dtype=float)
        j = np.arange(1, values.size + 1)
        errors = None if residuals is None else np.asarray(residuals, dtype=float)
        ok = np.ones(values.size, bool) if converged is None else np.asarray(converged, bool)
        ax.errorbar(j, values, yerr=errors, ls="none", color="C0", capsize=4, lw=1, zorder=2)
        _marked_values(ax, j, values, ok, ("converged", "not converged"), "{:.4g}", (6, 4))
        ax.set_xticks(j)
        ax.set_xlim(0.5, values.size + 0.5)
        ax.margins(y=0.15)
        ax.set_xlabel("j")
        ax.set_ylabel(r"$\lambda_j(\nabla^2 F)$")
        ax.set_title(rf"(a) top-{values.size} Hessian eigenvalues (Lanczos)"
                     + ("" if errors is None else "\n" + r"bars: residual $\|Hv_j - \lambda_j v_j\|$"))
        ax.grid(alpha=0.3)
    if density is not None:
        ax = axes.pop(0)
        drawn = [(np.asarray(grid, dtype=float), np.asarray(density, dtype=float),
                  {"color": "C0", "label": "SLQ density"})]
        density_axes(ax, drawn, density_floor([drawn[0][1]]))
        for k, value in enumerate([] if values is None else values):
            ax.axvline(value, color="C3", ls="--", lw=0.9,
                       label=rf"$\lambda_1 \ldots \lambda_{{{values.size}}}$ (Lanczos)" if k == 0 else None)
        ax.set_title(("(b) " if panels == 2 else "") + "Hessian spectral density (SLQ)")
    outside_legend(fig, fig.axes)
    if title:
        fig.suptitle(title)
    return fig


def _marked_values(ax: Any, x: np.ndarray, y: np.ndarray, ok: np.ndarray, labels: tuple[str, str], text: str,
                   offset: tuple[int, int]) -> None:
    """Points (x, y), solid where ``ok`` and hollow elsewhere (``labels``: the two kinds' legend entries, shown
    only when both occur), each labelled with its value (``text``, a format) at ``offset`` points."""
    for mask, face, label in ((ok, "C0", labels[0]), (~ok, "white", labels[1])):
        if mask.any():
            ax.scatter(x[mask], y[mask], s=40, facecolor=face, edgecolor="C0", zorder=3,
                       label=label if not ok.all() else None)
    for px, py in zip(x, y):
        ax.annotate(text.format(py), (px, py), xytext=offset, textcoords="offset points", fontsize=8)


def sharpness_profile_figure(rhos: np.ndarray, sharpness: np.ndarray, *, agreed: np.ndarray | None = None,
                             adaptive: bool = False, title: str | None = None) -> Figure:
    """S_rho = max_{||e|| <= rho} F(x + e) - F(x) of one model over the radius rho (log axis when the radii
    span a factor of 10 or more), each value labelled; hollow where ``agreed`` is False (no second ascent start
    reached that maximum: it may be a lower local one). ``adaptive``: the ASAM ball ||e / (|x| + eta)|| <= rho."""
    rhos, sharpness = np.asarray(rhos, dtype=float), np.asarray(sharpness, dtype=float)
    if rhos.shape != sharpness.shape or rhos.ndim != 1 or rhos.size == 0:
        raise LandscapeError(f"a sharpness profile needs one S_rho per radius (got {rhos.size} radii, "
                             f"{sharpness.size} values)")
    ok = np.ones(rhos.size, bool) if agreed is None else np.asarray(agreed, bool)
    order = np.argsort(rhos)
    fig = new_figure(6.4, 4.4)
    ax = fig.add_subplot()
    ax.plot(rhos[order], sharpness[order], "-", color="C0", lw=1.2, zorder=2)
    _marked_values(ax, rhos, sharpness, ok, ("another start reached it", "no other start reached it"), "{:.3g}",
                   (5, 5))
    if rhos.min() > 0 and rhos.max() / rhos.min() >= 10:
        ax.set_xscale("log")
    if rhos.size <= 8:  # each radius its tick, as it was given
        ax.set_xticks(rhos, [f"{r:g}" for r in rhos])
        ax.xaxis.set_minor_formatter(NullFormatter())
    ax.margins(x=0.1, y=0.15)
    ball = r"$\|e / (|x| + \eta)\| \leq \rho$ (ASAM)" if adaptive else r"$\|e\| \leq \rho$"
    ax.set_xlabel(rf"radius $\rho$ of the ball {ball}")
    ax.set_ylabel(r"$S_\rho$ = max$_{\|e\| \leq \rho}\, F(x+e) - F(x)$" if not adaptive
                  else r"$S_\rho$ = max over the ball of $F(x+e) - F(x)$")
    ax.set_title(title or r"sharpness $S_\rho$ over the radius $\rho$")
    ax.grid(alpha=0.3)
    outside_legend(fig, [ax])
    return fig
