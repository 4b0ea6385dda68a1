"""The report's plotly layout: plot sizes, titles wrapped to the width a plot has at the narrowest window the
report is made for (``NARROW_PX``, a 900 px window; subplot titles to their panel's share of it), so that no two
titles meet at any wider window, and axes of rounds with whole-number ticks."""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from landscape.figures.labels import wrap_title

PLOT_HEIGHT = 430
# The plot's width at the narrowest window the report is laid out for (900 px: the page's padding and scroll bar
# take the rest); titles are wrapped to fit it, so they fit every wider window too.
NARROW_PX = 800
MARGIN_L, MARGIN_R = 60, 20
COLORBAR_PX = 110  # the width a colour bar takes from the panels (plotly widens the right margin for it)
TITLE_PX, SUBPLOT_TITLE_PX = 16, 13  # font sizes
CHAR_EM = 0.62  # a character's mean width in em, of the widest usual sans-serif fonts (DejaVu Sans)
LINE_EM = 1.4  # a title line's height in em
MIN_TITLE_CHARS = 14


def title_chars(width_px: float, font_px: float) -> int:
    """How many characters of ``font_px`` fit in ``width_px``."""
    return max(MIN_TITLE_CHARS, int(width_px / (CHAR_EM * font_px)))


def round_axes(fig: Any) -> None:
    """Whole-number round ticks on each x axis of rounds, from the rounds drawn on that axis (a categorical
    axis, a chart by run, is left alone): a span of up to 10 rounds every round, a longer one plotly's own
    round steps; one round (only in a panel beside one over rounds) that tick alone."""
    drawn: dict[str, list[float]] = {}
    for trace in fig.data:
        if trace.x is not None:
            drawn.setdefault(trace.xaxis or "x", []).extend(float(v) for v in np.atleast_1d(trace.x)
                                                             if isinstance(v, (int, float, np.number)))
    for axis, xs in drawn.items():
        name = f"xaxis{axis[1:]}"
        if not xs or fig.layout[name].type == "category":
            continue
        low, high = min(xs), max(xs)
        if high == low:
            ticks: dict[str, Any] = {"tickmode": "array", "tickvals": [low], "range": [low - 1, low + 1]}
        else:
            ticks = {"tickformat": "d", **({"dtick": 1} if high - low <= 10 else {})}
        fig.update_layout({name: ticks})


def wrap_to(title: str, width: int) -> str:
    """``labels.wrap_title`` (lines broken at spaces), and a line that is still longer (one long word: a run
    directory's name) broken after its hyphens or underscores."""
    lines = []
    for line in wrap_title(title, width).split("<br>"):
        if len(line) <= width or "<" in line or "&" in line:
            lines.append(line)
            continue
        current = ""
        for piece in re.split(r"(?<=[-_])", line):
            if current and len(current) + len(piece) > width:
                lines.append(current)
                current = ""
            current += piece
        lines.append(current)
    return "<br>".join(lines)


def panel_width(fig: Any, x: float, plot_px: float) -> float:
    """The width in px, at a plot ``plot_px`` wide, of the subplot whose title is centred at paper ``x``."""
    for axis in fig.layout:
        if axis.startswith("xaxis") and fig.layout[axis].domain is not None:
            low, high = fig.layout[axis].domain
            if abs((low + high) / 2 - x) < 1e-6:
                return (high - low) * plot_px
    return plot_px


def figure_layout(fig: Any, title: str, *, rounds: bool = True, plot_height: int = PLOT_HEIGHT, **more: Any) -> Any:
    """Shared look; ``rounds``: the x axes count rounds (``round_axes``). The title and the subplot titles are
    wrapped to the width they have at the narrowest window (``NARROW_PX``), each subplot title to its own
    panel's, and the title sits at the top with room below it for every line of the subplot titles."""
    titles = [a for a in (fig.layout.annotations or ()) if a.text and a.yanchor == "bottom"]
    plot_px = NARROW_PX - MARGIN_L - MARGIN_R - (COLORBAR_PX if has_colorbar(fig) else 0)
    for annotation in titles:  # make_subplots' titles: bottom-anchored above each subplot
        annotation.text = wrap_to(annotation.text, title_chars(panel_width(fig, annotation.x, plot_px), SUBPLOT_TITLE_PX))
        annotation.font.size = SUBPLOT_TITLE_PX
    title = wrap_title(title, title_chars(NARROW_PX - MARGIN_L - MARGIN_R, TITLE_PX))
    below = max((a.text.count("<br>") + 1 for a in titles), default=0)
    top = round(16 + LINE_EM * TITLE_PX * (title.count("<br>") + 1) + LINE_EM * SUBPLOT_TITLE_PX * below + 14)
    layout = {"title": {"text": title, "y": 1, "yref": "container", "yanchor": "top", "pad": {"t": 16},
                        "font": {"size": TITLE_PX}},
              "height": plot_height + max(0, top - 60), "template": "plotly_white",
              "margin": {"l": MARGIN_L, "r": MARGIN_R, "t": max(60, top), "b": 50},
              "legend": {"orientation": "h", "y": -0.2}}
    fig.update_layout({**layout, **more})
    if rounds:
        round_axes(fig)
    return fig


def has_colorbar(fig: Any) -> bool:
    return any(getattr(trace, "coloraxis", None) or trace.type == "heatmap" for trace in fig.data)
