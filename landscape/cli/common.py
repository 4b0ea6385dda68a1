"""What the commands share: progress lines on stderr, the --trust-imports flag, the check of flag values."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from landscape.core import parallel
from landscape.core.errors import LandscapeError

if TYPE_CHECKING:
    from landscape.workflows.ensure import Notify


def progress_lines(quiet: bool) -> Notify:
    """A workflow's ``notify``: each line once on stderr (rank 0 under torchrun); none with --quiet."""
    def echo(line: str) -> None:
        if not quiet and parallel.is_main():
            click.echo(line, err=True)

    return echo


def check_printable(flag: str, text: str | None) -> None:
    """A flag's value holds no control characters (e.g. a newline pasted in)."""
    if text is not None and any(ord(c) < 32 or ord(c) == 127 for c in text):
        raise LandscapeError(f"{flag} must not hold control characters (got {text!r})")


def _trusting(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    """--trust-imports: the recorded recipes read by this command have their imports imported (for the
    command's duration: ``landscape.core.imports.trusted_imports``)."""
    if value:
        from landscape.core.imports import trusted_imports

        ctx.with_resource(trusted_imports(True))


def trust_imports_option(help_text: str):
    """The --trust-imports flag of a command that reads recorded recipes, with that command's help."""
    return click.option("--trust-imports", is_flag=True, expose_value=False, callback=_trusting,
                        help=help_text)


# The one grammar of --set, said once (landscape.config.overrides.classify_assignment decides it).
SET_GRAMMAR = ("Every command reads --set KEY by its first part: a recipe table or key (dataset, partition, model, "
               "algorithm, train, name, seed) a training recipe key, analyze an analysis setting, a pass name a "
               "pass option")


def set_option(examples: str, takes: str):
    """The --set option of a command: its examples, the shared grammar, and which kinds the command takes."""
    return click.option("--set", "assignments", multiple=True, metavar="KEY=VALUE",
                        help=f"{examples}. {SET_GRAMMAR}; {takes}")
