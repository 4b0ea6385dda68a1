"""Loss-surface figures from the files of the ``surface`` analysis pass (NPZ arrays + JSON metadata).

Input: ``analysis/round-NNNN/surface.npz`` (``loss``, ``accuracy``, ``x_coords``, ``y_coords`` and, by
directions, ``trajectory`` / ``trajectory_rounds`` or ``client_ids`` / ``client_coords``) and, when it sits
beside it, ``surface.json`` (the pass's record: directions, explained variance, clients, data, run, round).
A bare NPZ with ``loss`` and ``x_coords`` (and ``y_coords``) is enough; labels then fall back to d1 / d2.

Orientation. Surfaces are stored ``[ix, iy]`` (first index along d1). Matplotlib's ``contour(X, Y, Z)`` and
plotly's ``Surface(x, y, z)`` both take Z with ROWS along y and COLUMNS along x, so every renderer draws
``Z = values.T`` against ``X, Y = meshgrid(x_coords, y_coords)`` (``image_arrays``): d1 is the horizontal
axis of every picture.

Renderers: ``plot_curve_1d`` (interpolation lines), ``plot_contour`` (filled contours and/or contour lines,
optional log-spaced levels, the checkpoint marked, the PCA trajectory or the client models overlaid),
``plot_surface_3d`` (static 3D), ``surface_html`` (interactive plotly 3D, plotly.js inline so the file opens
with no network) and ``plot_panels`` (several runs side by side on ONE colour scale: same limits, same
levels, one colour bar). Colour bars and z axes carry about 5 round ticks (``nice_ticks``): the fewest digits
that tell them apart, one x10^k or offset for very small, large or narrow ranges, powers of ten (or 1-3 / 1-2-5
mantissas over a decade or two) on log scales. Static files are PNG, or PDF / SVG when the output name ends
so. Matplotlib is used through ``matplotlib.figure.Figure`` with the Agg canvas only (no pyplot, no global
backend switch).
"""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib import patheffects
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import LogNorm, Normalize
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter, MaxNLocator, NullFormatter, ScalarFormatter

from landscape.errors import LandscapeError
from landscape.runs import atomic_write, write_text

CMAP = "viridis"
OUTLINED = [patheffects.withStroke(linewidth=2, foreground="black")]  # white labels readable on any colour
STATIC_FORMATS = {".png": "png", ".pdf": "pdf", ".svg": "svg"}


# -- reading ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SurfaceData:
    """One surface as read from its files: values [nx, ny] (or [nx]) and what the figures need to label it."""

    x_coords: np.ndarray
    y_coords: np.ndarray | None
    loss: np.ndarray
    accuracy: np.ndarray | None = None
    meta: dict[str, Any] = field(default_factory=dict)  # the JSON record's "result" (may be empty)
    run: str = ""
    round: int | None = None
    extra: dict[str, np.ndarray] = field(default_factory=dict)  # trajectory, client_coords, ...

    @classmethod
    def from_arrays(cls, x_coords: Any, loss: Any, y_coords: Any = None, accuracy: Any = None,
                    meta: dict[str, Any] | None = None, run: str = "") -> SurfaceData:
        """A surface from arrays in our layout ([nx, ny] values, or [nx] for a line)."""
        surface = cls(np.asarray(x_coords, float), None if y_coords is None else np.asarray(y_coords, float),
                      np.asarray(loss, float), None if accuracy is None else np.asarray(accuracy, float),
                      dict(meta or {}), run)
        surface.check()
        return surface

    @property
    def is_2d(self) -> bool:
        return self.y_coords is not None

    def check(self) -> None:
        expected = (len(self.x_coords),) + (() if self.y_coords is None else (len(self.y_coords),))
        if self.loss.shape != expected:
            raise LandscapeError(f"surface values have shape {self.loss.shape}, but the coordinates give "
                                 f"{expected} ([ix, iy] layout)")
        if min(expected) < 2:
            raise LandscapeError(f"a surface of {'x'.join(map(str, expected))} points cannot be drawn (at least 2 "
                                 "per axis; the surface pass computes 3 or more)")

    def values(self, quantity: str = "loss") -> np.ndarray:
        if quantity == "loss":
            return self.loss
        if quantity == "accuracy" and self.accuracy is not None:
            return self.accuracy
        raise LandscapeError(f"this surface has no '{quantity}' values (loss or accuracy)")

    def axis_labels(self) -> tuple[str, str]:
        return axis_labels(self.meta)

    def quantity_label(self, quantity: str = "loss") -> str:
        text = str(self.meta.get("quantity", "loss"))
        return text.replace("loss", "accuracy", 1) if quantity == "accuracy" else text

    def title(self) -> str:
        if self.run and self.round is not None:
            return f"{self.run}, round {self.round}"
        return self.run


