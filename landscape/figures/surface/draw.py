"""Loss-surface figures drawn from the files of the ``surface`` analysis pass: matplotlib contour, 3D and 1D
pictures, and the interactive plotly HTML.

The files are read by ``landscape.figures.surface.data`` (``SurfaceData``, ``load_surface``), the colour
scales and ticks placed by ``landscape.figures.surface.scale``.

Renderers (each static ``plot_*`` saves its figure; its ``*_figure`` twin returns the matplotlib Figure and
what it drew, which ``landscape.api.plots`` draws the notebook API's surfaces with): ``plot_curve_1d``
(interpolation lines), ``plot_contour`` (filled contours and/or contour lines,
optional log-spaced levels, the checkpoint marked, the PCA trajectory or the client models overlaid),
``plot_surface_3d`` (static 3D), ``surface_html`` (interactive plotly 3D, plotly.js inline so the file opens
with no network) and ``plot_panels`` (several runs side by side on ONE colour scale: same limits, same
levels, one colour bar; the loss's rise above each x). Static files are PNG, or PDF / SVG. Panels of several
models put each model's ||x|| under its title and ``compare_planes``'s line under the panels. Matplotlib is
used through ``matplotlib.figure.Figure`` with the Agg canvas only (no pyplot, no global backend switch).
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib import patheffects
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from landscape.core.errors import LandscapeError
from landscape.figures.labels import caption_of, caption_path, set_caption, wrap_title
from landscape.figures.style import outside_legend
from landscape.figures.surface.data import (
    SurfaceData,
    _as_surface,
    _panel_titles,
    _short_labels,
    compare_planes,
    image_arrays,
)
from landscape.figures.surface.scale import (
    TICK_STEPS,
    TICKS,
    color_scale,
    colorbar,
    compared_scale,
    set_ticks,
    tick_formatter,
)
from landscape.store.fileio import atomic_write, write_text

CMAP = "viridis"
OUTLINED = [patheffects.withStroke(linewidth=2, foreground="black")]  # white labels readable on any colour
STATIC_FORMATS = {".png": "png", ".pdf": "pdf", ".svg": "svg"}
SCENE_TITLE_CHARS = 24  # a 3D axis title longer than this runs out of its scene's box and is cut there


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


def save_figure(fig: Figure, out: str | Path) -> Path:
    """Write a Figure as PNG / PDF / SVG (by the name's suffix), atomically, and its caption (``labels.
    set_caption``: the runs, rounds and settings it shows), where it has one, beside it as
    ``<file>.caption.txt``; return the image's path."""
    out = Path(out)
    fmt = STATIC_FORMATS.get(out.suffix.lower())
    if fmt is None:
        raise LandscapeError(f"figure file {out} must end in .png, .pdf or .svg")
    FigureCanvasAgg(fig)
    buffer = io.BytesIO()
    fig.savefig(buffer, format=fmt, dpi=150, bbox_inches="tight")
    atomic_write(out, lambda f: f.write(buffer.getvalue()))
    caption = caption_of(fig)
    if caption:
        write_text(caption_path(out), caption + "\n")
    return out


def save_figures(fig: Figure, stem: str | Path) -> list[Path]:
    """The one way a figure of the commands is written: ``<stem>.png`` and ``<stem>.pdf`` side by side, and
    ``<stem>.caption.txt`` where the figure has a caption; returns the files written."""
    stem = Path(stem)
    written = [save_figure(fig, stem.with_name(stem.name + suffix)) for suffix in (".png", ".pdf")]
    if caption_of(fig):
        written.append(caption_path(written[0]))
    return written


def _overlay(ax: Any, surface: SurfaceData, overlay: str | None) -> None:
    overlay = _overlay_kind(surface, overlay)
    if overlay is None:
        return
    if overlay == "trajectory":
        _draw_trajectory(ax, surface)
    elif overlay == "clients":
        _draw_clients(ax, surface)
    else:
        raise LandscapeError(f"unknown overlay '{overlay}'; choose trajectory, clients, auto or none")


def _overlay_kind(surface: SurfaceData, overlay: str | None) -> str | None:
    """The overlay to draw: None for "none"; for "auto" the one the surface's directions call for, else the
    one its NPZ holds (a trajectory first), else None; any other name as given."""
    kind = surface.meta.get("directions")
    if overlay == "none":
        overlay = None
    if overlay == "auto":
        overlay = {"pca": "trajectory", "clients": "clients"}.get(kind) if kind else None
        if overlay is None:
            overlay = "trajectory" if "trajectory" in surface.extra else (
                "clients" if "client_coords" in surface.extra else None)
    return overlay


