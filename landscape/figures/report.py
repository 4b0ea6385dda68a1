"""One self-contained HTML report over run directories: opens with no network.

The page carries plotly.js once, inline in ``<head>``; every plot is a ``<div class="plot" id="plot-NAME"
data-name="NAME">`` followed by a plain ``Plotly.newPlot`` call on its JSON, so a browser test can wait for
``.plot .main-svg``. Nothing on the page points outside it: no ``src`` / ``href`` to another address.

Contents: a comparison table across runs (final and best test accuracy, the latest analysis values:
lambda_max, trace, S_rho, Delta_D, Delta_FI, mean gradient cosine, ...); interactive curves over rounds
(test accuracy, train loss, flatness distance); the global sharpness S_rho(x^t) and lambda_1(x^t) at the
analysed rounds; Hessian spectral densities; flatness incompatibility with its split; client x client
gradient-cosine heatmaps; loss surfaces where ``analysis/round-NNNN/surface*.npz`` exist; and per run its
recipe and a table of the analysis summaries at every analysed round. Inputs are files only, read through
``rundata.load_runs``. This module assembles the page from its parts: the tables' numbers
(``report_data``), their HTML (``report_html``), the plotly figures (``report_plotly``) and the surfaces
section (``report_surfaces``).

Runs that differ only in their recipe's seed (``landscape.figures.seeds``) are one row of the comparison
table: each cell the mean over the seeds +- its standard error, with a column n; a single-seed run's row is as
it was.
The plotly figures draw such a group as its mean with a +-SE band (``report_plotly``).

Tables and curves read one set of settings per quantity (``landscape.figures.selection``: the defaults
unless a ``Selection`` says otherwise), named on the page where they are not the ones asked for; every
computed surface is drawn, each titled with its settings.
"""

from __future__ import annotations

import html
import shlex
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from landscape.core.errors import LandscapeError
from landscape.figures.extract import choose_rho
from landscape.figures.labels import settings_lines
from landscape.figures.report_data import all_rhos
from landscape.figures.report_html import (
    CSS,
    Page,
    analysis_table,
    comparison_table,
    note,
    recipe_table,
    run_name_cell,
    slug_of,
)
from landscape.figures.report_plotly import (
    cosine_figure,
    curve_figure,
    density_figure,
    incompatibility_figure,
    sharpness_figure,
)
from landscape.figures.report_surfaces import surfaces_section
from landscape.figures.rundata import RunData, RunsLike, as_runs
from landscape.figures.seeds import groups
from landscape.figures.selection import Selection
from landscape.store.fileio import write_text

CURVE_KEYS = [("accuracy", "test_acc"), ("train_loss", "train_loss"),
              ("flatness_distance", "flatness_distance")]
CURVE_CAPTIONS = {
    "test_acc": "test accuracy on the evaluation rounds (metrics.jsonl)",
    "train_loss": "mean local training loss of the round's clients (metrics.jsonl)",
    "flatness_distance": "flatness distance Δ_D = mean_i ‖y_i − ȳ‖² (ȳ the clients' mean), logged online",
}


def _common_rho(runs: Sequence[RunData]) -> float | None:
    """The radius the tables and the sharpness plot show S_rho at (``choose_rho``); None where the runs
    share none."""
    sharp_runs = [run for run in runs if run.analysed_rounds("sharpness")]
    try:
        return choose_rho(sharp_runs, None) if sharp_runs else None
    except LandscapeError:
        return None


def _comparison_section(runs: Sequence[RunData], rho: float | None) -> list[str]:
    """The comparison table, what its values are, the settings read and the results left out."""
    seeded = any(group.n > 1 for group in groups(runs))
    body = ['<section id="comparison"><h2>Comparison across runs</h2>', comparison_table(runs, rho),
            "<p>Analysis values are each pass's latest analysed round; &plusmn; is the Monte-Carlo "
            "standard error where the pass reports one"
            + ("; in a row of n &gt; 1 seeds (runs that differ only in their seed) each cell is the mean "
               "over the seeds &plusmn; its standard error (std / &radic;n)" if seeded else "") + ".</p>"]
    outputs = [output for run in runs for output in run.chosen]
    body.append("<p>" + "<br>".join(html.escape(line) for line in settings_lines(runs, outputs)) + "</p>")
    body += [note(line) for run in runs for line in run.notes()]
    return [*body, "</section>"]


