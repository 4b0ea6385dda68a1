"""The report's plotly figures: curves over rounds, global sharpness, spectral densities, flatness
incompatibility, gradient-cosine heatmaps and 1D loss lines.

Runs that differ only in their recipe's seed (``landscape.figures.seeds``) are drawn as one group: over rounds
one mean line in the group's colour with a +-SE band (an upper and a lower trace filled between them) and
"(n=3)" in the legend, each seed's value in the mean's hover text; spectral densities each seed as a thin line
in the group's colour; gradient cosines the mean matrix over seeds that analysed the same clients (n in the
title). A single-seed run is drawn exactly as before.

A panel is drawn over rounds only where some run (or seed group) has two or more rounds in it; otherwise it is a
chart by run "at round R" (``_at_round``: a dot, or for the incompatibility's parts a bar, per run with its
standard error as an error bar), never a line of one point.

Titles use HTML, never matplotlib mathtext (plotly would hand '$' to MathJax, which the page does not load),
and say what is drawn, never the settings: the report puts the settings in the line below the figure
(``build``). Every title is wrapped to the width its plot has at the narrowest window the report is made for
(``NARROW_PX``, a 900 px window), subplot titles to their panel's share of it, so that no two titles meet at
any wider window either. An axis of rounds has whole-number ticks.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.colors import to_hex, to_rgba

from landscape.figures.extract import (
    alignment_matrices,
    global_sharpness_series,
    hessian_summaries,
    incompatibility_series,
    lambda_max_series,
)
from landscape.figures.labels import METRIC_LABELS, wrap_title
from landscape.figures.over_seeds import by_seed_group, density_floor, mean_cosines, rounds_text
from landscape.figures.report.layout import (
    PLOT_HEIGHT,
    figure_layout,
)
from landscape.figures.rundata import RunData
from landscape.figures.seeds import SeedGroup, groups, series_mean
from landscape.store.results.files import read_arrays

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
    custom = [[float(scale * se[i]), "; ".join(f"{scale * v[i]:.4g}" for v in per_seed)]
              for i in range(rounds.size)]
    legendgroup = legendgroup if legendgroup is not None else name
    edge = {"color": to_hex(colour), "width": 0}
    band = {"x": rounds, "mode": "lines", "legendgroup": legendgroup, "showlegend": False,
            "hoverinfo": "skip"}
    line = {"color": to_hex(colour), **({"dash": dash} if dash else {})}
    error = {"type": "data", "array": scale * se, "visible": True} if rounds.size == 1 else None
    return [
        go.Scatter(y=scale * (mean + se), name=f"{name}: mean + SE", line=edge, **band),
        go.Scatter(y=scale * (mean - se), name=f"{name}: mean − SE", line=edge, fill="tonexty",
                   fillcolor=_translucent(colour), **band),
        go.Scatter(x=rounds, y=scale * mean, mode=mode, name=name, legendgroup=legendgroup,
                   showlegend=showlegend, line=line, marker=marker, error_y=error, customdata=custom,
                   hovertemplate=(f"round %{{x}}<br>mean %{{y:.4g}} ± %{{customdata[0]:.2g}} (SE, n={n})"
                                  f"<br>seeds {html.escape(seeds_text)}: %{{customdata[1]}}"
                                  f"<extra>{name}</extra>")),
    ]


def _over_rounds(seed_groups: Sequence[SeedGroup], series: Callable[[RunData], tuple[np.ndarray, np.ndarray]]
                 ) -> bool:
    """Whether some run or seed group has two or more rounds of ``series`` (the rounds every seed has)."""
    return any(series_mean(group, series)[0].size >= 2 for group in seed_groups)


@dataclass(frozen=True)
class _Point:
    """One run's (or seed group's) value at its one round, with its standard error (None: none)."""

    label: str
    colour: Any
    round: int
    value: float
    se: float | None
    seeds: str = ""  # each seed's value, for the hover text of a group


def _points(seed_groups: Sequence[SeedGroup], series: Callable[[RunData], tuple[np.ndarray, np.ndarray]],
            scale: float = 1.0, se_series: Callable[[RunData], tuple[np.ndarray, np.ndarray]] | None = None
            ) -> list[_Point]:
    """Each group's value at its latest round of ``series`` (used where it has one): a single run's value and
    its own standard error (``se_series``; None without), a group's mean over its seeds and the SE over them."""
    out = []
    for group in seed_groups:
        rounds, mean, se, _ = series_mean(group, series)
        if rounds.size == 0:
            continue
        if group.n > 1:
            values = []
            for run in group.runs:  # each seed's own value at that round, for the hover text
                theirs, own = series(run)
                values.append(scale * float(np.asarray(own)[np.asarray(theirs).tolist().index(int(rounds[-1]))]))
            seeds = "; ".join(f"{v:.4g}" for v in values)
            out.append(_Point(group.legend, group.colour, int(rounds[-1]), scale * float(mean[-1]),
                              scale * float(se[-1]) if se is not None else None,
                              f"seeds {', '.join(str(s) for s in group.seeds)}: {seeds}"))
            continue
        (run,) = group.runs
        own = None
        if se_series is not None:
            se_rounds, errors = se_series(run)
            where = list(np.asarray(se_rounds).tolist())
            if int(rounds[-1]) in where and np.isfinite(errors[where.index(int(rounds[-1]))]):
                own = scale * float(errors[where.index(int(rounds[-1]))])
        out.append(_Point(run.label, run.color, int(rounds[-1]), scale * float(mean[-1]), own))
    return out


