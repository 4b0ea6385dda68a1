"""``landscape analyze``: the analysis passes over checkpoints (a run, folders of runs, checkpoint files, a
plain state_dict), their settings from the flags and an analysis recipe."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

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
              help="the checkpoints to analyse: last, all, or a comma list of their rounds (10,20); of plain "
                   "state_dicts (every file unless given), also of their file names")
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
@trust_imports_option("import the modules the runs' recipes name in `imports` (their code runs); without "
                      "it, a run whose model, data set or partition comes from them is refused")
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
    every pass but `surface` runs; --directions/--grid/--span/--data alone run the surface pass.
    """
    from landscape.analyze.catalog import pass_options
    from landscape.analyze.recipes import load_analysis_recipe
    from landscape.analyze.scheduler import run_analysis
    from landscape.analyze.settings import AnalysisSettings
    from landscape.analyze.summary import format_summary

    click_ctx = click.get_current_context()

    def given(name: str) -> bool:
        return click_ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE

    foreign = _state_dict_model(model_spec, dataset_spec)
    recipe = load_analysis_recipe(analysis_recipe) if analysis_recipe is not None else None
    chosen = {"split": split, "analysis_samples": analysis_samples, "bn_mode": bn_mode, "device": device,
              "backend": backend, "hvp": hvp, "seed": seed, "dtype": dtype, "threads": threads,
              "memory_format": memory_format}
    set_settings, set_options = _set_kinds(assignments)
    if recipe is not None:
        chosen.update({k: v for k, v in recipe.settings.items() if not given(k)})
        if recipe.passes is not None and passes is None:
            passes = ",".join(recipe.passes)
    chosen.update(set_settings)
    checkpoints = _checkpoints(checkpoints, given("checkpoints"), recipe, foreign is not None)
    if chosen["analysis_samples"] < 0:
        raise LandscapeError(f"--analysis-samples must be >= 0 (got {chosen['analysis_samples']})")
    surface_flags = {"directions": directions, "grid": grid, "span": span, "data": surface_data}
    surface_flags = {k: v for k, v in surface_flags.items() if v is not None}
    names = _pass_names(passes, surface_flags, foreign is not None)
    values = _pass_values(names, recipe.options if recipe else {}, surface_flags, set_options)
    options = {name: pass_options(name, values[name]) for name in names}
    settings = AnalysisSettings(**chosen)
    if dry_run:
        from landscape.analyze.plan import format_plan, plan, skip_unavailable

        jobs, notes = skip_unavailable(plan(path, checkpoints, names, options, foreign))
        click.echo(format_plan(jobs, settings))
        for note in [] if quiet else notes:
            click.echo(f"note: {note}", err=True)
        return
    report = run_analysis(path, rounds=checkpoints, passes=names, settings=settings, options=options,
                          force=force, progress=not quiet, foreign=foreign)
    click.echo(format_summary(report))
    for note in [] if quiet else report.notes:
        click.echo(f"note: {note}", err=True)
    for warning in report.warnings:
        click.echo(f"warning: {warning}", err=True)
    click.echo(f"{report.computed} computed, {report.skipped} already done (same settings)")


def _checkpoints(flag: str, given: bool, recipe: Any, state_dict: bool) -> str:
    """The checkpoints to analyse: --checkpoints where given, else the analysis recipe's rounds, else last (every
    file of plain state_dicts: a folder of them is analysed whole unless --checkpoints picks some)."""
    if given:
        return flag
    if recipe is not None and recipe.rounds is not None:
        return recipe.rounds
    return "all" if state_dict else flag


def _state_dict_model(model_spec: str | None, dataset_spec: str | None) -> Any:
    """The model and data of a plain state_dict (--model and --dataset, both or neither), or None."""
    from landscape.analyze.state_dict_source import ForeignModel

    if (model_spec is None) != (dataset_spec is None):
        raise LandscapeError("a plain state_dict needs both --model and --dataset")
    return ForeignModel(model_spec, dataset_spec) if model_spec is not None else None


def _pass_names(passes: str | None, surface_flags: dict[str, str], state_dict: bool) -> list[str]:
    """The passes to run: --passes (a comma list), else the surface pass when a surface flag is given, else
    the default passes (on a plain state_dict, which has no clients, those that need none)."""
    from landscape.analyze.catalog import default_passes, load_passes

    if passes is not None:
        names = [p.strip() for p in passes.split(",") if p.strip()]
        if not names:
            raise LandscapeError(f"--passes {shown(passes)!r} names no pass; give a comma list of: "
                                 f"{', '.join(load_passes().names())} (or leave --passes out for the "
                                 "default)")
        return names
    if surface_flags:
        return ["surface"]
    return ["loss", "hessian", "sharpness"] if state_dict else default_passes()


def _set_kinds(assignments: tuple[str, ...]) -> tuple[dict[str, Any], list[tuple[str, Any]]]:
    """The --set keys by their kind (``recipe_overrides.classify_assignment``, one grammar for every command):
    analysis settings (analyze.<setting>) and pass options (<pass>.<option>); a training recipe key is refused
    naming the commands that take it."""
    from dataclasses import fields

    from landscape.analyze.catalog import load_passes
    from landscape.analyze.settings import AnalysisSettings
    from landscape.config.overrides import ANALYSIS_SETTING, classify_assignment, parse_assignment
    from landscape.config.schema import unknown_key_message

    allowed = [f.name for f in fields(AnalysisSettings)]
    settings: dict[str, Any] = {}
    options: list[tuple[str, Any]] = []
    for key, value in map(parse_assignment, assignments):
        if classify_assignment(key, load_passes().names, "analyze") != ANALYSIS_SETTING:
            options.append((key, value))
        elif key.partition(".")[2] not in allowed:
            raise LandscapeError(unknown_key_message(key, allowed, "in [analyze]", "analysis setting"))
        else:
            settings[key.partition(".")[2]] = value
    return settings, options


def _pass_values(names: list[str], recipe_options: dict[str, dict], surface_flags: dict[str, str],
                 assignments: list[tuple[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each chosen pass's option values as given: the analysis recipe's, the surface flags, then --set."""
    values: dict[str, dict] = {name: dict(recipe_options.get(name, {})) for name in names}
    if surface_flags:
        if "surface" not in values:
            raise LandscapeError("--directions, --grid, --span and --data set the surface pass; add it: "
                                 "--passes surface")
        values["surface"].update(surface_flags)
    for key, value in assignments:
        pass_name, _, option = key.partition(".")
        if pass_name not in values or not option:
            raise LandscapeError(f"--set takes PASS.KEY=VALUE for a chosen pass ({', '.join(names)}); "
                                 f"got '{key}'")
        values[pass_name][option] = value
    return values
