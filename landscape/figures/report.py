"""One self-contained HTML report over run directories: opens with no network.

The page carries plotly.js once, inline in ``<head>``; every plot is a ``<div class="plot" id="plot-NAME"
data-name="NAME">`` followed by a plain ``Plotly.newPlot`` call on its JSON, so a browser test can wait for
``.plot .main-svg``. Nothing on the page points outside it: no ``src`` / ``href`` to another address.

Contents: a comparison table across runs (final and best test accuracy, the latest analysis values:
lambda_max, trace, S_rho, Delta_D, Delta_FI, mean gradient cosine, ...); interactive curves over rounds
(test accuracy, train loss, flatness distance); the global sharpness S_rho(x^t) and lambda_1(x^t) at the
analysed rounds; Hessian spectral densities; flatness incompatibility with its split; client x client
gradient-cosine heatmaps; loss surfaces where ``analysis/round-NNNN/surface*.npz`` exist (2D ones drawn by
``landscape.figures.surfaces.surface_figure``, 1D ones as lines); and per run its recipe and a table of the
analysis summaries at every analysed round. Inputs are files only, read through ``curves.load_runs``.

Runs that differ only in their recipe's seed (``landscape.figures.seeds``) are one row of the comparison table:
each cell the mean over the seeds +- its standard error, with a column n; a single-seed run's row is as it was.
The plotly figures draw such a group the same way: over rounds one mean line in the group's colour with a
+-SE band (an upper and a lower trace filled between them; a single round: an error bar) and "(n=3)" in the
legend, each seed's value in the mean's hover text; spectral densities each seed as a thin line in the group's
colour; gradient cosines the mean matrix over seeds that analysed the same clients (n in the title). A
single-seed run is drawn exactly as before.

Tables and curves read one set of settings per quantity (``landscape.figures.selection``: the defaults
unless a ``Selection`` says otherwise), named on the page where they are not the ones asked for; every
computed surface is drawn, each titled with its settings.
"""

from __future__ import annotations

import html
import json
import math
import re
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.colors import to_hex, to_rgba

from landscape.analyze.registry import Quantity
from landscape.errors import LandscapeError
from landscape.figures.curves import (
    METRIC_LABELS,
    RunData,
    RunsLike,
    alignment_matrices,
    as_runs,
    choose_rho,
    global_sharpness_series,
    hessian_summaries,
    incompatibility_series,
    lambda_max_series,
    settings_caption,
    settings_lines,
    with_settings,
)
from landscape.figures.seeds import SeedGroup, groups, mean_se, series_mean
from landscape.figures.selection import Selection, settings_label
from landscape.runs import write_text

PLOTLY_CONFIG = {"responsive": True, "displaylogo": False}
PLOT_HEIGHT = 430
CURVE_KEYS = [("accuracy", "test_acc"), ("train_loss", "train_loss"), ("flatness_distance", "flatness_distance")]

_CSS = """
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
.plot { width: 100%; } .note { color: #8a5a00; } pre { background: #f7f7f7; padding: 0.6em; overflow-x: auto; }
"""


# -- page assembly --------------------------------------------------------------------------------------------


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "-", text).strip("-") or "plot"


def _script_json(value: Any) -> str:
    """JSON safe inside <script>: no '<' can end the element or open a comment."""
    return value.replace("<", "\\u003c") if isinstance(value, str) else json.dumps(value).replace("<", "\\u003c")


@dataclass
class Page:
    """The plots of a page: unique names, each rendered by a plain Plotly.newPlot call."""

    names: list[str] = field(default_factory=list)

    def plot(self, name: str, fig: Any, caption: str = "") -> str:
        import plotly.io as pio

        slug = base = _slug(name)
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


def _note(text: str) -> str:
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


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], css_class: str = "", text_cols: int = 1) -> str:
    """Cells are already HTML; the first ``text_cols`` columns are left-aligned."""
    def cls(i: int) -> str:
        return ' class="text"' if i < text_cols else ""

    head = "".join(f"<th{cls(i)}>{h}</th>" for i, h in enumerate(header))
    body = "".join("<tr>" + "".join(f"<td{cls(i)}>{c}</td>" for i, c in enumerate(row)) + "</tr>\n" for row in rows)
    css = f' class="{css_class}"' if css_class else ""
    return (f'<div class="scroll"><table{css}>\n<thead><tr>{head}</tr></thead>\n<tbody>\n{body}</tbody>\n'
            "</table></div>")  # a wide table scrolls inside the page, not the page sideways


def _run_name_cell(run: RunData) -> str:
    return _swatch_cell(run.color, run.label)


def _swatch_cell(colour: str, label: str) -> str:
    return f'<span class="swatch" style="background:{to_hex(colour)}"></span>{html.escape(label)}'


# -- analysis quantities (per pass record) -------------------------------------------------------------------

# The order of the passes' columns in the tables; a pass not named here comes after these, in name order.
TABLE_PASSES = ("hessian", "sharpness", "flatness", "incompatibility", "alignment", "loss")


def quantities(rhos: Sequence[float]) -> list[Quantity]:
    """Every analysis quantity the tables show (each pass's registered ``Quantity``s), with S_rho at each of
    ``rhos``."""
    from landscape.analyze.catalog import load_passes

    registry = load_passes()
    order = [name for name in TABLE_PASSES if name in registry]
    order += [name for name in registry.names() if name not in order]
    return [q for name in order for q in registry.quantities(name, rhos)]