CATEGORY_CHARS = 18  # a run's name under its dot or bars is wrapped to lines of this many characters
CATEGORY_AXIS = {"type": "category", "tickangle": 0, "title": {"text": ""}}


def _at_round_x(points: Sequence[_Point]) -> tuple[list[str], str]:
    """The categories of a chart by run (each run's label, wrapped, with its round where the runs' rounds
    differ) and what its title says of the rounds ('at round 3')."""
    rounds = sorted({p.round for p in points})
    if len(rounds) == 1:
        return [wrap_title(html.escape(p.label), CATEGORY_CHARS) for p in points], f"at round {rounds[0]}"
    return ([f"{wrap_title(html.escape(p.label), CATEGORY_CHARS)}<br>round {p.round}" for p in points],
            "each at its analysed round")


def _at_round(points: Sequence[_Point], *, symbol: str = "circle", shown: set[str] | None = None) -> list[Any]:
    """A chart by run of values at one round each: a dot per run in its colour, its standard error as an error
    bar; one legend entry per run (``shown``: the labels already in the legend, updated)."""
    import plotly.graph_objects as go

    shown = shown if shown is not None else set()
    xs, _ = _at_round_x(points)
    traces = []
    for x, p in zip(xs, points):
        error = {"type": "data", "array": [p.se], "visible": True} if p.se is not None else None
        hover = f"{html.escape(p.label)}, round {p.round}: %{{y:.4g}}"
        hover += f" ± {p.se:.2g} (SE)" if p.se is not None else ""
        hover += f"<br>{html.escape(p.seeds)}" if p.seeds else ""
        traces.append(go.Scatter(x=[x], y=[p.value], mode="markers", name=p.label, legendgroup=p.label,
                                 showlegend=p.label not in shown, error_y=error,
                                 marker={"color": to_hex(p.colour), "symbol": symbol, "size": 10},
                                 hovertemplate=hover + "<extra></extra>"))
        shown.add(p.label)
    return traces


def curve_figure(runs: Sequence[RunData], key: str) -> Any:
    """A metrics.jsonl key over rounds (test accuracy in %), one line per run or per seed group; where no run
    logs it at two rounds, a dot per run at its round."""
    import plotly.graph_objects as go

    fig = go.Figure()
    scale = 100.0 if key == "test_acc" else 1.0
    seed_groups = groups(runs)
    ylabel = "test accuracy (%)" if key == "test_acc" else _plain(METRIC_LABELS.get(key, key))
    name = ylabel.split(" (")[0]
    name = f"{name[:1].upper()}{name[1:]}"
    if not _over_rounds(seed_groups, lambda run: run.series(key)):
        points = _points(seed_groups, lambda run: run.series(key), scale)
        fig.add_traces(_at_round(points))
        _, at = _at_round_x(points)
        return figure_layout(fig, _seed_note(f"{name} {at}", seed_groups, "mean over seeds, bar: ± standard error"),
                       rounds=False, xaxis=CATEGORY_AXIS, yaxis_title=ylabel)
    for group in seed_groups:
        if group.n > 1:
            fig.add_traces(_seed_band(group, lambda run: run.series(key), name=group.legend,
                                      colour=group.colour, scale=scale, marker={"size": 4}))
            continue
        (run,) = group.runs
        rounds, values = run.series(key)
        fig.add_trace(go.Scatter(x=rounds, y=scale * values, mode="lines+markers", name=run.label,
                                 line={"color": to_hex(run.color)}, marker={"size": 4}))
    return figure_layout(fig, _seed_note(f"{name} over rounds", seed_groups), xaxis_title="round", yaxis_title=ylabel)


