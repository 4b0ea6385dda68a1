"""The HTML report usable at a 900 px window and at a wide one (1600 px), judged in a real browser: every table
that does not fit scrolls inside its own box with a visible cue (its scroll bar, and a shadow at the edge where
columns go on), no two plot titles meet and none runs off its plot, no caption holds a file name, and no panel
over rounds has a single round.

Debian's Chromium driven by Playwright (tests/support/browser.py: a skip without them, a failure under
LANDSCAPE_REQUIRE_BROWSER=1), with its scroll bars drawn as a reader sees them. Two reports over test_report's
analysed FedAvg run (built once per session): the run with two copies analysed at round 3 only (three heatmaps
side by side, the widest comparison table, a 3D loss surface and a 1D loss line), and the two copies alone (every analysis panel a chart by run at
round 3). Screenshots at both widths are left in the test's tmp_path.
"""

from __future__ import annotations

import shutil
from io import BytesIO
from pathlib import Path

import numpy as np
import pytest
from support.browser import (
    CHROMIUM_ARGS,
    TITLE_BOXES,
    chromium_path,
    intersecting,
    only_file_urls,
    plots_fit_their_boxes,
)
from test_report import FILE_NAME, run  # noqa: F401 (run: the analysed FedAvg run)

from landscape.figures.report import build as report

WIDTHS = (900, 1600)
DRAWN = "() => [...document.querySelectorAll('.plot')].every(d => d.querySelector('.main-svg'))"
# Each table's scrolling box: how much it hides, whether and how it scrolls (overflow, the scroll bar's height,
# its colours, the backgrounds that draw the edge shadows); and whether the page itself got wider than the window.
TABLES = """() => ({page: document.documentElement.scrollWidth, window: document.documentElement.clientWidth,
    tables: [...document.querySelectorAll('table')].map((t, index) => {
        const box = t.closest('.scroll') || t, style = getComputedStyle(box);
        return {index, hidden: box.scrollWidth - box.clientWidth, overflow: style.overflowX,
                bar: box.offsetHeight - box.clientHeight, colours: style.scrollbarColor,
                images: style.backgroundImage, attachment: style.backgroundAttachment,
                head: t.querySelector('th') ? t.querySelector('th').innerText.slice(0, 30) : ''};
    })})"""
# Every x axis titled "round": the distinct rounds its traces draw.
ROUND_AXES = """() => [...document.querySelectorAll('.plot')].flatMap(d => {
    const axes = {};
    for (const trace of d._fullData || []) {
        const name = 'xaxis' + ((trace.xaxis || 'x').slice(1));
        const axis = d._fullLayout[name];
        if (!axis || !axis.title || axis.title.text !== 'round') continue;
        (axes[name] = axes[name] || new Set());
        for (const x of Array.from(trace.x || [])) if (typeof x === "number") axes[name].add(x);
    }
    return Object.entries(axes).map(([axis, rounds]) => ({plot: d.dataset.name, axis, rounds: rounds.size}));
})"""
CAPTIONS = "() => [...document.querySelectorAll('figcaption')].map(c => c.innerText)"


@pytest.fixture(scope="module")
def reports(run, tmp_path_factory) -> dict[str, Path]:  # noqa: F811
    """'runs': the analysed run and two copies analysed at round 3 only; 'one round': the two copies."""
    root = tmp_path_factory.mktemp("report-layout")
    copies = []
    for name in ("second-run", "third-run"):
        shutil.copytree(run, root / name)
        shutil.rmtree(root / name / "analysis" / "round-0002")
        copies.append(root / name)
    x = np.linspace(-1.0, 1.0, 5)  # a 2D surface (a 3D plot with its own title) and a 1D line of the second run
    np.savez(copies[0] / "analysis" / "round-0003" / "surface.npz", x_coords=x, y_coords=x,
             loss=np.add.outer(x**2, 2 * x**2) + 1.0)
    np.savez(copies[0] / "analysis" / "round-0003" / "surface-interpolate.npz", x_coords=x, loss=x**2 + 1.0)
    return {"runs": report.write_report([run, *copies], root / "runs.html"),
            "one round": report.write_report(copies, root / "one-round.html")}


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """A Chromium page that may load nothing but file: and data: URLs, scroll bars drawn; the requests it was
    refused and its page errors, for the tests to check."""
    from playwright.sync_api import sync_playwright

    path = chromium_path()
    seen = {"offsite": [], "page_errors": []}
    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            tmp_path_factory.mktemp("report-profile"), executable_path=path, headless=True, args=CHROMIUM_ARGS,
            timeout=60_000, viewport={"width": WIDTHS[0], "height": 900}, service_workers="block",
            ignore_default_args=["--hide-scrollbars"])
        try:
            context.route("**/*", only_file_urls(seen["offsite"]))
            page = context.pages[0] if context.pages else context.new_page()
            page.on("pageerror", lambda error: seen["page_errors"].append(str(error)))
            yield page, seen
        finally:
            context.close()


