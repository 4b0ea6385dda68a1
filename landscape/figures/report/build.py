"""One self-contained HTML report over run directories: opens with no network.

The page carries plotly.js once, inline in ``<head>``; every plot is a ``<div class="plot" id="plot-NAME"
data-name="NAME">`` followed by a plain ``Plotly.newPlot`` call on its JSON, so a browser test can wait for
``.plot .main-svg``. Nothing on the page points outside it: no ``src`` / ``href`` to another address.

Contents: a comparison table across runs (final and best test accuracy, the latest analysis values:
lambda_max, trace, S_rho, Delta_D, Delta_FI, mean gradient cosine, ...); interactive curves over rounds
(test accuracy, train loss, flatness distance); the global sharpness S_rho(x^t) and lambda_1(x^t) at the
analysed rounds; Hessian spectral densities; flatness incompatibility with its split; client x client
gradient-cosine heatmaps; loss surfaces where ``analysis/round-NNNN/surface*.npz`` exist; and per run its
recipe (the keys every run's recipe shares once, and per run only its own values) and a table of the
analysis summaries at every analysed round. Inputs are files only, read through
``rundata.load_runs``. This module gathers what the page shows and fills in its jinja2 template
(``templates/page.html``, autoescaped): the tables' numbers (``data``), the tables, plots and notes
rendered by ``parts`` from ``templates/parts.html``, the plotly figures (``plots``) and the
surfaces section (``surfaces``).

Runs that differ only in their recipe's seed (``landscape.figures.seeds``) are one row of the comparison
table: each cell the mean over the seeds +- its standard error, with a column n; a single-seed run's row is as
it was.
The plotly figures draw such a group as its mean with a +-SE band (``plots``).

Tables and curves read one set of settings per quantity (``landscape.store.results.selection``: the defaults
unless a ``Selection`` says otherwise), named on the page where they are not the ones asked for: under the
comparison table, and in the settings line below each figure (``settings_line``), never in a title; every
computed surface is drawn, its settings in the line below it. A figure's caption says what it shows, never a
file name. Results that are not current (``landscape.store.results.validity``: their checkpoint changed or is gone
since they were analysed) are not shown; a note under the comparison table says which.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from markupsafe import Markup
from matplotlib.colors import to_hex

from landscape.analyze.passes import RESULT_NAMES
from landscape.core.errors import LandscapeError
from landscape.figures.extract import choose_rho
from landscape.figures.labels import settings_caption, settings_lines
from landscape.figures.report.data import all_rhos
from landscape.figures.report.parts import (
    Page,
    analysis_table,
    comparison_table,
    note,
    recipe_tables,
    render_page,
    slug_of,
)
from landscape.figures.report.plots import (
    cosine_figure,
    curve_figure,
    density_figure,
    incompatibility_figure,
    sharpness_figure,
)
from landscape.figures.report.surfaces import surfaces_section
from landscape.figures.rundata import RunData, RunsLike, as_runs
from landscape.figures.seeds import groups
from landscape.store.fileio import write_text
from landscape.store.results.selection import Selection
from landscape.store.results.validity import stale_note

CURVE_KEYS = [("accuracy", "test_acc"), ("train_loss", "train_loss"),
              ("flatness_distance", "flatness_distance")]
CURVE_CAPTIONS = {
    "test_acc": "Test accuracy of the global model on the evaluation rounds, as training logged it",
    "train_loss": "Mean local training loss of the round's clients, as training logged it",
    "flatness_distance": "Flatness distance Δ_D = mean_i ‖y_i − ȳ‖² (ȳ the clients' mean), logged online by training",
}


def _common_rho(runs: Sequence[RunData]) -> float | None:
    """The radius the tables and the sharpness plot show S_rho at (``choose_rho``); None where the runs
    share none."""
    sharp_runs = [run for run in runs if run.analysed_rounds("sharpness")]
    try:
        return choose_rho(sharp_runs, None) if sharp_runs else None
    except LandscapeError:
        return None


def _comparison(runs: Sequence[RunData], rho: float | None) -> dict[str, Any]:
    """The comparison table, whether a row is over seeds, the settings read and the results left out."""
    outputs = [output for run in runs for output in run.chosen]
    return {"table": comparison_table(runs, rho), "seeded": any(group.n > 1 for group in groups(runs)),
            "settings": settings_lines(runs, outputs),
            "notes": [stale_note(run.path, run.run.stale_results()) for run in runs if run.run.stale_results()]
            + [line for run in runs for line in run.notes()]}


def settings_line(runs: Sequence[RunData], outputs: Sequence[str]) -> str:
    """The line below a figure of ``runs`` saying with which settings its ``outputs`` were analysed, where they
    are not those asked for (``labels.settings_caption``): '' when they are. The report's titles never carry
    settings."""
    found = [(output, settings_caption(runs, output)) for output in dict.fromkeys(outputs)]
    found = [(output, text) for output, text in found if text]
    if len(found) == 1:
        return f"Settings: {found[0][1]}"
    return "Settings: " + "; ".join(f"{output}: {text}" for output, text in found) if found else ""


def _curves(runs: Sequence[RunData], page: Page) -> list[Markup]:
    """A plot per metrics.jsonl curve (``CURVE_KEYS``), a note for one that no run logs."""
    blocks = []
    for name, key in CURVE_KEYS:
        group = [run for run in runs if run.has_metric(key)]
        if group:
            blocks.append(page.plot(name, curve_figure(group, key), CURVE_CAPTIONS[key]))
        else:
            busy = [text for text in (run.in_use() for run in runs) if text]  # it may only not be logged yet
            blocks.append(note(f"no run has '{key}' in metrics.jsonl" + (f" yet: {'; '.join(busy)}" if busy else "")))
    return blocks


def _analysis_sections(runs: Sequence[RunData], rho: float | None,
                       page: Page) -> list[tuple[str, str, str, Markup]]:
    """(anchor, link text, heading, plot) of each analysis plot's section that some run has results for, in
    page order."""
    sections: list[tuple[str, str, str, tuple[str, ...], str, Callable[[], Any], str]] = [
        # (anchor, link text, heading, the passes any of which it draws, plot name, figure, caption)
        ("sharpness", "Global sharpness", "Global sharpness", ("sharpness", "hessian"),
         "global_sharpness", lambda: sharpness_figure(runs, rho),
         ("Global sharpness S_ρ(x^t) (the sharpness pass) and the top Hessian eigenvalue λ_1(x^t) (the hessian "
          "pass) of the global model at each analysed checkpoint, over rounds where a run has two or more, else "
          "one dot per run (FedNSAM Fig. 2b)")),
        ("spectra", "Spectra", "Hessian spectra", ("hessian",), "spectral_density",
         lambda: density_figure(runs),
         "Gaussian-smoothed stochastic Lanczos quadrature density of the Hessian ∇²F of the global model at "
         "each run's latest analysed round (log scale)"),
        ("incompatibility", "Incompatibility", "Flatness incompatibility", ("incompatibility",),
         "incompatibility", lambda: incompatibility_figure(runs),
         "Flatness incompatibility Δ_FI of the clients' SAM perturbations and its split into the heterogeneity "
         "across clients, the minibatch part within a client and twice their cross term"),
        ("alignment", "Alignment", "Gradient alignment", ("alignment",), "gradient_cosine",
         lambda: cosine_figure(runs),
         "Cosine C_ij = cos(∇F_i, ∇F_j) of each pair of clients' full local gradients at each run's latest "
         "analysed round"),
    ]
    return [(anchor, link, heading, page.plot(name, figure(), caption, settings_line(runs, passes)))
            for anchor, link, heading, passes, name, figure, caption in sections
            if any(run.analysed_rounds(p) for run in runs for p in passes)]


def _runs(runs: Sequence[RunData]) -> tuple[Markup | None, list[dict[str, Any]]]:
    """The recipe the runs share (None for one run), and per run: its name and directory, its analysis
    summaries at every analysed round and its recipe (``recipe_tables``: with several runs, only its own
    values)."""
    rhos = all_rhos(runs)
    shared, own = recipe_tables([run.recipe for run in runs])
    return shared, [{"slug": slug_of(run.name), "colour": to_hex(run.color), "label": run.label,
                     "path": str(run.path), "analysis": analysis_table(run, rhos) if run.analyses else None,
                     "missing": f"no analysis yet; run `landscape analyze {shlex.quote(str(run.path))}`",
                     "recipe": recipe} for run, recipe in zip(runs, own)]


def build_report(run_dirs: RunsLike, *, title: str = "landscape report",
                 selection: Selection | None = None) -> str:
    """The report's HTML text (see ``write_report``): ``templates/page.html`` filled in."""
    import plotly.offline

    runs = as_runs(run_dirs, selection if selection is not None else Selection(RESULT_NAMES))
    page = Page()
    rho = _common_rho(runs)
    comparison, curves = _comparison(runs, rho), _curves(runs, page)
    analyses = _analysis_sections(runs, rho, page)
    surfaces = surfaces_section(runs, page)
    nav = ([("comparison", "Comparison"), ("curves", "Curves")]
           + [(anchor, link) for anchor, link, _, _ in analyses]
           + ([("surfaces", "Surfaces")] if surfaces else []) + [("runs", "Runs")])
    shared_recipe, run_parts = _runs(runs)
    return render_page(
        title=title, plotly_js=Markup(plotly.offline.get_plotlyjs()),  # plotly's own library: trusted
        nav=nav, run_paths=[str(run.path) for run in runs], comparison=comparison, curves=curves,
        analyses=[(anchor, heading, plot) for anchor, _, heading, plot in analyses], surfaces=surfaces,
        shared_recipe=shared_recipe, runs=run_parts)


def write_report(run_dirs: RunsLike, out_html: str | Path, *, title: str = "landscape report",
                 selection: Selection | None = None) -> Path:
    """Write one self-contained HTML page over the runs (plotly.js inline once; no external addresses).
    ``selection``: the settings whose results the tables and curves read (default: the defaults)."""
    out = Path(out_html)
    write_text(out, build_report(run_dirs, title=title, selection=selection))
    return out
