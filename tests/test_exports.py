"""Exports carry no active content (issue 46, S4 and S5): what a claim file or a run's folder names reaches
claims.md as inert Markdown (escaped HTML and Markdown) and compare.csv as cells no spreadsheet evaluates
(OWASP's CSV-injection rule), while numbers stay numbers."""

from __future__ import annotations

import csv
import html
import json
import re
import shutil
from pathlib import Path

import markdown  # mkdocs's renderer (a test dependency: tests/test_docs.py builds the site)
import pytest
from support.helpers import invoke

from landscape.claims import checks as claims
from landscape.claims import table as claims_table
from landscape.figures.compare import csv_text
from landscape.figures.rundata import RunData
from landscape.store.run import Run

HOSTILE = [
    "</script><script>alert(11)</script><img src=x onerror=alert(1)>",
    "[click](javascript:alert(1)) ![x](http://x/y.png) <http://x>",
    "a | b | c",
    "`code` **bold** _it_ \\ back",
    "two\nlines <b>",
]


def _runs(root: Path, ids: tuple[str, str]) -> dict[str, list[RunData]]:
    """Two ids' runs of three seeds each, the second's flatness distance above the first's."""
    runs: dict[str, list[RunData]] = {}
    for k, run_id in enumerate(ids):
        for seed in range(3):
            folder = root / f"id{k}" / f"seed{seed}"
            folder.mkdir(parents=True)
            (folder / "recipe.toml").write_text(f'seed = {seed}\n\n[algorithm]\nname = "fedavg"\n')
            (folder / "metrics.jsonl").write_text(json.dumps(
                {"round": 1, "flatness_distance": 1.0 + k + 0.1 * seed, "flatness_distance_to_global": 0.0}) + "\n")
            runs.setdefault(run_id, []).append(RunData(Run(folder)))
    return runs


@pytest.mark.parametrize("text", HOSTILE)
def test_claims_md_shows_titles_and_labels_as_text(tmp_path, text):
    ids = (f"low {text}", f"high {text}")
    claim = claims.Claim(Path("c.toml"), f"name {text}", f"title {text}", "", Path("fig.toml"), (0, 1, 2),
                         (claims.Comparison(*ids, "flatness_distance", "last"),))
    decided = claims.decide([claims.evaluate(claim, _runs(tmp_path, ids))])
    decided = claims_table.compare_with(decided, {(claim.name,): f"HELD {text}"})
    (md,) = [p for p in claims_table.write_results(decided, tmp_path / "out", f"other {text}")
             if p.suffix == ".md"]
    written = md.read_text()
    assert not re.search(r"<[a-z/!]", written, re.I)  # no HTML as written, whatever renders it
    rendered = markdown.markdown(written, extensions=["tables"])
    assert not re.search(r"<(script|img|a|b|i|s|em|del)\b|<[^>]*\b(href|src|on\w+)=", rendered, re.I), rendered
    # the only markup is the table's own: bold verdicts and headings, code spans of plain names and commands
    assert set(re.findall(r"<strong>(.*?)</strong>", rendered)) == {"Published claims", claims.INCONCLUSIVE}
    assert set(re.findall(r"<code>(.*?)</code>", rendered)) == {"landscape claims --compare-with"}
    # the table keeps its columns: every row has as many cells as the header
    rows = re.findall(r"<tr>(.*?)</tr>", rendered, re.S)
    assert rows and {len(re.findall(r"<t[hd]", row)) for row in rows} == {len(claims_table.COLUMNS)}
    # and the reader sees the text as it was written (line breaks as spaces)
    shown = html.unescape(re.sub(r"<[^>]+>", "", rendered))
    for what in (f"title {text}", f"low {text}", f"high {text}", f"other {text}"):
        assert " ".join(what.splitlines()) in shown, what


@pytest.mark.parametrize("name", ['=HYPERLINK("http:x","y")', "+1+cmd|' -C calc'!A0", "-2+3", "@SUM(1+1)*cmd",
                                  "\t=1"])
def test_compare_csv_cells_are_never_formulas(one_round_run, tmp_path, name):
    for folder in (name, "-3"):  # a run named like a formula and one named like a negative number
        shutil.copytree(one_round_run, tmp_path / "runs" / folder)
    result = invoke("compare", tmp_path / "runs" / name, tmp_path / "runs" / "-3", "--out", tmp_path / "cmp")
    assert result.exit_code == 0, result.output
    with open(tmp_path / "cmp" / "compare.csv", newline="") as f:
        rows = list(csv.reader(f))
    directories = [row[1] for row in rows[1:]]
    assert directories == ["'" + name, "-3"]  # neutralised; the number stays a number
    for row in rows:
        for cell in row:
            assert not cell.startswith(("=", "+", "@", "\t", "\r")), cell
            assert not cell.startswith("-") or float(cell) <= 0, cell
    assert [float(c) for row in rows[1:] for c in row[2:] if c]  # the numbers read back as numbers


def test_numbers_written_as_text_stay_numbers():
    for number in ("-3", "-0.5", "+2", "1e-3", "-1.5E+07", ".5", "-7."):
        assert csv_text(number) == number
    for formula in ("-1+2", "-inf", "=1", "+A1", "@x", "-", "\r=1", "- 3"):
        assert csv_text(formula) == "'" + formula
    assert csv_text("fedavg") == "fedavg" and csv_text("") == ""
