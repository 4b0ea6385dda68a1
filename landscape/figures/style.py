"""The axes the matplotlib curve figures share: a constrained-layout Figure, a rounds axis with whole-number
ticks, a seed group drawn over rounds (one seed a line; several their mean with a +-SE band) and its caption
note, and the one legend of a figure, outside its axes (``outside_legend``: below them, never over the data).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from landscape.figures.seeds import SeedGroup, series_mean


def new_figure(width: float, height: float) -> Figure:
    """A Figure of ``width`` x ``height`` inches with constrained layout (drawn on Agg by ``save_figure``)."""
    return Figure(figsize=(width, height), layout="constrained")


def round_axis(ax: Any, rounds: set[int] | None = None) -> None:
    """A rounds axis with whole-number ticks; ``rounds``: the rounds drawn there, and when that is one round,
    that round alone in the middle (points, not a line on a fractional axis)."""
    ax.set_xlabel("round")
    ax.grid(alpha=0.3)
    if rounds is not None and len(rounds) == 1:
        (only,) = rounds
        ax.set_xticks([only])
        ax.set_xlim(only - 1, only + 1)
        return
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _marker(points: int) -> str | None:
    return "o" if points <= 40 else None


def over_rounds(ax: Any, group: SeedGroup, series: Any, *, marker: str | None = None, ms: float = 3,
                scale: float = 1.0, legend: bool = True) -> set[int]:
    """The group's ``series(run) -> (rounds, values)`` over rounds: one seed its line as before; several their
    mean with a +-SE band (an error bar at a single round). A single round is drawn as a point. Returns the
    rounds drawn."""
    rounds, mean, se, _ = series_mean(group, series)
    if rounds.size == 0:
        return set()
    shown = marker if marker is not None else _marker(len(rounds))
    style = {"color": group.colour, "label": group.legend if legend else None, "ms": ms,
             "marker": (shown or "o") if len(rounds) == 1 else shown}
    if se is not None and len(rounds) == 1:
        ax.errorbar(rounds, scale * mean, yerr=scale * se, capsize=4, ls="none", **style)
    else:
        ax.plot(rounds, scale * mean, ls="none" if len(rounds) == 1 else "-", **style)
        if se is not None:
            ax.fill_between(rounds, scale * (mean - se), scale * (mean + se), color=group.colour, alpha=0.2,
                            lw=0)
    return {int(r) for r in rounds}


def outside_legend(fig: Figure, axes: Sequence[Any], *, ncols: int = 4, fontsize: str = "small") -> Any:
    """One legend for ``axes``, below them outside every axes (constrained layout makes room), each label once
    (the first handle that has it); None when nothing is labelled. Figures put their legends here, never over
    their data."""
    handles: dict[str, Any] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    if not handles:
        return None
    return fig.legend(list(handles.values()), list(handles), loc="outside lower center",
                      ncols=min(len(handles), ncols), fontsize=fontsize)


def seed_note(seed_groups: Sequence[SeedGroup]) -> str:
    """A caption for figures that aggregate seeds ('' when every group is one run)."""
    return "mean over seeds, band / bars: standard error" if any(g.n > 1 for g in seed_groups) else ""