def _plain(label: str) -> str:
    """A METRIC_LABELS entry without matplotlib mathtext (plotly would hand '$' to MathJax, not loaded
    here)."""
    for tex, text in ((r"$\Delta_D$", "Δ<sub>D</sub>"),
                      (r"$\|y_i - \bar y\|^2$", "‖y<sub>i</sub> − ȳ‖²"),
                      (r"$\Delta_D / \|\bar y\|^2$", "Δ<sub>D</sub> / ‖ȳ‖²"),
                      (r"$\|y_i - x^{t+1}\|^2$", "‖y<sub>i</sub> − x<sup>t+1</sup>‖²"),
                      (r"$\|x^{t+1}\|^2$", "‖x<sup>t+1</sup>‖²"),
                      (r"$\|x^{t+1} - x^t\|$", "‖x<sup>t+1</sup> − x<sup>t</sup>‖")):
        label = label.replace(tex, text)
    return label.replace("$", "")


def sharpness_figure(runs: Sequence[RunData], rho: float | None) -> Any:
    """S_rho(x^t) (at ``rho``) and lambda_1(x^t) at the analysed rounds, side by side: each panel over rounds
    where some run has two analysed rounds of it, else a dot per run at its round."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    with_s = [run for run in runs if run.analysed_rounds("sharpness")] if rho is not None else []
    with_l = [run for run in runs if run.analysed_rounds("hessian")]
    panels = ((1, with_s, lambda run: global_sharpness_series(run, rho), "circle",
               f"S<sub>ρ</sub>(x<sup>t</sup>), ρ = {rho:g}" if rho is not None
               else "S<sub>ρ</sub>(x<sup>t</sup>): the runs share no ρ"),
              (2, with_l, lambda_max_series, "square", "λ<sub>1</sub>(x<sup>t</sup>)"))
    over = {col: _over_rounds(groups(group), series) for col, group, series, _, _ in panels}
    at_round = {col: _points(groups(group), series) for col, group, series, _, _ in panels if not over[col]}
    titles = [f"{title}, {_at_round_x(at_round[col])[1]}" if at_round.get(col) else title
              for col, *_, title in panels]
    fig = make_subplots(rows=1, cols=2, subplot_titles=titles, horizontal_spacing=0.16)
    sharp = {id(run) for run in with_s}
    seed_groups = []
    shown: set[str] = set()
    for col, group, series, symbol, _ in panels:
        if not over[col]:  # one round each: a dot per run
            seed_groups.extend(groups(group))
            fig.add_traces(_at_round(at_round[col], symbol=symbol, shown=shown), rows=1, cols=col)
            if at_round[col]:
                fig.update_xaxes(CATEGORY_AXIS, row=1, col=col)
            continue
        fig.update_xaxes(title_text="round", row=1, col=col)
        for seeds in groups(group):
            seed_groups.append(seeds)
            if seeds.n > 1:  # one legend entry per group: in the first panel that draws it
                first = col == 1 or not any(id(run) in sharp for run in seeds.runs)
                fig.add_traces(_seed_band(seeds, series, name=seeds.legend, colour=seeds.colour,
                                          showlegend=first and seeds.legend not in shown,
                                          marker={"symbol": symbol, "size": 7}),
                               rows=1, cols=col)
                shown.add(seeds.legend)
                continue
            (run,) = seeds.runs
            rounds, values = series(run)
            fig.add_trace(go.Scatter(x=rounds, y=values, mode="lines+markers", name=run.label,
                                     legendgroup=run.label, showlegend=run.label not in shown,
                                     line={"color": to_hex(run.color)}, marker={"symbol": symbol, "size": 7}),
                          row=1, col=col)
            shown.add(run.label)
    fig.update_yaxes(title_text="S<sub>ρ</sub>: F(x + e*) − F(x), ‖e*‖ ≤ ρ", row=1, col=1)
    fig.update_yaxes(title_text="λ<sub>1</sub>(∇²F)", row=1, col=2)
    title = "Global sharpness at the analysed rounds" if any(over.values()) else "Global sharpness"
    return figure_layout(fig, _seed_note(title, seed_groups, "mean over seeds, band or bar: ± standard error"))


def density_figure(runs: Sequence[RunData]) -> Any:
    """The Hessian spectral densities (SLQ) at each run's latest analysed round, log scale."""
    import plotly.graph_objects as go

    summaries = hessian_summaries([run for run in runs if run.analysed_rounds("hessian")])
    floor = density_floor([s.density for s in summaries])
    fig = go.Figure()
    grouped = by_seed_group(summaries)
    seed_groups = [group for group, _ in grouped]
    for group, members in grouped:
        if group.n > 1:  # each seed a thin line of the group's colour, one legend entry for the group
            name = f"{group.legend} ({rounds_text(sorted({s.round for s in members}))})"
            for k, (s, seed) in enumerate(zip(members, group.seeds)):
                fig.add_trace(go.Scatter(
                    x=s.grid, y=np.maximum(s.density, floor), mode="lines", name=name,
                    legendgroup=group.legend, showlegend=k == 0,
                    line={"color": to_hex(group.colour), "width": 1},
                    hovertemplate=(f"seed {html.escape(str(seed))}, round {s.round}<br>λ = %{{x:.4g}}, "
                                   f"density %{{y:.3g}}<extra>{group.legend}</extra>")))
            continue
        (s,) = members
        fig.add_trace(go.Scatter(x=s.grid, y=np.maximum(s.density, floor), mode="lines",
                                 name=f"{s.run.label} (round {s.round})",
                                 line={"color": to_hex(s.run.color)}))
    title = _seed_note("Hessian spectral density (SLQ), latest analysed round", seed_groups,
                       "one thin line per seed")
    return figure_layout(fig, title, rounds=False,
                   xaxis_title="eigenvalue λ",
                   yaxis={"type": "log", "exponentformat": "power", "title": {"text": "density (log scale)"}})


