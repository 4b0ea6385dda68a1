"""The documentation site: it builds with ``mkdocs build --strict`` (no network, nothing fetched), the generated
reference (docs/reference/, tools/reference.py) is current, and no page cites a file's line number."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import pytest
from support.helpers import load_script, shared_folder

from landscape.core.schema import rule

ROOT = Path(__file__).resolve().parents[1]
# The formulas of a page's Markdown, as pymdownx.arithmatex finds them: a displayed one is $$ ... $$ on lines of
# their own, an inline one $...$ (no space inside either $); none in fenced code or a code span.
FENCE = re.compile(r"^( *)(```|~~~).*?^\1\2[ \t]*$", re.S | re.M)
CODE_SPAN = re.compile(r"(`+)(?!`)((?:(?!\n[ \t]*\n).)+?)(?<!`)\1(?!`)", re.S)
DISPLAY = re.compile(r"^[ \t]*\$\$[ \t]*\n(.*?)\n[ \t]*\$\$[ \t]*$", re.S | re.M)
INLINE = re.compile(r"(?<![\\$])\$(?![\s$])((?:\\.|[^\\$])+?)(?<!\s)\$")
MATH_PAGES = ("metrics", "algorithms", "guides/own-model")  # the pages with formulas


def formulas(markdown: str) -> int:
    """How many formulas a page's Markdown holds (displayed and inline)."""
    text = CODE_SPAN.sub(" ", FENCE.sub("", markdown))
    return len(DISPLAY.findall(text)) + len(INLINE.findall(DISPLAY.sub("", text)))


def _tool():
    return load_script("tools/reference.py")


def build_site(out: Path) -> None:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-f",
                           str(ROOT / "mkdocs.yml"), "-d", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout}\n{done.stderr}"


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The built site, once per test session (this file and the browser test, tests/test_docs_browser.py)."""
    return shared_folder(tmp_path_factory, "site", build_site)


def test_the_site_builds_strictly_and_every_page_of_the_nav_is_there(site):
    for page in ("index", "guides/train", "guides/analyze", "guides/surfaces", "guides/figures", "guides/claims",
                 "guides/own-model", "guides/scale-out", "reference/cli", "reference/recipe-keys",
                 "reference/passes", "reference/plot-kinds", "reference/api", "reliability", "results/index",
                 "algorithms", "metrics", "architecture"):
        assert (site / f"{page}.html").is_file(), page


def test_every_formula_of_the_pages_is_marked_for_mathjax_which_the_site_carries(site):
    pages = sorted(p.relative_to(ROOT / "docs").with_suffix("").as_posix() for p in (ROOT / "docs").rglob("*.md")
                   if formulas(p.read_text()))
    assert set(MATH_PAGES) <= set(pages) and formulas((ROOT / "docs" / "metrics.md").read_text()) > 500
    for page in pages:
        html = (site / f"{page}.html").read_text()
        marked = re.findall(r'<(span|div) class="arithmatex">(.*?)</\1>', html, re.S)
        assert len(marked) == formulas((ROOT / "docs" / f"{page}.md").read_text()), page
        assert all(m[1].startswith(("\\(", "\\[")) for m in marked), page
        # no formula left as text for the reader: $$ outside the marked ones and outside code
        text = re.sub(r"<(code|pre)\b.*?</\1>", "", re.sub(r'<(span|div) class="arithmatex">.*?</\1>', "", html,
                                                            flags=re.S), flags=re.S)
        assert "$$" not in text and "\\frac" not in text, page
        assert 'src="javascripts/mathjax/tex-svg-full.js"' in html or 'src="../javascripts/mathjax/tex-svg-full.js"' in html
    assert (site / "javascripts" / "mathjax" / "tex-svg-full.js").stat().st_size > 1_000_000
    assert (site / "search" / "search_index.js").read_text().startswith("var __index = {")


def test_the_formula_count_sees_displayed_and_inline_formulas_but_not_code():
    assert formulas("a $x$ and $y_i$, `$z$` and $ 5 $.\n\n$$\nF(w) = \\frac1n\n$$\n\n```\n$HOME $x$\n```\n") == 3
    assert formulas("$\\lfloor$`swa_start`$\\cdot T\\rfloor$ costs \\$5") == 2


def test_the_api_reference_is_rendered_from_the_docstrings(site):
    html = (site / "reference" / "api.html").read_text()
    for name in ("api.hessian_eigs", "api.flatness_distance", "api.plots.plot_surface", "api.plots.plot_spectrum",
                 "api.plots.plot_sharpness", "store.run.open_run", "store.run.Run.model",
                 "store.run.PassRecord", "core.schema.read_toml", "core.errors.LandscapeError"):
        assert f'id="landscape.{name}"' in html, name
    # a docstring's words, not only the names
    assert "Analysis as plain functions" in html


def test_the_results_page_includes_the_generated_claims_tables(site):
    html = (site / "results" / "index.html").read_text()
    assert "--8&lt;--" not in html and "--8<--" not in html
    assert "fednsam-lowers-distance-and-sharpness" in html


def test_no_page_requests_anything_off_the_site(site):
    external = re.compile(r"""<(?:link|script|img)[^>]*(?:href|src)=["'](?:https?:)?//""", re.I)
    for page in site.rglob("*.html"):
        hit = external.search(page.read_text())
        assert hit is None, f"{page.relative_to(site)} requests {hit.group(0)}"


