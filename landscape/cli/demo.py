"""``landscape demo``: the demo workflow (FedAvg, FedSAM and FedNSAM on digits, analysed and drawn), its
summary printed."""

from __future__ import annotations

from pathlib import Path

import click

from landscape.cli.common import progress_lines


@click.command("demo")
@click.option("-o", "--out", type=click.Path(file_okay=False, path_type=Path), default=Path("runs/demo"),
              show_default=True, help="folder of the demo's runs, figures and report")
@click.option("--quiet", is_flag=True, help="no progress bars or progress lines (the summary and paths stay)")
def demo_command(out: Path, quiet: bool) -> None:
    """FedAvg, FedSAM and FedNSAM on digits (Dirichlet 0.1, 20 clients), analysed (every pass and a loss
    surface), the FedSAM-vs-FedNSAM comparison figures and the HTML report. Finished steps are reused."""
    from landscape.analyze.summary import format_summary
    from landscape.figures.compare import text_table
    from landscape.workflows.demo import run_demo

    demo = run_demo(out, progress=not quiet, notify=progress_lines(quiet))
    click.echo(format_summary(demo.analysis))
    click.echo("")
    click.echo(text_table(demo.comparison.header, demo.comparison.rows))
    for line in demo.comparison.settings:
        click.echo(line)
    click.echo("")
    click.echo(f"runs:    {', '.join(map(str, demo.paths))}")
    click.echo(f"figures: {demo.figures}/ (surfaces, surfaces-3d, accuracy, flatness-sharpness, hessian, "
               "alignment .png; surfaces.html; compare.csv)")
    click.echo(f"report:  {demo.report}")
