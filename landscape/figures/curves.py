"""The matplotlib curve figures of run directories (Agg canvas; PNG, or PDF / SVG by the file name).

Renderers (each ``plot_*`` saves and returns the path; its ``*_figure`` twin returns the matplotlib Figure):
``plot_accuracy`` (test accuracy over the evaluation rounds), ``plot_metric_over_rounds`` (any metrics.jsonl
key), ``plot_flatness_and_sharpness`` (FedNSAM Fig. 2: online flatness distance Delta_D, and global
sharpness S_rho(x^t) and lambda_1(x^t) at the analysed rounds), ``plot_hessian_summary`` (FedSAM-paper
Hessian figure: lambda_max and lambda_1 / lambda_k bars, the clients' lambda_max as dots beside each bar,
SLQ spectral densities; bar tick labels wrapped to their slot), ``plot_incompatibility``
(Delta_FI and its split with standard errors) and ``plot_alignment_heatmaps`` (client x client gradient
cosines on one colour scale [-1, 1]). The figures of one model from arrays (the notebook API's results) are in
``landscape.figures.spectrum``, whose density axes the Hessian figure shares. A run that lacks the analysis a figure needs raises a LandscapeError
that names the run and the ``landscape analyze`` command to run. Every run keeps one colour in every figure.

Seeds: runs that differ only in their recipe's seed (``landscape.figures.seeds``; a figure recipe's seeds of
one run id) are one group with one colour and label. Curves over rounds draw the group's mean with a +-SE band
(error bars at a single round) and "(n=3)" in the legend; the Hessian bars are means with SE error bars and
each seed as a hollow dot; spectral densities draw every seed as a thin line of the group's colour; alignment
heatmaps show the mean cosine matrix (n in the title); incompatibility curves the mean +- SE over seeds. A
single seed is drawn as before.

Paper-ready. Titles are short and plain: the runs, the rounds, how seeds are aggregated and the settings the
results were read with are the figure's caption (``labels.figure_caption``), which ``save_figure`` writes beside
the image as ``<file>.caption.txt``. Legends sit below the axes (``style.outside_legend``), never over the data.
A panel over rounds is drawn over rounds only where some run has two rounds or more of it: with one round each,
it is drawn by run (a bar per seed group at its round, "at round R" in the title; the incompatibility figure's
parts as bars), and the caption says so.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.colors import Normalize
from matplotlib.figure import Figure

from landscape.core.errors import LandscapeError
from landscape.figures.extract import (
    INCOMPATIBILITY_PARTS,
    HessianSummary,
    alignment_matrices,
    choose_rho,
    global_sharpness_series,
    hessian_summaries,
    incompatibility_series,
    lambda_max_series,
)
from landscape.figures.labels import METRIC_LABELS, figure_caption, rounds_span, set_caption
from landscape.figures.over_seeds import by_seed_group, density_floor, mean_cosines, rounds_text
from landscape.figures.rundata import RunsLike, as_runs, require_metric, require_passes
from landscape.figures.seeds import SeedGroup, groups, mean_se, series_mean
from landscape.figures.spectrum import density_axes
from landscape.figures.style import new_figure, outside_legend, over_rounds, round_axis, seed_note
from landscape.figures.surface.draw import save_figure

COSINE_CMAP = "RdBu_r"  # diverging: -1 blue, 0 white, +1 red


# -- curves from metrics.jsonl ----------------------------------------------------------------------------


def _over_rounds_or_by_run(ax: Any, seed_groups: Sequence[SeedGroup], series: Any, title: str, *,
                           scale: float = 1.0, marker: str | None = None, ms: float = 3) -> tuple[str, bool]:
    """Every group's ``series(run) -> (rounds, values)`` on ``ax``, titled ``title``: over rounds (one line a
    group, ``style.over_rounds``) where some group has two rounds or more; else by run, since a panel "over
    rounds" of one round is a column of dots: one bar a group at the round it has (``_seed_bars``: the value, or
    the mean +- SE over seeds with each seed a dot), that round in the title ("at round 30"; each bar's under
    it where they differ). Returns (the rounds for the caption, whether it was drawn over rounds)."""
    data = [[series(run) for run in group.runs] for group in seed_groups]
    rounds = [{int(r) for got, _ in values for r in got} for values in data]
    if any(len(of_group) >= 2 for of_group in rounds):
        drawn: set[int] = set()
        for group in seed_groups:
            drawn |= over_rounds(ax, group, series, marker=marker, ms=ms, scale=scale)
        round_axis(ax, drawn)
        ax.set_title(title)
        return rounds_span(drawn), True
    shown = [(group, [scale * float(values[-1]) for _, values in of_group if len(values)], at)
             for group, of_group, at in zip(seed_groups, data, rounds) if at]
    every = set().union(*(at for _, _, at in shown)) if shown else set()
    _seed_bars(ax, [(group, values) for group, values, _ in shown])
    ticks = [_tick_label(group.label, len(shown)) + (f"\n(n={group.n})" if group.n > 1 else "")
             + ("" if len(every) == 1 else "\n" + rounds_span(at)) for group, _, at in shown]
    ax.set_xticks(np.arange(len(shown)), ticks, fontsize="small")
    ax.margins(y=0.15)
    ax.grid(axis="y", alpha=0.3)
    ax.set_title(f"{title} at {rounds_span(every)}" if len(every) == 1 else f"{title}, by run")
    return (f"{rounds_span(every)} only, drawn by run (bars), not over rounds" if every else "none"), False


def accuracy_figure(runs: RunsLike) -> Figure:
    runs = as_runs(runs)
    require_metric(runs, "test_acc", "landscape train logs it on evaluation rounds, --eval-every N; a run of your "
                                     "own loop records it with RunWriter.round(..., metrics={'test_acc': ...})")
    fig = new_figure(6.4, 4.2)
    ax = fig.add_subplot()
    seed_groups = groups(runs)
    title = "Test accuracy of the global model"
    span, _ = _over_rounds_or_by_run(ax, seed_groups, lambda run: run.series("test_acc"), title, scale=100.0)
    ax.set_ylabel("test accuracy (%)")
    outside_legend(fig, [ax], ncols=3)
    return set_caption(fig, figure_caption(f"{title} (%) at the evaluation rounds, from metrics.jsonl", runs,
                                           span, notes=[seed_note(seed_groups)]))


def plot_accuracy(runs: RunsLike, out: str | Path) -> Path:
    """Test accuracy (%) over the evaluation rounds, one line per run."""
    return save_figure(accuracy_figure(runs), out)


def metric_figure(runs: RunsLike, key: str, ylabel: str | None = None, *, log: bool = False) -> Figure:
    runs = as_runs(runs)
    require_metric(runs, key)
    fig = new_figure(6.4, 4.2)
    ax = fig.add_subplot()
    seed_groups = groups(runs)
    label = ylabel or METRIC_LABELS.get(key, key)
    head = label.split(" (")[0]
    title = f"{head[:1].upper()}{head[1:]}"
    span, lines = _over_rounds_or_by_run(ax, seed_groups, lambda run: run.series(key),
                                         f"{title} over rounds")
    ax.set_ylabel(label)
    if log:  # a log axis needs a positive value to draw; without one the axis stays linear and says why
        drawn = ([np.asarray(line.get_ydata(), dtype=float) for line in ax.lines] if lines
                 else [np.asarray([bar.get_height() for bar in ax.patches], dtype=float)])
        values = np.concatenate(drawn or [np.empty(0)])
        if np.any(values > 0):
            ax.set_yscale("log")
        else:
            ax.set_ylabel(f"{label}\n(linear: no positive value for a log scale)")
    outside_legend(fig, [ax], ncols=3)
    return set_caption(fig, figure_caption(f"{title} (metrics.jsonl key {key}) over the rounds training logged "
                                           "it", runs, span, notes=[seed_note(seed_groups)]))


def plot_metric_over_rounds(runs: RunsLike, key: str, out: str | Path, ylabel: str | None = None, *,
                            log: bool = False) -> Path:
    """Any metrics.jsonl key over rounds (flatness_distance, train_loss, update_norm, ...), one line per
    run."""
    return save_figure(metric_figure(runs, key, ylabel, log=log), out)


# -- FedNSAM Fig. 2: flatness distance and global sharpness ------------------------------------------------


def flatness_and_sharpness_figure(runs: RunsLike, *, rho: float | None = None) -> Figure:
    runs = as_runs(runs)
    require_metric(runs, "flatness_distance")
    require_passes(runs, ["sharpness", "hessian"])
    rho = choose_rho(runs, rho)
    fig = new_figure(14, 4.4)
    ax_d, ax_s, ax_l = fig.subplots(1, 3)
    seed_groups = groups(runs)
    span_d, _ = _over_rounds_or_by_run(ax_d, seed_groups, lambda run: run.series("flatness_distance"),
                                       r"(a) flatness distance $\Delta_D$ (online)")
    span_s, _ = _over_rounds_or_by_run(ax_s, seed_groups, lambda run: global_sharpness_series(run, rho),
                                       rf"(b) global sharpness $S_\rho(x^t)$, $\rho$ = {rho:g}", marker="o", ms=6)
    span_l, _ = _over_rounds_or_by_run(ax_l, seed_groups, lambda_max_series,
                                       r"(c) top Hessian eigenvalue $\lambda_1(x^t)$", marker="s", ms=6)
    ax_d.set_ylabel(r"$\Delta_D$ = mean$_i \|y_{i,K}^t - \bar y^t\|^2$")
    ax_s.set_ylabel(r"$S_\rho$ = max$_{\|e\| \leq \rho}\, F(x+e) - F(x)$ (nats)")
    ax_l.set_ylabel(r"$\lambda_1(\nabla^2 F)$")
    outside_legend(fig, [ax_d, ax_s, ax_l], ncols=4, fontsize="medium")
    what = (f"FedNSAM Fig. 2: (a) the flatness distance Delta_D = mean_i ||y_i,K - y_bar||^2 that training logs "
            f"every round; (b) the global sharpness S_rho(x^t), the largest rise of F within radius rho = {rho:g} "
            "of x^t (sharpness pass); (c) the top Hessian eigenvalue lambda_1(x^t) of the global loss (hessian pass)")
    return set_caption(fig, figure_caption(what, runs, [f"(a) {span_d}", f"(b) {span_s}", f"(c) {span_l}"],
                                           outputs=["sharpness", "hessian"], notes=[seed_note(seed_groups)]))


def plot_flatness_and_sharpness(runs: RunsLike, out: str | Path, *, rho: float | None = None) -> Path:
    """FedNSAM Fig. 2: (a) Delta_D over rounds from metrics.jsonl; (b) S_rho(x^t) (sharpness pass) and (c)
    lambda_1(x^t) (hessian pass) at each analysed round (by run where the runs have one analysed round)."""
    return save_figure(flatness_and_sharpness_figure(runs, rho=rho), out)


# -- the Hessian figure --------------------------------------------------------------------------------------


# With the clients' dots: each bar on the left of its slot, the dots in a strip on its right, so that the
# bar's value label above it is never under a dot.
BAR_BESIDE_DOTS = (-0.15, 0.5)  # (the bar's offset from its slot's centre, its width)
CLIENT_STRIP = (0.3, 0.08)  # (the dots' offset from the slot's centre, half their strip's width)


def _seed_bars(ax: Any, groups_values: Sequence[tuple[SeedGroup, list[float]]], *, shift: float = 0.0,
               width: float = 0.8) -> bool:
    """One bar per group (at its slot + ``shift``): its value (one seed, labelled as before) or the mean over
    seeds with a +-SE error bar, each seed's value as a hollow dot and "mean +- SE" above. Returns whether
    seed dots were drawn."""
    x = np.arange(len(groups_values)) + shift
    stats = [mean_se(values) for _, values in groups_values]
    bars = ax.bar(x, [mean for mean, _, _ in stats], width=width, color=[g.colour for g, _ in groups_values],
                  alpha=0.85)
    ax.bar_label(bars, labels=[f"{mean:.3g}" if se is None else "" for mean, se, _ in stats], padding=2)
    dots = False
    for i, ((mean, se, n), (_, values)) in zip(x, zip(stats, groups_values)):
        if se is None:
            continue
        ax.errorbar([i], [mean], yerr=[se], color="black", capsize=5, lw=1.2, zorder=3)
        ax.scatter(i + np.linspace(-0.15, 0.15, n) * width, values, s=22, facecolor="white",
                   edgecolor="black", zorder=4, label="each seed" if not dots else None)
        dots = True
        top = max(mean + se, *values)
        # two short lines, so that the labels of neighbouring bars never run into each other
        ax.annotate(f"{mean:.3g}\n± {se:.2g}", (i, top), xytext=(0, 4), textcoords="offset points",
                    ha="center", va="bottom", fontsize="small", linespacing=1.0)
    return dots


def _client_dots(ax: Any, grouped: Sequence[tuple[SeedGroup, list[HessianSummary]]]) -> None:
    """Every seed's clients' local lambda_max as black dots in a strip beside the group's bar
    (``CLIENT_STRIP``)."""
    offset, half = CLIENT_STRIP
    shown_clients = False
    for i, (_, members) in enumerate(grouped):
        local = np.concatenate([s.client_lambda_max for s in members])  # every seed's clients
        if local.size:
            jitter = np.linspace(-half, half, local.size) if local.size > 1 else 0.0
            ax.scatter(i + offset + jitter, local, s=12, color="black", zorder=3,
                       label=r"clients' $\lambda_{max}(\nabla^2 F_i)$" if not shown_clients else None)
            shown_clients = True


def _tick_label(text: str, bars: int) -> str:
    """A bar's tick label wrapped at spaces to its slot's width (~48 characters over a panel), so that the
    labels of neighbouring bars never meet."""
    return "\n".join(textwrap.wrap(text, max(10, 48 // max(bars, 1)), break_on_hyphens=False)) or text


def hessian_figure(runs: RunsLike, *, round: int | None = None) -> Figure:
    summaries = hessian_summaries(runs, round)
    grouped = by_seed_group(summaries)
    fig = new_figure(15, 4.8)
    ax_max, ax_ratio, ax_density = fig.subplots(1, 3, width_ratios=[1, 1, 1.6])
    x = np.arange(len(grouped))
    rounds = {s.round for s in summaries}
    same_round = len(rounds) == 1  # then the round goes in the title, once

    def tick(group: SeedGroup, members: list[HessianSummary]) -> str:
        text = _tick_label(group.label, len(grouped)) + (f"\n(n={group.n})" if group.n > 1 else "")
        if not same_round:
            text += "\n" + rounds_text(sorted({s.round for s in members}))
        return text

    ticks = [tick(g, members) for g, members in grouped]
    shown_clients = any(s.client_lambda_max.size for s in summaries)
    shift, width = BAR_BESIDE_DOTS if shown_clients else (0.0, 0.8)
    _seed_bars(ax_max, [(g, [s.values[0] for s in members]) for g, members in grouped], shift=shift, width=width)
    _client_dots(ax_max, grouped)
    ax_max.set_title(r"(a) $\lambda_{max}(\nabla^2 F)$ (lower: flatter)"
                     + ("\n" + r"bars; dots: the clients' local $\lambda_{max}$" if shown_clients else ""))
    ax_max.set_ylabel(r"$\lambda_{max}$")
    ks = sorted({s.values.size for s in summaries})
    k_text = str(ks[0]) if len(ks) == 1 else "k"
    _seed_bars(ax_ratio, [(g, [s.ratio for s in members]) for g, members in grouped])
    # Not "lower: flatter": a run can have the smaller ratio and the larger lambda_max (panel a).
    ax_ratio.set_title(rf"(b) eigenvalue ratio $\lambda_1 / \lambda_{{{k_text}}}$"
                       + "\n(the FedSAM paper's proxy)")
    ax_ratio.set_ylabel(rf"$\lambda_1 / \lambda_{{{k_text}}}$")
    for ax in (ax_max, ax_ratio):
        tilt = len(grouped) > 3
        ax.set_xticks(x, ticks, rotation=30 if tilt else 0, ha="right" if tilt else "center",
                      rotation_mode="anchor", fontsize="small")
        ax.margins(y=0.15)  # room for the values above the bars
        ax.grid(axis="y", alpha=0.3)
    # several seeds: each a thin line of the group's colour, one legend entry
    density_axes(ax_density, [(s.grid, s.density, {
        "color": group.colour, "lw": 0.9 if group.n > 1 else None,
        "label": (group.legend if same_round else f"{group.legend} (round {s.round})")
        if k == 0 or not same_round else None}) for group, members in grouped for k, s in enumerate(members)],
        density_floor([s.density for s in summaries]))
    several = any(g.n > 1 for g, _ in grouped)
    if same_round:
        fig.suptitle(f"Hessian of the global loss at round {summaries[0].round}")
    ax_density.set_title("(c) Hessian spectral density (SLQ)")
    outside_legend(fig, [ax_max, ax_ratio, ax_density], ncols=4)
    what = ("The Hessian of the global loss F: (a) its largest eigenvalue lambda_max (Lanczos) per run"
            + (", the clients' local lambda_max(Hessian of F_i) as dots beside each bar" if shown_clients else "")
            + f"; (b) the ratio lambda_1 / lambda_{k_text}; (c) its spectral density (stochastic Lanczos "
            "quadrature), log scale (hessian pass)")
    runs_drawn = [s.run for s in summaries]
    return set_caption(fig, figure_caption(
        what, runs_drawn, rounds_span(rounds) + ("" if same_round else " (each bar's under it)"),
        outputs=["hessian"], notes=["bars: mean over seeds +- standard error, each seed a hollow dot"
                                    if several else ""]))


def plot_hessian_summary(runs: RunsLike, out: str | Path, *, round: int | None = None) -> Path:
    """lambda_max (with the clients' local lambda_max) and lambda_1 / lambda_k per run, and the spectral
    densities on a log scale, from each run's hessian pass (latest analysed round unless ``round``)."""
    return save_figure(hessian_figure(runs, round=round), out)


# -- flatness incompatibility --------------------------------------------------------------------------------

# result key (extract.INCOMPATIBILITY_PARTS) -> (legend label, style)
_INCOMPATIBILITY_LINES = {
    "incompatibility": (r"$\Delta_{FI}$ = mean$_i$ E$_B\|e_i^B - e^*\|^2$",
                        {"color": "black", "marker": "o", "lw": 2}),
    "heterogeneity": (r"heterogeneity mean$_i\|e_i - e^*\|^2$", {"color": "C0", "marker": "s"}),
    "batch_part": (r"batch part mean$_i$ E$_B\|e_i^B - e_i\|^2$", {"color": "C1", "marker": "^"}),
    "cross": ("2 × cross term", {"color": "C2", "marker": "v", "ls": "--"}),
}


_INCOMPATIBILITY_TICKS = [r"$\Delta_{FI}$", "heterogeneity", "batch part", "2 × cross"]  # the parts as bars


def incompatibility_figure(runs: RunsLike) -> Figure:
    runs = as_runs(runs)
    require_passes(runs, ["incompatibility"])
    seed_groups = groups(runs)
    cols = min(len(seed_groups), 3)
    rows = math.ceil(len(seed_groups) / cols)
    fig = new_figure(4.8 * cols + 0.5, 3.8 * rows + 0.8)
    axes = np.atleast_1d(fig.subplots(rows, cols, sharey=True, squeeze=False)).ravel()
    series = {id(run): incompatibility_series(run) for run in runs}
    # over rounds where some run has two analysed rounds or more; else each panel the parts as bars
    over = any(len(set(data["rounds"].tolist())) >= 2 for data in series.values())
    every: set[int] = set()
    for ax, group in zip(axes, seed_groups):
        data = [series[id(run)] for run in group.runs]
        by_run = {id(run): series[id(run)] for run in group.runs}
        drawn: set[int] = set()
        for part, (key, se_key, _) in enumerate(INCOMPATIBILITY_PARTS):
            label, style = _INCOMPATIBILITY_LINES[key]
            if group.n == 1:  # one seed: the pass's Monte-Carlo standard error
                rounds, values = data[0]["rounds"], data[0][key]
                error = data[0][se_key] if se_key else None
            else:  # several: the mean over seeds and its standard error
                rounds, values, error, _ = series_mean(
                    group, lambda run, k=key, d=by_run: (d[id(run)]["rounds"], d[id(run)][k]))
            drawn |= {int(r) for r in rounds}
            if over:
                ax.errorbar(rounds, values, yerr=error, capsize=3, ms=5, label=label, **style)
            elif len(values):
                ax.bar([part], [values[-1]], yerr=None if error is None else [error[-1]], capsize=3,
                       color=style["color"], alpha=0.85, label=label)
        every |= drawn
        ax.axhline(0.0, color="grey", lw=0.8)
        rhos = sorted({float(r) for d in data for r in d["rho"]})
        rho_text = ", ".join(f"{r:g}" for r in rhos)
        title = rf"{group.legend} ($\rho$ = {rho_text}, $\Delta_{{FI}} \leq 4\rho^2$)"
        if over:
            round_axis(ax, drawn)
        else:
            ax.set_xticks(range(len(INCOMPATIBILITY_PARTS)), _INCOMPATIBILITY_TICKS, fontsize="small")
            ax.grid(axis="y", alpha=0.3)
            title += f"\nat {rounds_span(drawn)}"
        ax.set_title(title, fontsize="medium")
    for ax in axes[len(seed_groups):]:
        ax.set_visible(False)
    for ax in axes[::cols]:
        ax.set_ylabel(r"squared perturbation distance $\|\cdot\|^2$")
    several = any(g.n > 1 for g in seed_groups)
    bars = ("error bars: standard error over seeds (n > 1), Monte-Carlo standard error (one seed)"
            if several and any(g.n == 1 for g in seed_groups)
            else "mean over seeds, error bars: standard error over seeds" if several
            else "error bars: Monte-Carlo standard error")
    fig.suptitle(r"Flatness incompatibility $\Delta_{FI}$ = heterogeneity + batch part + 2 × cross")
    outside_legend(fig, list(axes[:1]), ncols=4)
    what = ("The flatness incompatibility Delta_FI = mean_i E_B ||e_i^B - e*||^2 of each run and its split into "
            "the clients' heterogeneity, the minibatch part and twice the cross term (incompatibility pass)")
    span = rounds_span(every) + ("" if over else " only: each part drawn as a bar, not over rounds")
    return set_caption(fig, figure_caption(what, runs, span, outputs=["incompatibility"], notes=[bars]))


def plot_incompatibility(runs: RunsLike, out: str | Path) -> Path:
    """Delta_FI over the analysed rounds per run (one panel each, shared y), with its heterogeneity, batch
    part and 2 x cross term, error bars from the passes' standard errors."""
    return save_figure(incompatibility_figure(runs), out)


# -- gradient alignment ------------------------------------------------------------------------------------


def _client_ticks(ax: Any, clients: list[int]) -> None:
    step = max(1, math.ceil(len(clients) / 20))
    positions = list(range(0, len(clients), step))
    ax.set_xticks(positions, [str(clients[p]) for p in positions], fontsize="small")
    ax.set_yticks(positions, [str(clients[p]) for p in positions], fontsize="small")


def alignment_figure(runs: RunsLike, *, round: int | None = None) -> Figure:
    """Heatmaps of C_ij = cos(grad F_i, grad F_j), all on the one colour scale [-1, 1] with one colour bar;
    several seeds of a configuration: the mean matrix over them (n in the title)."""
    matrices = alignment_matrices(runs, round)
    grouped = by_seed_group(matrices)
    cols = min(len(grouped), 4)
    rows = math.ceil(len(grouped) / cols)
    fig = new_figure(3.9 * cols + 1.2, 3.9 * rows + 0.6)
    axes = np.atleast_1d(fig.subplots(rows, cols, squeeze=False)).ravel()
    norm = Normalize(vmin=-1.0, vmax=1.0)
    image = None
    for ax, (group, members) in zip(axes, grouped):
        shapes = {m.matrix.shape for m in members}
        if len(shapes) > 1:
            sizes = ", ".join(f"{a}x{b}" for a, b in sorted(shapes))
            raise LandscapeError(f"the seeds of {group.label} ({group.name}) have alignment matrices of "
                                 f"different sizes ({sizes}); analyse them with the same alignment.clients")
        cosines = mean_cosines(members)
        matrix, off, off_se = cosines.matrix, cosines.off_diagonal, cosines.off_diagonal_se
        same_clients = all(m.clients == members[0].clients for m in members)
        clients = members[0].clients if same_clients else list(range(len(matrix)))
        image = ax.imshow(matrix, cmap=COSINE_CMAP, norm=norm, interpolation="nearest")
        _client_ticks(ax, clients)
        if len(clients) <= 8:
            for (i, j), v in np.ndenumerate(matrix):
                ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize="x-small",
                        color="white" if abs(v) > 0.6 else "black")
        which = "client" if same_clients else "client (position: the seeds analysed other clients)"
        ax.set_xlabel(f"{which} j")
        ax.set_ylabel(f"{which} i")
        when = rounds_text(cosines.rounds)
        if group.n == 1:
            head = f"{group.label}, {when}\nmean off-diagonal = {off:.3f}"
        else:
            head = (f"{group.label}, {when}, mean of n={group.n} seeds\n"
                    f"mean off-diagonal = {off:.3f} ± {off_se:.2g}")
        ax.set_title(head, fontsize="medium")
    for ax in axes[len(grouped):]:
        ax.set_visible(False)
    fig.colorbar(image, ax=list(axes[: len(grouped)]), label=r"$\cos(\nabla F_i, \nabla F_j)$", shrink=0.85)
    fig.suptitle("Client gradient alignment")
    what = ("The cosines cos(grad F_i, grad F_j) of the clients' full-batch gradients at the global model, on one "
            "colour scale [-1, 1] (alignment pass)" + ("; several seeds: the mean matrix" if any(
                g.n > 1 for g, _ in grouped) else ""))
    return set_caption(fig, figure_caption(what, [m.run for m in matrices], rounds_span(m.round for m in matrices),
                                           outputs=["alignment"]))


def plot_alignment_heatmaps(runs: RunsLike, out: str | Path, *, round: int | None = None) -> Path:
    """Client x client gradient cosines side by side on one diverging colour scale [-1, 1], one colour bar,
    client ids on the axes (alignment pass, latest analysed round unless ``round``)."""
    return save_figure(alignment_figure(runs, round=round), out)
