"""The progress bar off a terminal (``landscape.core.progress.progress_bar`` makes it): tqdm's bar text as
lines, at most one every ``LINE_SECONDS`` and the last state when the bar closes."""

from __future__ import annotations

import time
from typing import Any

from tqdm import tqdm

LINE_SECONDS = 5.0  # at most one progress line per bar this often (and the last one)


class LineBar(tqdm):
    """tqdm's bar as lines: its text on a line of its own at most every LINE_SECONDS, and its last state when it
    closes (a bar that does not stay, ``leave=False``, ends without one). No carriage return, no position."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._line_at = -float("inf")
        self._line_n: float | None = None
        kwargs.update(position=None, dynamic_ncols=False)
        kwargs.setdefault("ncols", 100)
        super().__init__(*args, **kwargs)

    def _line(self) -> None:
        self.fp.write(self.__str__() + "\n")
        self.fp.flush()
        self._line_at, self._line_n = time.monotonic(), self.n

    def display(self, msg: str | None = None, pos: int | None = None) -> bool:
        if msg is None and time.monotonic() - self._line_at >= LINE_SECONDS:
            self._line()
        return True

    def clear(self, nolock: bool = False) -> None:
        """Nothing to clear: lines are never redrawn."""

    def moveto(self, n: int) -> None:
        """Lines have no position."""

    def close(self) -> None:
        if getattr(self, "disable", True):
            return
        if self.leave is not False and self._line_n != self.n:
            self._line()
        self.disable = True
        self._decr_instances(self)
