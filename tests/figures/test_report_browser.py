"""The HTML report in a real browser: headless Chromium opens the page `landscape report` writes, with the
network closed to it, and every plot draws without a JavaScript error.

Debian's Chromium driven by Playwright (tests/support/browser.py: a skip without them, a failure under
LANDSCAPE_REQUIRE_BROWSER=1). The full-page screenshot is left in the test's tmp_path.
"""

from __future__ import annotations

import shutil
from io import BytesIO
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from support.browser import CHROMIUM_ARGS, chromium_path, only_file_urls
from support.helpers import tiny_recipe
from test_report import ANALYSIS_PLOTS, CURVE_PLOTS, FAST, run  # noqa: F401 (run: the analysed FedAvg run)

from landscape.analyze.catalog import pass_options
from landscape.analyze.scheduler import run_analysis
from landscape.analyze.settings import AnalysisSettings
from landscape.cli import cli
from landscape.figures.report import surfaces as report_surfaces
from landscape.train import loop

SURFACE_PLOTS = {"surface-fedavg-round-2-surface-interpolate", "surface-fedavg-round-3-surface"}  # 1D line, 2D plane
DRAWN = """() => {
    const plots = [...document.querySelectorAll('.plot')];
    return plots.length > 0 && plots.every(d => d.querySelector('.main-svg'));
}"""
PLOT_STATE = """() => [...document.querySelectorAll('.plot')].map(d => ({
    name: d.dataset.name, id: d.id, svgs: d.querySelectorAll('.main-svg').length,
    traces: (d.data || []).length, laidOut: !!d._fullLayout,
    gl3d: !!(d._fullLayout && d._fullLayout.scene), canvases: d.querySelectorAll('canvas').length,
    noWebGL: d.innerText.includes('WebGL is not supported')}))"""
TWO_FRAMES = "() => new Promise(done => requestAnimationFrame(() => requestAnimationFrame(done)))"
WIDTHS = """() => ({page: document.documentElement.scrollWidth, window: document.documentElement.clientWidth,
    tables: [...document.querySelectorAll('table')].map(t => t.closest('.scroll') ?
        Math.ceil(t.closest('.scroll').getBoundingClientRect().right) : null)})"""


@pytest.fixture(scope="module")
def chromium() -> str:
    return chromium_path()


@pytest.fixture(scope="module")
def report_html(chromium, run, tmp_path_factory) -> Path:  # noqa: F811
    """`landscape report` over two runs: the analysed FedAvg run of test_report with a 1D loss line at round 2
    and a 2D surface at round 3, and a FedSAM run with only the hessian and alignment passes at round 3."""
    root = tmp_path_factory.mktemp("browser")
    fedavg, fedsam = root / "fedavg", root / "fedsam"
    shutil.copytree(run, fedavg)
    settings = AnalysisSettings(device="cpu", analysis_samples=100)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: one thread is faster on a busy machine
    try:
        for rounds, surface in (("2", {"directions": "interpolate", "grid": "9"}),
                                ("3", {"directions": "random", "grid": "9", "span": "-1:1"})):
            run_analysis(fedavg, rounds=rounds, passes=["surface"], options={"surface": pass_options("surface", surface)},
                         settings=settings, progress=False)
        loop.start_run(tiny_recipe(algorithm__name="fedsam", train__rounds=3, model__name="mlp", model__hidden=[16]),
                       fedsam, progress=False)
        run_analysis(fedsam, rounds="3", passes=["hessian", "alignment"],
                     options={name: pass_options(name, FAST[name]) for name in ("hessian", "alignment")},
                     settings=settings, progress=False)
    finally:
        torch.set_num_threads(threads)
    out = root / "report.html"
    result = CliRunner().invoke(cli, ["report", str(fedavg), str(fedsam), "-o", str(out)])
    assert result.exit_code == 0, result.output
    return out


def test_the_report_draws_every_plot_in_chromium_without_errors(chromium, report_html, tmp_path):
    from PIL import Image, ImageStat
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import sync_playwright

    assert report_surfaces.surface_renderer() is not None
    expected = CURVE_PLOTS | ANALYSIS_PLOTS | SURFACE_PLOTS
    page_errors: list[str] = []
    console_errors: list[str] = []
    offsite: list[str] = []

    shot = tmp_path / "report.png"
    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            tmp_path / "profile", executable_path=chromium, headless=True, args=CHROMIUM_ARGS, timeout=60_000,
            viewport={"width": 1400, "height": 900}, service_workers="block")
        try:
            context.route("**/*", only_file_urls(offsite))
            page = context.pages[0] if context.pages else context.new_page()
            page.on("pageerror", lambda error: page_errors.append(str(error)))
            page.on("console", lambda message: console_errors.append(message.text)
                    if message.type == "error" else None)
            page.goto(report_html.as_uri(), wait_until="load", timeout=60_000)
            try:
                page.wait_for_function(DRAWN, timeout=30_000)
            except PlaywrightTimeout:
                undrawn = [p["name"] for p in page.evaluate(PLOT_STATE) if not p["svgs"]]
                pytest.fail(f"plots not drawn in 30 s: {undrawn}; page errors {page_errors}; "
                            f"console errors {console_errors}; requests off the page {offsite}")
            page.evaluate(TWO_FRAMES)  # let the WebGL scene paint before the screenshots
            plots = page.evaluate(PLOT_STATE)
            surface_pixels = page.locator("#plot-surface-fedavg-round-3-surface").screenshot()
            page.screenshot(path=str(shot), full_page=True)
            widths = []  # at a narrow window too: tables scroll in their own box, never the page sideways
            for width in (1400, 900):
                page.set_viewport_size({"width": width, "height": 900})
                try:  # the plots follow the window (plotly's responsive resize) within a moment
                    page.wait_for_function("() => document.documentElement.scrollWidth <= "
                                           "document.documentElement.clientWidth", timeout=10_000)
                except PlaywrightTimeout:
                    pass  # the assertion below says how wide the page is
                widths.append(page.evaluate(WIDTHS))
        finally:
            context.close()

    assert offsite == []  # self-contained: nothing but the file itself (and data: URLs)
    assert page_errors == []
    assert console_errors == []
    names = [p["name"] for p in plots]
    assert len(names) == len(set(names)) and set(names) == expected
    for plot in plots:
        assert plot["id"] == f"plot-{plot['name']}", plot
        assert plot["svgs"] > 0 and plot["laidOut"] and plot["traces"] > 0, plot
        assert not plot["noWebGL"], plot
    for seen in widths:
        assert seen["page"] <= seen["window"], seen  # the page never scrolls sideways
        assert seen["tables"] and all(right is not None and right <= seen["window"] for right in seen["tables"]), seen
    (surface,) = [p for p in plots if p["gl3d"]]
    assert surface["name"] == "surface-fedavg-round-3-surface" and surface["canvases"] > 0, surface

    # The 3D surface really painted (a viridis sheet: many colours), and the page screenshot is a real picture.
    with Image.open(BytesIO(surface_pixels)) as image:
        assert len(image.convert("RGB").getcolors(1 << 24)) > 1000  # ~3000 drawn; ~240 for plotly's no-WebGL note
    assert shot.stat().st_size > 100_000
    with Image.open(shot) as image:
        assert image.format == "PNG" and image.width >= 1400 and image.height > 3000
        rgb = image.convert("RGB")
        assert len(rgb.getcolors(1 << 24)) > 1000 and min(ImageStat.Stat(rgb).stddev) > 10
