"""``landscape figures``: a paper figure from a figure recipe (the figure workflow), or what it would do."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from landscape.cli.common import check_printable, progress_lines, set_option, trust_imports_option
from landscape.core.errors import LandscapeError

if TYPE_CHECKING:
    from landscape.figures.recipe.figure import FigureRecipe
    from landscape.figures.rundata import RunData
    from landscape.workflows.figure import FigureAnalysis


@click.command("figures")
@click.argument("recipe_file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("-o", "--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="folder of the figure's runs (runs/<id>) and files [default: runs/figures/<name>, "
                   "runs/figures/<name>-paper at paper scale]")
@click.option("--scale", type=click.Choice(["digits", "paper"]), default=None,
              help="digits: minutes on a laptop CPU; paper: the papers' setting [default: the recipe's "
                   "scale]")
@click.option("--runs", "run_paths", multiple=True, type=click.Path(path_type=Path),
              help="draw these existing runs (run directories or folders of runs) instead of the recipe's; "
                   "analyses they lack are computed. Repeatable")
@click.option("--device", default="auto", show_default=True,
              help="auto, cpu, cuda or cuda:N (training and analysis)")
@set_option("a training recipe key for every run (--set train.rounds=10), an analysis setting (--set "
            "analyze.analysis_samples=500) or a pass option (--set hessian.top_k=10; hessian.rounds=all too)",
            "figures takes all three")
@click.option("--seeds", default=None, metavar="S,S,...",
              help="train every run once per seed (runs/<id>-seed<s>) and draw their mean +- standard error "
                   "[default: the recipe's seeds key, else one run each]")
@click.option("--dry-run", is_flag=True, help="print what would be trained, analysed and drawn, then exit")
@click.option("--quiet", is_flag=True,
              help="no progress bars, progress lines or notes (errors and results stay)")
@trust_imports_option("with --runs: import the modules their recipes name in `imports` to analyse what they "
                      "lack (their code runs)")
def figures_command(recipe_file: Path, out: Path | None, scale: str | None, run_paths: tuple[Path, ...],
                    device: str, assignments: tuple[str, ...], seeds: str | None, dry_run: bool,
                    quiet: bool) -> None:
    """Draw a paper figure from a figure recipe (figures/*.toml): train the runs it needs and analyse them
    where that is missing (finished runs and analyses are reused; a run whose recipe changed is retrained),
    then write <file>.png, <file>.pdf and <file>.caption.txt (+ <file>.html, interactive 3D, for surfaces)
    under --out."""
    from landscape.figures.recipe import figure as figure_recipe
    from landscape.workflows import figure

    fig = figure_recipe.load_figure_recipe(recipe_file, scale)
    for text in assignments:
        check_printable("--set", text)
    fig = fig.with_sets(assignments, "figures")
    if run_paths and fig.forced:
        raise LandscapeError("--set of training keys needs the recipe's runs; with --runs nothing is trained")
    if seeds is not None:
        if run_paths:
            raise LandscapeError("--seeds needs the recipe's runs; with --runs nothing is trained (runs "
                                 "given that differ only in their seed are aggregated as they are)")
        fig = fig.with_seeds(figure_recipe.parse_seeds(seeds, "--seeds"))
    out = out if out is not None else figure.figure_folder(fig, Path("runs/figures"))
    if dry_run:
        analysis, given = figure.check_figure(fig, out, device=device, run_paths=run_paths)
        if run_paths:
            _print_given(fig, given, out, analysis)
        else:
            _print_plan(fig, out, device, analysis)
        return
    written = figure.make_figure(fig, out, device=device, run_paths=run_paths, progress=not quiet,
                                 notify=progress_lines(quiet))
    click.echo(f"figure {fig.name}: " + ", ".join(str(p) for p in written))


def _print_given(fig: FigureRecipe, runs: list[RunData], out: Path, analysis: FigureAnalysis) -> None:
    """--dry-run with --runs: the given runs, the analysis jobs they lack (none of those done), the plots and
    what the jobs would cost."""
    from landscape.workflows.estimate import WorkEstimate

    estimate = WorkEstimate()
    click.echo(f"figure {fig.name} over {len(runs)} given run(s): {', '.join(str(run.path) for run in runs)}")
    given = [(None, run.path, None) for run in runs]
    for name, spec in fig.pass_rounds.items():
        click.echo("  " + estimate.pass_line(given, name, spec, analysis.options[name], analysis.settings))
    for plot in fig.plots:
        click.echo(f"  plot {plot.kind:<18} {out / plot.file}.png|pdf|caption.txt")
    for line in estimate.lines():
        click.echo(line)


def _print_plan(fig: FigureRecipe, out: Path, device: str, analysis: FigureAnalysis) -> None:
    """--dry-run: each run with what would be done with it and its training time, each pass with the jobs it
    would compute at its rounds (never those done) and their time, the plots, and the total with the rates
    measured here."""
    from landscape.config import recipe as recipes
    from landscape.store import lifecycle
    from landscape.workflows.estimate import WorkEstimate, about
    from landscape.workflows.figure import figure_plan

    estimate = WorkEstimate()
    seeded = f", {len(fig.seeds)} seeds: {','.join(map(str, fig.seeds))}" if fig.seeds else ""
    click.echo(f"figure {fig.name} ({fig.scale} scale{seeded}): {fig.title}")
    plan = figure_plan(fig, out, device)
    statuses = {}
    for run_id, entries in plan.items():
        for seed, recipe, path in entries:
            which = run_id if seed is None else f"{run_id} seed {seed}"
            status = statuses[path] = lifecycle.owned_run_status(recipe, path)
            seconds = estimate.training(recipe, path, status, analysis.settings)
            cost = f"  {about(seconds)}" if status != "done" else ""
            click.echo(f"  run {which:<22} {status:<8} {path}  [{recipes.run_name(recipe)}, "
                       f"{recipe.train.rounds} rounds]{cost}")
    runs = [(recipe, path, statuses[path]) for entries in plan.values() for _, recipe, path in entries]
    for name, spec in fig.pass_rounds.items():
        click.echo("  " + estimate.pass_line(runs, name, spec, analysis.options[name], analysis.settings))
    for plot in fig.plots:
        click.echo(f"  plot {plot.kind:<18} {out / plot.file}.png|pdf|caption.txt  runs {', '.join(plot.runs)}")
    for line in estimate.lines():
        click.echo(line)
