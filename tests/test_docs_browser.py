"""The documentation site in a real browser, opened from the file system (file://, the network closed): every
formula is typeset by the MathJax the site carries, search finds pages, and no code block hides part of a line.

Debian's Chromium driven by Playwright (tests/support/browser.py: a skip without them, a failure under
LANDSCAPE_REQUIRE_BROWSER=1). The site is the one tests/test_docs.py builds (once per session). Screenshots of
the pages with formulas, at 1280 and 900 px wide, are left in the tests' tmp_path.
"""

from __future__ import annotations

from io import BytesIO
from pathlib import Path

import pytest
from support.browser import CHROMIUM_ARGS, chromium_path, only_file_urls
from test_docs import MATH_PAGES, ROOT, formulas, site  # noqa: F401 (site: the built site)

WIDTHS = (1280, 900)
TYPESET = "() => window.MathJax && MathJax.startup && MathJax.startup.promise && true"
# What a reader sees of the formulas: MathJax's containers in the article, how many drew at a size, MathJax's
# errors (an unknown macro is one: docs/javascripts/mathjax.js), and TeX left as text anywhere on the page.
MATH_STATE = r"""() => {
    const article = document.querySelector('article');
    const shown = [...article.querySelectorAll('mjx-container')];
    const text = document.body.innerText;
    return {containers: shown.length,
            drawn: shown.filter(c => { const r = c.getBoundingClientRect(); return r.width > 0 && r.height > 0; }).length,
            svgs: article.querySelectorAll('mjx-container > svg').length,
            errors: [...document.querySelectorAll('[data-mml-node="merror"]')].map(e => e.textContent),
            raw: [...text.matchAll(/.{0,40}(\$\$|\\frac|\\\(|\\\[|\\operatorname).{0,40}/g)].map(m => m[0])};
}"""
# Each code block of the article: how much of its lines its box hides, whether it scrolls, the height of its
# scroll bar (0 where the bar is hidden or an overlay), its scroll bar's colours and its backgrounds (the right
# edge's shadow and the cover that hides it at the end of the lines: docs/stylesheets/extra.css); and whether
# the page itself got wider than the window.
CODE_STATE = """() => ({
    page: document.documentElement.scrollWidth, window: document.documentElement.clientWidth,
    blocks: [...document.querySelectorAll('article pre > code')].map((c, index) => {
        const style = getComputedStyle(c);
        return {index, hidden: c.scrollWidth - c.clientWidth, start: c.innerText.slice(0, 60),
                overflow: style.overflowX, bar: c.offsetHeight - c.clientHeight - parseFloat(style.borderTopWidth)
                    - parseFloat(style.borderBottomWidth), colours: style.scrollbarColor,
                images: style.backgroundImage, attachment: style.backgroundAttachment};
    })})"""
TWO_FRAMES = "() => new Promise(done => requestAnimationFrame(() => requestAnimationFrame(done)))"


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """A Chromium page that may load nothing but file: and data: URLs; its page and console errors, and the
    requests it was refused, are collected for the tests to check."""
    from playwright.sync_api import sync_playwright

    path = chromium_path()
    seen = {"offsite": [], "page_errors": [], "console_errors": []}
    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            tmp_path_factory.mktemp("docs-profile"), executable_path=path, headless=True, args=CHROMIUM_ARGS,
            timeout=60_000, viewport={"width": WIDTHS[0], "height": 900}, service_workers="block",
            ignore_default_args=["--hide-scrollbars"])  # scroll bars drawn, as a reader sees them
        try:
            context.route("**/*", only_file_urls(seen["offsite"]))
            page = context.pages[0] if context.pages else context.new_page()
            page.on("pageerror", lambda error: seen["page_errors"].append(str(error)))
            page.on("console", lambda message: seen["console_errors"].append(message.text)
                    if message.type == "error" else None)
            yield page, seen
        finally:
            context.close()


def _open(page, site: Path, name: str, width: int, typeset: bool = True) -> None:  # noqa: F811
    """Open the built page ``name`` at ``width`` px; one with formulas, once MathJax has typeset it (unless
    ``typeset`` is false)."""
    page.set_viewport_size({"width": width, "height": 900})
    page.goto((site / f"{name}.html").as_uri(), wait_until="load", timeout=60_000)
    if typeset and name in MATH_PAGES:
        page.wait_for_function(TYPESET, timeout=30_000)
        page.evaluate("() => MathJax.startup.promise")  # resolves once the page is typeset


def _assert_picture(png: bytes) -> None:
    from PIL import Image, ImageStat

    with Image.open(BytesIO(png)) as image:
        rgb = image.convert("RGB")
        assert len(rgb.getcolors(1 << 24)) > 50 and min(ImageStat.Stat(rgb).stddev) > 10


@pytest.mark.parametrize("name", MATH_PAGES)
def test_every_formula_is_typeset_from_the_file_system(browser, site, name, tmp_path):  # noqa: F811
    page, seen = browser
    expected = formulas((ROOT / "docs" / f"{name}.md").read_text())
    for width in WIDTHS:
        _open(page, site, name, width)
        state = page.evaluate(MATH_STATE)
        assert state["errors"] == [], (name, width)
        assert state["raw"] == [], (name, width)  # no $$, \frac, \( ... left as text
        assert state["containers"] >= expected and state["svgs"] == state["containers"], (name, width, state)
        assert state["drawn"] == state["containers"], (name, width, state)
        wide = page.evaluate("() => document.documentElement.scrollWidth - document.documentElement.clientWidth")
        assert wide <= 0, (name, width, wide)  # typeset formulas never make the page scroll sideways
        # what a reader sees: the top of the page and the first displayed formula (or the first inline one)
        shots = [page.screenshot()]
        displayed = page.locator("article div.arithmatex")
        (displayed if displayed.count() else page.locator("article span.arithmatex")).first.scroll_into_view_if_needed()
        page.evaluate(TWO_FRAMES)
        shots.append(page.screenshot())
        for where, png in zip(("top", "formula"), shots):
            (tmp_path / f"{name.replace('/', '-')}-{width}-{where}.png").write_bytes(png)
            _assert_picture(png)
    assert seen["offsite"] == [] and seen["page_errors"] == [] and seen["console_errors"] == []


