"""Figure recipes rendered: ``render`` draws one plot of a recipe (a ``PlotSpec``) by its plot kind
(``landscape.figures.plot_kinds``: the registry of kinds, their options and the passes each reads;
``landscape.figures.recipe.figure`` reads and checks the recipes).

``landscape figures`` (the workflow ``landscape.workflows.figure``) trains and analyses what is missing and
calls ``render``. This module reads only TOML and run directories, as every figure module does.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from landscape.figures.plot_kinds import PLOT_KINDS, PlotTable
from landscape.figures.rundata import RunData
from landscape.figures.surface import draw as surfaces
from landscape.store.fileio import write_text


@dataclass(frozen=True)
class PlotSpec:
    """One plot of a figure recipe, resolved: its kind, file (no suffix), run ids in drawing order, its table
    as its kind's options read it, and its title ('' for none)."""

    kind: str
    file: str
    runs: tuple[str, ...]
    options: PlotTable
    title: str = ""


def render(plot: PlotSpec, runs: list[RunData], out_dir: Path, surface: str = "surface",
           pages: dict[str, Path] | None = None) -> list[Path]:
    """Draw one plot: ``<file>.png``, ``<file>.pdf`` and its caption ``<file>.caption.txt`` (the runs, rounds
    and settings it shows; ``surfaces.save_figures``) (+ ``<file>.html`` for the kinds with an interactive
    renderer, the surface kinds, which draw the surfaces named ``surface``). ``pages``: the interactive pages
    already written for the figure, by their content; a plot whose page would be one of them (the contour and
    the 3D kinds of the same surfaces show the same interactive view) writes none and names that one."""
    kind = PLOT_KINDS.get(plot.kind)
    fig = kind.factory(runs, plot.options, surface)
    heading = plot.title
    if heading:  # above what the figure says there itself (the Hessian's round, the surfaces' planes)
        below = fig.get_suptitle()
        fig.suptitle(heading + (f"\n{below}" if below else ""), fontsize="large")
    written = surfaces.save_figures(fig, out_dir / plot.file)
    if kind.interactive is not None:
        html = kind.interactive(runs, plot.options, surface)
        if heading:
            html.update_layout(title={"text": heading})
        content = hashlib.sha256(html.to_json().encode()).hexdigest()  # the page's data and layout, no div id
        if pages is not None and content in pages:
            return written + [pages[content]]
        out = out_dir / f"{plot.file}.html"
        write_text(out, html.to_html(include_plotlyjs=True, full_html=True))
        written.append(out)
        if pages is not None:
            pages[content] = out
    return written