def all_rhos(runs: Sequence[RunData]) -> list[float]:
    found: set[float] = set()
    for run in runs:
        for rec in (run.analyses[r]["sharpness"] for r in run.analysed_rounds("sharpness")):
            found |= {round(float(v), 12) for v in np.atleast_1d(rec.array("global.rhos"))}
    return sorted(found)


def _metric_at(run: RunData, key: str, round: int) -> Any:
    for row in run.metrics:
        if row.get("round") == round and row.get(key) is not None:
            return row[key]
    return None


# -- tables ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ComparisonRow:
    """One run's line of a comparison: training outcome, and per quantity (value, standard error, round) at
    the latest round its pass analysed (None where the pass never ran)."""

    run: RunData
    rounds: int | None
    final_acc: float | None
    best_acc: float | None
    final_loss: float | None
    online_distance: float | None  # Delta_D logged by training at the last round
    latest: int | None  # the latest analysed round
    values: list[tuple[Any, Any, int] | None]


def comparison_rows(runs: Sequence[RunData], shown: Sequence[Quantity]) -> list[ComparisonRow]:
    rows = []
    for run in runs:
        _, acc = run.series("test_acc")
        _, loss = run.series("train_loss")
        _, distance = run.series("flatness_distance")
        analysed = sorted(run.analyses)
        values: list[tuple[Any, Any, int] | None] = []
        for q in shown:
            done = run.analysed_rounds(q.pass_name)
            values.append((*q.read(run.analyses[done[-1]][q.pass_name]), done[-1]) if done else None)
        rows.append(ComparisonRow(
            run, max((r["round"] for r in run.metrics if "round" in r), default=None),
            float(acc[-1]) if acc.size else None, float(np.nanmax(acc)) if acc.size else None,
            float(loss[-1]) if loss.size else None, float(distance[-1]) if distance.size else None,
            analysed[-1] if analysed else None, values))
    return rows


@dataclass(frozen=True)
class SeedStat:
    """One quantity over the seeds of a group: mean, standard error (None for one value), how many seeds have
    it, and each seed's value (None where a seed lacks it)."""

    mean: float | None
    se: float | None
    n: int
    per_seed: list[float | None]

    def text(self, *, plusmn: str = "+-", digits: str = ".4g") -> str:
        """'0.1234 +- 0.0056', with '(n=2)' when fewer seeds than the group's have the value; '-' for none."""
        if self.mean is None:
            return "-"
        out = f"{self.mean:{digits}}" + (f" {plusmn} {self.se:.2g}" if self.se is not None else "")
        return out + (f" (n={self.n})" if self.n < len(self.per_seed) else "")

    def seeds_text(self) -> str:
        """Each seed's value, '; '-separated ('-' where a seed lacks it): the CSV's per-seed cells."""
        return "; ".join("-" if v is None else f"{v:.6g}" for v in self.per_seed)


def seed_stat(values: Sequence[Any]) -> SeedStat:
    """``mean_se`` over the values that are there (None: the seed lacks the quantity)."""
    numbers: list[float | None] = []
    for value in values:
        try:
            numbers.append(None if value is None else float(value))
        except (TypeError, ValueError):
            numbers.append(None)
    have = [v for v in numbers if v is not None]
    if not have:
        return SeedStat(None, None, 0, numbers)
    mean, se, n = mean_se(have)
    return SeedStat(mean, se, n, numbers)


@dataclass(frozen=True)
class ComparisonGroup:
    """One configuration's line of a comparison: its seed group and each seed's ``ComparisonRow``."""

    group: SeedGroup
    rows: list[ComparisonRow]

    def stat(self, read: Callable[[ComparisonRow], Any]) -> SeedStat:
        return seed_stat([read(row) for row in self.rows])

    def quantity(self, k: int) -> tuple[SeedStat, list[int], bool]:
        """The ``k``-th shown quantity over the seeds, the rounds it was read at, and whether each seed's is at
        its latest analysed round."""
        values = [row.values[k] for row in self.rows]
        rounds = sorted({v[2] for v in values if v is not None})
        latest = all(v is None or v[2] == row.latest for v, row in zip(values, self.rows))
        return seed_stat([v[0] if v is not None else None for v in values]), rounds, latest


def comparison_groups(runs: Sequence[RunData], shown: Sequence[Quantity]) -> list[ComparisonGroup]:
    """``comparison_rows`` grouped by configuration (``seeds.groups``): one group per run unless runs differ
    only in their seed."""
    by_run = {id(row.run): row for row in comparison_rows(runs, shown)}
    return [ComparisonGroup(group, [by_run[id(run)] for run in group.runs]) for group in groups(runs)]


