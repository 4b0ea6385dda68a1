"""What the commands share: progress lines on stderr, the --trust-imports flag, the check of flag values, the
results ``--settings`` picks."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from landscape.core import parallel
from landscape.core.errors import LandscapeError

if TYPE_CHECKING:
    from landscape.store.results.selection import Selection
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


def results_selection(settings: tuple[str, ...]) -> Selection:
    """The results ``--settings KEY=VALUE`` (compare, report) picks: parsed, each value checked
    (``_check_filter_values``)."""
    from landscape.analyze.passes import RESULT_NAMES
    from landscape.store.results.selection import Selection

    selection = Selection.parse(RESULT_NAMES, settings)
    _check_filter_values(selection.filters)  # split=nan: refused naming the values allowed
    return selection


def _check_filter_values(filters: Any, flag: str = "--settings") -> None:
    """Each ``(key, value)`` of a results filter (``compare --settings split=test``) a value its setting could
    hold: an analysis setting as ``AnalysisSettings`` takes it, ``PASS.OPTION`` as the pass's options do, a bare
    option name as at least one pass that has it; else one line naming the allowed values (``--settings
    split=nan: settings.split must be one of train, test (got nan)``), so that no filter matches nothing and
    no hint names an ``analyze`` command that is refused."""
    from landscape.analyze.passes import PASSES as registry
    from landscape.analyze.settings import AnalysisSettings
    for key, value in filters:
        if "." in key:
            pass_name, _, option = key.partition(".")
            tries = [lambda p=pass_name, o=option: registry.get(p).make_options({o: value})]
        elif key in AnalysisSettings().record():
            tries = [lambda: AnalysisSettings(**{key: value})]
        else:
            tries = [lambda p=name: registry.get(p).make_options({key: value}) for name in registry.names()
                     if key in registry.get(name).option_defaults()]
        errors = []
        for attempt in tries:
            try:
                attempt()
                break
            except LandscapeError as error:
                errors.append(str(error))
        else:
            if errors:
                raise LandscapeError(f"{flag} {key}={value!r}: {errors[0]}")
