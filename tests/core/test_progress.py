"""Progress bars (landscape.core.progress): tqdm's on a terminal; off one, plain lines, at most one every
LINE_SECONDS and the last state, never a carriage-return redraw."""

from __future__ import annotations

import io

from landscape.core import line_bar
from landscape.core.line_bar import LINE_SECONDS
from landscape.core.progress import progress_bar


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_off_a_terminal_a_bar_is_a_few_lines_not_redraws(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(line_bar.time, "monotonic", clock)
    out = io.StringIO()
    bar = progress_bar(total=1000, desc="work", unit="step", file=out, mininterval=0)
    assert isinstance(bar, line_bar.LineBar)
    for _ in range(500):  # fast work: no line before LINE_SECONDS have passed
        bar.update(1)
        bar.set_postfix(loss=1.0)
    clock.now += LINE_SECONDS
    bar.update(1)  # a line, then none until LINE_SECONDS more
    bar.update(1)
    bar.close()
    text = out.getvalue()
    lines = text.splitlines()
    assert "\r" not in text and text.endswith("\n")
    assert len(lines) == 3, lines  # the start, one after LINE_SECONDS, the end
    assert "0/1000" in lines[0] and "501/1000" in lines[1] and "502/1000" in lines[2]


def test_a_bar_that_does_not_stay_ends_without_a_line_and_a_terminal_gets_tqdm(monkeypatch):
    out = io.StringIO()
    bar = progress_bar(total=10, desc="inner", file=out, leave=False, mininterval=0)
    bar.update(10)
    bar.close()
    assert out.getvalue().count("\n") == 1  # its first line only

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    terminal = Terminal()
    bar = progress_bar(total=3, desc="t", file=terminal)
    assert not isinstance(bar, line_bar.LineBar)
    bar.update(3)
    bar.close()
    assert "\r" in terminal.getvalue()  # tqdm's own redraws, where they belong
    assert progress_bar(total=3, file=io.StringIO(), disable=True).disable