def test_search_finds_pages_from_the_file_system(browser, site):  # noqa: F811
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    page, seen = browser
    _open(page, site, "index", WIDTHS[0])
    page.click("input.md-search__input")
    page.keyboard.type("sharpness")
    try:
        page.wait_for_function("() => document.querySelectorAll('.md-search-result__item').length > 0",
                               timeout=30_000)
    except PlaywrightTimeout:
        meta = page.locator(".md-search-result__meta").inner_text()
        pytest.fail(f"no search result in 30 s ({meta!r}); page errors {seen['page_errors']}; console errors "
                    f"{seen['console_errors']}; requests off the site {seen['offsite']}")
    links = page.eval_on_selector_all(".md-search-result__item a", "links => links.map(a => a.href)")
    assert any(link.startswith("file:") and "/metrics.html" in link for link in links), links
    assert "matching document" in page.locator(".md-search-result__meta").inner_text()
    page.keyboard.type("zzqqxxj")  # a word of no page: the results empty again
    page.wait_for_function("() => document.querySelectorAll('.md-search-result__item').length === 0",
                           timeout=10_000)
    assert seen["offsite"] == [] and seen["page_errors"] == [] and seen["console_errors"] == []


def _edges(page, index: int, where: str) -> tuple[int, int]:
    """The lightest grey levels of the left and right edges of the article's code block ``index`` (4 px wide
    bands down its box, scroll bar excluded), its lines scrolled to their ``where`` end. Text only darkens a
    band, so the lightest level is the block's background, or the shadow where one lies over the whole edge."""
    from PIL import Image

    block = page.locator("article pre > code").nth(index)
    block.scroll_into_view_if_needed()
    width, height = block.evaluate(f"c => {{ c.scrollLeft = {'0' if where == 'start' else 'c.scrollWidth'}; "
                                   "return [c.clientWidth, c.clientHeight]; }")
    page.evaluate(TWO_FRAMES)
    box = block.bounding_box()
    x, top = round(box["x"]), max(round(box["y"]) + 2, 0)  # the part of the block in the window
    bottom = min(round(box["y"]) + height - 2, page.viewport_size["height"])
    with Image.open(BytesIO(page.screenshot())) as image:  # the window as shown (no re-layout for a tall block)
        grey = image.convert("L")
        left = grey.crop((x + 1, top, x + 5, bottom)).getextrema()[1]
        right = grey.crop((x + width - 5, top, x + width - 1, bottom)).getextrema()[1]
    return left, right


def test_no_code_block_hides_part_of_a_line_without_showing_it(browser, site):  # noqa: F811
    page, seen = browser
    names = sorted(p.relative_to(site).with_suffix("").as_posix() for p in site.glob("**/*.html")
                   if p.name != "404.html")
    assert "guides/train" in names and "reference/cli" in names
    silent, wide, scrolling = [], [], []
    # MathJax (2 MB of script on every page) left out: code blocks do not wait on formulas (the typeset pages'
    # widths: the formula test)
    no_mathjax = "**/tex-svg-full.js"
    page.route(no_mathjax, lambda route: route.fulfill(status=200, content_type="text/javascript", body=""))
    for name in names:
        _open(page, site, name, WIDTHS[0], typeset=False)
        for width in WIDTHS[:1]:  # a reader's window (the formula test narrows the typeset pages to 900 px too)
            page.set_viewport_size({"width": width, "height": 900})
            page.evaluate(TWO_FRAMES)
            state = page.evaluate(CODE_STATE)
            for block in state["blocks"]:
                if block["hidden"] <= 0:
                    continue
                scrolling.append((name, width, block["index"]))
                cued = (block["overflow"] in ("auto", "scroll") and block["bar"] > 0
                        and "rgba(0, 0, 0, 0)" not in block["colours"].split(") ")[0]
                        and block["images"].count("linear-gradient") == 2
                        and block["attachment"].startswith("local, scroll"))
                if not cued:
                    silent.append((name, width, block))
            if state["page"] > state["window"]:
                wide.append((name, width, state["page"]))
    page.unroute(no_mathjax)
    assert silent == [], f"code blocks hide the end of their lines without a visible scroll bar and shadow: {silent}"
    assert wide == [], f"pages scroll sideways: {wide}"
    # The shadow shows where the lines go on, and the cover hides it at their end: the pixels of the first long
    # block at 1280 px of the train guide and of the first other page that has one (one style sheet serves all)
    assert any(name == "guides/train" for name, _, _ in scrolling), "the train guide's long commands"
    first_other = next(name for name, _, _ in scrolling if name != "guides/train")
    looked = set()
    for name, width, index in scrolling:
        if width != WIDTHS[0] or name in looked or name not in ("guides/train", first_other):
            continue
        looked.add(name)
        _open(page, site, name, width, typeset=False)  # the code blocks' pixels only
        page.add_style_tag(content=".md-clipboard, .md-header { visibility: hidden; }")
        background, start = _edges(page, index, "start")  # the left band: the block's padding
        end = _edges(page, index, "end")[1]
        assert background - start > 15 and abs(background - end) < 3, (name, index, background, start, end)
    assert seen["page_errors"] == [] and seen["console_errors"] == []