def _edge_shade(page, index: int) -> float:
    """The mean brightness (0-255) of the rightmost 4 px of table ``index``'s box, above its scroll bar."""
    from PIL import Image, ImageStat

    box = page.locator("table").nth(index).locator("xpath=ancestor::div[contains(@class, 'scroll')][1]")
    with Image.open(BytesIO(box.screenshot())) as image:
        rgb = image.convert("L")
        return ImageStat.Stat(rgb.crop((rgb.width - 4, 0, rgb.width, rgb.height - 16))).mean[0]


@pytest.mark.parametrize("which", ["runs", "one round"])
def test_the_report_reads_at_900_and_1600_px(browser, reports, which, tmp_path):
    page, seen = browser
    page.set_viewport_size({"width": WIDTHS[0], "height": 900})
    page.goto(reports[which].as_uri(), wait_until="load", timeout=60_000)
    page.wait_for_function(DRAWN, timeout=30_000)
    overflowing = 0
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 900})
        # plotly's responsive resize follows the window within a moment
        page.wait_for_function(plots_fit_their_boxes(), timeout=10_000)

        tables = page.evaluate(TABLES)
        assert tables["page"] <= tables["window"], tables  # the page never scrolls sideways
        for table in tables["tables"]:
            if table["hidden"] <= 0:
                continue
            overflowing += 1
            # it scrolls in its own box, and says so: a scroll bar drawn in colours of its own, and an edge shadow
            # (fixed to the box) with a cover at the table's end (scrolling with it) that hides it there
            assert table["overflow"] in ("auto", "scroll") and table["bar"] > 0, (width, table)
            assert table["colours"] not in ("", "auto"), (width, table)
            assert table["images"].count("linear-gradient") >= 2, (width, table)
            assert "local" in table["attachment"] and "scroll" in table["attachment"], (width, table)
            # the shadow is painted: the box's right edge is darker while columns go on than once scrolled to
            # the end of the table
            scroller = f"document.querySelectorAll('table')[{table['index']}].closest('.scroll')"
            page.evaluate(f"() => {{ {scroller}.scrollLeft = 0; }}")
            shaded = _edge_shade(page, table["index"])
            page.evaluate(f"() => {{ const b = {scroller}; b.scrollLeft = b.scrollWidth; }}")
            plain = _edge_shade(page, table["index"])
            page.evaluate(f"() => {{ {scroller}.scrollLeft = 0; }}")
            assert plain - shaded > 30, (width, table["head"], shaded, plain)

        boxes = page.evaluate(TITLE_BOXES)
        assert boxes, "no plot titles found"
        assert intersecting(boxes) == [], (width, intersecting(boxes))
        for box in boxes:  # whole, inside its plot
            assert box["left"] >= box["plotLeft"] - 1 and box["right"] <= box["plotRight"] + 1, (width, box)

        found = page.evaluate(CAPTIONS)
        assert found and not [c for c in found if FILE_NAME.search(c)], found
        assert [axis for axis in page.evaluate(ROUND_AXES) if axis["rounds"] < 2] == []
        page.screenshot(path=str(tmp_path / f"report-{width}.png"), full_page=True)  # last: it hides scroll bars
    if which == "runs":
        assert overflowing > 0  # the comparison table is wider than the page at 900 px: the check above ran
    else:
        assert page.evaluate(ROUND_AXES) == [] or all(a["plot"] in ("accuracy", "train_loss", "flatness_distance")
                                                      for a in page.evaluate(ROUND_AXES))
    assert seen["offsite"] == [] and seen["page_errors"] == []
