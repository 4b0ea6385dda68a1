"""The plot kinds of figure recipes, registered by name: each with its options (the keys a ``[[plots]]`` table of
that kind may hold, a schema dataclass checked by ``landscape.core.schema.load``), the passes it reads (with
the rounds it needs of them by default) and its draw function.

A plot kind is one block of this module: its options dataclass (a ``PlotTable`` with the kind's own keys), its
draw function ``(runs, options, surface) -> matplotlib Figure`` (``surface``: the result name of the figure's
surfaces) and ``@plot_kind(...)`` over it, which registers it in ``PLOT_KINDS``; an interactive (plotly) renderer
is optional. ``landscape.figures.recipe.figure`` checks each ``[[plots]]`` table by its kind's options, and
``landscape.figures.book.render`` draws it. Like every figure module, this one reads only run directories.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any, Literal

from matplotlib.figure import Figure

from landscape.core.registry import Entry, Registry
from landscape.core.schema import rule
from landscape.figures import curves
from landscape.figures.labels import caption_of, figure_caption, rounds_span, set_caption
from landscape.figures.rundata import RunData, require_passes
from landscape.figures.surface import draw as surfaces

# The numbers of a metrics.jsonl row, in the order the trainer writes them (landscape/train/trainer.py,
# run_round; docs/metrics.md section 9); `round` and `clients` (the sampled ids) are not quantities.
METRIC_KEYS = ("lr", "train_loss", "flatness_distance", "flatness_distance_normalized",
               "flatness_distance_to_global", "flatness_distance_to_global_normalized", "client_update_sq",
               "flatness_distance_relative", "update_norm",
               "uplink_floats", "swa_models", "test_loss", "test_acc", "seconds")
# A file name, a run id: one path component, no suffix.
ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"

Draw = Callable[[list[RunData], Any, str], Figure]  # (runs, the plot's options, the surfaces' result name)
Interactive = Callable[[list[RunData], Any, str], Any]  # the same -> a plotly figure


@dataclass(frozen=True, kw_only=True)
class PlotTable:
    """The keys every ``[[plots]]`` table has: its kind, the file it writes (default: the figure's name, then
    ``<name>-2``, ...), the run ids it draws in order (default: every run) and a title above it."""

    kind: str
    file: Annotated[str | None, rule(pattern=ID_PATTERN,
                                     text="must be letters, digits, '.', '_' or '-' (no suffix)")] = None
    runs: Annotated[tuple[str, ...] | None, rule(min_length=1, text="must be a non-empty list of run ids")] = None
    title: str | None = None


@dataclass(frozen=True, kw_only=True)
class PlotKind(Entry):
    """A plot kind (an ``Entry`` of the one registry): its options dataclass (a ``PlotTable``: the keys its
    tables may hold), the passes it reads (each with the rounds it needs by default: "last" or "all"; none for
    metrics.jsonl kinds), its draw function (``factory``, a ``Draw``) and, for the surface kinds, an
    interactive (plotly) one."""

    options: type[PlotTable] = PlotTable
    passes: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    interactive: Interactive | None = None


PLOT_KINDS = Registry("plot kind", PlotKind)


def plot_kind(name: str, summary: str, options: type[PlotTable] = PlotTable, passes: Mapping[str, str] | None = None,
              interactive: Interactive | None = None) -> Callable[[Draw], Draw]:
    """Register the decorated draw function as the plot kind ``name`` (its tables checked by ``options``)."""
    return PLOT_KINDS.register(name, summary=summary, options=options, passes=MappingProxyType(dict(passes or {})),
                               interactive=interactive)


def surface_sources(runs: Sequence[RunData], name: str = "surface") -> list[Path]:
    """Each run's surface ``name`` (surface, surface-pca, ...) at its latest analysed round."""
    require_passes(runs, [name])
    return [run.pass_record(name).path.with_suffix(".npz") for run in runs]


# -- loss surfaces: contour maps and 3D panels (+ interactive HTML) ---------------------------------------


