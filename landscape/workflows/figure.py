"""The figure workflow: a figure recipe (``figures.figure_recipe.FigureRecipe``) checked, its runs trained and
analysed where that is missing (make-like), then its plots drawn from the files."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from landscape.core import parallel
from landscape.core.errors import LandscapeError
from landscape.workflows.ensure import Notify, ensure_analysis, ensure_run, ignore

if TYPE_CHECKING:
    from landscape.figures.recipe.figure import FigureRecipe
    from landscape.figures.rundata import RunData
    from landscape.store.results.selection import Selection


def figure_folder(fig: FigureRecipe, parent: Path) -> Path:
    """The folder of a figure's runs and files under ``parent``: ``<name>``, ``<name>-paper`` at paper
    scale."""
    return parent / (fig.name + ("-paper" if fig.scale == "paper" else ""))


@dataclass(frozen=True)
class FigureAnalysis:
    """A figure's analysis, derived once from its recipe (``figure_analysis``): the analysis settings, each pass's
    checked options, and the results the figure reads (``selection``: exactly those of its own settings; other
    analyses of its runs stay on disk)."""

    settings: Any
    options: dict[str, Any]
    selection: Selection


def figure_analysis(fig: FigureRecipe, device: str) -> FigureAnalysis:
    """A figure recipe's analysis settings and each of its passes' options, checked, and the results it reads."""
    from landscape.analyze.catalog import pass_options
    from landscape.analyze.passes import RESULT_NAMES
    from landscape.analyze.plan import pass_settings_record
    from landscape.analyze.settings import AnalysisSettings
    from landscape.store.results.selection import Selection

    try:
        settings = AnalysisSettings(device=device, **fig.settings)
    except TypeError as e:
        raise LandscapeError(f"{fig.path}: bad analysis settings ({e})") from None
    except LandscapeError as e:
        raise LandscapeError(f"{fig.path}: {e}") from None
    passes = list(fig.pass_rounds)
    options = {name: pass_options(name, fig.pass_options.get(name, {})) for name in passes}
    unknown = sorted(set(fig.pass_options) - set(passes))
    if unknown:
        raise LandscapeError(f"{fig.path}: options for pass(es) {', '.join(unknown)} that no plot reads")
    selection = Selection(RESULT_NAMES, exact={name: pass_settings_record(name, options[name], settings)
                                                 for name in passes})
    return FigureAnalysis(settings, options, selection)


def figure_plan(fig: FigureRecipe, out: Path, device: str) -> dict[str, list[tuple[int | None, Any, Path]]]:
    """Run id -> (seed, resolved training recipe, run directory) of each of its runs
    (``FigureRecipe.seed_runs``)."""
    from landscape.config import overrides as recipe_overrides

    device_key = [("train.device", device)] if device != "auto" else []
    def resolved(run_id: str, seed: int | None) -> Any:
        return recipe_overrides.build(fig.train_recipe, fig.overrides(fig.run(run_id), seed) + device_key)

    return {run_id: [(seed, resolved(run_id, seed), path) for seed, path in entries]
            for run_id, entries in fig.seed_runs(out).items()}


def figure_training(fig: FigureRecipe, out: Path, device: str) -> dict[str, list[tuple[int | None, Any]]]:
    """Run id -> (seed, training settings) of each of its runs: what the figure's rounds are checked against
    before anything is trained."""
    return {run_id: [(seed, recipe.train) for seed, recipe, _ in entries]
            for run_id, entries in figure_plan(fig, out, device).items()}


def prepare_figure_runs(fig: FigureRecipe, out: Path, *, device: str, analysis: FigureAnalysis | None = None,
                        progress: bool = False, notify: Notify = ignore) -> dict[str, list[Path]]:
    """Train and analyse what a figure recipe needs and is missing, make-like: its runs under ``out/runs``
    (one per seed when it has seeds), then each pass at its rounds with the recipe's settings (``analysis``,
    derived here when not given). Returns run id -> its run directories, in the recipe's order (seeds in
    order)."""
    analysis = analysis if analysis is not None else figure_analysis(fig, device)
    plan = figure_plan(fig, out, device)
    for entries in plan.values():
        for _, run_recipe, path in entries:
            ensure_run(run_recipe, path, progress=progress, notify=notify)
    found = {run_id: [path for _, _, path in entries] for run_id, entries in plan.items()}
    ensure_analysis([path for paths in found.values() for path in paths], fig.pass_rounds, analysis.settings,
                    analysis.options, progress=progress)
    return found


def check_figure(fig: FigureRecipe, out: Path, *, device: str,
                 run_paths: tuple[Path, ...] = ()) -> tuple[FigureAnalysis, list[RunData]]:
    """Everything checked before anything is trained: the analysis settings and pass options (returned, as the
    figure's analysis), and either the given runs (``run_paths``: returned, read) or that each round the
    figure analyses is a checkpoint its own runs will have (no runs returned). The device too: one that is
    unknown or not here is refused now (a dry-run says so), not when the first run starts."""
    from landscape.config.setup import resolve_device
    from landscape.figures.recipe import rounds as figure_rounds
    from landscape.figures.rundata import load_runs

    resolve_device(device)
    analysis = figure_analysis(fig, device)
    if run_paths:
        return analysis, load_runs(list(run_paths))
    figure_rounds.check_pass_rounds(fig, figure_training(fig, out, device))
    return analysis, []


def make_figure(fig: FigureRecipe, out: Path, *, device: str = "auto", run_paths: tuple[Path, ...] = (),
                progress: bool = False, notify: Notify = ignore) -> list[Path]:
    """Draw a figure recipe into ``out``: train and analyse its runs where that is missing, or with
    ``run_paths`` analyse those runs where they lack the figure's results and draw every plot over all of
    them. Returns the files written (rank 0 draws under torchrun; every rank returns them)."""
    analysis, given = check_figure(fig, out, device=device, run_paths=run_paths)
    if run_paths:
        paths = [run.path for run in given]
        ensure_analysis(paths, fig.pass_rounds, analysis.settings, analysis.options, progress=progress)
        by_id = None
    else:
        by_id = prepare_figure_runs(fig, out, device=device, analysis=analysis, progress=progress, notify=notify)
        paths = [path for of_id in by_id.values() for path in of_id]
    return parallel.on_main(lambda: _draw(fig, out, paths, by_id, analysis.selection, notify))


def _draw(fig: FigureRecipe, out: Path, paths: list[Path], by_id: dict[str, list[Path]] | None,
          selection: Selection, notify: Notify) -> list[Path]:
    """Every plot of the figure: over all runs of ``paths`` (``by_id`` None), else over its own run ids."""
    from landscape.figures import book
    from landscape.figures.recipe import figure as figure_recipe
    from landscape.figures.rundata import load_runs

    drawn = load_runs(paths, selection)
    if by_id is None:
        chosen = [(plot, drawn) for plot in fig.plots]
    else:
        loaded, rest = {}, iter(drawn)
        for run_id, of_id in by_id.items():
            loaded[run_id] = [next(rest) for _ in of_id]
        chosen = [(plot, figure_recipe.figure_runs(fig, plot, loaded)) for plot in fig.plots]
    for run in drawn:
        for line in run.notes():
            notify(f"note: {line}")
    surface = fig.surface_name()
    pages: dict[str, Path] = {}  # one interactive page per view the figure shows
    before = {path for path in out.iterdir() if path.is_file()} if out.is_dir() else set()
    written = [path for plot, plot_runs in chosen for path in book.render(plot, plot_runs, out, surface, pages)]
    written = list(dict.fromkeys(written))
    replaced = [path.name for path in written if path in before]
    if replaced:  # nothing is overwritten without saying so
        notify(f"note: replaced {len(replaced)} file(s) in {out} that were there before: {', '.join(replaced)}")
    return written