_FI_PARTS = [("incompatibility", "incompatibility_se", "Δ<sub>FI</sub>", "black", "solid"),
             ("heterogeneity", None, "heterogeneity", "#1f77b4", "solid"),
             ("batch_part", "batch_part_se", "batch part", "#ff7f0e", "solid"),
             ("cross", "cross_se", "2 × cross", "#2ca02c", "dash")]
_FI_TITLE = "Flatness incompatibility Δ<sub>FI</sub> = heterogeneity + batch part + 2 × cross"


def _fi_bars(seed_groups: Sequence[SeedGroup], by_run: dict[int, dict[str, np.ndarray]]) -> tuple[list[Any], str]:
    """Delta_FI and its parts as grouped bars by run, each run at its one analysed round (a group: the means
    over its seeds, the SE over them as error bars; a run: its Monte-Carlo SE), and the x-axis title."""
    import plotly.graph_objects as go

    traces, at = [], ""
    for key, se_key, name, color, dash in _FI_PARTS:
        def part(run: RunData, k: str = key) -> tuple[np.ndarray, np.ndarray]:
            return by_run[id(run)]["rounds"], by_run[id(run)][k]

        def error(run: RunData, k: str | None = se_key) -> tuple[np.ndarray, np.ndarray]:
            return by_run[id(run)]["rounds"], by_run[id(run)][k]

        points = _points(seed_groups, part, se_series=error if se_key else None)
        xs, at = _at_round_x(points)
        errors = [p.se if p.se is not None else 0.0 for p in points]
        traces.append(go.Bar(x=xs, y=[p.value for p in points], name=name, legendgroup=name,
                             marker={"color": color, **({"pattern": {"shape": "/"}} if dash == "dash" else {})},
                             error_y={"type": "data", "array": errors, "visible": any(errors)},
                             customdata=[[p.round, p.se if p.se is not None else float("nan")] for p in points],
                             hovertemplate=(f"{name}, round %{{customdata[0]}}: %{{y:.4g}} ± %{{customdata[1]:.2g}}"
                                            "<extra>%{x}</extra>")))
    return traces, at


