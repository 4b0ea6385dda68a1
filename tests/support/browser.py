"""Debian's headless Chromium for the browser tests (the report, the documentation site), driven by Playwright for
Python; Playwright's own browser downloads are never used. Without Chromium or Playwright a browser test skips,
unless LANDSCAPE_REQUIRE_BROWSER=1 (CI sets it), where it fails."""

from __future__ import annotations

import os
import shutil

import pytest

REQUIRED = os.environ.get("LANDSCAPE_REQUIRE_BROWSER") == "1"
# Headless without a GPU; no first-run, sync, update or other background traffic: the network is closed here
# and Chromium stalls on refused connections otherwise. SwiftShader gives the report's 3D surface its WebGL.
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--enable-unsafe-swiftshader", "--disable-quic",
                 "--no-first-run", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"]


def unavailable(reason: str) -> None:
    if REQUIRED:
        pytest.fail(f"{reason}, and LANDSCAPE_REQUIRE_BROWSER=1 asks for the browser test")
    pytest.skip(reason)


def chromium_path() -> str:
    """Debian's Chromium, or a skip (a failure under LANDSCAPE_REQUIRE_BROWSER=1)."""
    path = shutil.which("chromium") or ("/usr/bin/chromium" if os.access("/usr/bin/chromium", os.X_OK) else None)
    if path is None:
        unavailable("chromium is not installed (Debian: apt-get install chromium)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        unavailable("playwright for Python is not installed (pip install -e '.[test]')")
    return path


def only_file_urls(offsite: list[str]):
    """A Playwright route handler that lets file: and data: URLs through and aborts (and notes in ``offsite``)
    every other request."""

    def route(route) -> None:
        url = route.request.url
        if url.startswith(("file:", "data:")):
            route.continue_()
        else:
            offsite.append(url)
            route.abort()

    return route


# Every plotly title on a page: each plot's title (.gtitle) and its annotations (make_subplots' subplot titles,
# the 3D surfaces' titles), as boxes in page pixels with the box of the plot they belong to.
TITLE_BOXES = """() => [...document.querySelectorAll('.plot')].flatMap(plot => {
    const outer = plot.getBoundingClientRect();
    return [...plot.querySelectorAll('.gtitle, .annotation-text')].filter(t => t.textContent.trim()).map(t => {
        const r = t.getBoundingClientRect();
        return {plot: plot.dataset.name, text: t.textContent.slice(0, 80), left: r.left, right: r.right, top: r.top,
                bottom: r.bottom, plotLeft: outer.left, plotRight: outer.right};
    });
})"""


def intersecting(boxes: list[dict]) -> list[tuple[str, str, str]]:
    """(plot, text, text) of each two boxes of ``TITLE_BOXES`` of one plot that overlap (by more than a pixel)."""
    found = []
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            if a["plot"] == b["plot"] and min(a["right"], b["right"]) - max(a["left"], b["left"]) > 1 \
                    and min(a["bottom"], b["bottom"]) - max(a["top"], b["top"]) > 1:
                found.append((a["plot"], a["text"], b["text"]))
    return found


def plots_fit_their_boxes() -> str:
    """A page function, true once every plotly plot has been laid out to its box's width (plotly's responsive
    resize follows a change of the window within a moment), or, for a plot of a fixed width (the 3D surfaces),
    fits in its box."""
    return """() => [...document.querySelectorAll('.plot')].every(d => {
        const box = d.getBoundingClientRect().width;
        return d._fullLayout && (d.layout && d.layout.width ? d._fullLayout.width <= box + 1
                                                            : Math.abs(d._fullLayout.width - box) < 2);
    })"""
