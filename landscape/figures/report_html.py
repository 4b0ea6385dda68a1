"""The report page's HTML parts: its style sheet, its plots (``Page``), cells and tables.

``Page.plot`` writes a plot as a ``<div class="plot" id="plot-NAME" data-name="NAME">`` followed by a plain
``Plotly.newPlot`` call on its JSON (names unique on the page). The tables: the comparison across runs (one
row per run, or per configuration over its seeds: mean +- standard error and n), each run's analysis
summaries at every analysed round, and its recipe. Cells are HTML; the numbers come from
``landscape.figures.report_data``.
"""

from __future__ import annotations

import html
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from matplotlib.colors import to_hex

from landscape.figures.over_seeds import rounds_text
from landscape.figures.report_data import SeedStat, comparison_groups, metric_at, quantities
from landscape.figures.rundata import RunData

PLOTLY_CONFIG = {"responsive": True, "displaylogo": False}

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 0 auto;
       max-width: 1400px; padding: 1em 2em; color: #222; }
h1 { margin-bottom: 0.2em; } h2 { border-bottom: 1px solid #ccc; padding-bottom: 0.2em; margin-top: 1.6em; }
nav a { margin-right: 1em; }
table { border-collapse: collapse; margin: 0.6em 0; font-size: 0.9em; }
th, td { border: 1px solid #ddd; padding: 0.25em 0.6em; text-align: right; }
th { background: #f4f4f4; } td.text, th.text { text-align: left; }
table.recipe td, table.recipe th { text-align: left; } table.recipe th.section { background: #e8eef7; }
.swatch { display: inline-block; width: 0.9em; height: 0.9em; margin-right: 0.4em; vertical-align: -0.1em; }
figure { margin: 0.8em 0; } figcaption { color: #555; font-size: 0.9em; max-width: 70em; }
.scroll { overflow-x: auto; max-width: 100%; }
table.comparison { font-size: 0.8em; }
table.comparison th { white-space: normal; vertical-align: bottom; max-width: 6.5em; }
table.comparison th, table.comparison td { padding: 0.2em 0.3em; }
table.comparison td { white-space: normal; } table.comparison td .v { white-space: nowrap; }
table.comparison td.text { overflow-wrap: anywhere; min-width: 8em; max-width: 14em; }
table.comparison td small { color: #666; }
.plot { width: 100%; } .note { color: #8a5a00; } pre { background: #f7f7f7; padding: 0.6em; \
overflow-x: auto; }
"""


# -- page parts ---------------------------------------------------------------------------------------------


def slug_of(text: str) -> str:
    """The text as an HTML id part: letters, digits, '_' and '-' ('plot' for none)."""
    return re.sub(r"[^A-Za-z0-9_-]+", "-", text).strip("-") or "plot"


def _script_json(value: Any) -> str:
    """JSON safe inside <script>: no '<' can end the element or open a comment."""
    text = value if isinstance(value, str) else json.dumps(value)
    return text.replace("<", "\\u003c")


@dataclass
class Page:
    """The plots of a page: unique names, each rendered by a plain Plotly.newPlot call."""

    names: list[str] = field(default_factory=list)

    def plot(self, name: str, fig: Any, caption: str = "") -> str:
        import plotly.io as pio

        slug = base = slug_of(name)
        k = 2
        while slug in self.names:
            slug, k = f"{base}-{k}", k + 1
        self.names.append(slug)
        spec = _script_json(pio.to_json(fig, validate=False))
        div_id = f"plot-{slug}"
        caption_html = f"<figcaption>{html.escape(caption)}</figcaption>" if caption else ""
        return (f'<figure>\n<div class="plot" id="{div_id}" data-name="{slug}"></div>\n'
                f'<script type="text/javascript">(function () {{ var spec = {spec}; '
                f'Plotly.newPlot("{div_id}", spec.data, spec.layout, {_script_json(PLOTLY_CONFIG)}); }})();'
                f"</script>\n{caption_html}</figure>")


def note(text: str) -> str:
    """A remark on the page (what is missing, left out or cannot be drawn)."""
    return f'<p class="note">{html.escape(text)}</p>'


def _num(value: Any, se: Any = None) -> str:
    if value is None:
        return "-"
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return str(int(value))
    try:
        v = float(value)
    except (TypeError, ValueError):
        return html.escape(str(value))
    text = f"{v:.4g}"
    if se is not None and math.isfinite(float(se)):
        text += f" &plusmn; {float(se):.2g}"
    return text


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], css_class: str = "",
           text_cols: int = 1) -> str:
    """Cells are already HTML; the first ``text_cols`` columns are left-aligned."""
    def cls(i: int) -> str:
        return ' class="text"' if i < text_cols else ""

    head = "".join(f"<th{cls(i)}>{h}</th>" for i, h in enumerate(header))
    body = "".join("<tr>" + "".join(f"<td{cls(i)}>{c}</td>" for i, c in enumerate(row)) + "</tr>\n"
                   for row in rows)
    css = f' class="{css_class}"' if css_class else ""
    return (f'<div class="scroll"><table{css}>\n<thead><tr>{head}</tr></thead>\n<tbody>\n{body}</tbody>\n'
            "</table></div>")  # a wide table scrolls inside the page, not the page sideways


def run_name_cell(run: RunData) -> str:
    """The run's label after a swatch of its colour."""
    return _swatch_cell(run.color, run.label)


def _swatch_cell(colour: str, label: str) -> str:
    return f'<span class="swatch" style="background:{to_hex(colour)}"></span>{html.escape(label)}'


# -- tables -------------------------------------------------------------------------------------------------


def _rounds_note(rounds: Sequence[int]) -> str:
    return f" ({rounds_text(rounds)})"


def _group_cell(stat: SeedStat) -> str:
    """A comparison cell of several seeds: mean and +- SE kept on one line each, wrapping between them."""
    if stat.mean is None:
        return "-"
    cell = f'<span class="v">{stat.mean:.4g}</span>'
    if stat.se is not None:
        cell += f' <span class="v">&plusmn; {stat.se:.2g}</span>'
    return cell + (f" <small>(n={stat.n})</small>" if stat.n < len(stat.per_seed) else "")


def comparison_table(runs: Sequence[RunData], rho: float | None) -> str:
    """One row per run (per configuration, for runs that differ only in their seed: the mean +- standard
    error over the seeds, and n): training outcome and the latest value of each analysis quantity."""
    shown = [q for q in quantities([rho] if rho is not None else [])
             if any(run.analysed_rounds(q.pass_name) for run in runs)]
    found = comparison_groups(runs, shown)
    seeded = any(cg.group.n > 1 for cg in found)
    header = (["run <small>(directory)</small>"] + (["n"] if seeded else [])
              + ["rounds", "final test acc (%)", "best test acc (%)", "final train loss",
                 "&Delta;<sub>D</sub> (online, last round)", "latest analysed round"]
              + [q.header for q in shown])
    rows = []
    for cg in found:
        if cg.group.n == 1:
            (row,) = cg.rows
            cells = [_dir_cell(run_name_cell(row.run), row.run.name)] + (["1"] if seeded else []) + [
                _num(row.rounds), _num(100 * row.final_acc) if row.final_acc is not None else "-",
                _num(100 * row.best_acc) if row.best_acc is not None else "-",
                _num(row.final_loss), _num(row.online_distance), _num(row.latest)]
            for value in row.values:
                if value is None:
                    cells.append("-")
                    continue
                cell = _num(value[0], value[1])
                cells.append(cell if value[2] == row.latest else f"{cell} (round {value[2]})")
            rows.append(cells)
            continue
        rounds = sorted({row.rounds for row in cg.rows if row.rounds is not None})
        latest = sorted({row.latest for row in cg.rows if row.latest is not None})
        cells = [_dir_cell(_swatch_cell(cg.group.colour, cg.group.label), cg.group.name), str(cg.group.n),
                 ", ".join(map(str, rounds)) or "-",
                 _group_cell(cg.stat(lambda row: None if row.final_acc is None else 100 * row.final_acc)),
                 _group_cell(cg.stat(lambda row: None if row.best_acc is None else 100 * row.best_acc)),
                 _group_cell(cg.stat(lambda row: row.final_loss)),
                 _group_cell(cg.stat(lambda row: row.online_distance)),
                 ", ".join(map(str, latest)) or "-"]
        for k in range(len(shown)):
            stat, at, at_latest = cg.quantity(k)
            cell = _group_cell(stat)
            cells.append(cell if at_latest or stat.mean is None
                         else f"{cell} <small>{_rounds_note(at)}</small>")
        rows.append(cells)
    return _table(header, rows, "comparison", text_cols=1)


def _dir_cell(name_cell: str, directory: str) -> str:
    """The run's name with its directory below it (one column: the table fits the page)."""
    return f"{name_cell}<br><small>{html.escape(directory)}</small>"


def analysis_table(run: RunData, rhos: Sequence[float]) -> str:
    """One row per analysed round of the run: test accuracy there and every analysis quantity it has."""
    shown = [q for q in quantities(rhos) if run.analysed_rounds(q.pass_name)]
    header = ["round", "test acc (%)"] + [q.header for q in shown]
    rows = []
    for r in sorted(run.analyses):
        acc = metric_at(run, "test_acc", r)
        row = [str(r), _num(100 * acc) if acc is not None else "-"]
        for q in shown:
            rec = run.analyses[r].get(q.pass_name)
            row.append(_num(*q.read(rec)) if rec is not None else "-")
        rows.append(row)
    return _table(header, rows, "analysis")


def recipe_table(recipe: dict) -> str:
    """The recipe as a two-column table, one header row per TOML section."""
    rows = [f'<tr><th class="text">{html.escape(k)}</th><td class="text">{html.escape(repr(v))}</td></tr>'
            for k, v in recipe.items() if not isinstance(v, dict)]
    for section, values in recipe.items():
        if isinstance(values, dict):
            rows.append(f'<tr><th class="section" colspan="2">[{html.escape(section)}]</th></tr>')
            rows += [f'<tr><th class="text">{html.escape(k)}</th>'
                     f'<td class="text">{html.escape(_toml_text(v))}</td></tr>' for k, v in values.items()]
    return '<table class="recipe">\n' + "\n".join(rows) + "\n</table>"


def _toml_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    return str(value)

