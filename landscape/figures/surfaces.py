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
so. Several models side by side: ``compare_planes`` says whether their surfaces lie on one plane (euclidean
or filter-reference directions, the stored d1 / d2 equal) or each on its model's own filter-normalised plane,
with each model's weight norm ||x||; the panels and the HTML put ||x|| under each title and that line under
the panels. Matplotlib is used through ``matplotlib.figure.Figure`` with the Agg canvas only (no pyplot, no global
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
        values = {"loss": self.loss, "accuracy": self.accuracy}.get(quantity)
        if values is None:
            raise LandscapeError(f"this surface has no '{quantity}' values (loss or accuracy)")
        return values

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


def normalization_of(meta: dict[str, Any]) -> str | None:
    """How a random plane was normalised: filter (per model; also every record written before the option
    existed), euclidean or filter-reference; None for other directions (or no record)."""
    if meta.get("directions") != "random":
        return None
    return str(meta.get("normalization") or "filter")


def axis_labels(meta: dict[str, Any]) -> tuple[str, str]:
    """The names of the two directions, as the figures write them."""
    kind = meta.get("directions")
    if kind == "random":
        ortho = ", orthogonalised" if meta.get("orthogonalize") else ""
        normalization = normalization_of(meta)
        if normalization == "euclidean":
            length = f"{float(meta.get('length', float('nan'))):g}"
            return f"d1 (random, ||d1|| = {length})", f"d2 (random, ||d2|| = {length}{ortho})"
        if normalization == "filter-reference":
            to = f"filter-normalised to {meta.get('reference', 'a reference')}"
            return f"d1 (random, {to})", f"d2 (random, {to}{ortho})"
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


# -- comparing surfaces of several models -------------------------------------------------------------------


@dataclass(frozen=True)
class PlaneComparison:
    """Whether surfaces drawn side by side share one plane, so that their axes are one distance in parameter
    space and their widths compare the models; with every model's weight norm ||x|| to print beside them.

    ``normalizations``: each surface's (``normalization_of``: filter | euclidean | filter-reference, None for
    pca / clients / interpolate or a bare NPZ). ``weight_norms``: each surface's ``weight_norm`` record (None
    where it was written before the pass recorded it). ``comparable``: every surface a random plane of a mode
    whose directions do not depend on the model (euclidean, filter-reference) with the same settings.
    ``same_plane``: the stored d1 (and d2) are equal for all of them (None when some NPZ lacks them)."""

    normalizations: tuple[str | None, ...]
    weight_norms: tuple[float | None, ...]
    comparable: bool
    same_plane: bool | None
    text: str  # one line for a caption or under a table


def weight_norm_text(surface: SurfaceData) -> str:
    """'||x|| = 23.41' from the surface's record ('' when it does not hold one)."""
    norm = surface.meta.get("weight_norm")
    return f"||x|| = {float(norm):.4g}" if isinstance(norm, (int, float)) else ""


def compare_planes(sources: Sequence[str | Path | SurfaceData], labels: Sequence[str] | None = None
                   ) -> PlaneComparison:
    """What a side-by-side picture of these surfaces compares (``PlaneComparison``), with a line that says it:
    per-model filter normalisation (Li et al. 2018) scales each plane with its own model's filters, so a plane
    of a model with c times the weights reaches c times as far per axis unit; euclidean directions (one stated
    length) and filter directions normalised to one reference model are the same vector for every model."""
    surfaces = [_as_surface(s) for s in sources]
    labels = list(labels) if labels else [s.title() or f"surface {k}" for k, s in enumerate(surfaces)]
    modes = tuple(normalization_of(s.meta) for s in surfaces)
    norms = tuple(float(s.meta["weight_norm"]) if isinstance(s.meta.get("weight_norm"), (int, float)) else None
                  for s in surfaces)
    settings = {(m, s.meta.get("length") if m == "euclidean" else s.meta.get("reference"))
                for m, s in zip(modes, surfaces)}
    comparable = all(m in ("euclidean", "filter-reference") for m in modes) and len(settings) == 1
    names = [k for k in ("d1", "d2") if all(k in s.extra for s in surfaces)]
    same = (None if "d1" not in names else
            all(np.array_equal(s.extra[k], surfaces[0].extra[k]) for s in surfaces for k in names))
    given = [f"{label} = {norm:.4g}" for label, norm in zip(labels, norms) if norm is not None]
    norms_text = ("||x||: " + ", ".join(given)) if given else "||x|| not recorded (rerun the surface pass)"
    if comparable:
        mode, setting = next(iter(settings))
        what = (f"euclidean directions of length {float(setting):g}" if mode == "euclidean"
                else f"directions filter-normalised to {setting}")
        plane = {True: "one plane for every model (identical d1, d2)", False: "but the planes differ "
                 "(other seeds or architectures)", None: "one setting for every model"}[same]
        text = f"{what}: {plane}; {norms_text}"
    elif all(m == "filter" for m in modes):
        text = ("per-model filter-normalised planes (Li et al. 2018): each axis unit scales with that model's "
                f"own filters, so the widths also compare weight norms; {norms_text}")
    elif all(m in ("euclidean", "filter-reference") for m in modes):
        shown = ", ".join(sorted(f"{m} {'length' if m == 'euclidean' else 'to'} {v}" for m, v in settings))
        text = f"planes of different settings ({shown}): the axes are not one distance; {norms_text}"
    else:
        shown = ", ".join(sorted({m or "not a random plane" for m in modes}))
        text = f"planes of different normalisations ({shown}): the axes are not one distance; {norms_text}"
    return PlaneComparison(modes, norms, comparable, same, text)


def _short_labels(titles: Sequence[str]) -> list[str]:
    """Panel titles without the settings they show ('label, round 30 [grid=21, ...]' -> 'label, round 30'), for
    the caption line that names every panel's ||x||."""
    return [title.split("\n")[0].split(" [")[0] for title in titles]


def _panel_titles(surfaces: list[SurfaceData], titles: list[str]) -> list[str]:
    """Titles with each model's ||x|| under them, when there is more than one panel."""
    if len(surfaces) < 2:
        return titles
    return [f"{title}\n{weight_norm_text(s)}" if weight_norm_text(s) else title
            for title, s in zip(titles, surfaces)]


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
    planes = compare_planes(surfaces, _short_labels(titles)) if len(surfaces) > 1 else None
    titles = _panel_titles(surfaces, titles)
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
    if planes is not None:  # what the panels' axes are: one plane, or each model's own filter norms
        # above 3D panels (their axis labels reach below the boxes, where the layout does not see them)
        (fig.suptitle if kind == "3d" else fig.supxlabel)(planes.text, fontsize=8, wrap=True)
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
    planes = compare_planes(surfaces, _short_labels(titles)) if len(surfaces) > 1 else None
    titles = [t.replace("\n", "<br>") for t in _panel_titles(surfaces, titles)]
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
    if planes is not None:
        fig.add_annotation(text=planes.text, showarrow=False, xref="paper", yref="paper", x=0.0, y=-0.08,
                           xanchor="left", yanchor="top", font={"size": 11})
        fig.update_layout(margin={"b": 90})
    return fig


def surface_html(sources: Sequence[str | Path | SurfaceData], out: str | Path,
                 titles: Sequence[str] | None = None, *, quantity: str = "loss") -> Path:
    """Interactive 3D surface(s) in one self-contained HTML file (plotly.js inline: opens with no network)."""
    out = Path(out)
    html = surface_figure(sources, titles, quantity=quantity).to_html(include_plotlyjs=True, full_html=True)
    write_text(out, html)
    return out
