"""The demo workflow: the shipped figure recipe figures/demo.toml (FedAvg, FedSAM and FedNSAM trained by
train/digits-fedavg.toml, analysed by every pass and a loss surface, drawn) made by the figure workflow, as
any figure recipe is; then the demo's two steps that a figure recipe does not express: the comparison table
(``figures.compare``: printed, and compare.csv) and the HTML report."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from landscape.core import parallel
from landscape.core.errors import LandscapeError
from landscape.workflows.ensure import Notify, ensure_analysis, ignore

if TYPE_CHECKING:
    from landscape.analyze.summary import AnalysisReport
    from landscape.core.rounds import Rounds
    from landscape.figures.compare import Comparison
    from landscape.figures.recipe.figure import FigureRecipe

# The demo's figure recipe: the repository's figures/ folder, next to the package.
DEMO_FIGURE = Path(__file__).resolve().parents[2] / "figures" / "demo.toml"
DEVICE = "cpu"  # the demo trains and analyses on the CPU (minutes), whatever the machine has


class Demo(NamedTuple):
    """What the demo made: its run directories, the folder of its files (figures, compare.csv), the figure
    files written, the analysis (every row, as ``landscape analyze`` summarises it), the comparison of the
    three runs and the report's path."""

    paths: list[Path]
    figures: Path
    written: list[Path]
    analysis: AnalysisReport
    comparison: Comparison
    report: Path


def demo_recipe(assignments: Sequence[str] = ()) -> FigureRecipe:
    """The demo's figure recipe, read and checked, with ``--set KEY=VALUE`` texts applied as ``landscape
    figures`` applies them (a training key for every run, ``analyze.<setting>``, ``<pass>.<option>``)."""
    from landscape.figures.recipe.figure import load_figure_recipe

    if not DEMO_FIGURE.is_file():
        raise LandscapeError(f"the demo's figure recipe {DEMO_FIGURE} is missing (the demo runs from a checkout "
                             "of the repository)")
    return load_figure_recipe(DEMO_FIGURE).with_sets(assignments, "demo")


def run_demo(out: Path, *, assignments: Sequence[str] = (), progress: bool = False,
             notify: Notify = ignore) -> Demo:
    """Make the demo's figure recipe into ``out`` (make-like: finished runs and analyses are reused; runs in
    ``out/runs/<id>``, figures in ``out``), then its comparison table and report."""
    from landscape.analyze.summary import AnalysisReport, analysis_data
    from landscape.workflows.figure import figure_analysis, make_figure

    fig = demo_recipe(assignments)
    written = make_figure(fig, out, device=DEVICE, progress=progress, notify=notify)
    paths = [path for entries in fig.seed_runs(out).values() for _, path in entries]
    analysis = figure_analysis(fig, DEVICE)
    settings, selection = analysis.settings, analysis.selection
    # every result is on disk now: the reports only read their summaries
    reports = ensure_analysis(paths, _in_pass_order(fig.pass_rounds), settings, analysis.options)

    def extra_steps() -> tuple[Comparison, Path]:
        from landscape.figures.compare import compare
        from landscape.figures.report.build import write_report

        comparison = compare(paths, out, selection=selection, draw_surfaces=False)
        return comparison, write_report(paths, out / "report.html", title=fig.title, selection=selection)

    comparison, report = parallel.on_main(extra_steps)
    rows = _rows(reports, [path.name for path in paths])
    return Demo(paths, out, written, AnalysisReport(rows=rows, data=analysis_data(settings)), comparison, report)


def _in_pass_order(pass_rounds: dict[str, Rounds]) -> dict[str, Rounds]:
    """The passes as ``landscape analyze`` orders them: its default passes in their order, then the others."""
    from landscape.analyze.catalog import default_passes

    order = default_passes()
    return dict(sorted(pass_rounds.items(), key=lambda item: order.index(item[0]) if item[0] in order
                       else len(order)))


def _rows(reports: list[AnalysisReport], runs: list[str]) -> list[dict]:
    """One row per (run, round) with the summaries of every pass, as one analysis of them all gives them:
    the runs in order, each by round."""
    merged: dict[tuple, dict] = {}
    for report in reports:
        for row in report.rows:
            merged.setdefault((row.get("run"), row.get("round")), {}).update(row)
    return sorted(merged.values(), key=lambda row: (runs.index(row["run"]), row.get("round", 0)))
