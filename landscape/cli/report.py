"""``landscape report``: one self-contained HTML page over runs."""

from __future__ import annotations

from pathlib import Path

import click

from landscape.core.errors import LandscapeError


@click.command("report")
@click.argument("runs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("-o", "--out", type=click.Path(dir_okay=False, path_type=Path), default=Path("report.html"),
              show_default=True, help="the HTML file to write")
@click.option("--title", default="landscape report", show_default=True)
@click.option("--quiet", is_flag=True, expose_value=False,
              help="accepted as on every command; report prints no progress, only its result line (and a note "
                   "per run whose results it leaves out as not current, or whose recipe.toml was edited after "
                   "training)")
@click.option("--settings", "settings", multiple=True, metavar="KEY=VALUE",
              help="read the results analysed with these settings (as landscape compare --settings) "
                   "[default: the defaults]. Repeatable")
def report_command(runs: tuple[Path, ...], out: Path, title: str, settings: tuple[str, ...]) -> None:
    """One self-contained HTML page (opens with no network) over RUNS (run directories or folders of runs):
    each run's recipe, curves, spectra, surfaces and tables of the analysis, and a comparison table."""
    from landscape.cli.common import results_selection
    from landscape.figures.report.build import write_report

    selection = results_selection(settings)
    for path in runs:
        if not path.is_dir():
            raise LandscapeError(f"{path} is not a directory (give run directories or folders of runs)")
    click.echo(f"report: {write_report(list(runs), out, title=title, selection=selection)}")
