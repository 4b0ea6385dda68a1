"""Figure recipes rendered: the plot kinds (the passes each reads, at which rounds by default) and ``render``,
which draws one plot of a recipe (``landscape.figures.figure_recipe`` reads and checks the recipes).

Each plot kind names the passes it reads (and at which rounds by default); ``landscape figures`` (the workflow
``landscape.workflows.figure``) trains and analyses what is missing and calls ``render``. This module reads only
TOML and run directories, as every figure module does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from landscape.figures import curves, surfaces
from landscape.figures.rundata import RunData, require_passes
from landscape.store.fileio import write_text


@dataclass(frozen=True)
class PlotKind:
    """A renderer: the passes it reads, each with the rounds it needs by default ("last" or "all")."""

    summary: str
    passes: dict[str, str]
    draw: Callable[[list[RunData], dict[str, Any]], Figure]
    interactive: Callable[[list[RunData], dict[str, Any]], Any] | None = None  # a plotly figure (3D)
    options: tuple[str, ...] = ()  # plot keys besides kind, file, runs, title


def surface_sources(runs: Sequence[RunData], name: str = "surface") -> list[Path]:
    """Each run's surface ``name`` (surface, surface-pca, ...) at its latest analysed round."""
    require_passes(runs, [name])
    return [run.pass_record(name).path.with_suffix(".npz") for run in runs]


def _panels(kind: str) -> Callable[[list[RunData], dict[str, Any]], Figure]:
    def draw(runs: list[RunData], plot: dict[str, Any]) -> Figure:
        fig, _ = surfaces.panels_figure(surface_sources(runs, plot["surface"]), [run.label for run in runs],
                                        kind=kind, quantity=plot.get("quantity", "loss"),
                                        log_levels=plot.get("log", False))
        return fig

    return draw


def _surfaces_html(runs: list[RunData], plot: dict[str, Any]) -> Any:
    return surfaces.surface_figure(surface_sources(runs, plot["surface"]), [run.label for run in runs],
                                   quantity=plot.get("quantity", "loss"))


PLOT_KINDS: dict[str, PlotKind] = {
    "surfaces": PlotKind("contour maps side by side on one colour scale (+ interactive 3D HTML)",
                         {"surface": "last"}, _panels("contour"), _surfaces_html, ("quantity", "log")),
    "surfaces-3d": PlotKind("3D surfaces side by side on one colour and z scale (+ interactive 3D HTML)",
                            {"surface": "last"}, _panels("3d"), _surfaces_html, ("quantity", "log")),
    "flatness-sharpness": PlotKind(
        "flatness distance Delta_D, global sharpness S_rho and lambda_1 over rounds (FedNSAM Fig. 2)",
        {"sharpness": "all", "hessian": "all"},
        lambda runs, plot: curves.flatness_and_sharpness_figure(runs, rho=plot.get("rho")), options=("rho",)),
    "hessian": PlotKind("lambda_max, lambda_1/lambda_k and the spectral density per run (FedSAM paper)",
                        {"hessian": "last"}, lambda runs, plot: curves.hessian_figure(runs)),
    "incompatibility": PlotKind("flatness incompatibility Delta_FI and its split over rounds (FedVSSAM)",
                                {"incompatibility": "all"}, lambda runs, plot: curves.incompatibility_figure(runs)),
    "alignment": PlotKind("client x client gradient cosine heatmaps on one scale",
                          {"alignment": "last"}, lambda runs, plot: curves.alignment_figure(runs)),
    "accuracy": PlotKind("test accuracy over rounds", {}, lambda runs, plot: curves.accuracy_figure(runs)),
    "metric": PlotKind("any metrics.jsonl key over rounds", {},
                       lambda runs, plot: curves.metric_figure(runs, plot["key"], log=plot.get("log", False)),
                       options=("key", "log")),
}


@dataclass(frozen=True)
class PlotSpec:
    kind: str
    file: str
    runs: tuple[str, ...]  # run ids, in drawing order
    options: dict[str, Any]
    title: str = ""



def render(plot: PlotSpec, runs: list[RunData], out_dir: Path, surface: str = "surface") -> list[Path]:
    """Draw one plot: ``<file>.png`` and ``<file>.pdf`` (+ ``<file>.html`` for the surface kinds, which draw
    the surfaces named ``surface``)."""
    kind = PLOT_KINDS[plot.kind]
    options = {**plot.options, "surface": surface}
    fig = kind.draw(runs, options)
    heading = plot.title
    if heading:
        fig.suptitle(heading, fontsize="large")
    written = [surfaces.save_figure(fig, out_dir / f"{plot.file}{suffix}") for suffix in (".png", ".pdf")]
    if kind.interactive is not None:
        html = kind.interactive(runs, options)
        if heading:
            html.update_layout(title={"text": heading})
        out = out_dir / f"{plot.file}.html"
        write_text(out, html.to_html(include_plotlyjs=True, full_html=True))
        written.append(out)
    return written