def test_no_page_cites_a_line_number_of_a_file():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    cited = [f"{p.relative_to(ROOT)}: {m.group(0)}" for p in pages
             for m in re.finditer(r"\S*\.py:\d+", p.read_text())]
    assert not cited, f"line numbers go stale; name the function instead: {cited}"


def test_the_generated_reference_is_current():
    assert _tool().stale() == [], "run: python tools/reference.py --write"


def test_the_check_names_a_missing_or_edited_page(tmp_path):
    tool = _tool()
    assert tool.stale(tmp_path) == list(tool.PAGES)
    for name, text in tool.pages().items():
        (tmp_path / name).write_text(text)
    assert tool.stale(tmp_path) == []
    (tmp_path / "passes.md").write_text(tool.pages()["passes.md"] + "a line by hand\n")
    assert tool.stale(tmp_path) == ["passes.md"]


def test_the_reference_names_every_command_option_entry_pass_and_plot_kind():
    from landscape.analyze.catalog import load_passes
    from landscape.cli import cli
    from landscape.config.recipe import registries
    from landscape.figures.plot_kinds import PLOT_KINDS

    pages = _tool().pages()
    for name, command in cli.commands.items():
        assert f"## landscape {name}\n" in pages["cli.md"]
        for param in command.params:
            if getattr(param, "hidden", False) or not hasattr(param, "opts") or param.param_type_name != "option":
                continue
            assert any(f"`{opt}" in pages["cli.md"] or f", {opt}" in pages["cli.md"] for opt in param.opts), param
    for section, registry in registries().items():
        for entry in registry.entries():
            assert f"#### {section} `{entry.name}`" in pages["recipe-keys.md"]
            for key in entry.option_defaults():
                assert f"| `{key}` |" in pages["recipe-keys.md"], (entry.name, key)
    for name in load_passes().names():
        assert f"## {name}\n" in pages["passes.md"]
    for name in PLOT_KINDS:
        assert f"## {name}\n" in pages["plot-kinds.md"]


@dataclass(frozen=True)
class _Example:
    # the first key's words,
    # over two lines
    first: Annotated[int, rule("0: off", ge=0)] = 0
    second: Annotated[float, rule(gt=0, le=1, text="must be in (0, 1]")] = 0.5  # the second's
    third: Literal["a", "b"] = "a"
    fourth: Annotated[tuple[Annotated[float, rule(gt=0)], ...], rule(min_length=1)] = (0.1,)
    fifth: str | None = None
    sixth: tuple[Literal["x", "y"], ...] = ()


def test_a_key_row_gives_kind_default_range_and_the_comment_of_its_field():
    rows = _tool().key_rows(_Example)
    assert rows[2] == "| `first` | integer | `0` | &gt;= 0 (0: off) | the first key's words, over two lines |"
    assert rows[3] == "| `second` | number | `0.5` | in (0, 1\\] | the second's |"
    assert rows[4] == '| `third` | one of "a", "b" | `"a"` |  |  |'
    assert rows[5] == "| `fourth` | list of numbers | `[0.1]` | at least 1 item(s) each &gt; 0 |  |"
    assert rows[6] == "| `fifth` | string | `(unset)` |  |  |"
    assert rows[7] == '| `sixth` | list, each one of "x", "y" | `[]` |  |  |'
