"""The ``landscape`` command line. The only place that wires the stages together."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from landscape import __version__
from landscape.errors import LandscapeError


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
    landscape train --algorithm fedavg --rounds 30  or from flags (defaults: digits, Dirichlet 0.1)
    landscape list                                  everything that can be named in a recipe
    """


# Flags that set one recipe key each: (option name, recipe key, click type, help).
_RECIPE_FLAGS: list[tuple[str, str, Any, str]] = [
    ("--algorithm", "algorithm.name", str, "federated algorithm (see `landscape list`)"),
    ("--dataset", "dataset.name", str, "data set: digits (default, offline), synthetic, mnist, ..."),
    ("--model", "model.name", str, "model: mlp, cnn, lenet5, resnet18"),
    ("--partition", "partition.name", str, "how the training set is split: iid, dirichlet, pathological, natural"),
    ("--alpha", "partition.alpha", float, "Dirichlet concentration (smaller = more heterogeneous)"),
    ("--clients", "partition.clients", int, "number of clients N"),
    ("--participation", "train.participation", float, "fraction of clients sampled per round, in (0, 1]"),
    ("--rounds", "train.rounds", int, "communication rounds T"),
    ("--local-epochs", "train.local_epochs", int, "local epochs E per round"),
    ("--local-steps", "train.local_steps", int, "fixed local steps K per round (overrides epochs when > 0)"),
    ("--batch-size", "train.batch_size", int, "local minibatch size"),
    ("--lr", "train.lr", float, "client learning rate eta"),
    ("--seed", "seed", int, "seed of partition, initialisation, sampling and batches"),
    ("--checkpoint-every", "train.checkpoint_every", int, "checkpoint every N rounds (and always at the end)"),
    ("--eval-every", "train.eval_every", int, "evaluate on the test set every N rounds (and at the end)"),
    ("--data-root", "dataset.root", str, "folder holding torchvision-format data sets"),
    ("--device", "train.device", str, "auto, cpu, cuda or cuda:N"),
]


def _recipe_options(f):
    for flag, key, kind, help_text in reversed(_RECIPE_FLAGS):
        f = click.option(flag, type=kind, default=None, help=f"{help_text} [{key}]")(f)
    return f


@cli.command("train")
@click.argument("recipe_file", required=False, type=click.Path(dir_okay=False, path_type=Path))
@_recipe_options
@click.option("--download", is_flag=True, default=None, help="download torchvision data sets where a network exists")
@click.option("--keep-clients", is_flag=True, default=None, help="also save the clients' final models at checkpoints")
@click.option("--set", "assignments", multiple=True, metavar="KEY=VALUE",
              help="set any recipe key, e.g. --set train.weight_decay=1e-3 (repeatable)")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="run directory [default: runs/<generated name>]")
@click.option("--dry-run", is_flag=True, help="print the resolved recipe and the client x class table, then exit")
@click.option("--overwrite", is_flag=True, help="replace an existing run directory")
@click.option("--resume", "resume_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="continue the run in this directory from its last checkpoint (with --rounds to extend it)")
@click.option("--quiet", is_flag=True, help="no progress bar")
def train_command(recipe_file: Path | None, download: bool | None, keep_clients: bool | None,
                  assignments: tuple[str, ...], out: Path | None, dry_run: bool, overwrite: bool,
                  resume_dir: Path | None, quiet: bool, **flags: Any) -> None:
    """Train one federated run from a RECIPE_FILE (TOML) and/or flags.

    Flags override the recipe, and --set overrides both. The run directory gets the fully resolved recipe,
    partition.json, metrics.jsonl (one line per round) and checkpoints/round-XXXX.pt.
    """
    from landscape import recipe as recipes
    from landscape.train import loop

    overrides: list[tuple[str, Any]] = []
    for flag, key, _, _ in _RECIPE_FLAGS:
        value = flags[flag.lstrip("-").replace("-", "_")]
        if value is not None:
            overrides.append((key, value))
    if download:
        overrides.append(("dataset.download", True))
    if keep_clients:
        overrides.append(("train.keep_clients", True))
    overrides += [recipes.parse_assignment(a) for a in assignments]

    if resume_dir is not None:
        extra = [k for k, _ in overrides if k != "train.rounds"]
        if recipe_file is not None or extra or out is not None or overwrite or dry_run:
            raise LandscapeError("--resume continues a run as recorded; only --rounds may be given with it")
        rounds = dict(overrides).get("train.rounds")
        state = loop.resume_run(resume_dir, rounds=rounds, progress=not quiet)
        _report(resume_dir, state.round)
        return

    recipe = recipes.build(recipe_file, overrides)
    out = out if out is not None else Path("runs") / (recipe["name"] or recipes.run_name(recipe))
    if dry_run:
        from landscape.data.partitions import format_partition_table

        setup = loop.prepare_data(recipe)
        loop.check_local_work(recipe["train"])
        click.echo(recipes.to_toml(recipe))
        click.echo(f"# run directory: {out}")
        click.echo(format_partition_table(setup.histogram))
        return
    state = loop.start_run(recipe, out, overwrite=overwrite, progress=not quiet)
    _report(out, state.round)


def _report(out: Path, rounds: int) -> None:
    from landscape.runs import RunDir

    rows = [r for r in RunDir(out).read_metrics() if "test_acc" in r]
    tail = f"; test accuracy {rows[-1]['test_acc']:.4f} (round {rows[-1]['round']})" if rows else ""
    click.echo(f"run {out}: {rounds} rounds{tail}")


@cli.command("list")
def list_command() -> None:
    """List everything a recipe can name: algorithms, data sets, models, partitions, with their options."""
    from landscape.recipe import registries

    for section, registry in registries().items():
        click.echo(f"{registry.kind}s ([{section}] name = ...):")
        for entry in registry.entries():
            click.echo(f"  {entry.name:<14} {entry.summary}")
            options = entry.option_defaults()
            if options:
                click.echo("  " + " " * 15 + "options: " + ", ".join(f"{k}={v!r}" for k, v in options.items()))
        click.echo("")


def main() -> None:
    cli(prog_name="landscape")


if __name__ == "__main__":  # python -m landscape.cli
    sys.exit(main())