def _rounds_note(rounds: Sequence[int]) -> str:
    return f" (round{'s' if len(rounds) > 1 else ''} {', '.join(map(str, rounds))})"


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
                 "&Delta;<sub>D</sub> (online, last round)", "latest analysed round"] + [q.header for q in shown])
    rows = []
    for cg in found:
        if cg.group.n == 1:
            (row,) = cg.rows
            cells = [_dir_cell(_run_name_cell(row.run), row.run.name)] + (["1"] if seeded else []) + [
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
                 _group_cell(cg.stat(lambda row: row.final_loss)), _group_cell(cg.stat(lambda row: row.online_distance)),
                 ", ".join(map(str, latest)) or "-"]
        for k in range(len(shown)):
            stat, at, at_latest = cg.quantity(k)
            cell = _group_cell(stat)
            cells.append(cell if at_latest or stat.mean is None else f"{cell} <small>{_rounds_note(at)}</small>")
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
        acc = _metric_at(run, "test_acc", r)
        row = [str(r), _num(100 * acc) if acc is not None else "-"]
        for q in shown:
            rec = run.analyses[r].get(q.pass_name)
            row.append(_num(*q.read(rec)) if rec is not None else "-")
        rows.append(row)
    return _table(header, rows, "analysis")


def recipe_table(recipe: dict) -> str:
    rows = [f'<tr><th class="text">{html.escape(k)}</th><td class="text">{html.escape(repr(v))}</td></tr>'
            for k, v in recipe.items() if not isinstance(v, dict)]
    for section, values in recipe.items():
        if isinstance(values, dict):
            rows.append(f'<tr><th class="section" colspan="2">[{html.escape(section)}]</th></tr>')
            rows += [f'<tr><th class="text">{html.escape(k)}</th><td class="text">{html.escape(_toml_text(v))}</td>'
                     "</tr>" for k, v in values.items()]
    return '<table class="recipe">\n' + "\n".join(rows) + "\n</table>"


def _toml_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    return str(value)


# -- plotly figures -------------------------------------------------------------------------------------------


def _layout(fig: Any, title: str, *, rounds: bool = True, **more: Any) -> Any:
    """Shared look; ``rounds``: the x axes count rounds (whole-number ticks when there are few)."""
    # room above the plots for every line of the title, and a line more for subplot titles
    subplot_titles = any(a.text for a in (fig.layout.annotations or ()))
    top = 36 + 22 * (title.count("<br>") + 1) + (22 if subplot_titles else 0)
    layout = {"title": {"text": title}, "height": PLOT_HEIGHT, "template": "plotly_white",
              "margin": {"l": 60, "r": 20, "t": max(60, top), "b": 50}, "legend": {"orientation": "h", "y": -0.2}}
    fig.update_layout({**layout, **more})
    if rounds:
        xs = [float(v) for trace in fig.data for v in np.atleast_1d(trace.x if trace.x is not None else [])]
        span = (max(xs) - min(xs)) if xs else 0.0
        fig.update_xaxes(tickformat="d", **({"dtick": 1} if span <= 10 else {}))
    return fig


SEED_BAND_ALPHA = 0.2
SEED_NOTE = "mean over seeds, band: ± standard error"


def _translucent(colour: Any, alpha: float = SEED_BAND_ALPHA) -> str:
    r, g, b, _ = to_rgba(colour)
    return f"rgba({round(255 * r)}, {round(255 * g)}, {round(255 * b)}, {alpha:g})"


def _seed_note(title: str, seed_groups: Sequence[SeedGroup], note: str = SEED_NOTE) -> str:
    """The title with how seeds are drawn, when some group has several; as it is otherwise."""
    return f"{title} ({note})" if any(g.n > 1 for g in seed_groups) else title


def _seed_band(group: SeedGroup, series: Callable[[RunData], tuple[np.ndarray, np.ndarray]], *, name: str,
               colour: Any, scale: float = 1.0, legendgroup: str | None = None, showlegend: bool = True,
               mode: str = "lines+markers", marker: dict | None = None, dash: str | None = None) -> list[Any]:
    """A group of several seeds over rounds (``seeds.series_mean`` at the rounds every seed has): an upper
    (mean + SE) and a lower (mean - SE, filled up to the upper) trace, translucent and without a legend entry,
    then the mean line; one legendgroup for the three. The mean's hover names the mean, SE, n and each seed's
    value; at a single round the SE is also an error bar. [] when the seeds share no round."""
    import plotly.graph_objects as go

    rounds, mean, se, n = series_mean(group, series)
    if rounds.size == 0:
        return []
    per_seed = []
    for run in group.runs:  # each seed's own values at those rounds, for the hover text
        theirs, values = series(run)
        where = {int(r): i for i, r in enumerate(np.asarray(theirs).tolist())}
        per_seed.append(np.asarray(values, dtype=float)[[where[int(r)] for r in rounds]])
    seeds_text = ", ".join(str(s) for s in group.seeds)
    custom = [[float(scale * se[i]), "; ".join(f"{scale * v[i]:.4g}" for v in per_seed)] for i in range(rounds.size)]
    legendgroup = legendgroup if legendgroup is not None else name
    edge = {"color": to_hex(colour), "width": 0}
    band = {"x": rounds, "mode": "lines", "legendgroup": legendgroup, "showlegend": False, "hoverinfo": "skip"}
    line = {"color": to_hex(colour), **({"dash": dash} if dash else {})}
    error = {"type": "data", "array": scale * se, "visible": True} if rounds.size == 1 else None
    return [
        go.Scatter(y=scale * (mean + se), name=f"{name}: mean + SE", line=edge, **band),
        go.Scatter(y=scale * (mean - se), name=f"{name}: mean − SE", line=edge, fill="tonexty",
                   fillcolor=_translucent(colour), **band),
        go.Scatter(x=rounds, y=scale * mean, mode=mode, name=name, legendgroup=legendgroup, showlegend=showlegend,
                   line=line, marker=marker, error_y=error, customdata=custom,
                   hovertemplate=(f"round %{{x}}<br>mean %{{y:.4g}} ± %{{customdata[0]:.2g}} (SE, n={n})"
                                  f"<br>seeds {html.escape(seeds_text)}: %{{customdata[1]}}<extra>{name}</extra>")),
    ]


