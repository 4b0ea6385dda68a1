"""Colour scales and round ticks of the surface figures: the limits and levels several panels share (of
the loss's rise above each panel's centre where they compare loss surfaces: ``compared_scale``), and the ticks
of colour bars and z axes.

Colour bars and z axes carry about 5 round ticks (``nice_ticks``): the fewest digits that tell them apart,
one x10^k or offset for very small, large or narrow ranges, powers of ten (or 1-3 / 1-2-5 mantissas over a
decade or two) on log scales.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from matplotlib.colors import LogNorm, Normalize
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter, MaxNLocator, NullFormatter, ScalarFormatter

from landscape.core.errors import LandscapeError
from landscape.figures.surface.data import SurfaceData

# A log scale of the loss's rise spans this many decades below the largest rise of the panels.
RISE_DECADES = 3


LOSS = "loss"  # the surfaces' loss values (``SurfaceData.values``), drawn as rises side by side

def compared_scale(surfaces: list[SurfaceData], quantity: str, log_levels: bool, count: int
                   ) -> tuple[list[SurfaceData], np.ndarray, Normalize, str]:
    """What panels side by side draw: (the surfaces as drawn, their shared levels and norm, the colour bar's
    label). Two or more 2D loss surfaces: each one's rise above its centre, L - L(x) in nats (x: the grid
    point nearest the plane's origin), on one scale, so that the panel whose loss rises least spans the least
    of it whatever its loss at x (on a scale of the loss itself, a log one above all, a model that reaches a
    lower loss looks sharper although its loss rises less). ``log_levels``: a log scale of the rise over
    ``RISE_DECADES`` decades below the largest, smaller rises and falls below L(x) drawn in its lowest colour
    (linear where the loss rises nowhere). Else the values themselves."""
    label = surfaces[0].quantity_label(quantity)
    if quantity != LOSS or len(surfaces) < 2 or not all(s.is_2d for s in surfaces):
        return surfaces, *color_scale([s.values(quantity) for s in surfaces], log_levels, count), label
    rises = [s.loss - s.loss[int(np.argmin(np.abs(s.x_coords))), int(np.argmin(np.abs(s.y_coords)))]
             for s in surfaces]
    top = max((float(r[np.isfinite(r)].max()) for r in rises if np.isfinite(r).any()), default=0.0)
    log_levels = log_levels and top > 0
    label = f"rise of the {label}\nabove each panel's x (nats)"
    if log_levels:
        floor = top * 10.0**-RISE_DECADES
        rises = [np.maximum(r, floor) for r in rises]  # NaN stays NaN
        label += f"\nlog scale; rises under {floor:.2g} lowest"
    drawn = [dataclasses.replace(s, loss=r, meta={**s.meta, "z_label": "loss rise (nats)"})
             for s, r in zip(surfaces, rises)]
    return drawn, *color_scale(rises, log_levels, count), label


def color_scale(values: list[np.ndarray], log_levels: bool, count: int) -> tuple[np.ndarray, Normalize]:
    finite = np.concatenate([v[np.isfinite(v)].ravel() for v in values]) if values else np.array([])
    if log_levels:
        finite = finite[finite > 0]
    if finite.size == 0:
        above = " above 0 (log levels)" if log_levels else ""
        raise LandscapeError(f"the surface has no finite values to draw{above}")
    vmin, vmax = float(finite.min()), float(finite.max())
    if vmax <= vmin:
        vmax = vmin + (abs(vmin) * 1e-6 or 1e-6)
    if log_levels:
        return np.geomspace(vmin, vmax, count), LogNorm(vmin, vmax)
    return np.linspace(vmin, vmax, count), Normalize(vmin, vmax)


TICKS = 5  # about this many labelled ticks on a colour bar or a z axis
TICK_STEPS = [1, 2, 2.5, 5, 10]  # linear ticks are multiples of these x 10^k


def nice_ticks(vmin: float, vmax: float, log: bool = False, count: int = TICKS) -> np.ndarray:
    """About ``count`` round values inside [vmin, vmax] to label a colour bar or an axis with. Linear:
    multiples of 1, 2, 2.5 or 5 x 10^k. Log: powers of ten when three or more fall inside (every 2nd, 3rd, ...
    when there are more than ``count`` + 1), else 1-3, 1-2-5 or 1..9 x 10^k (whichever gives a number of
    ticks nearest ``count``), else (a range under a factor of about 1.5) round linear values."""
    lo, hi = float(vmin), float(vmax)
    if not (np.isfinite(lo) and np.isfinite(hi)) or hi <= lo or (log and lo <= 0):
        scale = " on a log scale" if log else ""
        raise LandscapeError(f"cannot place ticks on the range [{vmin:g}, {vmax:g}]{scale}")
    tol = (hi - lo) * 1e-9

    def inside(values: Any) -> np.ndarray:
        values = np.array([float(f"{v:.12g}") for v in np.ravel(values)])  # 3 * 0.1 is 0.3
        return values[(values >= lo - tol) & (values <= hi + tol)]

    if log:
        exponents = np.arange(int(np.floor(np.log10(lo))), int(np.ceil(np.log10(hi))) + 1)
        powers = 10.0 ** exponents
        decades = inside(powers)
        if len(decades) >= 3:
            stride = int(np.ceil(len(decades) / (count + 1)))
            kept = [d for d in decades if round(np.log10(d)) % stride == 0]
            return np.array(kept if len(kept) >= 2 else decades[::stride])
        options = [inside(np.outer(powers, subs)) for subs in ((1, 3), (1, 2, 5), tuple(range(1, 10)))]
        options = [ticks for ticks in options if len(ticks) >= 3]
        if options:  # the count nearest ``count``; of two as near, the fewer kinds of mantissa
            return min(options, key=lambda ticks: abs(len(ticks) - count))
    ticks = inside(MaxNLocator(count, steps=TICK_STEPS).tick_values(lo, hi))
    return ticks if len(ticks) >= 2 else np.array([lo, hi])


def _log_labels(ticks: np.ndarray) -> list[str]:
    """Labels of log-scale ticks: 10^k when every tick is a power of ten, else the fewest significant digits
    that tell the ticks apart (m x 10^k outside 0.001 .. 10^4)."""
    exponents = np.round(np.log10(ticks)).astype(int)
    if np.allclose(ticks, 10.0 ** exponents, rtol=1e-9):
        return [f"$\\mathdefault{{10^{{{k}}}}}$" for k in exponents]
    def plain(value: float, digits: int) -> str:  # 30, not 3e+01
        return np.format_float_positional(value, precision=digits, fractional=False, trim="-")

    digits = next((p for p in range(1, 13) if len({plain(t, p) for t in ticks}) == len(ticks)), 12)
    if all(1e-3 <= abs(t) < 1e4 for t in ticks):
        return [plain(t, digits) for t in ticks]
    labels = []  # all as m x 10^k (10^k where m is 1), not 3000 beside 1 x 10^4
    for t in ticks:
        k = int(np.floor(np.log10(abs(t))))
        mantissa = plain(t / 10.0 ** k, digits)
        text = f"10^{{{k}}}" if mantissa == "1" else f"{mantissa}\\times10^{{{k}}}"
        labels.append(f"$\\mathdefault{{{text}}}$")
    return labels


def tick_formatter(ticks: np.ndarray, log: bool = False) -> Any:
    """The formatter of ``nice_ticks``: on a linear scale matplotlib's ScalarFormatter (as many decimals as
    the tick spacing needs, one x10^k or offset above the bar for very small, large or narrow ranges); on a
    log scale ``_log_labels``."""
    if not log:
        formatter = ScalarFormatter(useMathText=True)
        formatter.set_powerlimits((-3, 4))
        return formatter
    labels = dict(zip(np.asarray(ticks, float).tolist(), _log_labels(np.asarray(ticks, float))))

    def label(value: float, _: Any = None) -> str:
        near = [text for tick, text in labels.items() if np.isclose(value, tick, rtol=1e-6, atol=0.0)]
        return near[0] if near else ""

    return FuncFormatter(label)


def set_ticks(axis: Any, vmin: float, vmax: float, log: bool = False) -> np.ndarray:
    """Put ``nice_ticks`` and their labels on a matplotlib axis (a colour bar's long axis, a z axis)."""
    ticks = nice_ticks(vmin, vmax, log)
    axis.set_major_locator(FixedLocator(ticks))
    axis.set_major_formatter(tick_formatter(ticks, log))
    axis.set_minor_formatter(NullFormatter())  # log scales: no 2x10^0-style minor labels
    return ticks


def colorbar(fig: Figure, mappable: Any, ax: Any, label: str, shrink: float = 1.0,
              pad: float = 0.05) -> None:
    bar = fig.colorbar(mappable, ax=ax, label=label, shrink=shrink, pad=pad)
    log = isinstance(mappable.norm, LogNorm)
    ticks = nice_ticks(mappable.norm.vmin, mappable.norm.vmax, log)
    # through the colour bar, which would otherwise put back its own locator (every few contour levels)
    bar.locator, bar.formatter = FixedLocator(ticks), tick_formatter(ticks, log)
    bar.minorformatter = NullFormatter()  # log scales: no 2x10^0-style minor labels