def _curves_section(runs: Sequence[RunData], page: Page) -> list[str]:
    """A plot per metrics.jsonl curve (``CURVE_KEYS``), a note for one that no run logs."""
    body = ['<section id="curves"><h2>Curves over rounds</h2>']
    for name, key in CURVE_KEYS:
        group = [run for run in runs if run.has_metric(key)]
        if group:
            body.append(page.plot(name, curve_figure(group, key), CURVE_CAPTIONS[key]))
        else:
            body.append(note(f"no run has '{key}' in metrics.jsonl"))
    return [*body, "</section>"]


def _analysis_sections(runs: Sequence[RunData], rho: float | None, page: Page) -> list[tuple[str, str, str]]:
    """(anchor, link text, HTML) of each analysis plot's section that some run has results for, in page
    order."""
    sections: list[tuple[str, str, str, tuple[str, ...], str, Callable[[], Any], str]] = [
        # (anchor, link text, heading, the passes any of which it draws, plot name, figure, caption)
        ("sharpness", "Global sharpness", "Global sharpness over rounds", ("sharpness", "hessian"),
         "global_sharpness", lambda: sharpness_figure(runs, rho),
         ("S_ρ(x^t) from the sharpness pass and λ_1(x^t) from the hessian pass, per analysed checkpoint "
          "(FedNSAM Fig. 2b)")),
        ("spectra", "Spectra", "Hessian spectra", ("hessian",), "spectral_density",
         lambda: density_figure(runs),
         "Gaussian-smoothed stochastic Lanczos quadrature density of ∇²F (log scale)"),
        ("incompatibility", "Incompatibility", "Flatness incompatibility", ("incompatibility",),
         "incompatibility", lambda: incompatibility_figure(runs), ""),
        ("alignment", "Alignment", "Gradient alignment", ("alignment",), "gradient_cosine",
         lambda: cosine_figure(runs), "C_ij = cos(∇F_i, ∇F_j) at each run's latest analysed round"),
    ]
    found = []
    for anchor, link, heading, passes, name, figure, caption in sections:
        if any(run.analysed_rounds(p) for run in runs for p in passes):
            plot = page.plot(name, figure(), caption)
            found.append((anchor, link, f'<section id="{anchor}"><h2>{heading}</h2>\n{plot}\n</section>'))
    return found


def _runs_section(runs: Sequence[RunData]) -> list[str]:
    """Per run: its name and directory, its analysis summaries at every analysed round, its recipe."""
    rhos = all_rhos(runs)
    body = ['<section id="runs"><h2>Runs</h2>']
    for run in runs:
        body.append(f'<h3 id="run-{slug_of(run.name)}">{run_name_cell(run)} '
                    f"<small>({html.escape(str(run.path))})</small></h3>")
        if run.analyses:
            body.append("<h4>Analysis summaries</h4>")
            body.append(analysis_table(run, rhos))
        else:
            body.append(note(f"no analysis yet; run `landscape analyze {shlex.quote(str(run.path))}`"))
        body.append("<h4>Recipe</h4>")
        body.append(recipe_table(run.recipe))
    return [*body, "</section>"]


def build_report(run_dirs: RunsLike, *, title: str = "landscape report",
                 selection: Selection | None = None) -> str:
    """The report's HTML text (see ``write_report``)."""
    import plotly.offline

    runs = as_runs(run_dirs, selection if selection is not None else Selection())
    page = Page()
    rho = _common_rho(runs)
    body = [f"<h1>{html.escape(title)}</h1>",
            "<p>Runs: " + ", ".join(html.escape(str(run.path)) for run in runs) + "</p>",
            *_comparison_section(runs, rho), *_curves_section(runs, page)]
    analyses = _analysis_sections(runs, rho, page)
    surfaces = surfaces_section(runs, page)
    body += [text for _, _, text in analyses] + ([surfaces] if surfaces else []) + _runs_section(runs)
    nav = ([("comparison", "Comparison"), ("curves", "Curves")]
           + [(anchor, link) for anchor, link, _ in analyses]
           + ([("surfaces", "Surfaces")] if surfaces else []) + [("runs", "Runs")])
    links = " ".join(f'<a href="#{anchor}">{text}</a>' for anchor, text in nav)
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
        f"<title>{html.escape(title)}</title>", f"<style>{CSS}</style>",
        f'<script type="text/javascript">{plotly.offline.get_plotlyjs()}</script>', "</head>", "<body>",
        f"<nav>{links}</nav>", *body, "</body>", "</html>", ""])


def write_report(run_dirs: RunsLike, out_html: str | Path, *, title: str = "landscape report",
                 selection: Selection | None = None) -> Path:
    """Write one self-contained HTML page over the runs (plotly.js inline once; no external addresses).
    ``selection``: the settings whose results the tables and curves read (default: the defaults)."""
    out = Path(out_html)
    write_text(out, build_report(run_dirs, title=title, selection=selection))
    return out
