"""``landscape train``: one run, a sweep of runs, or the resumption of one, from a recipe file and flags."""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

import click

from landscape.cli.common import check_printable, progress_lines, set_option, trust_imports_option
from landscape.core.errors import LandscapeError

# Flags that set one recipe key each: (option name, recipe key, help). Comma lists (--alpha 0.6,0.1) sweep.
# The help shows each key's value in the default recipe; the flags themselves default to None (not given), so
# a recipe file's values stand.
_RECIPE_FLAGS: list[tuple[str, str, str]] = [
    ("--algorithm", "algorithm.name", "federated algorithm (see `landscape list`)"),
    ("--dataset", "dataset.name", "data set: digits (offline), mnist1d (generated), synthetic, mnist, ..."),
    ("--model", "model.name", "model: mlp, cnn, lenet5, resnet18, stacked-lstm"),
    ("--partition", "partition.name",
     "how the training set is split: dirichlet-client-reuse (as the papers' reference codes draw), "
     "dirichlet-client (no reuse), dirichlet, iid, pathological, natural"),
    ("--alpha", "partition.alpha", "Dirichlet concentration (smaller = more heterogeneous)"),
    ("--clients", "partition.clients", "number of clients N"),
    ("--participation", "train.participation", "fraction of clients sampled per round, in (0, 1]"),
    ("--rounds", "train.rounds", "communication rounds T"),
    ("--local-epochs", "train.local_epochs", "local epochs E per round"),
    ("--local-steps", "train.local_steps", "fixed local steps K per round (overrides epochs when > 0)"),
    ("--batch-size", "train.batch_size", "local minibatch size"),
    ("--lr", "train.lr", "client learning rate eta"),
    ("--rho", "algorithm.rho", "SAM radius rho of an algorithm that has one (see `landscape list`)"),
    ("--seed", "seed", "seed of partition, initialisation, sampling and batches"),
    ("--checkpoint-every", "train.checkpoint_every", "checkpoint every N rounds (and always at the end)"),
    ("--eval-every", "train.eval_every", "evaluate on the test set every N rounds (and at the end)"),
    ("--data-root", "dataset.root", "folder holding the data sets read from files (torchvision's layout, LEAF's)"),
    ("--device", "train.device", "auto, cpu, cuda or cuda:N"),
    ("--threads", "train.threads", "CPU threads (0: every core); the last bits depend on it"),
]
_NO_SWEEP = {"dataset.root", "train.device"}  # values that may hold commas themselves


@functools.lru_cache(maxsize=1)
def _default_recipe() -> Any:
    from landscape.config import recipe as recipes

    return recipes.resolve({})


