"""The ``landscape`` command line. The only place that wires the stages together."""

from __future__ import annotations

import functools
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from landscape import __version__, parallel
from landscape.errors import LandscapeError, shown

if TYPE_CHECKING:
    from landscape.figures.book import FigureRecipe


class _Group(click.Group):
    """Turns a LandscapeError into one line on stderr and exit status 1, never a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except LandscapeError as e:
            click.echo(f"error: {e}", err=True)
            ctx.exit(1)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            ctx.exit(130)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="landscape")
def cli() -> None:
    """Train federated sharpness-aware algorithms and measure why they generalise or fail.

    \b
    landscape train train/digits-quick.toml        train from a recipe
    landscape train --algorithm fedavg --rounds 30  or from flags (defaults: landscape train --help)
    landscape analyze runs/<name>                   Hessian, sharpness, flatness, alignment of checkpoints
    landscape figures figures/fedsam-hessian.toml   a paper figure (trains and analyses what it needs)
    landscape compare RUN_A RUN_B                   a table and the surfaces side by side
    landscape claims claims/*.toml                  check published claims over seeds: HELD / NOT HELD
    landscape demo                                  all of it on digits, in minutes
    landscape list                                  everything that can be named in a recipe
    """


# Flags that set one recipe key each: (option name, recipe key, help). Comma lists (--alpha 0.6,0.1) sweep.
# The help shows each key's value in the default recipe; the flags themselves default to None (not given), so
# a recipe file's values stand.
_RECIPE_FLAGS: list[tuple[str, str, str]] = [
    ("--algorithm", "algorithm.name", "federated algorithm (see `landscape list`)"),
    ("--dataset", "dataset.name", "data set: digits (offline), mnist1d (generated), synthetic, mnist, ..."),
    ("--model", "model.name", "model: mlp, cnn, lenet5, resnet18"),
    ("--partition", "partition.name",
     "how the training set is split: iid, dirichlet, dirichlet-client, pathological, natural"),
    ("--alpha", "partition.alpha", "Dirichlet concentration (smaller = more heterogeneous)"),
    ("--clients", "partition.clients", "number of clients N"),
    ("--participation", "train.participation", "fraction of clients sampled per round, in (0, 1]"),
    ("--rounds", "train.rounds", "communication rounds T"),
    ("--local-epochs", "train.local_epochs", "local epochs E per round"),
    ("--local-steps", "train.local_steps", "fixed local steps K per round (overrides epochs when > 0)"),
    ("--batch-size", "train.batch_size", "local minibatch size"),
    ("--lr", "train.lr", "client learning rate eta"),
    ("--seed", "seed", "seed of partition, initialisation, sampling and batches"),
    ("--checkpoint-every", "train.checkpoint_every", "checkpoint every N rounds (and always at the end)"),
    ("--eval-every", "train.eval_every", "evaluate on the test set every N rounds (and at the end)"),
    ("--data-root", "dataset.root", "folder holding torchvision-format data sets"),
    ("--device", "train.device", "auto, cpu, cuda or cuda:N"),
    ("--threads", "train.threads", "CPU threads (0: every core); the last bits depend on it"),
]
_NO_SWEEP = {"dataset.root", "train.device"}  # values that may hold commas themselves


@functools.lru_cache(maxsize=1)
def _default_recipe() -> Any:
    from landscape import recipe as recipes

    return recipes.resolve({})


class _RecipeOption(click.Option):
    """A flag setting one recipe key: None unless given, its help showing the key's default-recipe value."""

    def __init__(self, *args: Any, recipe_key: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.recipe_key = recipe_key

    def get_help_extra(self, ctx: click.Context) -> Any:
        extra = super().get_help_extra(ctx)
        extra["default"] = str(_default_recipe().get(self.recipe_key))
        return extra


def _recipe_options(f):
    for flag, key, help_text in reversed(_RECIPE_FLAGS):
        sweep = "" if key in _NO_SWEEP else "; a,b,c sweeps"
        f = click.option(flag, cls=_RecipeOption, recipe_key=key, type=str, default=None,
                         help=f"{help_text} [{key}{sweep}]")(f)
    return f


def _trusting(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    """--trust-imports: the recorded recipes read by this command have their imports imported (for the
    command's duration: ``landscape.imports.trusted_imports``)."""
    if value:
        from landscape.imports import trusted_imports

        ctx.with_resource(trusted_imports(True))


def _trust_imports_option(help_text: str):
    return click.option("--trust-imports", is_flag=True, expose_value=False, callback=_trusting, help=help_text)


@cli.command("train")
@click.argument("recipe_file", required=False, type=click.Path(dir_okay=False, path_type=Path))
@_recipe_options
@click.option("--download", is_flag=True, default=None, help="download torchvision data sets where a network exists")
@click.option("--keep-clients", is_flag=True, default=None, help="also save the clients' final models at checkpoints")
@click.option("--swa", is_flag=True, default=None, help="server SWA (Caldarola et al. 2022) on top of the algorithm")
@click.option("--set", "assignments", multiple=True, metavar="KEY=VALUE",
              help="set any recipe key, e.g. --set train.weight_decay=1e-3 or --set algorithm.fedsam.rho=0.05")
@click.option("-o", "--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="run directory [default: runs/<generated name>]; for a sweep, the folder of its runs")
@click.option("--dry-run", is_flag=True, help="print the resolved recipe and the client x class table (or the "
              "sweep's runs), then exit")
@click.option("--overwrite", is_flag=True, help="replace an existing run directory")
@click.option("--resume", "resume_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="continue the run in this directory from its last checkpoint (with --rounds to extend it)")
@click.option("--quiet", is_flag=True, help="no progress bar or progress lines (errors, warnings and results stay)")
@_trust_imports_option("with --resume: import the modules the run's recipe names in `imports` (their code runs; "
                       "a recipe file you name is always imported)")
def train_command(recipe_file: Path | None, download: bool | None, keep_clients: bool | None, swa: bool | None,
                  assignments: tuple[str, ...], out: Path | None, dry_run: bool, overwrite: bool,
                  resume_dir: Path | None, quiet: bool, **flags: Any) -> None:
    """Train federated runs from a RECIPE_FILE (TOML) and/or flags.

    Flags override the recipe, and --set overrides both. A comma list in a flag (--algorithm fedsam,fednsam
    --alpha 0.6,0.1 --seed 0,1) or a [sweep] table in the recipe makes one run per combination, named
    systematically under --out (default runs/); finished runs are skipped and unfinished ones resumed.
    Each run directory gets the fully resolved recipe, partition.json, metrics.jsonl (one line per round)
    and checkpoints/round-NNNN.pt.
    """
    from landscape import lifecycle
    from landscape import recipe as recipes
    from landscape.train import loop

    overrides: list[tuple[str, Any]] = []
    axes: dict[str, list] = {}
    given = [(flag, flags[flag.lstrip("-").replace("-", "_")]) for flag, _, _ in _RECIPE_FLAGS]
    for flag, text in given + [("--set", a) for a in assignments]:
        if text is not None and any(ord(c) < 32 or ord(c) == 127 for c in text):  # e.g. a newline pasted in
            raise LandscapeError(f"{flag} must not hold control characters (got {text!r})")
    for flag, key, _ in _RECIPE_FLAGS:
        text = flags[flag.lstrip("-").replace("-", "_")]
        if text is None:
            continue
        if "," in text and key not in _NO_SWEEP:
            axes[key] = [recipes.parse_value(item.strip()) for item in text.split(",")]
        else:
            overrides.append((key, text if key in _NO_SWEEP else recipes.parse_value(text)))
    for enabled, key in ((download, "dataset.download"), (keep_clients, "train.keep_clients"), (swa, "train.swa")):
        if enabled:
            overrides.append((key, True))
    overrides += [recipes.parse_assignment(a) for a in assignments]

    if resume_dir is not None:
        extra = [k for k, _ in overrides if k not in ("train.rounds", "train.threads")]
        if recipe_file is not None or extra or axes or out is not None or overwrite or dry_run:
            raise LandscapeError("--resume continues a run as recorded; only --rounds may be given with it, and "
                                 "--threads")
        rounds = dict(overrides).get("train.rounds")
        if rounds is not None and (isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1):
            raise LandscapeError(f"--rounds must be a positive integer (got {rounds!r})")
        threads = dict(overrides).get("train.threads")
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 0):
            raise LandscapeError(f"--threads must be a whole number >= 0 (got {threads!r})")
        state = loop.resume_run(resume_dir, rounds=rounds, progress=not quiet, threads=threads)
        _report(resume_dir, state.round)
        return

    runs = recipes.build_sweep(recipe_file, overrides, axes)
    if not any(swept for _, swept in runs):  # one run: --out is its directory
        recipe = runs[0][0]
        out = out if out is not None else Path("runs") / (recipe.name or recipes.run_name(recipe))
        if dry_run:
            from landscape.data.partitions import format_partition_table, heterogeneity
            from landscape.setup import prepare_data

            setup = prepare_data(recipe)
            loop.check_local_work(recipe.train)
            click.echo(recipes.to_toml(recipe))
            click.echo(f"# run directory: {out}")
            click.echo(format_partition_table(setup.histogram))
            click.echo(heterogeneity(setup.histogram).text())
            return
        state = loop.start_run(recipe, out, overwrite=overwrite, progress=not quiet)
        _report(out, state.round)
        return

    # A sweep: every run under --out, checked before any of them starts.
    parent = out if out is not None else Path("runs")
    plan = [(recipe, parent / recipes.sweep_run_name(recipe, swept)) for recipe, swept in runs]
    names = [p.name for _, p in plan]
    if len(set(names)) != len(names):
        first = next(i for i, name in enumerate(names) if names.index(name) != i)
        a, b = runs[names.index(names[first])][1], runs[first][1]
        differ = ", ".join(f"{k} = {a[k]!r} and {b[k]!r}" for k in a if a[k] != b.get(k)) or ", ".join(
            f"{k} = {v!r}" for k, v in a.items())
        raise LandscapeError(f"two runs of this sweep get the same name '{names[first]}' ({differ}); give them "
                             "different values or a name")
    statuses = [lifecycle.sweep_status(recipe, path, overwrite) for recipe, path in plan]
    if dry_run:
        for (_, path), status in zip(plan, statuses):
            click.echo(f"{status:<8} {path}")
        return
    for i, ((recipe, path), status) in enumerate(zip(plan, statuses), start=1):
        _status(f"[{i}/{len(plan)}] {status}: {path}", quiet)
        if status == "done":
            continue
        if status == "resume":
            state = loop.resume_run(path, progress=not quiet, threads=recipe.train.threads)
        else:
            state = loop.start_run(recipe, path, overwrite=overwrite, progress=not quiet)
        _report(path, state.round)


def _status(line: str, quiet: bool) -> None:
    """A progress line on stderr, once (rank 0 under torchrun); none with --quiet."""
    if not quiet and parallel.is_main():
        click.echo(line, err=True)


def _report(out: Path, rounds: int) -> None:
    from landscape.runs import RunDir

    rows = [r for r in RunDir(out).read_metrics() if "test_acc" in r]
    tail = f"; test accuracy {rows[-1]['test_acc']:.4f} (round {rows[-1]['round']})" if rows else ""
    click.echo(f"run {out}: {rounds} rounds{tail}")


def _no_rounds_on_analyze(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    """``analyze --rounds``: train's count of rounds is not analyze's choice of checkpoints."""
    if value is not None:
        given = shown(shlex.quote(value) if value.isprintable() else repr(value))
        raise LandscapeError(f"analyze picks checkpoints with --checkpoints (last, all, or a comma list of rounds), "
                             f"not --rounds: use --checkpoints {given}")


@cli.command("analyze")
@click.argument("path", type=click.Path(path_type=Path))
@click.argument("analysis_recipe", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--checkpoints", default="last", show_default=True,
              help="the checkpoints to analyse: last, all, or a comma list of their rounds (10,20)")
@click.option("--rounds", hidden=True, expose_value=False, callback=_no_rounds_on_analyze)
@click.option("--passes", default=None,
              help="comma list of passes [default: all but surface; see `landscape list`]")
@click.option("--analysis-samples", type=int, default=0, show_default=True,
              help="a fixed seeded subset of N samples of the split (0: all)")
@click.option("--split", type=click.Choice(["train", "test"]), default="train", show_default=True,
              help="train: the union of all clients' training data; test: the test set")
@click.option("--bn-mode", type=click.Choice(["eval", "train-batch-stats", "recompute"]), default="eval",
              show_default=True, help="BatchNorm statistics used by the analysis")
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N")
@click.option("--backend", type=click.Choice(["native", "pyhessian"]), default="native", show_default=True,
              help="pyhessian: also compute lambda_max and trace with the PyHessian package (cross-check)")
@click.option("--hvp", type=click.Choice(["double-backward", "forward-over-reverse"]), default="double-backward",
              show_default=True, help="how Hessian-vector products are computed")
@click.option("--dtype", type=click.Choice(["auto", "float32", "float64"]), default="auto", show_default=True,
              help="auto: the run's train.dtype (a state_dict's own dtype)")
@click.option("--model", "model_spec", default=None, metavar="NAME|MODULE:FACTORY",
              help="PATH is a plain state_dict file or a folder of them: the model, a registered name or "
                   "package.module:factory (called with no arguments)")
@click.option("--dataset", "dataset_spec", default=None, metavar="NAME|MODULE:FACTORY",
              help="with --model: the data, a registered data set (--split picks train or test) or "
                   "package.module:factory returning (inputs, targets), a Dataset or a DataLoader")
@click.option("--seed", type=int, default=0, show_default=True, help="seed of subsets, probes and minibatches")
@click.option("--threads", type=click.IntRange(min=0), default=1, show_default=True,
              help="CPU threads (0: every core); the numbers' last bits depend on it, the machine never sets it")
@click.option("--set", "assignments", multiple=True, metavar="PASS.KEY=VALUE",
              help="a pass option, e.g. --set hessian.top_k=10 or --set sharpness.rhos=[0.05,0.1]")
@click.option("--directions", type=click.Choice(["random", "pca", "clients", "interpolate"]), default=None,
              help="surface pass: filter-normalised random plane, PCA of the trajectory, the plane of two kept "
                   "clients, or a 1D line to a target [surface.directions]")
@click.option("--grid", default=None, help="surface pass: points per axis, 41 or 41x25 (odd) [surface.grid]")
@click.option("--span", default=None, help="surface pass: coordinate range, e.g. -1:1, or auto [surface.span]")
@click.option("--data", "surface_data", default=None,
              help="surface pass: global, test or client:<i> (local vs global landscape) [surface.data]")
@click.option("--force", is_flag=True, help="recompute passes already computed with the same settings")
@click.option("--dry-run", is_flag=True, help="print the runs, rounds and passes with an estimate of Hessian-vector "
              "products and seconds (timed by one gradient), then exit")
@click.option("--quiet", is_flag=True, help="no progress bars or notes (errors and the summary stay)")
@_trust_imports_option("import the modules the runs' recipes name in `imports` (their code runs); without it, a "
                       "run whose model, data set or partition comes from them is refused")
def analyze_command(path: Path, analysis_recipe: Path | None, checkpoints: str, passes: str | None,
                    analysis_samples: int, split: str, bn_mode: str, device: str, backend: str, hvp: str,
                    dtype: str, model_spec: str | None, dataset_spec: str | None, seed: int, threads: int,
                    assignments: tuple[str, ...], directions: str | None, grid: str | None, span: str | None,
                    surface_data: str | None, force: bool, dry_run: bool, quiet: bool) -> None:
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
    from landscape.analyze.catalog import default_passes, pass_options
    from landscape.analyze.context import AnalysisSettings, ForeignModel
    from landscape.analyze.recipes import load_analysis_recipe
    from landscape.analyze.scheduler import format_summary, run_analysis
    from landscape.recipe import parse_assignment

    click_ctx = click.get_current_context()

    def given(name: str) -> bool:
        return click_ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE

    foreign = None
    if (model_spec is None) != (dataset_spec is None):
        raise LandscapeError("a plain state_dict needs both --model and --dataset")
    if model_spec is not None:
        foreign = ForeignModel(model_spec, dataset_spec)
    recipe = load_analysis_recipe(analysis_recipe) if analysis_recipe is not None else None
    chosen = {"split": split, "analysis_samples": analysis_samples, "bn_mode": bn_mode, "device": device, "backend": backend,
                  "hvp": hvp, "seed": seed, "dtype": dtype, "threads": threads}
    if recipe is not None:
        chosen.update({k: v for k, v in recipe.settings.items() if not given(k)})
        if recipe.rounds is not None and not given("checkpoints"):
            checkpoints = recipe.rounds
        if recipe.passes is not None and passes is None:
            passes = ",".join(recipe.passes)
    split, analysis_samples = chosen["split"], chosen["analysis_samples"]
    if analysis_samples < 0:
        raise LandscapeError(f"--analysis-samples must be >= 0 (got {analysis_samples})")
    surface_flags = {"directions": directions, "grid": grid, "span": span, "data": surface_data}
    surface_flags = {k: v for k, v in surface_flags.items() if v is not None}
    if passes is not None:
        names = [p.strip() for p in passes.split(",") if p.strip()]
        if not names:
            from landscape.analyze.catalog import load_passes

            raise LandscapeError(f"--passes {shown(passes)!r} names no pass; give a comma list of: "
                                 f"{', '.join(load_passes().names())} (or leave --passes out for the "
                                 "default)")
    elif surface_flags:
        names = ["surface"]
    else:  # a state_dict has no clients: the passes that need none
        names = ["loss", "hessian", "sharpness"] if foreign is not None else default_passes()
    values: dict[str, dict] = {name: dict(recipe.options.get(name, {})) if recipe else {} for name in names}
    if surface_flags:
        if "surface" not in values:
            raise LandscapeError("--directions, --grid, --span and --data set the surface pass; add it: --passes surface")
        values["surface"].update(surface_flags)
    for text in assignments:
        key, value = parse_assignment(text)
        pass_name, _, option = key.partition(".")
        if pass_name not in values or not option:
            raise LandscapeError(f"--set takes PASS.KEY=VALUE for a chosen pass ({', '.join(names)}); got '{key}'")
        values[pass_name][option] = value
    options = {name: pass_options(name, values[name]) for name in names}
    settings = AnalysisSettings(**chosen)
    if dry_run:
        from landscape.analyze.scheduler import format_plan, plan

        click.echo(format_plan(plan(path, checkpoints, names, options, foreign), settings))
        return
    report = run_analysis(path, rounds=checkpoints, passes=names, settings=settings, options=options, force=force,
                          progress=not quiet, foreign=foreign)
    click.echo(format_summary(report))
    for note in [] if quiet else report.notes:
        click.echo(f"note: {note}", err=True)
    for warning in report.warnings:
        click.echo(f"warning: {warning}", err=True)
    click.echo(f"{report.computed} computed, {report.skipped} already done (same settings)")


@cli.command("report")
@click.argument("runs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("-o", "--out", type=click.Path(dir_okay=False, path_type=Path), default=Path("report.html"),
              show_default=True, help="the HTML file to write")
@click.option("--title", default="landscape report", show_default=True)
@click.option("--quiet", is_flag=True, expose_value=False,
              help="accepted as on every command; report prints no progress or notes, only its result line")
@click.option("--settings", "settings", multiple=True, metavar="KEY=VALUE",
              help="read the results analysed with these settings (as landscape compare --settings) "
                   "[default: the defaults]. Repeatable")
def report_command(runs: tuple[Path, ...], out: Path, title: str, settings: tuple[str, ...]) -> None:
    """One self-contained HTML page (opens with no network) over RUNS (run directories or folders of runs):
    each run's recipe, curves, spectra, surfaces and tables of the analysis, and a comparison table."""
    from landscape.figures.report import write_report
    from landscape.figures.selection import Selection

    selection = Selection.parse(settings)
    for path in runs:
        if not path.is_dir():
            raise LandscapeError(f"{path} is not a directory (give run directories or folders of runs)")
    click.echo(f"report: {write_report(list(runs), out, title=title, selection=selection)}")


def _ensure_run(recipe: dict, path: Path, quiet: bool) -> None:
    """Train a run directory this command owns, make-like: reuse it when done, resume it when unfinished,
    retrain it when its recipe changed."""
    from landscape import lifecycle
    from landscape.train import loop

    status = lifecycle.owned_run_status(recipe, path)
    _status(f"train {path}: {status}", quiet)
    if status == "new":
        lifecycle.claim_runs_folder(path.parent)
    if status in ("new", "replace"):
        loop.start_run(recipe, path, overwrite=status == "replace", progress=not quiet)
    elif status == "resume":
        loop.resume_run(path, rounds=recipe.train.rounds, progress=not quiet, threads=recipe.train.threads)


def _figure_analysis(fig: FigureRecipe, device: str) -> tuple[Any, dict[str, Any]]:
    """A figure recipe's analysis settings and each of its passes' options, checked."""
    from landscape.analyze.catalog import pass_options
    from landscape.analyze.context import AnalysisSettings

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
    return settings, options


def _figure_plan(fig: FigureRecipe, out: Path, device: str) -> dict[str, list[tuple[int | None, Any, Path]]]:
    """Run id -> (seed, resolved training recipe, run directory) of each of its runs (``FigureRecipe.seed_runs``)."""
    from landscape import recipe as recipes

    device_key = [("train.device", device)] if device != "auto" else []
    return {run_id: [(seed, recipes.build(fig.train_recipe, fig.overrides(fig.run(run_id), seed) + device_key), path)
                     for seed, path in entries]
            for run_id, entries in fig.seed_runs(out).items()}


def _figure_training(fig: FigureRecipe, out: Path, device: str) -> dict[str, list[tuple[int | None, Any]]]:
    """Run id -> (seed, training settings) of each of its runs: what the figure's rounds are checked against
    before anything is trained."""
    return {run_id: [(seed, recipe.train) for seed, recipe, _ in entries]
            for run_id, entries in _figure_plan(fig, out, device).items()}


def _analyse_figure_runs(fig: FigureRecipe, paths: list[Path], settings: Any, options: dict[str, Any], quiet: bool) -> None:
    from landscape.analyze.scheduler import run_analysis

    for path in paths:
        for name in fig.pass_rounds:
            run_analysis(path, rounds=fig.pass_rounds[name], passes=[name], settings=settings,
                         options={name: options[name]}, progress=not quiet)


def prepare_figure_runs(recipe: FigureRecipe, out: Path, *, device: str, quiet: bool) -> dict[str, list[Path]]:
    """Train and analyse what a figure recipe (``book.FigureRecipe``) needs and is missing, make-like: its runs
    under ``out/runs`` (one per seed when it has seeds), then each pass at its rounds with the recipe's
    settings. Returns run id -> its run directories, in the recipe's order (seeds in order)."""
    settings, options = _figure_analysis(recipe, device)
    plan = _figure_plan(recipe, out, device)
    for entries in plan.values():
        for _, run_recipe, path in entries:
            _ensure_run(run_recipe, path, quiet)
    found = {run_id: [path for _, _, path in entries] for run_id, entries in plan.items()}
    _analyse_figure_runs(recipe, [path for paths in found.values() for path in paths], settings, options, quiet)
    return found


@cli.command("figures")
@click.argument("recipe_file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("-o", "--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="folder of the figure's runs (runs/<id>) and files [default: runs/figures/<name>, "
                   "runs/figures/<name>-paper at paper scale]")
@click.option("--scale", type=click.Choice(["digits", "paper"]), default=None,
              help="digits: minutes on a laptop CPU; paper: the papers' setting [default: the recipe's scale]")
@click.option("--runs", "run_paths", multiple=True, type=click.Path(path_type=Path),
              help="draw these existing runs (run directories or folders of runs) instead of the recipe's; "
                   "analyses they lack are computed. Repeatable")
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N (training and analysis)")
@click.option("--set", "assignments", multiple=True, metavar="KEY=VALUE",
              help="a training recipe key for every run (--set train.rounds=10), an analysis setting "
                   "(--set analyze.analysis_samples=500) or a pass option (--set hessian.top_k=10)")
@click.option("--seeds", default=None, metavar="S,S,...",
              help="train every run once per seed (runs/<id>-seed<s>) and draw their mean +- standard error "
                   "[default: the recipe's seeds key, else one run each]")
@click.option("--dry-run", is_flag=True, help="print what would be trained, analysed and drawn, then exit")
@click.option("--quiet", is_flag=True, help="no progress bars, progress lines or notes (errors and results stay)")
@_trust_imports_option("with --runs: import the modules their recipes name in `imports` to analyse what they lack "
                       "(their code runs)")
def figures_command(recipe_file: Path, out: Path | None, scale: str | None, run_paths: tuple[Path, ...],
                    device: str, assignments: tuple[str, ...], seeds: str | None, dry_run: bool, quiet: bool) -> None:
    """Draw a paper figure from a figure recipe (figures/*.toml): train the runs it needs and analyse them
    where that is missing (finished runs and analyses are reused; a run whose recipe changed is retrained),
    then write <file>.png and <file>.pdf (+ <file>.html, interactive 3D, for surfaces) under --out."""
    from landscape import recipe as recipes
    from landscape.analyze.catalog import load_passes
    from landscape.figures import book
    from landscape.figures.curves import load_runs

    fig = book.load_figure_recipe(recipe_file, scale)
    for text in assignments:
        if any(ord(c) < 32 or ord(c) == 127 for c in text):
            raise LandscapeError(f"--set must not hold control characters (got {text!r})")
        fig.assign(*recipes.parse_assignment(text), load_passes().names())
    if run_paths and fig.forced:
        raise LandscapeError("--set of training keys needs the recipe's runs; with --runs nothing is trained")
    if seeds is not None:
        if run_paths:
            raise LandscapeError("--seeds needs the recipe's runs; with --runs nothing is trained (runs given "
                                 "that differ only in their seed are aggregated as they are)")
        fig.set_seeds(book.parse_seeds(seeds, "--seeds"))
    out = out if out is not None else Path("runs/figures") / (fig.name + ("-paper" if fig.scale == "paper" else ""))
    settings, options = _figure_analysis(fig, device)
    passes = list(fig.pass_rounds)
    if not run_paths:  # the rounds it analyses are checkpoints its runs will have
        book.check_pass_rounds(fig, _figure_training(fig, out, device))

    if run_paths:  # the given runs, every plot over all of them
        runs = load_runs(list(run_paths))
        paths = [run.path for run in runs]
        plots = [(plot, runs) for plot in fig.plots]
        if dry_run:
            click.echo(f"figure {fig.name} over {len(runs)} given run(s): {', '.join(map(str, paths))}")
            for name in passes:
                click.echo(f"  analyze {name} at rounds {fig.pass_rounds[name]}")
            for plot in fig.plots:
                click.echo(f"  plot {plot.kind:<18} {out / plot.file}.png|pdf")
            return
        _analyse_figure_runs(fig, paths, settings, options, quiet)
    else:
        if dry_run:
            from landscape import lifecycle

            seeded = f", {len(fig.seeds)} seeds: {','.join(map(str, fig.seeds))}" if fig.seeds else ""
            click.echo(f"figure {fig.name} ({fig.scale} scale{seeded}): {fig.title}")
            for run_id, entries in _figure_plan(fig, out, device).items():
                for seed, recipe, path in entries:
                    which = run_id if seed is None else f"{run_id} seed {seed}"
                    click.echo(f"  run {which:<22} {lifecycle.owned_run_status(recipe, path):<8} {path}  "
                               f"[{recipes.run_name(recipe)}, {recipe.train.rounds} rounds]")
            for name in passes:
                click.echo(f"  analyze {name} at rounds {fig.pass_rounds[name]}")
            for plot in fig.plots:
                click.echo(f"  plot {plot.kind:<18} {out / plot.file}.png|pdf  runs {', '.join(plot.runs)}")
            return
        by_id = prepare_figure_runs(fig, out, device=device, quiet=quiet)
        paths = [path for of_id in by_id.values() for path in of_id]

    # The figure reads the results of exactly its own settings (other analyses of the runs stay on disk).
    selection = _figure_selection(fig, device)

    def draw() -> list[Path]:
        drawn = load_runs(paths, selection)  # read after the analysis above
        if run_paths:
            chosen = [(plot, drawn) for plot, _ in plots]
        else:
            loaded, rest = {}, iter(drawn)
            for run_id, of_id in by_id.items():
                loaded[run_id] = [next(rest) for _ in of_id]
            chosen = [(plot, book.figure_runs(fig, plot, loaded)) for plot in fig.plots]
        for run in drawn:
            for line in [] if quiet else run.notes():
                click.echo(f"note: {line}", err=True)
        return [path for plot, plot_runs in chosen for path in book.render(plot, plot_runs, out, fig.surface_name())]

    written = parallel.on_main(draw)  # under torchrun rank 0 draws; the others wait for it
    click.echo(f"figure {fig.name}: " + ", ".join(str(p) for p in written))


@cli.command("claims")
@click.argument("claim_files", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option("-o", "--out", type=click.Path(file_okay=False, path_type=Path), default=Path("runs/claims"),
              show_default=True, help="folder for claims.md (the verdict table) and claims.json (every number)")
@click.option("--figures-out", type=click.Path(file_okay=False, path_type=Path), default=Path("runs/figures"),
              show_default=True, help="each claim's runs live in <this>/<figure name> (where `landscape figures` "
                                      "puts them, so the two share runs)")
@click.option("--seeds", default=None, metavar="S,S,...", help="the seeds of every claim [default: each file's]")
@click.option("--scale", type=click.Choice(["digits", "paper"]), default=None,
              help="the figures' scale [default: each figure recipe's]")
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N (training and analysis)")
@click.option("--set", "assignments", multiple=True, metavar="KEY=VALUE",
              help="a training key for every run, e.g. --set dataset.name=mnist1d (give another --figures-out)")
@click.option("--dry-run", is_flag=True, help="print the claims, their comparisons and runs, then exit")
@click.option("--quiet", is_flag=True, help="no progress bars or progress lines (verdicts and errors stay)")
def claims_command(claim_files: tuple[Path, ...], out: Path, figures_out: Path, seeds: str | None, scale: str | None,
                   device: str, assignments: tuple[str, ...], dry_run: bool, quiet: bool) -> None:
    """Check published claims (claims/*.toml) on runs of several seeds: train and analyse the runs of each
    claim's figure recipe where missing (as `landscape figures` does), then test each comparison over seeds
    (one-sided paired t-test, exact sign-flip test, Holm's step over every comparison of this call) and print
    HELD / NOT HELD / INCONCLUSIVE with the numbers."""
    from landscape import recipe as recipes
    from landscape.analyze.catalog import load_passes
    from landscape.figures import book, claims
    from landscape.figures.claim_files import check_rounds
    from landscape.figures.curves import load_runs

    chosen = book.parse_seeds(seeds, "--seeds") if seeds is not None else None
    for text in assignments:
        if any(ord(c) < 32 or ord(c) == 127 for c in text):
            raise LandscapeError(f"--set must not hold control characters (got {text!r})")
    work = []
    for path in claim_files:  # every file is checked before anything is trained
        claim = claims.load_claim(path, chosen)
        fig = book.load_figure_recipe(claim.figure, scale)
        for text in assignments:
            fig.assign(*recipes.parse_assignment(text), load_passes().names())
        fig.set_seeds(list(claim.seeds))
        claims.check_run_ids(claim, [spec.id for spec in fig.runs])
        fig.runs = [spec for spec in fig.runs if spec.id in claim.run_ids()]  # only the runs it compares
        needed = set()
        for comparison in claim.comparisons:
            output = claims.analysis_output(comparison.quantity)
            if output is not None and output not in fig.pass_rounds:
                raise LandscapeError(f"{path}: {comparison.quantity} needs the {output} pass, which "
                                     f"{claim.figure.name} does not run")
            needed |= {output} - {None}
        # only the passes it reads (with the figure's options and rounds, so `landscape figures` reuses them)
        fig.pass_rounds = {name: rounds for name, rounds in fig.pass_rounds.items() if name in needed}
        fig.pass_options = {name: opts for name, opts in fig.pass_options.items() if name in needed}
        fig_out = figures_out / (fig.name + ("-paper" if fig.scale == "paper" else ""))
        trained = _figure_training(fig, fig_out, device)  # its rounds exist in the runs it will train
        book.check_pass_rounds(fig, trained)
        check_rounds(claim, trained, fig.pass_rounds)
        work.append((claim, fig, fig_out))
    if dry_run:
        for claim, fig, fig_out in work:
            click.echo(f"claim {claim.name}: {claim.text}")
            click.echo(f"  runs of {claim.figure.name} ({fig.scale} scale) in {fig_out}, seeds "
                       f"{','.join(map(str, claim.seeds))}: {', '.join(claim.run_ids())}")
            for comparison in claim.comparisons:
                click.echo(f"  test {comparison.text} over rounds {comparison.rounds}")
        return
    results = []
    for claim, fig, fig_out in work:
        _status(f"claim {claim.name}: runs of {claim.figure.name} in {fig_out}", quiet)
        by_id = prepare_figure_runs(fig, fig_out, device=device, quiet=quiet)
        selection = _figure_selection(fig, device)
        wanted = {run_id: by_id[run_id] for run_id in claim.run_ids()}
        loaded = iter(load_runs([p for paths in wanted.values() for p in paths], selection))
        runs = {run_id: [next(loaded) for _ in paths] for run_id, paths in wanted.items()}
        results.append(claims.evaluate(claim, runs))
    results = claims.decide(results)  # Holm's step over every comparison of every claim file given
    family = max((r.family for result in results for r in result.comparisons), default=0)
    click.echo(f"claims: Holm's step over the {family} tested comparison(s) of this call; a comparison is HELD "
               f"when p_Holm (of the one-sided paired t-test) and p_sign-flip (exact) are below the level")
    for result in results:
        for line in result.lines():
            click.echo(line)
    written = parallel.on_main(lambda: claims.write_results(results, out))
    click.echo("claims: " + ", ".join(f"{sum(r.verdict == v for r in results)} {v}"
                                      for v in (claims.HELD, claims.NOT_HELD, claims.INCONCLUSIVE))
               + f"; {', '.join(map(str, written))}")


def _figure_selection(fig: Any, device: str) -> Any:
    """The results a figure reads: exactly those of its own analysis settings (other analyses of its runs stay
    on disk)."""
    from landscape.analyze.results import settings_record
    from landscape.figures.selection import Selection

    settings, options = _figure_analysis(fig, device)
    return Selection(exact={name: settings_record(settings, options[name]) for name in fig.pass_rounds})


@cli.command("compare")
@click.argument("runs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("-o", "--out", type=click.Path(file_okay=False, path_type=Path), default=Path("runs/compare"),
              show_default=True, help="folder for compare.csv and the surface figures")
@click.option("--rho", type=float, default=None, help="the radius of the S_rho column [default: 0.05 when computed]")
@click.option("--quantity", type=click.Choice(["loss", "accuracy"]), default="loss", show_default=True,
              help="what the surface panels show")
@click.option("--directions", type=click.Choice(["random", "pca", "clients"]), default="random", show_default=True,
              help="which of the runs' surfaces to draw (the surface pass's directions)")
@click.option("--settings", "settings", multiple=True, metavar="KEY=VALUE",
              help="read the results analysed with these settings, e.g. --settings split=test, --settings "
                   "surface.data=client:3 --settings surface.grid=9 [default: the defaults]. Repeatable")
@click.option("--quiet", is_flag=True, help="no notes on what the runs lack (the table and its lines stay)")
def compare_command(runs: tuple[Path, ...], out: Path, rho: float | None, quantity: str, directions: str,
                    settings: tuple[str, ...], quiet: bool) -> None:
    """RUNS side by side (run directories or folders of runs): a table of test accuracy, lambda_max, trace,
    S_rho, Delta_D, Delta_FI and mean gradient cosine at each run's latest analysed round (printed and
    written to compare.csv), and the runs' loss surfaces on one colour scale (surfaces.png|pdf contours,
    surfaces-3d.png|pdf, surfaces.html). Reads files only; what a run lacks is named with its command.
    Results of one checkpoint analysed with different settings all stay on disk: --settings picks which are
    read (default: the training split, global data, default options); the lines under the table say which."""
    from landscape.figures.compare import compare, text_table
    from landscape.figures.selection import Selection

    result = compare(list(runs), out, rho=rho, quantity=quantity, directions=directions,
                     selection=Selection.parse(settings))
    click.echo(text_table(result.header, result.rows))
    for line in result.settings:
        click.echo(line)
    for line in [] if quiet else result.missing:
        click.echo(f"note: {line}", err=True)
    click.echo("wrote " + ", ".join(str(p) for p in result.written))


# The demo: the recipe of train/digits-fedavg.toml, for three algorithms, with client models kept.
_DEMO_OVERRIDES: list[tuple[str, Any]] = [
    ("dataset.name", "digits"), ("partition.name", "dirichlet-client"), ("partition.clients", 20),
    ("partition.alpha", 0.1),
    ("model.name", "cnn"), ("train.rounds", 30), ("train.participation", 0.25), ("train.local_epochs", 5),
    ("train.batch_size", 32), ("train.lr", 0.1), ("train.checkpoint_every", 10), ("train.keep_clients", True),
    ("train.device", "cpu"),
]
_DEMO_ALGORITHMS = ["fedavg", "fedsam", "fednsam"]
# one plane for the three runs (filter-normalised to their shared initial model): their surfaces compare basins
_DEMO_SURFACE = {"directions": "random", "grid": "21", "span": "-1:1", "normalization": "filter-reference",
                 "reference": "round:0"}
# pass options other than the defaults (the tests make them cheap). S_rho from one start (the SAM direction's
# ascent, still run to the tolerance): on the digits CNN the 8 starts of the default agree, at 1/8 of the cost.
_DEMO_PASS_OPTIONS: dict[str, dict] = {"sharpness": {"starts": 1}}
_DEMO_CURVE_ROUNDS = "10,20"  # checkpoints before the last (30) where the demo also computes S_rho


@cli.command("demo")
@click.option("-o", "--out", type=click.Path(file_okay=False, path_type=Path), default=Path("runs/demo"),
              show_default=True, help="folder of the demo's runs, figures and report")
@click.option("--quiet", is_flag=True, help="no progress bars or progress lines (the summary and paths stay)")
def demo_command(out: Path, quiet: bool) -> None:
    """FedAvg, FedSAM and FedNSAM on digits (Dirichlet 0.1, 20 clients), analysed (every pass and a loss
    surface), the FedSAM-vs-FedNSAM comparison figures and the HTML report. Finished steps are reused."""
    from landscape import recipe as recipes
    from landscape.analyze.catalog import default_passes, pass_options
    from landscape.analyze.context import AnalysisSettings
    from landscape.analyze.scheduler import AnalysisReport, analysis_data, format_summary, run_analysis
    from landscape.figures import curves
    from landscape.figures.compare import compare, text_table
    from landscape.figures.report import write_report

    runs = recipes.build_sweep(None, _DEMO_OVERRIDES, {"algorithm.name": _DEMO_ALGORITHMS})
    paths = [out / recipes.sweep_run_name(recipe, swept) for recipe, swept in runs]
    for (recipe, _), path in zip(runs, paths):
        _ensure_run(recipe, path, quiet)
    names = [*default_passes(), "surface"]
    options = {name: pass_options(name, _DEMO_PASS_OPTIONS.get(name, {})) for name in names}
    options["surface"] = pass_options("surface", _DEMO_SURFACE)
    settings = AnalysisSettings(device="cpu")
    rows = []
    for path in paths:
        last = run_analysis(path, passes=names, settings=settings, options=options, progress=not quiet).rows
        # S_rho at the earlier checkpoints too: the sharpness curve of the flatness-sharpness figure
        earlier = run_analysis(path, rounds=_DEMO_CURVE_ROUNDS, passes=["sharpness"], settings=settings,
                               options={"sharpness": options["sharpness"]}, progress=not quiet).rows
        rows += sorted(earlier + last, key=lambda row: row.get("round", 0))
    figures = out / "figures"

    def draw() -> tuple[Any, Path]:
        comparison = compare(paths, figures)  # the FedAvg / FedSAM / FedNSAM surfaces on one scale, the table
        curves.plot_accuracy(paths, figures / "accuracy.png")
        curves.plot_flatness_and_sharpness(paths, figures / "flatness-sharpness.png")
        curves.plot_hessian_summary(paths, figures / "hessian.png")
        curves.plot_alignment_heatmaps(paths, figures / "alignment.png")
        return comparison, write_report(paths, out / "report.html",
                                        title="landscape demo: FedAvg, FedSAM, FedNSAM on digits")

    comparison, report = parallel.on_main(draw)  # under torchrun rank 0 draws; the others wait for it
    click.echo(format_summary(AnalysisReport(rows=rows, data=analysis_data(settings))))
    click.echo("")
    click.echo(text_table(comparison.header, comparison.rows))
    for line in comparison.settings:
        click.echo(line)
    click.echo("")
    click.echo(f"runs:    {', '.join(map(str, paths))}")
    click.echo(f"figures: {figures}/ (surfaces, surfaces-3d, accuracy, flatness-sharpness, hessian, alignment .png; "
               "surfaces.html; compare.csv)")
    click.echo(f"report:  {report}")


@cli.command("list")
def list_command() -> None:
    """List everything a recipe can name (algorithms, data sets, models, partitions) and the analysis passes,
    each with its options' defaults as recipe lines (TOML: paste them into the entry's table)."""
    from landscape.analyze.catalog import load_passes
    from landscape.recipe import registries

    headers = [(f"{registry.kind}s ([{section}] name = ...):", registry) for section, registry in registries().items()]
    headers.append(("analysis passes (landscape analyze --passes NAME --set NAME.option=...):", load_passes()))
    for header, registry in headers:
        click.echo(header)
        for entry in registry.entries():
            click.echo(f"  {entry.name:<14} {entry.summary}")
            for line in _toml_lines(entry.option_defaults()):
                click.echo(" " * 17 + line)
        click.echo("")


def _toml_lines(values: dict, prefix: str = "") -> list[str]:
    """``key = value`` lines as a recipe writes them (true, "gn", [200, 200], 0.1; tables as dotted keys)."""
    from landscape.recipe import to_toml

    lines = []
    for key, value in values.items():
        if isinstance(value, dict):  # an empty one is the empty inline table
            lines += _toml_lines(value, f"{prefix}{key}.") if value else [f"{prefix}{key} = {{}}"]
            continue
        try:
            lines.append(to_toml({f"{prefix}{key}": value}).strip())
        except TypeError:  # e.g. None: TOML has no such value
            lines.append(f"# {prefix}{key}: {value!r} (no TOML form; not settable in a recipe)")
    return lines


def main() -> None:
    with parallel.session():  # under torchrun: join the ranks' process group; a plain process: nothing
        cli(prog_name="landscape")


if __name__ == "__main__":  # python -m landscape.cli
    sys.exit(main())
