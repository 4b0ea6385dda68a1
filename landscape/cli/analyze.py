"""``landscape analyze``: the analysis passes over checkpoints (a run, folders of runs, checkpoint files, a
plain state_dict), their settings from the flags and an analysis recipe."""

from __future__ import annotations

import shlex
from pathlib import Path

import click

from landscape.analyze.settings import SETTING_CHOICES
from landscape.cli.common import set_option, trust_imports_option
from landscape.core.errors import LandscapeError, shown


def _no_rounds_on_analyze(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    """``analyze --rounds``: train's count of rounds is not analyze's choice of checkpoints."""
    if value is not None:
        given = shown(shlex.quote(value) if value.isprintable() else repr(value))
        raise LandscapeError("analyze picks checkpoints with --checkpoints (last, all, or a comma list of "
                             f"rounds), not --rounds: use --checkpoints {given}")


@click.command("analyze")
@click.argument("path", type=click.Path(path_type=Path))
@click.argument("analysis_recipe", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--checkpoints", default="last", show_default=True,
              help="the checkpoints to analyse: last, all, or a comma list of their rounds (10,20), or last N "
                   "(the grammar of rounds); of plain state_dicts (every file unless given), also of their file "
                   "names")
@click.option("--rounds", hidden=True, expose_value=False, callback=_no_rounds_on_analyze)
@click.option("--passes", default=None,
              help="comma list of passes [default: all but surface; see `landscape list`]")
@click.option("--analysis-samples", type=int, default=0, show_default=True,
              help="a fixed seeded subset of N samples of the split (0: all)")
@click.option("--split", type=click.Choice(SETTING_CHOICES["split"]), default="train", show_default=True,
              help="train: all clients' training data pooled (of a registered data set with --model: "
                   "its training set); test: the test set")
@click.option("--bn-mode", type=click.Choice(SETTING_CHOICES["bn_mode"]), default="eval",
              show_default=True, help="BatchNorm statistics used by the analysis")
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N")
@click.option("--backend", type=click.Choice(SETTING_CHOICES["backend"]), default="native", show_default=True,
              help="pyhessian: also compute lambda_max and trace with the PyHessian package (cross-check)")
@click.option("--hvp", type=click.Choice(SETTING_CHOICES["hvp"]),
              default="auto",
              show_default=True, help="how Hessian-vector products are computed (auto: double-backward, through "
                                      "kept graphs where they fit)")
@click.option("--dtype", type=click.Choice(SETTING_CHOICES["dtype"]), default="auto", show_default=True,
              help="auto: the run's train.dtype (a state_dict's own dtype)")
@click.option("--model", "model_spec", default=None, metavar="NAME|MODULE:FACTORY",
              help="PATH is a plain state_dict file or a folder of them: the model, a registered name or "
                   "package.module:factory (called with no arguments)")
@click.option("--dataset", "dataset_spec", default=None, metavar="NAME|MODULE:FACTORY",
              help="with --model: the data, a registered data set (--split picks train or test) or "
                   "package.module:factory returning (inputs, targets), a Dataset or a DataLoader")
@click.option("--seed", type=int, default=0, show_default=True,
              help="seed of subsets, probes and minibatches")
@click.option("--threads", type=click.IntRange(min=0), default=1, show_default=True,
              help="CPU threads (0: every core); the numbers' last bits depend on it, the machine never "
                   "sets it")
@click.option("--memory-format", type=click.Choice(SETTING_CHOICES["memory_format"]), default="auto",
              show_default=True, help="layout of the losses' and gradients' 4-D tensors (auto: channels-last "
                                      "on the CPU for a model with 2-D convolutions); the last bits depend on "
                                      "it")
@set_option("a pass option, e.g. --set hessian.top_k=10 or --set sharpness.rhos=[0.05,0.1], or an analysis "
            "setting, e.g. --set analyze.batch_size=256 (over the flags)", "analyze takes the last two")
@click.option("--directions", type=click.Choice(["random", "pca", "clients", "interpolate"]), default=None,
              help="surface pass: filter-normalised random plane, PCA of the trajectory, the plane of two "
                   "kept clients, or a 1D line to a target [surface.directions]")
@click.option("--grid", default=None, help="surface pass: points per axis, 41 or 41x25 (odd) [surface.grid]")
@click.option("--span", default=None,
              help="surface pass: coordinate range, e.g. -1:1, or auto [surface.span]")
@click.option("--data", "surface_data", default=None,
              help="surface pass: global, test or client:<i> (local vs global landscape) [surface.data]")
@click.option("--force", is_flag=True, help="recompute passes already computed with the same settings")
@click.option("--dry-run", is_flag=True, help="print the runs, rounds and passes with an estimate of "
              "Hessian-vector products and seconds (timed by one gradient), then exit")
@click.option("--quiet", is_flag=True, help="no progress bars or notes (errors and the summary stay)")
@trust_imports_option("import the modules the runs' recipes name in `imports` (their code runs) before the "
                      "passes are checked; without it, a run whose model, data set or partition comes from them "
                      "is refused, and so is a pass they declare")
def analyze_command(path: Path, analysis_recipe: Path | None, checkpoints: str, passes: str | None,
                    analysis_samples: int, split: str, bn_mode: str, device: str, backend: str, hvp: str,
                    dtype: str, model_spec: str | None, dataset_spec: str | None, seed: int, threads: int,
                    memory_format: str, assignments: tuple[str, ...], directions: str | None, grid: str | None,
                    span: str | None, surface_data: str | None, force: bool, dry_run: bool, quiet: bool) -> None:
    """Analyse checkpoints: Hessian spectrum, sharpness, flatness distance, incompatibility, alignment,
    loss surfaces.

    PATH is a run directory, a folder of runs, a run's checkpoints/ folder, a folder of checkpoints, or one
    checkpoint file; with --model and --dataset, a plain state_dict file or a folder of them. ANALYSIS_RECIPE
    (e.g. analyze/quick.toml) gives the passes, rounds (--checkpoints), settings and pass options; flags given
    here win.
    Results go to analysis/round-NNNN/<pass>.json (+ .npz) with the settings that produced them; passes
    already computed with the same settings are skipped. A summary table is printed at the end. By default
    every pass but `surface` runs; --directions/--grid/--span/--data or --set surface.KEY=VALUE alone run
    the surface pass (the --set of a pass that runs only when named names it).
    """
    from landscape.analyze.scheduler import run_analysis
    from landscape.analyze.summary import format_summary
    from landscape.workflows.analysis import analysis_request

    click_ctx = click.get_current_context()
    flags = {"split": split, "analysis_samples": analysis_samples, "bn_mode": bn_mode, "device": device,
             "backend": backend, "hvp": hvp, "seed": seed, "dtype": dtype, "threads": threads,
             "memory_format": memory_format}
    given = {name for name in [*flags, "checkpoints"]
             if click_ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE}
    surface_flags = {"directions": directions, "grid": grid, "span": span, "data": surface_data}
    request = analysis_request(path=path, flags=flags, given=given, recipe=analysis_recipe, checkpoints=checkpoints,
                               passes=passes, assignments=assignments,
                               surface_flags={k: v for k, v in surface_flags.items() if v is not None},
                               model_spec=model_spec, dataset_spec=dataset_spec)
    if dry_run:
        from landscape.analyze.plan import format_plan, plan, skip_unavailable
        from landscape.analyze.scheduler import recorded_summaries

        jobs, notes = skip_unavailable(plan(path, request.rounds, request.passes, request.options,
                                            request.settings, request.foreign))
        recorded, _ = recorded_summaries(jobs, request.settings, force)
        click.echo(format_plan(jobs, request.settings, [summary is not None for summary in recorded]))
        for note in [] if quiet else notes:
            click.echo(f"note: {note}", err=True)
        return
    report = run_analysis(path, rounds=request.rounds, passes=request.passes, settings=request.settings,
                          options=request.options, force=force, progress=not quiet, foreign=request.foreign)
    click.echo(format_summary(report))
    for note in [] if quiet else report.notes:
        click.echo(f"note: {note}", err=True)
    for warning in report.warnings:
        click.echo(f"warning: {warning}", err=True)
    click.echo(f"{report.computed} computed, {report.skipped} already done (same settings)")