class _RecipeOption(click.Option):
    """A flag setting one recipe key: None unless given, its help showing the key's default-recipe value."""

    def __init__(self, *args: Any, recipe_key: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.recipe_key = recipe_key

    def get_help_extra(self, ctx: click.Context) -> Any:
        extra = super().get_help_extra(ctx)
        try:
            extra["default"] = str(_default_recipe().get(self.recipe_key))
        except KeyError:  # an option of some algorithms (rho): the algorithm's own default
            extra["default"] = "the algorithm's"
        return extra


def _recipe_options(f):
    for flag, key, help_text in reversed(_RECIPE_FLAGS):
        sweep = "" if key in _NO_SWEEP else "; a,b,c sweeps"
        f = click.option(flag, cls=_RecipeOption, recipe_key=key, type=str, default=None,
                         help=f"{help_text} [{key}{sweep}]")(f)
    return f


@click.command("train")
@click.argument("recipe_file", required=False, type=click.Path(dir_okay=False, path_type=Path))
@_recipe_options
@click.option("--download", is_flag=True, default=None,
              help="download torchvision data sets where a network exists")
@click.option("--keep-clients", is_flag=True, default=None,
              help="also save the clients' final models at checkpoints")
@click.option("--swa", is_flag=True, default=None,
              help="server SWA (Caldarola et al. 2022) on top of the algorithm")
@click.option("--log", default=None, metavar="TRACKERS",
              help="also log the metrics and analysis results to tensorboard, wandb (offline) or both, e.g. "
                   "--log tensorboard,wandb [train.log; docs/tracking.md]")
@set_option("set any recipe key, e.g. --set train.weight_decay=1e-3 or --set algorithm.fedsam.rho=0.05",
            "train takes the first")
@click.option("-o", "--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="the folder the runs go into, one run or a sweep alike: each run's directory is <out>/<its "
                   "name> [default: runs]")
@click.option("--name", "name", default=None, metavar="NAME",
              help="the directory name of a single run (<out>/NAME) [default: the generated name, as a sweep "
                   "names its runs: <dataset>-<algorithm>-<partition>-<model>-c<clients>-s<seed>]")
@click.option("--dry-run", is_flag=True,
              help="print the resolved recipe and the client x class table (or the sweep's runs), then exit")
@click.option("--overwrite", is_flag=True,
              help="train anew where a run directory exists, replacing it (the line says which)")
@click.option("--resume", "resume_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="continue the run in this directory from its last checkpoint (with --rounds to extend it)")
@click.option("--quiet", is_flag=True,
              help="no progress bar or progress lines (errors, warnings and results stay)")
@trust_imports_option("with --resume: import the modules the run's recipe names in `imports` (their code "
                      "runs; a recipe file you name is always imported)")
def train_command(recipe_file: Path | None, download: bool | None, keep_clients: bool | None,
                  swa: bool | None, assignments: tuple[str, ...], out: Path | None, name: str | None,
                  dry_run: bool, overwrite: bool, resume_dir: Path | None, quiet: bool, **flags: Any) -> None:
    """Train federated runs from a RECIPE_FILE (TOML) and/or flags.

    Flags override the recipe, and --set overrides both. A comma list in a flag (--algorithm fedsam,fednsam
    --alpha 0.6,0.1 --seed 0,1) or a [sweep] table in the recipe makes one run per combination. Every run,
    one or many, goes into --out (default runs/) as <out>/<its generated name>, or <out>/NAME for a single run
    given --name. The same command run again skips finished runs and continues unfinished ones, a single
    run's as a sweep's (another recipe's run in the way: refused unless --overwrite). Each run directory gets
    the fully resolved recipe, partition.json, metrics.jsonl (one line per round) and checkpoints/round-NNNN.pt.
    """
    from landscape.config import overrides as recipe_overrides
    from landscape.workflows import sweep

    switches = {"dataset.download": download, "train.keep_clients": keep_clients, "train.swa": swa}
    log = flags.pop("log")
    overrides, axes = _overrides(flags, switches, assignments)
    if log is not None:  # --log tensorboard,wandb: one list, never a sweep ('' logs to none)
        check_printable("--log", log)
        overrides.insert(0, ("train.log", [name.strip() for name in log.split(",") if name.strip()]))
    if flags.get("rho") is not None and resume_dir is None:
        _check_rho(recipe_file, overrides, axes)
    if resume_dir is not None:
        others = (recipe_file is not None or bool(axes) or out is not None or name is not None or overwrite
                  or dry_run)
        _resume(resume_dir, overrides, others, quiet)
        return
    check_printable("--name", name)
    runs = recipe_overrides.build_sweep(recipe_file, overrides, axes)
    # Every run under --out, one or many, checked before any of them starts.
    plan = sweep.plan_sweep(runs, out if out is not None else Path("runs"), overwrite, name=name)
    if not any(swept for _, swept in runs):
        _one_run(plan[0], dry_run, quiet)
        return
    if dry_run:
        from landscape.config.setup import resolve_device

        for device in dict.fromkeys(run.recipe.train.device for run in plan):
            resolve_device(device)
        for run in plan:
            click.echo(f"{run.status:<8} {run.path}")
        return
    trained = sweep.run_sweep(plan, overwrite=overwrite, progress=not quiet, notify=progress_lines(quiet),
                              replacing=_say_replacing)
    for path, rounds in trained:
        _report(path, rounds)


def _say_replacing(run: Any) -> None:
    """The line before --overwrite replaces a run directory: which one, and what it held (on stderr, also with
    --quiet: nothing is replaced without saying so)."""
    from landscape.core import parallel

    if parallel.is_main():
        click.echo(f"replacing {run.path} (--overwrite): it holds {run.held}", err=True)


def _overrides(flags: dict[str, Any], switches: dict[str, bool | None],
               assignments: tuple[str, ...]) -> tuple[list[tuple[str, Any]], dict[str, list]]:
    """The recipe keys the flags set, in order (recipe flags, switches, then --set), and the swept ones (comma
    lists): every value checked for control characters first."""
    from landscape.config import overrides as recipe_overrides

    given = [(flag, key, flags[flag.lstrip("-").replace("-", "_")]) for flag, key, _ in _RECIPE_FLAGS]
    for flag, text in [(flag, text) for flag, _, text in given] + [("--set", a) for a in assignments]:
        check_printable(flag, text)
    overrides: list[tuple[str, Any]] = []
    axes: dict[str, list] = {}
    for flag, key, text in given:
        if text is None:
            continue
        _refuse_decimal_comma(flag, key, text)
        if "," in text and key not in _NO_SWEEP:
            axes[key] = [recipe_overrides.parse_value(item.strip()) for item in text.split(",")]
        else:
            overrides.append((key, text if key in _NO_SWEEP else recipe_overrides.parse_value(text)))
    overrides += [(key, True) for key, enabled in switches.items() if enabled]
    for key, value in map(recipe_overrides.parse_assignment, assignments):
        recipe_overrides.classify_assignment(key, _pass_names, "train")  # refuses a pass option, an analysis setting
        overrides.append((key, value))
    return overrides, axes


def _refuse_decimal_comma(flag: str, key: str, text: str) -> None:
    """A number flag's value that reads as a decimal comma is refused with a hint: two parts of digits where
    the first is 0 or the second starts with 0 (``--lr 0,05``, ``--alpha 0,1``: a sweep of 0 and 05 was never
    meant); other comma lists sweep (``--lr 0.01,0.05``, ``--lr 1,5``)."""
    match = re.fullmatch(r"\s*(\d+),(\d+)\s*", text)
    if match is None or not (match[1] == "0" or match[2].startswith("0")):
        return
    try:
        number = isinstance(_default_recipe().get(key), float)
    except KeyError:  # an option of some algorithms (rho)
        number = True
    if number:
        raise LandscapeError(f"{flag} {text.strip()} looks like a decimal comma: use a decimal point "
                             f"({match[1]}.{match[2]}); a sweep is a comma list of values, e.g. {flag} 0.01,0.05")


def _check_rho(recipe_file: Path | None, overrides: list[tuple[str, Any]], axes: dict[str, list]) -> None:
    """--rho sets the algorithm's option rho (``algorithm.rho``): refused in one line when an algorithm of the
    run (or of the sweep) has none, naming those that have it."""
    from landscape.config import overrides as recipe_overrides
    from landscape.config.algorithms import ALGORITHMS

    others = [(k, v) for k, v in overrides if k != "algorithm.rho"]
    runs = recipe_overrides.build_sweep(recipe_file, others, {k: v for k, v in axes.items() if k != "algorithm.rho"})
    with_rho = [name for name in ALGORITHMS.names() if "rho" in ALGORITHMS.get(name).option_defaults()]
    lacking = sorted({recipe.algorithm.name for recipe, _ in runs} - set(with_rho))
    if lacking:
        raise LandscapeError(f"--rho sets the algorithm's rho (algorithm.<name>.rho), and {', '.join(lacking)} "
                             f"{'has' if len(lacking) == 1 else 'have'} none; the algorithms with one: "
                             f"{', '.join(with_rho)}")


def _pass_names() -> list[str]:
    """The declared analysis passes (their specs only: no pass module is loaded)."""
    from landscape.analyze.passes import PASSES

    return PASSES.names()


def _resume(resume_dir: Path, overrides: list[tuple[str, Any]], others: bool, quiet: bool) -> None:
    """--resume: the run continued as recorded, to --rounds (and on --threads) when given; refused with any
    other recipe key or flag (``others``)."""
    from landscape.train import loop

    if others or any(k not in ("train.rounds", "train.threads") for k, _ in overrides):
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


def _one_run(run: Any, dry_run: bool, quiet: bool) -> None:
    """One run (a ``sweep.SweepRun``: <out>/<its name>), or with --dry-run its recipe and client x class table. As
    a sweep's run: a directory holding this recipe's run is continued where it stopped (or left as it is when it
    is finished), one of another recipe is refused unless --overwrite replaces it."""
    from landscape.config import recipe as recipes
    from landscape.store.directory import RunDir
    from landscape.workflows import sweep

    recipe, out, status = run.recipe, run.path, run.status
    if dry_run:
        from landscape.config.setup import check_module, prepare_data, resolve_device
        from landscape.data.partitions import format_partition_table, heterogeneity
        from landscape.train.trainer import check_local_work

        resolve_device(recipe.train.device)  # unknown or not here: refused now, as the run would be
        setup = prepare_data(recipe)
        check_module(recipe, setup.bundle)  # a model too big for this machine: refused as the run would be
        check_local_work(recipe.train)
        click.echo(recipes.to_toml(recipe))
        click.echo(f"# run directory: {out} ({status})")
        click.echo(format_partition_table(setup.histogram))
        click.echo(heterogeneity(setup.histogram, setup.client_indices, len(setup.bundle.train)).text())
        return
    if status == "done":
        progress_lines(quiet)(f"{out} holds this recipe's run, finished: nothing to train (--overwrite trains "
                              "it anew)")
        _report(out, RunDir(out).rounds()[-1])
        return
    if status == "resume":
        saved = RunDir(out).rounds()  # none: killed before its first checkpoint
        progress_lines(quiet)(f"{out} holds this recipe's run, unfinished: continued from its last checkpoint "
                              f"(round {saved[-1]})" if saved else
                              f"{out} holds this recipe's run, unfinished: started again from round 0 (it has "
                              "no checkpoint)")
    ((path, rounds),) = sweep.run_sweep([run], overwrite=status == "replace", progress=not quiet,
                                        replacing=_say_replacing)
    _report(path, rounds)


def _report(out: Path, rounds: int) -> None:
    """The result line of a trained run: its rounds and its last test accuracy."""
    from landscape.store.directory import RunDir

    rows = [r for r in RunDir(out).read_metrics() if "test_acc" in r]
    tail = f"; test accuracy {rows[-1]['test_acc']:.4f} (round {rows[-1]['round']})" if rows else ""
    click.echo(f"run {out}: {rounds} rounds{tail}")