def curve_figure(runs: Sequence[RunData], key: str) -> Any:
    import plotly.graph_objects as go

    fig = go.Figure()
    scale = 100.0 if key == "test_acc" else 1.0
    seed_groups = groups(runs)
    for group in seed_groups:
        if group.n > 1:
            fig.add_traces(_seed_band(group, lambda run: run.series(key), name=group.legend, colour=group.colour,
                                      scale=scale, marker={"size": 4}))
            continue
        (run,) = group.runs
        rounds, values = run.series(key)
        fig.add_trace(go.Scatter(x=rounds, y=scale * values, mode="lines+markers", name=run.label,
                                 line={"color": to_hex(run.color)}, marker={"size": 4}))
    ylabel = "test accuracy (%)" if key == "test_acc" else _plain(METRIC_LABELS.get(key, key))
    name = ylabel.split(" (")[0]
    return _layout(fig, _seed_note(f"{name[:1].upper()}{name[1:]} over rounds", seed_groups), xaxis_title="round",
                   yaxis_title=ylabel)


def _plain(label: str) -> str:
    """A METRIC_LABELS entry without matplotlib mathtext (plotly would hand '$' to MathJax, not loaded here)."""
    for tex, text in ((r"$\Delta_D$", "Δ<sub>D</sub>"), (r"$\|y_i - \bar y\|^2$", "‖y<sub>i</sub> − ȳ‖²"),
                      (r"$\Delta_D / \|\bar y\|^2$", "Δ<sub>D</sub> / ‖ȳ‖²"),
                      (r"$\|y_i - x^{t+1}\|^2$", "‖y<sub>i</sub> − x<sup>t+1</sup>‖²"),
                      (r"$\|x^{t+1}\|^2$", "‖x<sup>t+1</sup>‖²"),
                      (r"$\|x^{t+1} - x^t\|$", "‖x<sup>t+1</sup> − x<sup>t</sup>‖")):
        label = label.replace(tex, text)
    return label.replace("$", "")


def _titled(title: str, settings: str) -> str:
    """A plot title with the settings it shows (``curves.settings_caption``) on a second line."""
    return with_settings(title, html.escape(settings), "<br>", matplotlib=False)


def sharpness_figure(runs: Sequence[RunData], rho: float | None) -> Any:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    with_s = [run for run in runs if run.analysed_rounds("sharpness")] if rho is not None else []
    with_l = [run for run in runs if run.analysed_rounds("hessian")]
    titles = (_titled(f"S<sub>ρ</sub>(x<sup>t</sup>), ρ = {rho:g}", settings_caption(with_s, "sharpness"))
              if rho is not None else "S<sub>ρ</sub>(x<sup>t</sup>): the runs share no ρ",
              _titled("λ<sub>1</sub>(x<sup>t</sup>)", settings_caption(with_l, "hessian")))
    fig = make_subplots(rows=1, cols=2, subplot_titles=titles, horizontal_spacing=0.1)
    sharp = {id(run) for run in with_s}
    seed_groups = []
    for col, group, series, symbol in ((1, with_s, lambda run: global_sharpness_series(run, rho), "circle"),
                                       (2, with_l, lambda_max_series, "square")):
        for seeds in groups(group):
            seed_groups.append(seeds)
            if seeds.n > 1:  # one legend entry per group: in the first panel that draws it
                fig.add_traces(_seed_band(seeds, series, name=seeds.legend, colour=seeds.colour,
                                          showlegend=col == 1 or not any(id(run) in sharp for run in seeds.runs),
                                          marker={"symbol": symbol, "size": 7}), rows=1, cols=col)
                continue
            (run,) = seeds.runs
            rounds, values = series(run)
            fig.add_trace(go.Scatter(x=rounds, y=values, mode="lines+markers", name=run.label, legendgroup=run.label,
                                     showlegend=run not in with_s or col == 1, line={"color": to_hex(run.color)},
                                     marker={"symbol": symbol, "size": 7}), row=1, col=col)
    fig.update_xaxes(title_text="round")
    fig.update_yaxes(title_text="S<sub>ρ</sub>: F(x + e*) − F(x), ‖e*‖ ≤ ρ", row=1, col=1)
    fig.update_yaxes(title_text="λ<sub>1</sub>(∇²F)", row=1, col=2)
    return _layout(fig, _seed_note("Global sharpness at the analysed rounds", seed_groups,
                                   "mean over seeds, band or bar: ± standard error"))