def _draw_trajectory(ax: Any, surface: SurfaceData) -> None:
    if "trajectory" not in surface.extra:
        raise LandscapeError("overlay 'trajectory' needs a PCA surface (its NPZ has no 'trajectory')")
    path = surface.extra["trajectory"]
    rounds = surface.extra.get("trajectory_rounds", np.arange(len(path)))
    ax.plot(path[:, 0], path[:, 1], "-o", color="white", mec="black", mew=0.6, ms=4, lw=1.2,
            label="trajectory x^t", zorder=3)
    for k in sorted({0, len(path) - 1}):
        ax.annotate(f"t={int(rounds[k])}", path[k], textcoords="offset points", xytext=(5, 5), fontsize=8,
                    color="white", path_effects=OUTLINED)


def _draw_clients(ax: Any, surface: SurfaceData) -> None:
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


def _mark_centre(ax: Any, surface: SurfaceData) -> None:
    # a surface read from a run names its round or checkpoint; one of the notebook API, the model it was given
    label = (f"x (round {surface.round})" if surface.round is not None
             else "x (checkpoint)" if surface.run else "x (the model)")
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
    for axis in (ax.xaxis, ax.yaxis):  # about 5 ticks: panels side by side have no room for 9 labels
        axis.set_major_locator(MaxNLocator(TICKS, steps=TICK_STEPS))
    panel = PanelData(x_grid, y_grid, z, np.asarray(levels), float(norm.vmin), float(norm.vmax), segments)
    return panel, mappable


# -- renderers --------------------------------------------------------------------------------------------


def plot_contour(source: str | Path | SurfaceData, out: str | Path, *, quantity: str = "loss",
                 filled: bool = True, lines: bool = True, log_levels: bool = False,
                 overlay: str | None = "auto", levels: int = 30, title: str | None = None) -> PanelData:
    """Contour map of one 2D surface: d1 horizontal, d2 vertical, the checkpoint marked (red star), a colour
    bar naming the quantity and data; ``overlay``: "trajectory" (PCA), "clients" (client plane), "auto"
    (whichever the surface has) or None."""
    fig, panel = contour_figure(source, quantity=quantity, filled=filled, lines=lines, log_levels=log_levels,
                                overlay=overlay, levels=levels, title=title)
    save_figure(fig, out)
    return panel


def contour_figure(source: str | Path | SurfaceData, *, quantity: str = "loss", filled: bool = True,
                   lines: bool = True, log_levels: bool = False, overlay: str | None = "auto", levels: int = 30,
                   title: str | None = None) -> tuple[Figure, PanelData]:
    """The Figure of ``plot_contour`` and what its panel drew."""
    surface = _as_surface(source)
    level_values, norm = color_scale([surface.values(quantity)], log_levels, levels)
    fig = Figure(figsize=(6.4, 5.2), layout="constrained")
    ax = fig.add_subplot()
    panel, mappable = _contour_panel(ax, surface, quantity, level_values, norm, filled, lines, overlay)
    colorbar(fig, mappable, ax, surface.quantity_label(quantity))
    ax.set_title(surface.title() if title is None else title)
    outside_legend(fig, [ax], fontsize=8)  # the centre and the overlay below the map, never over it
    set_caption(fig, _surface_caption([surface], quantity))
    return fig, panel


def plot_panels(sources: Sequence[str | Path | SurfaceData], titles: Sequence[str] | None, out: str | Path, *,
                kind: str = "contour", quantity: str = "loss", log_levels: bool = False, filled: bool = True,
                lines: bool = True, overlay: str | None = "auto", levels: int = 30) -> list[PanelData]:
    """Several surfaces side by side on ONE colour scale (same limits and levels, one colour bar; the loss's
    rise above each x: ``compared_scale``). ``kind``: "contour" or "3d" (3D panels also share the z limits)."""
    fig, panels = panels_figure(sources, titles, kind=kind, quantity=quantity, log_levels=log_levels,
                                filled=filled, lines=lines, overlay=overlay, levels=levels)
    save_figure(fig, out)
    return panels


