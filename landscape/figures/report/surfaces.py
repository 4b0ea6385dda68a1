"""The report's loss-surface section: every surface of every run, titled with what it is (the run, the round and
the plane), its caption saying what it shows and its settings in the line below it (never in its title).

2D surfaces are 3D plotly plots (``landscape.figures.surface.draw.surface_figure``); those of one quantity (e.g.
training loss (global F)) share one colour scale and z range (``surfaces.value_range``), so that runs compare
by eye. 1D surfaces are lines on their own axes. The section says what the runs' random planes compare
(``surfaces.compare_planes``) and, per plane, the model's weight norm. Its HTML is the ``surfaces_section``
macro of ``templates/parts.html``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from markupsafe import Markup
from matplotlib.colors import to_hex

from landscape.analyze.passes import RESULT_NAMES
from landscape.core.errors import LandscapeError
from landscape.figures.report.data import surface_files
from landscape.figures.report.parts import Page, note, parts
from landscape.figures.report.plots import line_surface_figure
from landscape.figures.rundata import RunData
from landscape.store.results.files import read_arrays, read_record


def surface_renderer() -> Callable[..., Any] | None:
    """``landscape.figures.surface.draw.surface_figure`` when that module provides it."""
    try:
        from landscape.figures.surface import draw as surfaces
    except ImportError:
        return None
    renderer = getattr(surfaces, "surface_figure", None)
    return renderer if callable(renderer) else None


def _surface_kind(path: Path) -> tuple[str, str]:
    """What the surface is ('random plane ...', 'PCA plane of the trajectory', 'plane of two client models' or
    'line to <target>', from the record beside the NPZ; 'loss surface' without one) and, where they are not the
    defaults, its settings ('' where they are): the settings go below the plot, never into its title."""
    try:
        record = read_record(path.with_suffix(".json"))
        meta = record.get("result", {})
    except LandscapeError:
        return "loss surface", ""
    kind = meta.get("directions") if isinstance(meta, dict) else None
    from landscape.figures.surface.data import normalization_of

    random = "random plane"
    if kind == "random":
        random = {"filter": "random plane filter-normalised to this model (Li et al. 2018)",
                  "euclidean": f"euclidean random plane (||d1|| = ||d2|| = {meta.get('length')})",
                  "filter-reference": f"random plane filter-normalised to {meta.get('reference')}",
                  }.get(normalization_of(meta) or "filter", random)
    names = {"random": random, "pca": "PCA plane of the trajectory", "clients": "plane of two client models"}
    text = (f"line to {meta.get('target', 'the target')}" if kind == "interpolate"
            else names.get(kind, "loss surface"))
    try:
        settings = RESULT_NAMES.settings_label("surface", record.get("settings"))
    except (ValueError, AttributeError):
        return text, ""
    return text, "" if settings == "the defaults" else settings


def _surface_scales(paths: Sequence[Path]) -> tuple[dict[Path, str], dict[str, tuple[float, float]]]:
    """The quantity each 2D surface shows (its colour-bar label, e.g. training loss (global F)) and, per
    quantity, the (lowest, highest) value over all of them (``surfaces.value_range``; one flat surface: a
    range around its value): the colour scale and z range that the report's 3D plots of that quantity share.
    Files that cannot be read are left out here (drawing them says why)."""
    from landscape.figures.surface.data import load_surface
    from landscape.figures.surface.draw import value_range

    quantity: dict[Path, str] = {}
    of_quantity: dict[str, list[Any]] = {}
    for path in paths:
        try:
            surface = load_surface(path)
        except (LandscapeError, OSError, ValueError, KeyError):
            continue
        if not surface.is_2d or not np.isfinite(surface.loss).any():
            continue
        label = quantity[path] = surface.quantity_label("loss")
        of_quantity.setdefault(label, []).append(surface)
    return quantity, {label: value_range(found) for label, found in of_quantity.items()}


def _plane_caption(path: Path) -> str:
    """'; ||x|| = 23.4; ...' for a 2D surface's caption: the model's weight norm and, for a per-model
    filter-normalised plane, that its axis units are that model's own (not comparable across runs)."""
    from landscape.figures.surface.data import load_surface, normalization_of, weight_norm_text

    try:
        surface = load_surface(path)
    except (LandscapeError, OSError, ValueError, KeyError):
        return ""
    text = f"; {weight_norm_text(surface)}" if weight_norm_text(surface) else ""
    if normalization_of(surface.meta) == "filter":
        text += "; filter-normalised to this model's own weights: its axis units are not another run's"
    return text


