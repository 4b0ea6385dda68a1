"""Progress bars that suit where they are written: tqdm's bar on a terminal (or its widget in a notebook);
elsewhere (output redirected to a file or a pipe, a CI log) a plain line every few seconds
(``landscape.core.line_bar.LINE_SECONDS``) and one when the bar ends, never a redraw (tqdm writes its redraws with carriage returns, which fill a log file with copies).

Every bar of the package is made by :func:`progress_bar`, with tqdm's arguments; tqdm is imported only where a
bar is made. Work whose whole amount is known before it starts counts itself in a :class:`Budget`, which reports
``progress(done, total)`` (the callback the analysis's work bar takes), so that its bar has a total and a time left.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any


def progress_bar(**kwargs: Any) -> Any:
    """A tqdm bar (``tqdm(**kwargs)``) on a terminal or in a notebook; elsewhere a line bar
    (``landscape.core.line_bar.LineBar``)."""
    from tqdm.auto import tqdm as auto_bar  # tqdm's widget in a notebook, its terminal bar elsewhere

    stream = kwargs.get("file") or sys.stderr
    on_terminal = bool(getattr(stream, "isatty", lambda: False)())
    if kwargs.get("disable") or "notebook" in auto_bar.__module__ or on_terminal:
        return auto_bar(**kwargs)
    from landscape.core.line_bar import LineBar

    return LineBar(**kwargs)


class Budget:
    """A known amount of work, ``total`` units, counted as it is done and reported to ``progress(done, total)``
    (once at the start, with 0, and after each ``advance``). Work that turns out not to be needed (an ascent
    stopped early, a result taken from a cache) is advanced past all the same, so the count ends at the total."""

    def __init__(self, progress: Callable[[int, int | None], None], total: int) -> None:
        self.progress, self.total, self.done = progress, int(total), 0
        progress(0, self.total)

    def advance(self, units: int = 1) -> None:
        self.done += int(units)
        self.progress(self.done, self.total)