def load_surface(path: str | Path) -> SurfaceData:
    """Read ``surface.npz`` (give the NPZ or its JSON) and the JSON record beside it when present."""
    path = Path(path)
    npz = path.with_suffix(".npz")
    if not npz.is_file():
        raise LandscapeError(f"surface file not found: {npz}")
    try:
        with np.load(npz, allow_pickle=False) as f:
            arrays = {k: f[k] for k in f.files}
    except (OSError, ValueError) as e:
        raise LandscapeError(f"cannot read surface file {npz}: {e}") from None
    if "loss" not in arrays or "x_coords" not in arrays:
        raise LandscapeError(f"{npz} is not a surface file (it has no 'loss' and 'x_coords')")
    record: dict[str, Any] = {}
    sidecar = npz.with_suffix(".json")
    if sidecar.is_file():
        try:
            record = json.loads(sidecar.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise LandscapeError(f"cannot read {sidecar}: {e}") from None
        if not isinstance(record, dict) or not isinstance(record.get("result", {}), dict):
            raise LandscapeError(f"{sidecar} is not a surface record (a JSON object with a 'result' table); "
                                 "rerun the surface pass with --force")
    known = {"loss", "accuracy", "x_coords", "y_coords"}
    surface = SurfaceData(
        arrays["x_coords"].astype(float), arrays["y_coords"].astype(float) if "y_coords" in arrays else None,
        arrays["loss"].astype(float), arrays["accuracy"].astype(float) if "accuracy" in arrays else None,
        record.get("result", {}), str(record.get("run", npz.parent.name)), record.get("round"),
        {k: v for k, v in arrays.items() if k not in known},
    )
    surface.check()
    return surface


def _as_surface(source: str | Path | SurfaceData) -> SurfaceData:
    return source if isinstance(source, SurfaceData) else load_surface(source)


def axis_labels(meta: dict[str, Any]) -> tuple[str, str]:
    """The names of the two directions, as the figures write them."""
    kind = meta.get("directions")
    if kind == "random":
        ortho = ", orthogonalised" if meta.get("orthogonalize") else ""
        return "d1 (filter-normalised random)", f"d2 (filter-normalised random{ortho})"
    if kind == "pca":
        ratios = list(meta.get("explained_variance", [])) + [float("nan")] * 2
        return f"PC1 ({100 * float(ratios[0]):.1f}% var.)", f"PC2 ({100 * float(ratios[1]):.1f}% var.)"
    if kind == "clients":
        a, b = (list(meta.get("clients", [])) + ["a", "b"])[:2]
        return f"client {a} direction", f"client {b} direction (Gram-Schmidt)"
    if kind == "interpolate":
        return f"alpha (x -> {meta.get('target', 'target')})", ""
    return "d1", "d2"


def image_arrays(surface: SurfaceData, quantity: str = "loss") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(X, Y, Z) for matplotlib / plotly: Z[iy, ix] = values[ix, iy], X[iy, ix] = x_coords[ix]."""
    if not surface.is_2d:
        raise LandscapeError("this surface is a 1D line; draw it with plot_curve_1d")
    x_grid, y_grid = np.meshgrid(surface.x_coords, surface.y_coords, indexing="xy")
    return x_grid, y_grid, surface.values(quantity).T


# -- shared helpers ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PanelData:
    """What one panel drew (for checks): the arrays, the levels and the colour limits, and for contour lines
    the line segments per level (matplotlib's ``allsegs``)."""

    X: np.ndarray
    Y: np.ndarray
    Z: np.ndarray
    levels: np.ndarray
    vmin: float
    vmax: float
    segments: list = field(default_factory=list)


def _color_scale(values: list[np.ndarray], log_levels: bool, count: int) -> tuple[np.ndarray, Normalize]:
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
_STEPS = [1, 2, 2.5, 5, 10]  # linear ticks are multiples of these x 10^k


def nice_ticks(vmin: float, vmax: float, log: bool = False, count: int = TICKS) -> np.ndarray:
    """About ``count`` round values inside [vmin, vmax] to label a colour bar or an axis with. Linear: multiples
    of 1, 2, 2.5 or 5 x 10^k. Log: powers of ten when three or more fall inside (every 2nd, 3rd, ... when there
    are more than ``count`` + 1), else 1-3, 1-2-5 or 1..9 x 10^k (whichever gives a number of ticks nearest
    ``count``), else (a range under a factor of about 1.5) round linear values."""
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
    ticks = inside(MaxNLocator(count, steps=_STEPS).tick_values(lo, hi))
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
    the tick spacing needs, one x10^k or offset above the bar for very small, large or narrow ranges); on a log
    scale ``_log_labels``."""
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


def _colorbar(fig: Figure, mappable: Any, ax: Any, label: str, shrink: float = 1.0,
              pad: float = 0.05) -> None:
    bar = fig.colorbar(mappable, ax=ax, label=label, shrink=shrink, pad=pad)
    log = isinstance(mappable.norm, LogNorm)
    ticks = nice_ticks(mappable.norm.vmin, mappable.norm.vmax, log)
    # through the colour bar, which would otherwise put back its own locator (every few contour levels)
    bar.locator, bar.formatter = FixedLocator(ticks), tick_formatter(ticks, log)
    bar.minorformatter = NullFormatter()  # log scales: no 2x10^0-style minor labels


def save_figure(fig: Figure, out: str | Path) -> Path:
    """Write a Figure as PNG / PDF / SVG (by the name's suffix), atomically; return the path."""
    out = Path(out)
    fmt = STATIC_FORMATS.get(out.suffix.lower())
    if fmt is None:
        raise LandscapeError(f"figure file {out} must end in .png, .pdf or .svg")
    FigureCanvasAgg(fig)
    buffer = io.BytesIO()
    fig.savefig(buffer, format=fmt, dpi=150, bbox_inches="tight")
    atomic_write(out, lambda f: f.write(buffer.getvalue()))
    return out


def _overlay(ax: Any, surface: SurfaceData, overlay: str | None) -> None:
    kind = surface.meta.get("directions")
    if overlay == "none":
        overlay = None
    if overlay == "auto":
        overlay = {"pca": "trajectory", "clients": "clients"}.get(kind) if kind else None
        if overlay is None:
            overlay = "trajectory" if "trajectory" in surface.extra else (
                "clients" if "client_coords" in surface.extra else None)
    if overlay is None:
        return
    if overlay == "trajectory":
        if "trajectory" not in surface.extra:
            raise LandscapeError("overlay 'trajectory' needs a PCA surface (its NPZ has no 'trajectory')")
        path = surface.extra["trajectory"]
        rounds = surface.extra.get("trajectory_rounds", np.arange(len(path)))
        ax.plot(path[:, 0], path[:, 1], "-o", color="white", mec="black", mew=0.6, ms=4, lw=1.2,
                label="trajectory x^t", zorder=3)
        for k in sorted({0, len(path) - 1}):
            ax.annotate(f"t={int(rounds[k])}", path[k], textcoords="offset points", xytext=(5, 5), fontsize=8,
                        color="white", path_effects=OUTLINED)
    elif overlay == "clients":
        if "client_coords" not in surface.extra:
            raise LandscapeError("overlay 'clients' needs a client-plane surface (its NPZ has no "
                                 "'client_coords')")
        coords = surface.extra["client_coords"]
        ids = surface.extra.get("client_ids", np.arange(len(coords)))
        pair = set(surface.meta.get("clients", []))
        ax.scatter(coords[:, 0], coords[:, 1], c=["tab:orange" if int(i) in pair else "white" for i in ids],
                   edgecolors="black", s=36, zorder=4, label="client models y_i (projected)")
        for (cx, cy), i in zip(coords, ids):
            ax.annotate(str(int(i)), (cx, cy), textcoords="offset points", xytext=(4, 4), fontsize=8,
                        color="white", path_effects=OUTLINED)
    else:
        raise LandscapeError(f"unknown overlay '{overlay}'; choose trajectory, clients, auto or none")


def _mark_centre(ax: Any, surface: SurfaceData) -> None:
    label = f"x (round {surface.round})" if surface.round is not None else "x (checkpoint)"
    ax.plot([0.0], [0.0], marker="*", color="red", mec="black", ms=13, ls="none", label=label, zorder=5)


def _contour_panel(ax: Any, surface: SurfaceData, quantity: str, levels: np.ndarray, norm: Normalize,
                   filled: bool, lines: bool, overlay: str | None) -> tuple[PanelData, Any]:
    x_grid, y_grid, z = image_arrays(surface, quantity)
    masked = np.ma.masked_invalid(z)
    mappable, segments = None, []
    if filled:
        mappable = ax.contourf(x_grid, y_grid, masked, levels=levels, cmap=CMAP, norm=norm, extend="neither")
    if lines:
        line_kw = ({"colors": "black", "linewidths": 0.5, "alpha": 0.6} if filled
                   else {"cmap": CMAP, "norm": norm})
        contour = ax.contour(x_grid, y_grid, masked, levels=levels, **line_kw)
        segments = contour.allsegs
        mappable = mappable or contour
    if not filled and not lines:
        raise LandscapeError("a contour figure needs filled contours, contour lines or both")
    _mark_centre(ax, surface)
    _overlay(ax, surface, overlay)
    xlabel, ylabel = surface.axis_labels()
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_xlim(surface.x_coords[0], surface.x_coords[-1])
    ax.set_ylim(surface.y_coords[0], surface.y_coords[-1])
    ax.legend(loc="upper right", fontsize=7, framealpha=0.7)
    panel = PanelData(x_grid, y_grid, z, np.asarray(levels), float(norm.vmin), float(norm.vmax), segments)
    return panel, mappable


# -- renderers --------------------------------------------------------------------------------------------


def plot_contour(source: str | Path | SurfaceData, out: str | Path, *, quantity: str = "loss",
                 filled: bool = True, lines: bool = True, log_levels: bool = False,
                 overlay: str | None = "auto", levels: int = 30, title: str | None = None) -> PanelData:
    """Contour map of one 2D surface: d1 horizontal, d2 vertical, the checkpoint marked (red star), a colour
    bar naming the quantity and data; ``overlay``: "trajectory" (PCA), "clients" (client plane), "auto"
    (whichever the surface has) or None."""
    surface = _as_surface(source)
    level_values, norm = _color_scale([surface.values(quantity)], log_levels, levels)
    fig = Figure(figsize=(6.4, 5.2), layout="constrained")
    ax = fig.add_subplot()
    panel, mappable = _contour_panel(ax, surface, quantity, level_values, norm, filled, lines, overlay)
    _colorbar(fig, mappable, ax, surface.quantity_label(quantity))
    ax.set_title(surface.title() if title is None else title)
    save_figure(fig, out)
    return panel


def plot_panels(sources: Sequence[str | Path | SurfaceData], titles: Sequence[str] | None, out: str | Path, *,
                kind: str = "contour", quantity: str = "loss", log_levels: bool = False, filled: bool = True,
                lines: bool = True, overlay: str | None = "auto", levels: int = 30) -> list[PanelData]:
    """Several surfaces side by side on ONE colour scale (same limits and levels, one colour bar), e.g. the
    FedSAM vs FedNSAM picture. ``kind``: "contour" or "3d" (3D panels also share the z limits)."""
    fig, panels = panels_figure(sources, titles, kind=kind, quantity=quantity, log_levels=log_levels,
                                filled=filled, lines=lines, overlay=overlay, levels=levels)
    save_figure(fig, out)
    return panels


def panels_figure(sources: Sequence[str | Path | SurfaceData], titles: Sequence[str] | None = None, *,
                  kind: str = "contour", quantity: str = "loss", log_levels: bool = False, filled: bool = True,
                  lines: bool = True, overlay: str | None = "auto", levels: int = 30
                  ) -> tuple[Figure, list[PanelData]]:
    """The Figure of ``plot_panels`` and what each panel drew."""
    if kind not in ("contour", "3d"):
        raise LandscapeError(f"panel kind must be contour or 3d, got '{kind}'")
    surfaces = [_as_surface(s) for s in sources]
    if not surfaces:
        raise LandscapeError("plot_panels needs at least one surface")
    titles = list(titles) if titles else [s.title() for s in surfaces]
    if len(titles) != len(surfaces):
        raise LandscapeError(f"{len(titles)} titles for {len(surfaces)} surfaces")
    level_values, norm = _color_scale([s.values(quantity) for s in surfaces], log_levels, levels)
    width = 5.6 if kind == "3d" else 4.6  # 3D panels: room for the z label beside each box
    fig = Figure(figsize=(width * len(surfaces) + 1.2, 4.6 if kind == "3d" else 4.4), layout="constrained")
    if kind == "3d":
        fig.get_layout_engine().set(w_pad=0.25, wspace=0.08)
    panels, axes, mappable = [], [], None
    for k, (surface, title) in enumerate(zip(surfaces, titles)):
        if kind == "contour":
            ax = fig.add_subplot(1, len(surfaces), k + 1)
            panel, mappable = _contour_panel(ax, surface, quantity, level_values, norm, filled, lines,
                                             overlay)
        else:
            ax = fig.add_subplot(1, len(surfaces), k + 1, projection="3d", computed_zorder=False)
            panel, mappable = _surface_panel(ax, surface, quantity, norm, log_levels)
            ax.set_zlim(norm.vmin, norm.vmax)
            panel = PanelData(panel.X, panel.Y, panel.Z, level_values, panel.vmin, panel.vmax)
        ax.set_title(title)
        panels.append(panel)
        axes.append(ax)
    _colorbar(fig, mappable, axes, surfaces[0].quantity_label(quantity), shrink=0.85,
              pad=0.08 if kind == "3d" else 0.05)  # room for the z label
    return fig, panels


def _surface_panel(ax: Any, surface: SurfaceData, quantity: str, norm: Normalize,
                   log_levels: bool) -> tuple[PanelData, Any]:
    x_grid, y_grid, z = image_arrays(surface, quantity)
    mappable = ax.plot_surface(x_grid, y_grid, np.ma.masked_invalid(z), cmap=CMAP, norm=norm, rstride=1,
                               cstride=1, linewidth=0.1, edgecolor="none", antialiased=True)
    centre = tuple(int(np.argmin(np.abs(c))) for c in (surface.x_coords, surface.y_coords))
    # drawn after the surface with computed_zorder=False on the axes, so the surface never hides it
    ax.scatter([0.0], [0.0], [surface.values(quantity)[centre]], color="red", edgecolors="black", marker="*",
               s=140, depthshade=False, label="x", zorder=10)
    xlabel, ylabel = surface.axis_labels()
    ax.set_xlabel(xlabel, fontsize=8)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.set_zlabel(quantity, fontsize=8, labelpad=8)
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_locator(MaxNLocator(5))
    if log_levels:
        ax.set_zscale("log")
        set_ticks(ax.zaxis, norm.vmin, norm.vmax, log=True)
    else:  # MaxNLocator follows the z limits (set after this by the panels, autoscaled otherwise)
        ax.zaxis.set_major_locator(MaxNLocator(TICKS, steps=_STEPS))
        ax.zaxis.set_major_formatter(tick_formatter(np.array([]), log=False))
    return PanelData(x_grid, y_grid, z, np.array([]), float(norm.vmin), float(norm.vmax)), mappable


def plot_surface_3d(source: str | Path | SurfaceData, out: str | Path, *, quantity: str = "loss",
                    log_levels: bool = False, title: str | None = None) -> PanelData:
    """Static 3D view of one 2D surface (matplotlib), the checkpoint marked, with a colour bar."""
    surface = _as_surface(source)
    _, norm = _color_scale([surface.values(quantity)], log_levels, 2)
    fig = Figure(figsize=(6.4, 5.2), layout="constrained")
    ax = fig.add_subplot(projection="3d", computed_zorder=False)
    panel, mappable = _surface_panel(ax, surface, quantity, norm, log_levels)
    ax.set_title(surface.title() if title is None else title)
    _colorbar(fig, mappable, ax, surface.quantity_label(quantity), shrink=0.7, pad=0.12)
    save_figure(fig, out)
    return panel


def plot_curve_1d(sources: Sequence[str | Path | SurfaceData], out: str | Path, *,
                  labels: Sequence[str] | None = None, accuracy: bool = True) -> list[np.ndarray]:
    """Loss (solid, left axis) and accuracy (dashed, right axis) along 1D lines x + alpha (target - x);
    alpha = 0 (x) and alpha = 1 (the target) marked. Returns the plotted loss curves."""
    surfaces = [_as_surface(s) for s in sources]
    if not surfaces:
        raise LandscapeError("plot_curve_1d needs at least one curve")
    if any(s.is_2d for s in surfaces):
        raise LandscapeError("plot_curve_1d draws 1D surfaces (interpolate); draw 2D ones with plot_contour")
    if not labels:
        labels = [s.meta.get("target", s.run) or f"curve {k}" for k, s in enumerate(surfaces)]
    fig = Figure(figsize=(6.4, 4.2), layout="constrained")
    ax = fig.add_subplot()
    twin = ax.twinx() if accuracy and any(s.accuracy is not None for s in surfaces) else None
    curves = []
    for k, (surface, label) in enumerate(zip(surfaces, labels)):
        color = f"C{k % 10}"
        ax.plot(surface.x_coords, surface.loss, "-o", ms=3, color=color, label=f"{label}: loss")
        curves.append(surface.loss)
        if twin is not None and surface.accuracy is not None:
            twin.plot(surface.x_coords, surface.accuracy, "--", color=color, label=f"{label}: accuracy")
    for alpha, name in ((0.0, "x"), (1.0, "target")):
        ax.axvline(alpha, color="grey", ls=":", lw=1)
        ax.annotate(name, (alpha, 1.0), xycoords=("data", "axes fraction"), textcoords="offset points",
                    xytext=(3, -12), fontsize=8, color="grey")
    ax.set_xlabel(surfaces[0].axis_labels()[0] if len(surfaces) == 1 else "alpha (x -> target)")
    ax.set_ylabel(surfaces[0].quantity_label("loss"))
    if twin is not None:
        twin.set_ylabel("accuracy")
        twin.set_ylim(0, 1)
    handles, names = ax.get_legend_handles_labels()
    if twin is not None:
        more, more_names = twin.get_legend_handles_labels()
        handles, names = handles + more, names + more_names
    fig.legend(handles, names, loc="outside lower center", ncols=min(4, len(handles)), fontsize=8)
    save_figure(fig, out)
    return curves


# -- interactive ------------------------------------------------------------------------------------------


def value_range(sources: Sequence[str | Path | SurfaceData], quantity: str = "loss") -> tuple[float, float]:
    """(lowest, highest) finite value of the surfaces together: the colour and z range they share."""
    _, norm = _color_scale([_as_surface(s).values(quantity) for s in sources], False, 2)
    return float(norm.vmin), float(norm.vmax)


def surface_figure(sources: Sequence[str | Path | SurfaceData], titles: Sequence[str] | None = None, *,
                   quantity: str = "loss", limits: tuple[float, float] | None = None) -> Any:
    """A plotly figure: one 3D surface per source, side by side, on one shared colour scale and z range, which
    is ``limits`` when given (e.g. ``value_range`` of surfaces drawn in other figures), else the sources'."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    surfaces = [_as_surface(s) for s in sources]
    if not surfaces:
        raise LandscapeError("surface_html needs at least one surface")
    titles = list(titles) if titles else [s.title() or f"surface {k}" for k, s in enumerate(surfaces)]
    _, norm = _color_scale([s.values(quantity) for s in surfaces], False, 2)
    if limits is not None:
        low, high = (float(v) for v in limits)
        if not (np.isfinite(low) and np.isfinite(high) and low < high):
            raise LandscapeError(f"surface limits must be two finite numbers, low < high; got {limits}")
        norm = Normalize(low, high)
    fig = make_subplots(rows=1, cols=len(surfaces), specs=[[{"type": "surface"}] * len(surfaces)],
                        subplot_titles=titles, horizontal_spacing=0.02)
    for k, surface in enumerate(surfaces):
        _, _, z = image_arrays(surface, quantity)
        fig.add_trace(go.Surface(x=surface.x_coords, y=surface.y_coords, z=z, coloraxis="coloraxis",
                                 name=titles[k]), row=1, col=k + 1)
        centre = tuple(int(np.argmin(np.abs(c))) for c in (surface.x_coords, surface.y_coords))
        fig.add_trace(go.Scatter3d(x=[0.0], y=[0.0], z=[float(surface.values(quantity)[centre])],
                                   mode="markers", marker={"color": "red", "size": 5, "symbol": "diamond"},
                                   name="x (checkpoint)", showlegend=k == 0), row=1, col=k + 1)
        xlabel, ylabel = surface.axis_labels()
        scene = "scene" if k == 0 else f"scene{k + 1}"
        fig.update_layout({scene: {"xaxis_title": xlabel, "yaxis_title": ylabel, "zaxis_title": quantity,
                                   "zaxis": {"range": [norm.vmin, norm.vmax]},
                                   # seen from further away than plotly's default: axis titles stay in view
                                   "camera": {"eye": {"x": 1.75, "y": 1.75, "z": 1.05}}}})
    fig.update_layout(coloraxis={"colorscale": CMAP.capitalize(), "cmin": norm.vmin, "cmax": norm.vmax,
                                 "colorbar": {"title": {"text": surfaces[0].quantity_label(quantity)}}},
                      height=600, width=max(680, 540 * len(surfaces)),
                      legend={"orientation": "h", "x": 0.0, "y": -0.02, "yanchor": "top"},
                      margin={"l": 10, "r": 10, "t": 60, "b": 60})
    return fig


def surface_html(sources: Sequence[str | Path | SurfaceData], out: str | Path,
                 titles: Sequence[str] | None = None, *, quantity: str = "loss") -> Path:
    """Interactive 3D surface(s) in one self-contained HTML file (plotly.js inline: opens with no network)."""
    out = Path(out)
    html = surface_figure(sources, titles, quantity=quantity).to_html(include_plotlyjs=True, full_html=True)
    write_text(out, html)
    return out
