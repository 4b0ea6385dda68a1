"""The demo workflow: the shipped recipe train/digits-fedavg.toml for FedAvg, FedSAM and FedNSAM, analysed
(every pass and a loss surface), the comparison figures and the HTML report."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from landscape.core import parallel
from landscape.core.errors import LandscapeError
from landscape.workflows.ensure import Notify, ensure_run, ignore

if TYPE_CHECKING:
    from landscape.analyze.summary import AnalysisReport
    from landscape.figures.compare import Comparison

# The recipe the demo trains: the repository's train/ folder, next to the package.
DEMO_RECIPE = Path(__file__).resolve().parents[2] / "train" / "digits-fedavg.toml"
# The demo's changes to it: client models kept (the flatness and alignment passes read them), on the CPU.
_DEMO_OVERRIDES: list[tuple[str, Any]] = [("train.keep_clients", True), ("train.device", "cpu")]
_DEMO_ALGORITHMS = ["fedavg", "fedsam", "fednsam"]
# one plane for the three runs (filter-normalised to their shared initial model): their surfaces compare
# basins
_DEMO_SURFACE = {"directions": "random", "grid": "21", "span": "-1:1", "normalization": "filter-reference",
                 "reference": "round:0"}
# pass options other than the defaults (the tests make them cheap). S_rho from 4 starts (the centre's, SAM's
# direction, and 3 random points), half the default's 8: enough for a second start to confirm the maximum or
# to show that the starts disagree (the summary prints an unconfirmed S_rho as ">=").
_DEMO_PASS_OPTIONS: dict[str, dict] = {"sharpness": {"starts": 4}}
_DEMO_CURVE_ROUNDS = "10,20"  # checkpoints before the last (30) where the demo also computes S_rho


class Demo(NamedTuple):
    """What the demo made: its run directories, the figures folder, the analysis (every row, as
    ``landscape analyze`` summarises it), the comparison of the three runs and the report's path."""

    paths: list[Path]
    figures: Path
    analysis: AnalysisReport
    comparison: Comparison
    report: Path


def run_demo(out: Path, *, progress: bool = False, notify: Notify = ignore) -> Demo:
    """Train (make-like: finished runs are reused), analyse and draw the demo into ``out``."""
    from landscape.analyze.catalog import default_passes, pass_options
    from landscape.analyze.scheduler import run_analysis
    from landscape.analyze.settings import AnalysisSettings
    from landscape.analyze.summary import AnalysisReport, analysis_data
    from landscape.config import overrides as recipe_overrides

    if not DEMO_RECIPE.is_file():
        raise LandscapeError(f"the demo's recipe {DEMO_RECIPE} is missing (the demo runs from a checkout of "
                             "the repository)")
    runs = recipe_overrides.build_sweep(DEMO_RECIPE, _DEMO_OVERRIDES, {"algorithm.name": _DEMO_ALGORITHMS})
    paths = [out / recipe_overrides.sweep_run_name(recipe, swept) for recipe, swept in runs]
    for (recipe, _), path in zip(runs, paths):
        ensure_run(recipe, path, progress=progress, notify=notify)
    names = [*default_passes(), "surface"]
    options = {name: pass_options(name, _DEMO_PASS_OPTIONS.get(name, {})) for name in names}
    options["surface"] = pass_options("surface", _DEMO_SURFACE)
    settings = AnalysisSettings(device="cpu")
    rows = []
    for path in paths:
        last = run_analysis(path, passes=names, settings=settings, options=options, progress=progress).rows
        # S_rho at the earlier checkpoints too: the sharpness curve of the flatness-sharpness figure
        earlier = run_analysis(path, rounds=_DEMO_CURVE_ROUNDS, passes=["sharpness"], settings=settings,
                               options={"sharpness": options["sharpness"]}, progress=progress).rows
        rows += sorted(earlier + last, key=lambda row: row.get("round", 0))
    figures = out / "figures"
    comparison, report = parallel.on_main(lambda: _draw(paths, figures, out / "report.html"))
    return Demo(paths, figures, AnalysisReport(rows=rows, data=analysis_data(settings)), comparison, report)


def _draw(paths: list[Path], figures: Path, report: Path) -> tuple[Comparison, Path]:
    """The comparison (the three surfaces on one scale, the table), four more figures and the report."""
    from landscape.figures import curves
    from landscape.figures.compare import compare
    from landscape.figures.report.build import write_report

    comparison = compare(paths, figures)
    curves.plot_accuracy(paths, figures / "accuracy.png")
    curves.plot_flatness_and_sharpness(paths, figures / "flatness-sharpness.png")
    curves.plot_hessian_summary(paths, figures / "hessian.png")
    curves.plot_alignment_heatmaps(paths, figures / "alignment.png")
    return comparison, write_report(paths, report, title="landscape demo: FedAvg, FedSAM, FedNSAM on digits")
