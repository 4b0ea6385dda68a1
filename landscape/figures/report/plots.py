"""The report's plotly figures: curves over rounds, global sharpness, spectral densities, flatness
incompatibility, gradient-cosine heatmaps and 1D loss lines.

Runs that differ only in their recipe's seed (``landscape.figures.seeds``) are drawn as one group: over rounds
one mean line in the group's colour with a +-SE band (an upper and a lower trace filled between them; a single
round: an error bar) and "(n=3)" in the legend, each seed's value in the mean's hover text; spectral densities
each seed as a thin line in the group's colour; gradient cosines the mean matrix over seeds that analysed the
same clients (n in the title). A single-seed run is drawn exactly as before. Titles use HTML, never
matplotlib mathtext (plotly would hand '$' to MathJax, which the page does not load), wrapped to the plot's
width; an axis of rounds has whole-number ticks, one round a single tick.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence
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
from landscape.figures.labels import METRIC_LABELS, settings_caption, with_settings, wrap_title
from landscape.figures.over_seeds import by_seed_group, density_floor, mean_cosines, rounds_text
from landscape.figures.rundata import RunData
from landscape.figures.seeds import SeedGroup, groups, series_mean

PLOT_HEIGHT = 430
TITLE_CHARS = 90  # a title line's characters: fits a plot ~800 px wide (the page at a 900 px window)
SUBPLOT_TITLE_CHARS = 110  # shared by the subplots side by side
LINE_PX = 22  # the height of a title line


def _round_axes(fig: Any) -> None:
    """Whole-number round ticks on each x axis, from the rounds drawn on that axis: one round is that tick
    alone in the middle of [round - 1, round + 1] (not 29, 29.5, ... written 29, 30, 30, 31, 31), a span of
    up to 10 rounds every round, a longer one plotly's own round steps."""
    drawn: dict[str, list[float]] = {}
    for trace in fig.data:
        if trace.x is not None:
            drawn.setdefault(trace.xaxis or "x", []).extend(float(v) for v in np.atleast_1d(trace.x))
    for axis, xs in drawn.items():
        low, high = min(xs), max(xs)
        if high == low:
            ticks: dict[str, Any] = {"tickmode": "array", "tickvals": [low], "range": [low - 1, low + 1]}
        else:
            ticks = {"tickformat": "d", **({"dtick": 1} if high - low <= 10 else {})}
        fig.update_layout({f"xaxis{axis[1:]}": ticks})