def density_figure(runs: Sequence[RunData]) -> Any:
    import plotly.graph_objects as go

    summaries = hessian_summaries([run for run in runs if run.analysed_rounds("hessian")])
    peak = max((float(np.nanmax(s.density)) for s in summaries if s.density.size), default=1.0)
    floor = peak * 1e-7 if peak > 0 else 1e-12
    fig = go.Figure()
    by_run = {id(s.run): s for s in summaries}
    seed_groups = groups([s.run for s in summaries])
    for group in seed_groups:
        members = [by_run[id(run)] for run in group.runs]
        if group.n > 1:  # each seed a thin line of the group's colour, one legend entry for the group
            theirs = sorted({s.round for s in members})
            name = f"{group.legend} (round{'s' if len(theirs) > 1 else ''} {', '.join(map(str, theirs))})"
            for k, (s, seed) in enumerate(zip(members, group.seeds)):
                fig.add_trace(go.Scatter(
                    x=s.grid, y=np.maximum(s.density, floor), mode="lines", name=name, legendgroup=group.legend,
                    showlegend=k == 0, line={"color": to_hex(group.colour), "width": 1},
                    hovertemplate=(f"seed {html.escape(str(seed))}, round {s.round}<br>λ = %{{x:.4g}}, "
                                   f"density %{{y:.3g}}<extra>{group.legend}</extra>")))
            continue
        (s,) = members
        fig.add_trace(go.Scatter(x=s.grid, y=np.maximum(s.density, floor), mode="lines",
                                 name=f"{s.run.label} (round {s.round})", line={"color": to_hex(s.run.color)}))
    title = _titled(_seed_note("Hessian spectral density (SLQ), latest analysed round", seed_groups,
                               "one thin line per seed"),
                    settings_caption([s.run for s in summaries], "hessian"))
    return _layout(fig, title, rounds=False,
                   xaxis_title="eigenvalue λ",
                   yaxis={"type": "log", "exponentformat": "power", "title": {"text": "density (log scale)"}})


_FI_PARTS = [("incompatibility", "incompatibility_se", "Δ<sub>FI</sub>", "black", "solid"),
             ("heterogeneity", None, "heterogeneity", "#1f77b4", "solid"),
             ("batch_part", "batch_part_se", "batch part", "#ff7f0e", "solid"),
             ("cross", "cross_se", "2 × cross", "#2ca02c", "dash")]


def incompatibility_figure(runs: Sequence[RunData]) -> Any:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    seed_groups = groups([run for run in runs if run.analysed_rounds("incompatibility")])
    titles = [_titled(g.legend, g.runs[0].shown("incompatibility")) for g in seed_groups]
    fig = make_subplots(rows=1, cols=len(seed_groups), shared_yaxes=True, subplot_titles=titles,
                        horizontal_spacing=0.04)
    for col, group in enumerate(seed_groups, start=1):
        if group.n > 1:  # each part's mean over the seeds, in the part's colour, with a +-SE band
            by_run = {id(run): incompatibility_series(run) for run in group.runs}
            for key, _, name, color, dash in _FI_PARTS:
                fig.add_traces(_seed_band(group, lambda run, k=key, d=by_run: (d[id(run)]["rounds"], d[id(run)][k]),
                                          name=name, colour=color, showlegend=col == 1, dash=dash), rows=1, cols=col)
            continue
        (run,) = group.runs
        data = incompatibility_series(run)
        for key, se_key, name, color, dash in _FI_PARTS:
            error = {"type": "data", "array": data[se_key], "visible": True} if se_key else None
            fig.add_trace(go.Scatter(x=data["rounds"], y=data[key], error_y=error, mode="lines+markers", name=name,
                                     legendgroup=name, showlegend=col == 1, line={"color": color, "dash": dash}),
                          row=1, col=col)
    fig.update_xaxes(title_text="round")
    fig.update_yaxes(title_text="squared perturbation distance", row=1, col=1)
    several = [g.n > 1 for g in seed_groups]
    bars = ("error bars: Monte-Carlo SE; bands: ± SE over seeds" if any(several) and not all(several)
            else "mean over seeds, bands: ± SE over seeds" if any(several) else "error bars: Monte-Carlo SE")
    return _layout(fig, f"Flatness incompatibility Δ<sub>FI</sub> = heterogeneity + batch part + 2 × cross ({bars})")


