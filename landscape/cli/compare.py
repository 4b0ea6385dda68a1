"""``landscape compare``: runs side by side, a table and their loss surfaces on one colour scale."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click


@click.command("compare")
@click.argument("runs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("-o", "--out", type=click.Path(file_okay=False, path_type=Path), default=Path("runs/compare"),
              show_default=True, help="folder for compare.csv and the surface figures")
@click.option("--rho", type=float, default=None,
              help="the radius of the S_rho column [default: 0.05 when computed]")
@click.option("--quantity", type=click.Choice(["loss", "accuracy"]), default="loss", show_default=True,
              help="what the surface panels show")
@click.option("--directions", type=click.Choice(["random", "pca", "clients"]), default="random",
              show_default=True,
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
    from landscape.analyze.passes import RESULT_NAMES
    from landscape.figures.compare import compare, text_table
    from landscape.store.results.selection import Selection

    selection = Selection.parse(RESULT_NAMES, settings)
    _check_filter_values(selection.filters)  # split=nan: refused naming the values allowed
    result = compare(list(runs), out, rho=rho, quantity=quantity, directions=directions, selection=selection)
    click.echo(text_table(result.header, result.rows))
    for line in result.settings:
        click.echo(line)
    for line in [] if quiet else result.missing:
        click.echo(f"note: {line}", err=True)
    click.echo("wrote " + ", ".join(str(p) for p in result.written))


def _check_filter_values(filters: Any, flag: str = "--settings") -> None:
    """Each ``(key, value)`` of a results filter (``compare --settings split=test``) a value its setting could
    hold: an analysis setting as ``AnalysisSettings`` takes it, ``PASS.OPTION`` as the pass's options do, a bare
    option name as at least one pass that has it; else one line naming the allowed values (``--settings
    split=nan: settings.split must be one of train, test (got nan)``), so that no filter matches nothing and
    no hint names an ``analyze`` command that is refused."""
    from landscape.analyze.passes import PASSES as registry
    from landscape.analyze.settings import AnalysisSettings
    from landscape.core.errors import LandscapeError

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