@dataclass(frozen=True, kw_only=True)
class SurfacePlot(PlotTable):
    quantity: Literal["loss", "accuracy"] = "loss"  # what the panels show
    log: bool = False  # log-spaced colour levels (the flat basins stay visible)


def _panels(runs: list[RunData], plot: SurfacePlot, surface: str, kind: str) -> Figure:
    fig, _ = surfaces.panels_figure(surface_sources(runs, surface), [run.label for run in runs], kind=kind,
                                    quantity=plot.quantity, log_levels=plot.log)
    what = (f"{'3D surfaces' if kind == '3d' else 'Contour maps'} of the {plot.quantity} ({surface} pass) side by "
            "side on one colour scale" + (", log-spaced levels" if plot.log else ""))
    return set_caption(fig, figure_caption(what, runs, rounds_span(run.analysed_rounds(surface)[-1] for run in runs),
                                           outputs=[surface], notes=[caption_of(fig)]))


def _surfaces_html(runs: list[RunData], plot: SurfacePlot, surface: str) -> Any:
    return surfaces.surface_figure(surface_sources(runs, surface), [run.label for run in runs],
                                   quantity=plot.quantity)


@plot_kind("surfaces", "contour maps side by side on one colour scale (+ interactive 3D HTML, one page per "
                       "figure for the same surfaces)", SurfacePlot,
           {"surface": "last"}, _surfaces_html)
def _contour_maps(runs: list[RunData], plot: SurfacePlot, surface: str) -> Figure:
    return _panels(runs, plot, surface, "contour")


@plot_kind("surfaces-3d", "3D surfaces side by side on one colour and z scale (+ interactive 3D HTML, one page per "
                          "figure for the same surfaces)",
           SurfacePlot, {"surface": "last"}, _surfaces_html)
def _surfaces_3d(runs: list[RunData], plot: SurfacePlot, surface: str) -> Figure:
    return _panels(runs, plot, surface, "3d")


# -- curves over rounds and per-run summaries -------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class FlatnessSharpnessPlot(PlotTable):
    rho: Annotated[float | None, rule(gt=0)] = None  # the radius of S_rho drawn (default: the runs' only one)


@plot_kind("flatness-sharpness",
           "flatness distance Delta_D, global sharpness S_rho and lambda_1 over rounds (FedNSAM Fig. 2)",
           FlatnessSharpnessPlot, {"sharpness": "all", "hessian": "all"})
def _flatness_sharpness(runs: list[RunData], plot: FlatnessSharpnessPlot, surface: str) -> Figure:
    return curves.flatness_and_sharpness_figure(runs, rho=plot.rho)


@plot_kind("hessian", "lambda_max, lambda_1/lambda_k and the spectral density per run (FedSAM paper)",
           passes={"hessian": "last"})
def _hessian(runs: list[RunData], plot: PlotTable, surface: str) -> Figure:
    return curves.hessian_figure(runs)


@plot_kind("incompatibility", "flatness incompatibility Delta_FI and its split over rounds (FedVSSAM)",
           passes={"incompatibility": "all"})
def _incompatibility(runs: list[RunData], plot: PlotTable, surface: str) -> Figure:
    return curves.incompatibility_figure(runs)


@plot_kind("alignment", "client x client gradient cosine heatmaps on one scale", passes={"alignment": "last"})
def _alignment(runs: list[RunData], plot: PlotTable, surface: str) -> Figure:
    return curves.alignment_figure(runs)


@plot_kind("accuracy", "test accuracy over rounds")
def _accuracy(runs: list[RunData], plot: PlotTable, surface: str) -> Figure:
    return curves.accuracy_figure(runs)


@dataclass(frozen=True, kw_only=True)
class MetricPlot(PlotTable):
    key: Annotated[Literal[METRIC_KEYS], rule(text=f"must be a metrics.jsonl key ({', '.join(METRIC_KEYS)})")]
    log: bool = False  # a log y axis


@plot_kind("metric", "any metrics.jsonl key over rounds", MetricPlot)
def _metric(runs: list[RunData], plot: MetricPlot, surface: str) -> Figure:
    return curves.metric_figure(runs, plot.key, log=plot.log)