def cosine_figure(runs: Sequence[RunData]) -> Any:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    matrices = alignment_matrices([run for run in runs if run.analysed_rounds("alignment")])
    by_run = {id(m.run): m for m in matrices}
    panels: list[tuple[str, Any]] = []  # (title, heatmap)
    for group in groups([m.run for m in matrices]):
        members = [by_run[id(run)] for run in group.runs]
        if group.n > 1 and all(m.clients == members[0].clients for m in members):
            # the mean matrix over the seeds; each cell's hover: its SE and each seed's cosine
            matrix, se, n = mean_se([m.matrix for m in members])
            off, off_se, _ = mean_se([m.mean_off_diagonal for m in members])
            theirs = sorted({m.round for m in members})
            when = f"round{'s' if len(theirs) > 1 else ''} {', '.join(map(str, theirs))}"
            seeds_text = html.escape(", ".join(str(s) for s in group.seeds))
            text = [[f"± {se[i, j]:.2g} (SE, n={n})<br>seeds {seeds_text}: "
                     + "; ".join(f"{m.matrix[i, j]:.3f}" for m in members) for j in range(matrix.shape[1])]
                    for i in range(matrix.shape[0])]
            ids = [str(c) for c in members[0].clients]
            panels.append((_titled(f"{group.label}, {when}, mean of n={n} seeds<br>mean off-diagonal "
                                   f"{off:.3f} ± {off_se:.2g}", group.runs[0].shown("alignment")),
                           go.Heatmap(z=matrix, x=ids, y=ids, text=text, coloraxis="coloraxis",
                                      hovertemplate="client i=%{y}, j=%{x}: mean cos=%{z:.3f} %{text}<extra></extra>")))
            continue
        for m, seed in zip(members, group.seeds):  # one seed, or seeds that analysed other clients: each its own
            ids = [str(c) for c in m.clients]
            label = m.run.label if group.n == 1 else f"{m.run.label}, seed {seed}"
            panels.append((_titled(f"{label}, round {m.round}<br>mean off-diagonal {m.mean_off_diagonal:.3f}",
                                   m.run.shown("alignment")),
                           go.Heatmap(z=m.matrix, x=ids, y=ids, coloraxis="coloraxis",
                                      hovertemplate="client i=%{y}, j=%{x}: cos=%{z:.3f}<extra></extra>")))
    fig = make_subplots(rows=1, cols=len(panels), subplot_titles=[title for title, _ in panels],
                        horizontal_spacing=0.06)
    for col, (_, heatmap) in enumerate(panels, start=1):
        fig.add_trace(heatmap, row=1, col=col)
        fig.update_xaxes(type="category", title_text="client j", tickangle=0, tickfont={"size": 9}, row=1, col=col)
        fig.update_yaxes(type="category", autorange="reversed", title_text="client i" if col == 1 else None,
                         scaleanchor="x" if col == 1 else f"x{col}", row=1, col=col)
    fig.update_layout(coloraxis={"colorscale": "RdBu_r", "cmin": -1.0, "cmax": 1.0,
                                 "colorbar": {"title": {"text": "cos(∇F<sub>i</sub>, ∇F<sub>j</sub>)"}}})
    fig.update_yaxes(tickfont={"size": 9})
    return _layout(fig, "Client gradient alignment (one colour scale, −1 to 1)", rounds=False,
                   height=PLOT_HEIGHT + 80, margin={"l": 60, "r": 20, "t": 100, "b": 50})


# -- surfaces ---------------------------------------------------------------------------------------------------


def surface_renderer() -> Callable[..., Any] | None:
    """``landscape.figures.surfaces.surface_figure`` when that module provides it."""
    try:
        from landscape.figures import surfaces
    except ImportError:
        return None
    renderer = getattr(surfaces, "surface_figure", None)
    return renderer if callable(renderer) else None


def surface_files(run: RunData) -> list[tuple[int, Path]]:
    """(round, path) of every surface of the run, whatever its directions and settings: the NPZ of each
    surface pass result (a partial grid is not a result yet), and ``surface*.npz`` files without a record."""
    found = {(r, rec.path.with_suffix(".npz")) for r, recs in run.results.items() for rec in recs
             if rec.pass_name == "surface" and rec.path.with_suffix(".npz").is_file()}
    recorded = {path for _, path in found}
    for path in (run.path / "analysis").glob("round-*/surface*.npz"):
        match = re.fullmatch(r"round-(\d{4,})", path.parent.name)
        if match and not path.name.endswith(".partial.npz") and path not in recorded \
                and not path.with_suffix(".json").is_file():
            found.add((int(match.group(1)), path))
    return sorted(found)


def _surface_kind(path: Path) -> str:
    """'random plane', 'PCA plane', 'client plane' or 'line to <target>' from the record beside the NPZ."""
    try:
        meta = json.loads(path.with_suffix(".json").read_text()).get("result", {})
    except (OSError, ValueError, AttributeError):
        return path.name
    kind = meta.get("directions") if isinstance(meta, dict) else None
    from landscape.figures.surfaces import normalization_of

    random = "random plane"
    if kind == "random":
        random = {"filter": "random plane filter-normalised to this model (Li et al. 2018)",
                  "euclidean": f"euclidean random plane (||d1|| = ||d2|| = {meta.get('length')})",
                  "filter-reference": f"random plane filter-normalised to {meta.get('reference')}",
                  }.get(normalization_of(meta) or "filter", random)
    names = {"random": random, "pca": "PCA plane of the trajectory", "clients": "plane of two client models"}
    text = f"line to {meta.get('target', 'the target')}" if kind == "interpolate" else names.get(kind, path.name)
    try:
        record = json.loads(path.with_suffix(".json").read_text())
        settings = settings_label("surface", record.get("settings"))
    except (OSError, ValueError, AttributeError):
        return text
    return text if settings == "the defaults" else f"{text}, {settings}"


def _line_surface_figure(path: Path, title: str, color: str) -> Any:
    import plotly.graph_objects as go

    with np.load(path, allow_pickle=False) as f:
        x, loss = np.asarray(f["x_coords"], float), np.asarray(f["loss"], float)
    fig = go.Figure(go.Scatter(x=x, y=loss, mode="lines+markers", name="loss", marker={"size": 4},
                               line={"color": color}))
    return _layout(fig, title, rounds=False, xaxis_title="step along the direction", yaxis_title="loss")


