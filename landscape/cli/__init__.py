"""The ``landscape`` command line: the click group and its commands, one module each (parse the flags, call
a workflow of ``landscape.workflows`` or one stage, print)."""

from __future__ import annotations

import warnings
from typing import Any

import click

from landscape import __version__
from landscape.cli.analyze import analyze_command
from landscape.cli.claims import claims_command
from landscape.cli.compare import compare_command
from landscape.cli.demo import demo_command
from landscape.cli.figures import figures_command
from landscape.cli.importing import import_command
from landscape.cli.listing import list_command
from landscape.cli.report import report_command
from landscape.cli.train import train_command
from landscape.core import parallel
from landscape.core.errors import LandscapeError, LandscapeNote


class _Group(click.Group):
    """Turns a LandscapeError into one line on stderr and exit status 1, never a traceback; a ``LandscapeNote``
    (a run's results left out as not current, its recipe.toml edited after training) into one ``note:`` line."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            with warnings.catch_warnings():
                _notes_of_warnings()
                return super().invoke(ctx)
        except LandscapeError as e:
            click.echo(f"error: {e}", err=True)
            ctx.exit(1)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            ctx.exit(130)


def _notes_of_warnings() -> None:
    """Inside ``warnings.catch_warnings()``: each ``LandscapeNote`` (results left out as not current, a run's
    recipe.toml edited after training) printed once as ``note: ...`` on stderr (on rank 0 under torchrun), every
    other warning as before."""
    original, printed = warnings.showwarning, set()

    def show(message: Any, category: type, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
        if not issubclass(category, LandscapeNote):
            original(message, category, filename, lineno, file, line)
        elif str(message) not in printed and parallel.is_main():
            printed.add(str(message))
            click.echo(f"note: {message}", err=True)

    warnings.simplefilter("always", LandscapeNote)
    warnings.showwarning = show


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
    landscape report runs/demo/runs -o report.html  one HTML page over runs: tables, curves, surfaces
    landscape import -o RUN --global ... --clients ...  a run from your own checkpoint files
    landscape claims claims/*.toml                  check published claims over seeds: HELD / NOT HELD
    landscape demo                                  all of it on digits, in minutes
    landscape list                                  everything that can be named in a recipe
    """


for _command in (train_command, analyze_command, report_command, figures_command, claims_command,
                 compare_command, import_command, demo_command, list_command):
    cli.add_command(_command)


def main() -> None:
    """The console script ``landscape``."""
    with parallel.session():  # under torchrun: join the ranks' process group; a plain process: nothing
        cli(prog_name="landscape")
