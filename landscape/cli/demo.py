"""``landscape demo``: the demo workflow (the figure recipe figures/demo.toml: FedAvg, FedSAM and FedNSAM on
digits, analysed and drawn; then the comparison table and the report), its summary printed."""

from __future__ import annotations

from pathlib import Path

import click

from landscape.cli.common import check_printable, progress_lines, set_option


@click.command("demo")
@click.option("-o", "--out", type=click.Path(file_okay=False, path_type=Path), default=Path("runs/demo"),
              show_default=True, help="folder of the demo's runs (runs/<id>), figures and report")
@set_option("a training recipe key for every run (--set train.rounds=10), an analysis setting (--set "
            "analyze.analysis_samples=500) or a pass option (--set surface.grid=11; sharpness.rounds=5,10 too), "
            "over figures/demo.toml's", "demo takes all three, as figures does")
@click.option("--quiet", is_flag=True, help="no progress bars or progress lines (the summary and paths stay)")
def demo_command(out: Path, assignments: tuple[str, ...], quiet: bool) -> None:
    """FedAvg, FedSAM and FedNSAM on digits (Dirichlet 0.1, 20 clients), analysed (every pass and a loss
    surface) and drawn by the figure recipe figures/demo.toml, then the comparison table (compare.csv) and the
    HTML report. Finished steps are reused."""
    from landscape.analyze.summary import format_summary
    from landscape.figures.compare import text_table
    from landscape.workflows.demo import run_demo

    for text in assignments:
        check_printable("--set", text)
    demo = run_demo(out, assignments=assignments, progress=not quiet, notify=progress_lines(quiet))
    click.echo(format_summary(demo.analysis))
    click.echo("")
    click.echo(text_table(demo.comparison.header, demo.comparison.rows))
    for line in demo.comparison.settings:
        click.echo(line)
    click.echo("")
    click.echo(f"runs:    {', '.join(map(str, demo.paths))}")
    stems = list(dict.fromkeys(path.stem for path in demo.written if path.suffix == ".png"))
    pages = [path.name for path in demo.written if path.suffix == ".html"]
    click.echo(f"figures: {demo.figures}/ ({', '.join(stems)} .png|pdf|caption.txt; {', '.join(pages)}; compare.csv)")
    click.echo(f"report:  {demo.report}")