def _surface_scales(paths: Sequence[Path]) -> tuple[dict[Path, str], dict[str, tuple[float, float]]]:
    """The quantity each 2D surface shows (its colour-bar label, e.g. training loss (global F)) and, per
    quantity, the (lowest, highest) value over all of them: the colour scale and z range that the report's 3D
    plots of that quantity share. Files that cannot be read are left out here (drawing them says why)."""
    from landscape.figures.surfaces import load_surface

    quantity: dict[Path, str] = {}
    scales: dict[str, tuple[float, float]] = {}
    for path in paths:
        try:
            surface = load_surface(path)
        except (LandscapeError, OSError, ValueError, KeyError):
            continue
        finite = surface.loss[np.isfinite(surface.loss)]
        if not surface.is_2d or finite.size == 0:
            continue
        label = quantity[path] = surface.quantity_label("loss")
        low, high = scales.get(label, (math.inf, -math.inf))
        scales[label] = (min(low, float(finite.min())), max(high, float(finite.max())))
    for label, (low, high) in scales.items():
        if high <= low:  # one flat surface: a range around its value, as the figures draw it
            scales[label] = (low, low + (abs(low) * 1e-6 or 1e-6))
    return quantity, scales


def _plane_caption(path: Path) -> str:
    """'; ||x|| = 23.4; ...' for a 2D surface's caption: the model's weight norm and, for a per-model
    filter-normalised plane, that its axis units are that model's own (not comparable across runs)."""
    from landscape.figures.surfaces import load_surface, normalization_of, weight_norm_text

    try:
        surface = load_surface(path)
    except (LandscapeError, OSError, ValueError, KeyError):
        return ""
    text = f"; {weight_norm_text(surface)}" if weight_norm_text(surface) else ""
    if normalization_of(surface.meta) == "filter":
        text += "; filter-normalised to this model's own weights: its axis units are not another run's"
    return text


def _random_planes_line(files: Sequence[tuple[RunData, int, Path]]) -> str:
    """What the random planes of different runs compare (``surfaces.compare_planes``), '' for fewer than two."""
    from landscape.figures.surfaces import compare_planes, load_surface

    found = []
    for run, r, path in files:
        try:
            surface = load_surface(path)
        except (LandscapeError, OSError, ValueError, KeyError):
            continue
        if surface.is_2d and surface.meta.get("directions") == "random":
            found.append((f"{run.label} (round {r})", surface))
    if len({label.rsplit(' (round', 1)[0] for label, _ in found}) < 2:
        return ""
    planes = compare_planes([s for _, s in found], [label for label, _ in found])
    return f"Random planes of the runs: {planes.text}."


def surfaces_section(runs: Sequence[RunData], page: Page) -> str:
    files = [(run, r, p) for run in runs for r, p in surface_files(run)]
    if not files:
        return ""
    renderer = surface_renderer()
    quantity, scales = _surface_scales([p for _, _, p in files]) if renderer is not None else ({}, {})
    counts = {label: list(quantity.values()).count(label) for label in scales}
    parts = ['<section id="surfaces"><h2>Loss surfaces</h2>']
    if scales:
        shared = "; ".join(f"{label}: {low:.4g} to {high:.4g} ({counts[label]} surface"
                           f"{'s' if counts[label] > 1 else ''})" for label, (low, high) in scales.items())
        text = ("The 3D surfaces share one colour scale and z range, so that runs compare by eye: " if len(scales) == 1
                else "3D surfaces of one quantity share one colour scale and z range; surfaces of different "
                     "quantities are on separate scales: ")
        parts.append(f"<p>{html.escape(text + shared)}.</p>")
    planes_line = _random_planes_line(files)
    if planes_line:
        parts.append(f"<p>{html.escape(planes_line)}</p>")
    for run, r, path in files:
        title = f"{run.label}, round {r}, {_surface_kind(path)}"
        # The plot is named by the output (surface, surface-pca, ...), not by the settings part of the file name.
        name = f"surface-{run.name}-round-{r}-{path.stem.partition('@')[0]}"
        caption = f"from {path}"
        try:
            with np.load(path, allow_pickle=False) as f:
                is_2d = "y_coords" in f.files
            if is_2d and renderer is None:
                parts.append(_note(f"{path}: no surface renderer available (landscape.figures.surfaces."
                                   "surface_figure); the surface is left out"))
                continue
            if is_2d:
                label = quantity.get(path, "")
                fig = renderer([path], [title], limits=scales.get(label))
                if label and counts[label] == 1 and len(scales) > 1:
                    caption += f"; on its own scale: the only surface of {label}"
                elif label:
                    low, high = scales[label]
                    caption += f"; colours and z on the scale shared by every surface of {label}: {low:.4g} to {high:.4g}"
                caption += _plane_caption(path)
            else:
                fig = _line_surface_figure(path, title, to_hex(run.color))
                caption += "; a 1D line, drawn as a curve on its own axis (not on the surfaces' colour scale)"
        except (LandscapeError, OSError, ValueError, KeyError) as e:
            parts.append(_note(f"{path}: cannot draw this surface ({e})"))
            continue
        parts.append(f"<h3>{html.escape(title)}</h3>")
        parts.append(page.plot(name, fig, caption))
    parts.append("</section>")
    return "\n".join(parts)


# -- the page ---------------------------------------------------------------------------------------------------