def _random_planes_line(files: Sequence[tuple[RunData, int, Path]]) -> str:
    """What the random planes of different runs compare (``landscape.figures.surface.data.compare_planes``); ''
    for fewer than two runs."""
    from landscape.figures.surface.data import compare_planes, load_surface

    found = []
    for run, r, path in files:
        try:
            surface = load_surface(path)
        except (LandscapeError, OSError, ValueError, KeyError):
            continue
        if surface.is_2d and surface.meta.get("directions") == "random":
            found.append((f"{run.label} (round {r})", surface))
    if len({label.rsplit(' (round', 1)[0] for label, _ in found}) < 2:
        return ""
    planes = compare_planes([s for _, s in found], [label for label, _ in found])
    return f"Random planes of the runs: {planes.text}."


def _scales_text(scales: dict[str, tuple[float, float]], counts: dict[str, int]) -> str:
    """What the 3D surfaces' colour scales are, per quantity; '' for none."""
    if not scales:
        return ""
    shared = "; ".join(f"{label}: {low:.4g} to {high:.4g} ({counts[label]} surface"
                       f"{'s' if counts[label] > 1 else ''})" for label, (low, high) in scales.items())
    text = ("The 3D surfaces share one colour scale and z range, so that runs compare by eye: "
            if len(scales) == 1
            else "3D surfaces of one quantity share one colour scale and z range; surfaces of different "
                 "quantities are on separate scales: ")
    return text + shared


@dataclass(frozen=True)
class _Scales:
    """The 2D surfaces' renderer and shared scales (``_surface_scales``) and how many surfaces each has."""

    renderer: Callable[..., Any] | None
    quantity: dict[Path, str]
    scales: dict[str, tuple[float, float]]
    counts: dict[str, int]


def _figure(run: RunData, r: int, path: Path, title: str, kind: str, shared: _Scales) -> tuple[Any, str] | str:
    """(figure, caption) of one surface file, the caption saying what it shows; the note to show instead where
    it cannot be drawn."""
    try:
        is_2d = "y_coords" in read_arrays(path)
        if is_2d and shared.renderer is None:
            return (f"{path}: no surface renderer available (landscape.figures.surface.draw.surface_figure); "
                    "the surface is left out")
        if not is_2d:
            along = (f"along the {kind}, from its round-{r} model" if kind.startswith("line")
                     else f"along one direction through its round-{r} model")
            return (line_surface_figure(path, title.replace("\n", "<br>"), to_hex(run.color)),
                    f"Loss of {run.label} {along}; a 1D line, drawn as a curve on its own axis (not on the "
                    "surfaces' colour scale)")
        label = shared.quantity.get(path, "")
        fig = shared.renderer([path], [title], limits=shared.scales.get(label))
    except (LandscapeError, OSError, ValueError, KeyError) as e:
        return f"{path}: cannot draw this surface ({e})"
    caption = f"{(label or 'loss')[:1].upper()}{(label or 'loss')[1:]} of {run.label} over the {kind}, centred on its " \
              f"round-{r} model (the marker)"
    if label and shared.counts[label] == 1 and len(shared.scales) > 1:
        caption += f"; on its own scale: the only surface of {label}"
    elif label:
        low, high = shared.scales[label]
        caption += f"; colours and z on the scale shared by every surface of {label}: {low:.4g} to {high:.4g}"
    return fig, caption + _plane_caption(path)


def surfaces_section(runs: Sequence[RunData], page: Page) -> Markup:
    """The section (``surfaces_section`` of ``templates/parts.html``), its plots added to ``page``; '' when no
    run has a surface."""
    files = [(run, r, p) for run in runs for r, p in surface_files(run)]
    if not files:
        return Markup("")
    renderer = surface_renderer()
    quantity, scales = _surface_scales([p for _, _, p in files]) if renderer is not None else ({}, {})
    shared = _Scales(renderer, quantity, scales,
                     {label: list(quantity.values()).count(label) for label in scales})
    items: list[tuple[str | None, Markup]] = []
    for run, r, path in files:
        # the heading and the plot's title: the run, the round and the plane (a line each in the title); the
        # settings in the line below the plot
        kind, settings = _surface_kind(path)
        head = f"{run.label}, round {r}"
        drawn = _figure(run, r, path, f"{head}\n{kind}", kind, shared)
        if isinstance(drawn, str):
            items.append((None, note(drawn)))
            continue
        # The plot is named by the output (surface, surface-pca, ...), not by the settings part of the file
        # name.
        name = f"surface-{run.name}-round-{r}-{path.stem.partition('@')[0]}"
        items.append((f"{head}, {kind}", page.plot(name, *drawn, f"Settings: {settings}" if settings else "")))
    return parts().surfaces_section(_scales_text(scales, shared.counts), _random_planes_line(files), items)