def _layout(fig: Any, title: str, *, rounds: bool = True, **more: Any) -> Any:
    """Shared look; ``rounds``: the x axes count rounds (``_round_axes``). Titles are wrapped to the plot's
    width (subplot titles to their share of it), and the title sits at the top with room below it for every
    line of the subplot titles."""
    titles = [a for a in (fig.layout.annotations or ()) if a.text and a.yanchor == "bottom"]
    columns = max(1, len({round(float(a.x), 6) for a in titles}))
    for annotation in titles:  # make_subplots' titles: bottom-anchored above each subplot
        annotation.text = wrap_title(annotation.text, max(28, SUBPLOT_TITLE_CHARS // columns))
    title = wrap_title(title, TITLE_CHARS)
    below = max((a.text.count("<br>") + 1 for a in titles), default=0)
    top = 16 + LINE_PX * (title.count("<br>") + 1) + LINE_PX * below + 14
    layout = {"title": {"text": title, "y": 1, "yref": "container", "yanchor": "top", "pad": {"t": 16}},
              "height": PLOT_HEIGHT + max(0, top - 60), "template": "plotly_white",
              "margin": {"l": 60, "r": 20, "t": max(60, top), "b": 50},
              "legend": {"orientation": "h", "y": -0.2}}
    fig.update_layout({**layout, **more})
    if rounds:
        _round_axes(fig)
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


def curve_figure(runs: Sequence[RunData], key: str) -> Any:
    """A metrics.jsonl key over rounds (test accuracy in %), one line per run or per seed group."""
    import plotly.graph_objects as go

    fig = go.Figure()
    scale = 100.0 if key == "test_acc" else 1.0
    seed_groups = groups(runs)
    for group in seed_groups:
        if group.n > 1:
            fig.add_traces(_seed_band(group, lambda run: run.series(key), name=group.legend,
                                      colour=group.colour, scale=scale, marker={"size": 4}))
            continue
        (run,) = group.runs
        rounds, values = run.series(key)
        fig.add_trace(go.Scatter(x=rounds, y=scale * values, mode="lines+markers", name=run.label,
                                 line={"color": to_hex(run.color)}, marker={"size": 4}))
    ylabel = "test accuracy (%)" if key == "test_acc" else _plain(METRIC_LABELS.get(key, key))
    name = ylabel.split(" (")[0]
    return _layout(fig, _seed_note(f"{name[:1].upper()}{name[1:]} over rounds", seed_groups),
                   xaxis_title="round", yaxis_title=ylabel)


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


def _titled(title: str, settings: str) -> str:
    """A plot title with the settings it shows (``labels.settings_caption``) on a second line."""
    return with_settings(title, html.escape(settings), "<br>", matplotlib=False)


def sharpness_figure(runs: Sequence[RunData], rho: float | None) -> Any:
    """S_rho(x^t) (at ``rho``) and lambda_1(x^t) at the analysed rounds, side by side."""
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
                first = col == 1 or not any(id(run) in sharp for run in seeds.runs)
                fig.add_traces(_seed_band(seeds, series, name=seeds.legend, colour=seeds.colour,
                                          showlegend=first, marker={"symbol": symbol, "size": 7}),
                               rows=1, cols=col)
                continue
            (run,) = seeds.runs
            rounds, values = series(run)
            fig.add_trace(go.Scatter(x=rounds, y=values, mode="lines+markers", name=run.label,
                                     legendgroup=run.label, showlegend=run not in with_s or col == 1,
                                     line={"color": to_hex(run.color)}, marker={"symbol": symbol, "size": 7}),
                          row=1, col=col)
    fig.update_xaxes(title_text="round")
    fig.update_yaxes(title_text="S<sub>ρ</sub>: F(x + e*) − F(x), ‖e*‖ ≤ ρ", row=1, col=1)
    fig.update_yaxes(title_text="λ<sub>1</sub>(∇²F)", row=1, col=2)
    return _layout(fig, _seed_note("Global sharpness at the analysed rounds", seed_groups,
                                   "mean over seeds, band or bar: ± standard error"))


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
    """Delta_FI and its parts over the analysed rounds, one panel per run or seed group."""
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
                fig.add_traces(_seed_band(group, lambda run, k=key, d=by_run: (d[id(run)]["rounds"],
                                                                               d[id(run)][k]),
                                          name=name, colour=color, showlegend=col == 1, dash=dash),
                               rows=1, cols=col)
            continue
        (run,) = group.runs
        data = incompatibility_series(run)
        for key, se_key, name, color, dash in _FI_PARTS:
            error = {"type": "data", "array": data[se_key], "visible": True} if se_key else None
            fig.add_trace(go.Scatter(x=data["rounds"], y=data[key], error_y=error, mode="lines+markers",
                                     name=name, legendgroup=name, showlegend=col == 1,
                                     line={"color": color, "dash": dash}),
                          row=1, col=col)
    fig.update_xaxes(title_text="round")
    fig.update_yaxes(title_text="squared perturbation distance", row=1, col=1)
    several = [g.n > 1 for g in seed_groups]
    bars = ("error bars: Monte-Carlo SE; bands: ± SE over seeds" if any(several) and not all(several)
            else "mean over seeds, bands: ± SE over seeds" if any(several) else "error bars: Monte-Carlo SE")
    return _layout(fig, "Flatness incompatibility Δ<sub>FI</sub> = heterogeneity + batch part + 2 × cross"
                        f"<br>({bars})")


def cosine_figure(runs: Sequence[RunData]) -> Any:
    """Client x client gradient-cosine heatmaps on one colour scale, -1 to 1."""
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
            panels.append((_titled(f"{group.label}, {rounds_text(mean.rounds)}, mean of n={mean.n} seeds"
                                   f"<br>mean off-diagonal {mean.off_diagonal:.3f} "
                                   f"± {mean.off_diagonal_se:.2g}",
                                   group.runs[0].shown("alignment")),
                           go.Heatmap(z=mean.matrix, x=ids, y=ids, text=text, coloraxis="coloraxis",
                                      hovertemplate="client i=%{y}, j=%{x}: mean cos=%{z:.3f} %{text}"
                                                    "<extra></extra>")))
            continue
        # one seed, or seeds that analysed other clients: each its own
        for m, seed in zip(members, group.seeds):
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
        fig.update_xaxes(type="category", title_text="client j", tickangle=0, tickfont={"size": 9},
                         row=1, col=col)
        fig.update_yaxes(type="category", autorange="reversed", title_text="client i" if col == 1 else None,
                         scaleanchor="x" if col == 1 else f"x{col}", row=1, col=col)
    fig.update_layout(coloraxis={"colorscale": "RdBu_r", "cmin": -1.0, "cmax": 1.0,
                                 "colorbar": {"title": {"text": "cos(∇F<sub>i</sub>, ∇F<sub>j</sub>)"}}})
    fig.update_yaxes(tickfont={"size": 9})
    return _layout(fig, "Client gradient alignment (one colour scale, −1 to 1)", rounds=False,
                   height=PLOT_HEIGHT + 80)


def line_surface_figure(path: Path, title: str, color: str) -> Any:
    """A 1D surface (loss along one direction, ``x_coords``) as a line on its own axes."""
    import plotly.graph_objects as go

    with np.load(path, allow_pickle=False) as f:
        x, loss = np.asarray(f["x_coords"], float), np.asarray(f["loss"], float)
    fig = go.Figure(go.Scatter(x=x, y=loss, mode="lines+markers", name="loss", marker={"size": 4},
                               line={"color": color}))
    return _layout(fig, title, rounds=False, xaxis_title="step along the direction", yaxis_title="loss")