def incompatibility_figure(runs: Sequence[RunData]) -> Any:
    """Delta_FI and its parts over the analysed rounds, one panel per run or seed group with two or more
    analysed rounds; the runs analysed at one round as grouped bars by run in a panel of their own (the only
    panel where no run has two)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    seed_groups = groups([run for run in runs if run.analysed_rounds("incompatibility")])
    by_run = {id(run): incompatibility_series(run) for group in seed_groups for run in group.runs}

    def total(run: RunData) -> tuple[np.ndarray, np.ndarray]:
        return by_run[id(run)]["rounds"], by_run[id(run)]["incompatibility"]

    over = [group for group in seed_groups if _over_rounds([group], total)]
    single = [group for group in seed_groups if group not in over]
    several = [g.n > 1 for g in seed_groups]
    bars = ("error bars: Monte-Carlo SE; bands: ± SE over seeds" if any(several) and not all(several)
            else "mean over seeds, bands: ± SE over seeds" if any(several) else "error bars: Monte-Carlo SE")
    if not over:
        traces, at = _fi_bars(single, by_run)
        return figure_layout(go.Figure(traces), f"{_FI_TITLE}, {at}<br>({bars.replace('bands', 'bars')})", rounds=False,
                       barmode="group", xaxis=CATEGORY_AXIS, yaxis_title="squared perturbation distance")
    single_bars = _fi_bars(single, by_run) if single else None
    titles = [g.legend for g in over] + ([f"the runs of one analysed round, {single_bars[1]}"] if single_bars else [])
    rows, cols, height, gap = _grid(len(titles), PLOT_HEIGHT - 130)
    fig = make_subplots(rows=rows, cols=cols, shared_yaxes=True, subplot_titles=titles, horizontal_spacing=0.05,
                        vertical_spacing=gap)
    for k, group in enumerate(over):
        row, col = k // cols + 1, k % cols + 1
        fig.update_xaxes(title_text="round", row=row, col=col)
        if group.n > 1:  # each part's mean over the seeds, in the part's colour, with a +-SE band
            for key, _, name, color, dash in _FI_PARTS:
                fig.add_traces(_seed_band(group, lambda run, k=key, d=by_run: (d[id(run)]["rounds"],
                                                                               d[id(run)][k]),
                                          name=name, colour=color, showlegend=k == 0, dash=dash),
                               rows=row, cols=col)
            continue
        (run,) = group.runs
        data = by_run[id(run)]
        for key, se_key, name, color, dash in _FI_PARTS:
            error = {"type": "data", "array": data[se_key], "visible": True} if se_key else None
            fig.add_trace(go.Scatter(x=data["rounds"], y=data[key], error_y=error, mode="lines+markers",
                                     name=name, legendgroup=name, showlegend=k == 0,
                                     line={"color": color, "dash": dash}),
                          row=row, col=col)
    if single_bars:
        traces, _ = single_bars
        for trace in traces:
            trace.showlegend = False  # the lines' legend entries name the parts
        row, col = (len(titles) - 1) // cols + 1, (len(titles) - 1) % cols + 1
        fig.add_traces(traces, rows=row, cols=col)
        fig.update_xaxes(CATEGORY_AXIS, row=row, col=col)
        fig.update_layout(barmode="group")
    for row in range(1, rows + 1):
        fig.update_yaxes(title_text="squared perturbation distance", row=row, col=1)
    return figure_layout(fig, f"{_FI_TITLE}<br>({bars})", plot_height=height + 130)


PANEL_COLUMNS = 3  # panels of one run each side by side at most; more go on further rows
ROW_GAP_PX = 140  # between rows of panels: the next row's titles (up to 5 lines) and this row's axis titles
# client numbers labelled along a heatmap's axis at most, with one or two panels side by side: a panel is about
# 300 px wide at a 900 px window, room for about 20 labels of up to three digits at the ticks' size (two thirds
# of that with three panels)
CLIENT_LABELS = 20


def client_tick_step(clients: int, columns: int = 1) -> int:
    """Every how many clients a heatmap's axis labels one: 1, 2, 5, 10, 20, 50, ... , the least that labels at
    most ``CLIENT_LABELS`` in a row of ``columns`` panels (at 100 clients and two panels every 5th, where every
    4th ran the numbers together)."""
    most = CLIENT_LABELS * min(2, columns) // max(1, columns)
    return next(m * 10**e for e in range(12) for m in (1, 2, 5) if clients <= most * m * 10**e)


def _grid(panels: int, row_px: int) -> tuple[int, int, int, float]:
    """(rows, columns, height of the rows in px, vertical spacing) of ``panels`` panels of ``row_px`` each, at
    most ``PANEL_COLUMNS`` side by side: at a 900 px window a panel keeps room for its title."""
    cols = max(1, min(panels, PANEL_COLUMNS))
    rows = -(-panels // cols)
    height = rows * row_px + (rows - 1) * ROW_GAP_PX
    return rows, cols, height, ROW_GAP_PX / height if rows > 1 else 0.0


def cosine_figure(runs: Sequence[RunData]) -> Any:
    """Client x client gradient-cosine heatmaps on one colour scale, -1 to 1: up to ``PANEL_COLUMNS`` side by
    side, further runs on further rows."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    matrices = alignment_matrices([run for run in runs if run.analysed_rounds("alignment")])
    panels: list[tuple[str, Any]] = []  # (title, heatmap)
    for group, members in by_seed_group(matrices):
        if group.n > 1 and all(m.clients == members[0].clients for m in members):
            # the mean matrix over the seeds; each cell's hover: its SE and each seed's cosine
            mean = mean_cosines(members)
            seeds_text = html.escape(", ".join(str(s) for s in group.seeds))
            text = [[f"± {mean.se[i, j]:.2g} (SE, n={mean.n})<br>seeds {seeds_text}: "
                     + "; ".join(f"{m.matrix[i, j]:.3f}" for m in members)
                     for j in range(mean.matrix.shape[1])]
                    for i in range(mean.matrix.shape[0])]
            ids = [str(c) for c in members[0].clients]
            panels.append((f"{group.label}, {rounds_text(mean.rounds)}, mean of n={mean.n} seeds"
                           f"<br>mean off-diagonal {mean.off_diagonal:.3f} ± {mean.off_diagonal_se:.2g}",
                           go.Heatmap(z=mean.matrix, x=ids, y=ids, text=text, coloraxis="coloraxis",
                                      hovertemplate="client i=%{y}, j=%{x}: mean cos=%{z:.3f} %{text}"
                                                    "<extra></extra>")))
            continue
        # one seed, or seeds that analysed other clients: each its own
        for m, seed in zip(members, group.seeds):
            ids = [str(c) for c in m.clients]
            label = m.run.label if group.n == 1 else f"{m.run.label}, seed {seed}"
            panels.append((f"{label}, round {m.round}<br>mean off-diagonal {m.mean_off_diagonal:.3f}",
                           go.Heatmap(z=m.matrix, x=ids, y=ids, coloraxis="coloraxis",
                                      hovertemplate="client i=%{y}, j=%{x}: cos=%{z:.3f}<extra></extra>")))
    rows, cols, height, gap = _grid(len(panels), 340)  # heatmaps are square: as wide as they are tall
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=[title for title, _ in panels],
                        horizontal_spacing=0.08, vertical_spacing=gap)
    for k, (_, heatmap) in enumerate(panels):
        row, col = k // cols + 1, k % cols + 1
        fig.add_trace(heatmap, row=row, col=col)
        ticks = {"tickmode": "linear", "tick0": 0, "dtick": client_tick_step(len(heatmap.x), cols)}
        fig.update_xaxes(type="category", title_text="client j", tickangle=0, tickfont={"size": 9}, **ticks,
                         row=row, col=col)
        fig.update_yaxes(type="category", autorange="reversed", title_text="client i" if col == 1 else None,
                         scaleanchor=f"x{k + 1 if k else ''}", constrain="domain", constraintoward="top", **ticks,
                         row=row, col=col)  # square cells, right under the panel's title
    fig.update_layout(coloraxis={"colorscale": "RdBu_r", "cmin": -1.0, "cmax": 1.0,
                                 "colorbar": {"title": {"text": "cos(∇F<sub>i</sub>, ∇F<sub>j</sub>)"},
                                              "lenmode": "pixels", "len": 240, "y": 1, "yanchor": "top"}})
    fig.update_yaxes(tickfont={"size": 9})
    return figure_layout(fig, "Client gradient alignment (one colour scale, −1 to 1)", rounds=False,
                   plot_height=height + 80)


def line_surface_figure(path: Path, title: str, color: str) -> Any:
    """A 1D surface (loss along one direction, ``x_coords``) as a line on its own axes."""
    import plotly.graph_objects as go

    f = read_arrays(path, ["x_coords", "loss"])
    x, loss = np.asarray(f["x_coords"], float), np.asarray(f["loss"], float)
    fig = go.Figure(go.Scatter(x=x, y=loss, mode="lines+markers", name="loss", marker={"size": 4},
                               line={"color": color}))
    return figure_layout(fig, title, rounds=False, xaxis_title="step along the direction", yaxis_title="loss")