def build_report(run_dirs: RunsLike, *, title: str = "landscape report", selection: Selection | None = None) -> str:
    """The report's HTML text (see ``write_report``)."""
    import plotly.offline

    runs = as_runs(run_dirs, selection if selection is not None else Selection())
    page = Page()
    rhos = all_rhos(runs)
    sharp_runs = [run for run in runs if run.analysed_rounds("sharpness")]
    try:
        rho = choose_rho(sharp_runs, None) if sharp_runs else None
    except LandscapeError:
        rho = None
    body: list[str] = [f"<h1>{html.escape(title)}</h1>",
                       "<p>Runs: " + ", ".join(html.escape(str(run.path)) for run in runs) + "</p>"]
    nav = [("comparison", "Comparison"), ("curves", "Curves")]

    body.append('<section id="comparison"><h2>Comparison across runs</h2>')
    body.append(comparison_table(runs, rho))
    seeded = any(group.n > 1 for group in groups(runs))
    body.append("<p>Analysis values are each pass's latest analysed round; &plusmn; is the Monte-Carlo "
                "standard error where the pass reports one"
                + ("; in a row of n &gt; 1 seeds (runs that differ only in their seed) each cell is the mean over "
                   "the seeds &plusmn; its standard error (std / &radic;n)" if seeded else "") + ".</p>")
    outputs = [output for run in runs for output in run.chosen]
    body.append("<p>" + "<br>".join(html.escape(line) for line in settings_lines(runs, outputs)) + "</p>")
    body += [_note(line) for run in runs for line in run.notes()]
    body.append("</section>")

    body.append('<section id="curves"><h2>Curves over rounds</h2>')
    for name, key in CURVE_KEYS:
        group = [run for run in runs if run.has_metric(key)]
        if group:
            caption = {"test_acc": "test accuracy on the evaluation rounds (metrics.jsonl)",
                       "train_loss": "mean local training loss of the round's clients (metrics.jsonl)",
                       "flatness_distance": "flatness distance Δ_D = mean_i ‖y_i − ȳ‖² (ȳ the clients' mean), logged online"}[key]
            body.append(page.plot(name, curve_figure(group, key), caption))
        else:
            body.append(_note(f"no run has '{key}' in metrics.jsonl"))
    body.append("</section>")

    if any(run.analysed_rounds("sharpness") or run.analysed_rounds("hessian") for run in runs):
        nav.append(("sharpness", "Global sharpness"))
        body.append('<section id="sharpness"><h2>Global sharpness over rounds</h2>')
        body.append(page.plot("global_sharpness", sharpness_figure(runs, rho),
                              "S_ρ(x^t) from the sharpness pass and λ_1(x^t) from the hessian pass, per analysed "
                              "checkpoint (FedNSAM Fig. 2b)"))
        body.append("</section>")
    if any(run.analysed_rounds("hessian") for run in runs):
        nav.append(("spectra", "Spectra"))
        body.append('<section id="spectra"><h2>Hessian spectra</h2>')
        body.append(page.plot("spectral_density", density_figure(runs),
                              "Gaussian-smoothed stochastic Lanczos quadrature density of ∇²F (log scale)"))
        body.append("</section>")
    if any(run.analysed_rounds("incompatibility") for run in runs):
        nav.append(("incompatibility", "Incompatibility"))
        body.append('<section id="incompatibility"><h2>Flatness incompatibility</h2>')
        body.append(page.plot("incompatibility", incompatibility_figure(runs)))
        body.append("</section>")
    if any(run.analysed_rounds("alignment") for run in runs):
        nav.append(("alignment", "Alignment"))
        body.append('<section id="alignment"><h2>Gradient alignment</h2>')
        body.append(page.plot("gradient_cosine", cosine_figure(runs),
                              "C_ij = cos(∇F_i, ∇F_j) at each run's latest analysed round"))
        body.append("</section>")
    surfaces = surfaces_section(runs, page)
    if surfaces:
        nav.append(("surfaces", "Surfaces"))
        body.append(surfaces)

    nav.append(("runs", "Runs"))
    body.append('<section id="runs"><h2>Runs</h2>')
    for run in runs:
        body.append(f'<h3 id="run-{_slug(run.name)}">{_run_name_cell(run)} '
                    f"<small>({html.escape(str(run.path))})</small></h3>")
        if run.analyses:
            body.append("<h4>Analysis summaries</h4>")
            body.append(analysis_table(run, rhos))
        else:
            body.append(_note(f"no analysis yet; run `landscape analyze {shlex.quote(str(run.path))}`"))
        body.append("<h4>Recipe</h4>")
        body.append(recipe_table(run.recipe))
    body.append("</section>")

    links = " ".join(f'<a href="#{anchor}">{text}</a>' for anchor, text in nav)
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
        f"<title>{html.escape(title)}</title>", f"<style>{_CSS}</style>",
        f'<script type="text/javascript">{plotly.offline.get_plotlyjs()}</script>', "</head>", "<body>",
        f"<nav>{links}</nav>", *body, "</body>", "</html>", ""])


def write_report(run_dirs: RunsLike, out_html: str | Path, *, title: str = "landscape report",
                 selection: Selection | None = None) -> Path:
    """Write one self-contained HTML page over the runs (plotly.js inline once; no external addresses).
    ``selection``: the settings whose results the tables and curves read (default: the defaults)."""
    out = Path(out_html)
    write_text(out, build_report(run_dirs, title=title, selection=selection))
    return out
