"""The verdicts of one ``landscape claims`` call as a table (``claims.md``) and a record (``claims.json``), and
the FRAGILE mark.

The table shows the published claims, then this project's hypotheses (claims no paper makes: ``hypothesis =
true`` in the claim file), each as rows of comparisons with both directions' p-values and the detectable
difference at the comparison's Holm step, and under them each claim's operationalisation in one line
(``ClaimResult.operationalisation``: quantity and scale, rounds, partition). ``compare_with`` takes the verdicts
of another call's ``claims.json`` (``read_verdicts``: the same claims computed another way, e.g. with the other
``train.memory_format``) and marks every claim and comparison whose verdict differs there FRAGILE.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from landscape.claims.checks import POWER, ClaimResult, ComparisonResult, _num, _p, _rounds_text
from landscape.core.errors import LandscapeError
from landscape.core.reading import read_json
from landscape.figures.seeds import mean_se
from landscape.store.fileio import write_text

COLUMNS = ("claim", "verdict", "comparison (lower < higher)", "lower: mean +- SE", "higher: mean +- SE", "n",
           "higher - lower (95% CI)", "t", "p_t", "p_sign-flip", "p_Holm", "opposite p_t", "opposite p_sign-flip",
           "opposite p_Holm", "detectable at its Holm level")
Key = tuple[str, ...]  # (claim name,) or (claim name, lower, higher, quantity)


_ACTIVE = re.compile(r"[\\`*\[\]|]|(?<![0-9A-Za-z])_|_(?![0-9A-Za-z])")
_PLAIN = re.compile(r"[\w.\-/+:=,@ ]*\w[\w.\-/+:=,@ ]*")
_ENTITIES = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}


def md_text(text: str) -> str:
    """``text`` (a claim's title, a run id, a quantity, a folder name: whatever a claim file or a run names) as
    inert Markdown: HTML's ``& < >`` as entities, Markdown's link, image, code, emphasis and table marks
    backslash-escaped, line breaks as spaces; so a renderer that passes raw HTML (Python-Markdown, mkdocs) shows
    the text and runs nothing. Underscores inside a word (``flatness_distance``) stay as written."""
    text = " ".join(str(text).splitlines())
    text = "".join(_ENTITIES.get(c, c) for c in text)
    return _ACTIVE.sub(lambda m: "\\" + m.group(0), text)


def md_code(text: str) -> str:
    """``text`` (a claim's name, a folder) in a code span when it is plain (letters, digits and ``_ . - / + : =
    , @`` and spaces), else as ``md_text``: a renderer shows a code span as written, but what reads the file as
    written should find no markup in it either."""
    text = str(text)
    return f"`{text}`" if _PLAIN.fullmatch(text) else md_text(text)


def _comparison_key(name: str, lower: str, higher: str, quantity: str) -> Key:
    return (name, lower, higher, quantity)


def read_verdicts(folder: Path) -> dict[Key, str]:
    """The verdict of every claim and comparison in ``folder/claims.json`` (another ``landscape claims`` call's
    output), by (claim name,) and (claim name, lower, higher, quantity); one line if it cannot be read."""
    path = Path(folder) / "claims.json"
    try:
        records = read_json(path, "a claims.json of `landscape claims`")
        verdicts: dict[Key, str] = {}
        for record in records:
            name = record.get("name") or Path(record["file"]).stem
            verdicts[(name,)] = record["verdict"]
            for c in record["comparisons"]:
                verdicts[_comparison_key(name, c["lower"], c["higher"], c["quantity"])] = c["verdict"]
    except LandscapeError as e:
        raise LandscapeError(f"--compare-with {folder}: {e}") from None
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise LandscapeError(f"--compare-with {folder}: {path} is not a claims.json of `landscape claims` "
                             f"({type(e).__name__}: {e})") from None
    return verdicts


def compare_with(results: Sequence[ClaimResult], other: Mapping[Key, str]) -> list[ClaimResult]:
    """``results`` with each claim's and comparison's verdict in ``other`` (``read_verdicts``) beside their own:
    FRAGILE where the two differ (None where ``other`` lacks it)."""
    out = []
    for result in results:
        name = result.claim.name
        rows = tuple(replace(r, other_verdict=other.get(_comparison_key(name, r.comparison.lower, r.comparison.higher,
                                                                        r.comparison.quantity)))
                     for r in result.comparisons)
        out.append(replace(result, comparisons=rows, other_verdict=other.get((name,))))
    return out


def _fragile(other: str | None, fragile: bool) -> str:
    return f" FRAGILE ({md_text(other or '')} in the other results)" if fragile else ""


def _row(result: ClaimResult, r: ComparisonResult, first: bool) -> str:
    lo, lo_se, n = mean_se(r.lower)
    hi, hi_se, _ = mean_se(r.higher)
    head = ("", "")
    if first:
        head = (f"{md_text(result.claim.text)} ({md_code(result.claim.name)})",
                f"**{result.verdict}**" + _fragile(result.other_verdict, result.fragile))
    diff = "-" if r.ci95 is None else f"{r.mean_difference:.3g} ({r.ci95[0]:.3g} to {r.ci95[1]:.3g})"
    detectable = ("-" if r.detectable_difference is None
                  else f"{r.detectable_difference:.2g} at {r.holm_level:.2g} (step {r.holm_step} of {r.family})")
    comparison = (f"{md_text(r.comparison.quantity)} ({md_text(_rounds_text(r.comparison.rounds))}): "
                  f"{md_text(r.comparison.lower)} < {md_text(r.comparison.higher)}: {r.verdict}")
    cells = (*head, comparison + _fragile(r.other_verdict, r.fragile),
             _num(lo, lo_se), _num(hi, hi_se), str(n), diff, "-" if r.t is None else f"{r.t:.2f}", _p(r.p),
             _p(r.p_signflip), _p(r.p_holm), _p(r.p_opposite), _p(r.p_signflip_opposite), _p(r.p_holm_opposite),
             detectable)
    return "| " + " | ".join(cells) + " |"


def _section(title: str, results: Sequence[ClaimResult]) -> list[str]:
    lines = [title, "", "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += [_row(result, r, i == 0) for result in results for i, r in enumerate(result.comparisons)]
    lines += ["", "Tested as (quantity (scale), rounds; partition):", ""]
    return lines + [f"- {md_code(result.claim.name)}: {md_text(result.operationalisation())}"
                    for result in results] + [""]


def markdown_table(results: Sequence[ClaimResult], compared_with: str = "") -> str:
    """The published claims' table, then this project's hypotheses' (each claim's operationalisation under
    it), and a legend; with ``compared_with`` (the other results' folder) the FRAGILE count."""
    published = [r for r in results if not r.claim.hypothesis]
    hypotheses = [r for r in results if r.claim.hypothesis]
    lines: list[str] = []
    if published:
        lines += _section("**Published claims**", published)
    if hypotheses:
        lines += _section("**This project's hypotheses** (claims no paper makes)", hypotheses)
    family = max((r.family for result in results for r in result.comparisons), default=0)
    lines.append(
        f"p-values one-sided: p_t the paired t-test, p_sign-flip the exact sign-flip permutation test (smallest p "
        f"2^-n), p_Holm p_t after Holm's step over the {family} tested comparisons of both sections; the claimed "
        f"direction (higher > lower), then the opposite one (higher < lower, its own Holm family). HELD: p_Holm "
        f"and p_sign-flip of the claimed direction below the level; NOT HELD: the same for the opposite "
        f"direction; a claim is HELD when every comparison is, NOT HELD when one is. detectable: the smallest "
        f"mean difference the one-sided t-test detects with power {POWER:g} at this n and sd, at the level of "
        f"the comparison's Holm step (level / (m - k + 1) for the k-th smallest p_t of m). Scale: raw, or "
        f"relative (free of the weights' and the client updates' scale).")
    if compared_with:
        claims = sum(r.fragile for r in results)
        rows = sum(r.fragile for result in results for r in result.comparisons)
        missing = sum(r.other_verdict is None for result in results for r in result.comparisons)
        lines.append(
            f"\nFRAGILE: the verdict differs in {md_code(compared_with)} (the same claims computed another way: "
            f"`landscape claims --compare-with`): {claims} of {len(results)} claims, {rows} of "
            f"{sum(len(r.comparisons) for r in results)} comparisons"
            + (f"; {missing} comparison(s) are not in it" if missing else "") + ".")
    return "\n".join(lines)


def write_results(results: Sequence[ClaimResult], out: Path, compared_with: str = "") -> list[Path]:
    """``claims.json`` (every number) and ``claims.md`` (the table) under ``out``."""
    written = [out / "claims.json", out / "claims.md"]
    write_text(written[0], json.dumps([r.to_dict() for r in results], indent=1) + "\n")
    write_text(written[1], markdown_table(results, compared_with) + "\n")
    return written