def panels_figure(sources: Sequence[str | Path | SurfaceData], titles: Sequence[str] | None = None, *,
                  kind: str = "contour", quantity: str = "loss", log_levels: bool = False,
                  filled: bool = True, lines: bool = True, overlay: str | None = "auto", levels: int = 30
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
    planes = compare_planes(surfaces, _short_labels(titles)) if len(surfaces) > 1 else None
    surfaces, level_values, norm, label = compared_scale(surfaces, quantity, log_levels, levels)
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
    colorbar(fig, mappable, axes, label, shrink=0.85, pad=0.08 if kind == "3d" else 0.05)  # room for z label
    if kind == "contour":
        outside_legend(fig, axes, fontsize=8)  # the centre and the overlays below the maps, never over them
    if planes is not None and not planes.comparable:
        # panels whose axes are not one distance say so on the figure, above them (under 3D panels their axis
        # labels reach below the boxes, where the layout does not see them; under contour maps is the legend),
        # the weight norms under each title; the caption has the whole line
        fig.suptitle(planes.planes, fontsize=8, wrap=True)
    set_caption(fig, _surface_caption(surfaces, quantity, planes.text if planes is not None else ""))
    return fig, panels


def _surface_caption(surfaces: Sequence[SurfaceData], quantity: str, planes: str = "") -> str:
    """The caption lines of surface pictures: what they show, the directions' full names (3D axes are labelled
    with the short ones) and, for several models, what their planes compare (``compare_planes``); the figure's
    maker adds its runs and settings (``labels.figure_caption``)."""
    names = dict.fromkeys(" and ".join(s.axis_labels()) for s in surfaces)
    lines = [f"{surfaces[0].quantity_label(quantity)} on the plane x + a d1 + b d2 around each model x (red star)",
             f"Axes: {'; '.join(names)}"]
    if planes:
        lines.append(f"Planes: {planes}")
    return "\n".join(line[:1].upper() + line[1:] + "." for line in lines)


def _surface_panel(ax: Any, surface: SurfaceData, quantity: str, norm: Normalize,
                   log_levels: bool) -> tuple[PanelData, Any]:
    x_grid, y_grid, z = image_arrays(surface, quantity)
    mappable = ax.plot_surface(x_grid, y_grid, np.ma.masked_invalid(z), cmap=CMAP, norm=norm, rstride=1,
                               cstride=1, linewidth=0.1, edgecolor="none", antialiased=True)
    centre = tuple(int(np.argmin(np.abs(c))) for c in (surface.x_coords, surface.y_coords))
    # drawn after the surface with computed_zorder=False on the axes, so the surface never hides it
    ax.scatter([0.0], [0.0], [surface.values(quantity)[centre]], color="red", edgecolors="black", marker="*",
               s=140, depthshade=False, label="x", zorder=10)
    # the directions by their short names ('d1'; the caption has the full ones): a full name along a 3D axis
    # runs into that axis's tick labels; padded clear of them
    xlabel, ylabel = (_scene_title(label) for label in surface.axis_labels())
    ax.set_xlabel(xlabel, fontsize=9, labelpad=6)
    ax.set_ylabel(ylabel, fontsize=9, labelpad=6)
    ax.set_zlabel(surface.meta.get("z_label", quantity), fontsize=8, labelpad=10)  # compared_scale's rise
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_locator(MaxNLocator(4, steps=TICK_STEPS))
    if log_levels:
        ax.set_zscale("log")
        set_ticks(ax.zaxis, norm.vmin, norm.vmax, log=True)
    else:  # MaxNLocator follows the z limits (set after this by the panels, autoscaled otherwise)
        ax.zaxis.set_major_locator(MaxNLocator(TICKS, steps=TICK_STEPS))
        ax.zaxis.set_major_formatter(tick_formatter(np.array([]), log=False))
    return PanelData(x_grid, y_grid, z, np.array([]), float(norm.vmin), float(norm.vmax)), mappable


def plot_surface_3d(source: str | Path | SurfaceData, out: str | Path, *, quantity: str = "loss",
                    log_levels: bool = False, title: str | None = None) -> PanelData:
    """Static 3D view of one 2D surface (matplotlib), the checkpoint marked, with a colour bar."""
    fig, panel = surface_3d_figure(source, quantity=quantity, log_levels=log_levels, title=title)
    save_figure(fig, out)
    return panel


def surface_3d_figure(source: str | Path | SurfaceData, *, quantity: str = "loss", log_levels: bool = False,
                      title: str | None = None) -> tuple[Figure, PanelData]:
    """The Figure of ``plot_surface_3d`` and what it drew."""
    surface = _as_surface(source)
    _, norm = color_scale([surface.values(quantity)], log_levels, 2)
    fig = Figure(figsize=(6.4, 5.2), layout="constrained")
    ax = fig.add_subplot(projection="3d", computed_zorder=False)
    panel, mappable = _surface_panel(ax, surface, quantity, norm, log_levels)
    ax.set_title(surface.title() if title is None else title)
    colorbar(fig, mappable, ax, surface.quantity_label(quantity), shrink=0.7, pad=0.12)
    set_caption(fig, _surface_caption([surface], quantity))
    return fig, panel


def plot_curve_1d(sources: Sequence[str | Path | SurfaceData], out: str | Path, *,
                  labels: Sequence[str] | None = None, accuracy: bool = True) -> list[np.ndarray]:
    """Loss (solid, left axis) and accuracy (dashed, right axis) along 1D lines x + alpha (target - x);
    alpha = 0 (x) and alpha = 1 (the target) marked. Returns the plotted loss curves."""
    fig, curves = curve_1d_figure(sources, labels=labels, accuracy=accuracy)
    save_figure(fig, out)
    return curves


# alpha = 0 is the model x, alpha = 1 the target of an interpolation line
INTERPOLATION_MARKS = ((0.0, "x"), (1.0, "target"))


def curve_1d_figure(sources: Sequence[str | Path | SurfaceData], *, labels: Sequence[str] | None = None,
                    accuracy: bool = True, marks: Sequence[tuple[float, str]] = INTERPOLATION_MARKS,
                    title: str | None = None) -> tuple[Figure, list[np.ndarray]]:
    """The Figure of ``plot_curve_1d`` and the plotted loss curves; ``marks``: the (coordinate, name) pairs
    marked by dotted lines (a random line has only x, at 0)."""
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
    for alpha, name in marks:
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
    if title:
        ax.set_title(title)
    return fig, curves


# -- interactive ------------------------------------------------------------------------------------------


def value_range(sources: Sequence[str | Path | SurfaceData], quantity: str = "loss") -> tuple[float, float]:
    """(lowest, highest) finite value of the surfaces together: the colour and z range they share."""
    _, norm = color_scale([_as_surface(s).values(quantity) for s in sources], False, 2)
    return float(norm.vmin), float(norm.vmax)


def _scene_title(label: str) -> str:
    """A 3D axis title: the direction's name alone ('d1') where its full label ('d1 (random, filter-normalised
    to round:0)') would be cut at the scene's edge; the figure's titles and caption say what the plane is."""
    return label if len(label) <= SCENE_TITLE_CHARS else label.split(" (")[0]


def _scene(surface: SurfaceData, norm: Normalize) -> dict[str, Any]:
    """The 3D scene of one surface: its axis titles (none on z, which the colour bar names: a z title sits at
    the scene's left edge, where it is cut), the shared z range, the camera."""
    xlabel, ylabel = surface.axis_labels()
    return {"xaxis_title": _scene_title(xlabel), "yaxis_title": _scene_title(ylabel), "zaxis_title": "",
            "zaxis": {"range": [norm.vmin, norm.vmax]},
            # seen from further away than plotly's default: axis titles stay in view
            "camera": {"eye": {"x": 1.75, "y": 1.75, "z": 1.05}}}


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
    width = max(680, 540 * len(surfaces))
    # plotly never wraps a title: each line to its panel's width (less margins and colour bar; ~8.5 px a char)
    titles = [wrap_title(t.replace("\n", "<br>"), int((width - 130) / len(surfaces) / 8.5))
              for t in _panel_titles(surfaces, titles)]
    top = max(60, 16 + 22 * max(t.count("<br>") + 1 for t in titles))  # room for every title line
    _, norm = color_scale([s.values(quantity) for s in surfaces], False, 2)
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
        fig.update_layout({"scene" if k == 0 else f"scene{k + 1}": _scene(surface, norm)})
    fig.update_layout(coloraxis={"colorscale": CMAP.capitalize(), "cmin": norm.vmin, "cmax": norm.vmax,
                                 "colorbar": {"title": {"text": surfaces[0].quantity_label(quantity)}}},
                      height=540 + top, width=width,
                      legend={"orientation": "h", "x": 0.0, "y": -0.02, "yanchor": "top"},
                      margin={"l": 10, "r": 10, "t": top, "b": 60})
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
