"""``landscape compare``: runs side by side, a table and their loss surfaces on one colour scale."""

from __future__ import annotations

from pathlib import Path

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
    from landscape.cli.common import results_selection
    from landscape.figures.compare import compare, text_table

    selection = results_selection(settings)
    result = compare(list(runs), out, rho=rho, quantity=quantity, directions=directions, selection=selection)
    click.echo(text_table(result.header, result.rows))
    for line in result.settings:
        click.echo(line)
    for line in [] if quiet else result.missing:
        click.echo(f"note: {line}", err=True)
    click.echo("wrote " + ", ".join(str(p) for p in result.written))
