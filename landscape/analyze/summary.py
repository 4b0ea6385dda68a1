"""The report of an analysis (``AnalysisReport``: its rows, counts, notes and warnings) and its plain-text
summary table (``format_summary``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from landscape.analyze.settings import AnalysisSettings


@dataclass
class AnalysisReport:
    """What ``run_analysis`` did: a row of summaries per (run, round), the jobs computed and skipped, the
    settings of each result name, and its notes and warnings."""

    # one per (run, round) (a state_dict's: per file, "file" its label): summaries of every pass
    rows: list[dict] = field(default_factory=list)
    computed: int = 0
    skipped: int = 0
    settings: dict[str, str] = field(default_factory=dict)  # result name -> its settings other than the defaults
    notes: list[str] = field(default_factory=list)  # what was skipped, one line each
    warnings: list[str] = field(default_factory=list)  # inputs that look wrong: said even with --quiet
    data: str = ""  # the analysis data the values are on (``analysis_data``); "" when not known


def analysis_data(settings: AnalysisSettings, data: str | None = None) -> str:
    """The data the analysis values are computed on, in words (what the summary's accuracy is measured on): a
    run's split, or ``data`` where the source says what it is (a state_dict's: "data from mylab.data:make_set",
    "the test set of digits")."""
    text = data or ("the test set" if settings.split == "test"
                    else "the training split (the union of the clients' training data)")
    if settings.analysis_samples:
        text += f", a seeded subset of {settings.analysis_samples} samples"
    return text


KEYS = ("run", "file", "round")  # the columns that say which checkpoint a row is (those the rows have)
SUMMARY_WIDTH = 120  # the summary table is cut into blocks of columns that fit this many characters
RUN_WIDTH = 40  # longer run names are written as [1], [2], ... in the table and in full under it
# a summary's list of its keys whose values are lower bounds only (S_rho of a search that did not confirm its
# maximum): printed ">=value", not a column itself
LOWER_BOUNDS = "lower_bounds"


def _wrapped(text: str, indent: str = "    ") -> list[str]:
    import textwrap

    return textwrap.wrap(text, SUMMARY_WIDTH, subsequent_indent=indent, break_on_hyphens=False,
                         break_long_words=False)


def format_summary(report: AnalysisReport) -> str:
    """A plain-text table, one line per (run, round), one column per summary value (named by its key in the
    results' ``summary``), in the order the passes ran; a state_dict's rows say their file (and round only where
    the files' names carry rounds). No line is wider than ``SUMMARY_WIDTH``: columns that do not fit go to
    further blocks (each repeating the key columns), run names longer than ``RUN_WIDTH`` are numbered and
    written out under the table, and the accuracy is said to be the analysis accuracy it is."""
    if not report.rows:
        return "nothing analysed"
    columns: list[str] = []
    for row in report.rows:
        columns += [k for k in row if k not in KEYS and k != LOWER_BOUNDS and k not in columns]
    names = list(dict.fromkeys(str(row.get("run")) for row in report.rows))
    numbered = any(len(name) > RUN_WIDTH for name in names)
    run_cell = {name: f"[{k + 1}]" if numbered else name for k, name in enumerate(names)}
    shown = [k for k in KEYS if k == "run" or any(k in row for row in report.rows)]
    keys = [shown] + [[run_cell[str(row.get("run"))]] + [_cell(row.get(k)) for k in shown[1:]]
                      for row in report.rows]
    table = [columns] + [[_cell(row.get(c), c in row.get(LOWER_BOUNDS, ())) for c in columns]
                         for row in report.rows]
    lines = _blocks(keys, table)
    if numbered or "acc" in columns or any(report.settings.values()) or _bounded(report):
        lines.append("")
    if numbered:
        lines += [f"{run_cell[name]} {name}" for name in names]
    return "\n".join(lines + _notes(report, "acc" in columns))


def _cell(value: Any, bound: bool = False) -> str:
    if isinstance(value, float):
        return f"{'>=' if bound else ''}{value:.4g}"
    return "-" if value is None else str(value)


def _pack(key_widths: list[int], widths: list[int], limit: int) -> list[list[int]]:
    """The columns (their indices) cut into blocks, each as many as fit in ``limit`` characters after the key
    columns (at least one)."""
    blocks: list[list[int]] = [[]]
    used = sum(key_widths) + 2
    for i, width in enumerate(widths):
        if blocks[-1] and used + 2 + width > limit:
            blocks.append([])
            used = sum(key_widths) + 2
        blocks[-1].append(i)
        used += 2 + width
    return blocks


def _blocks(keys: list[list[str]], table: list[list[str]]) -> list[str]:
    """The lines of the table's blocks (each: the keys, then its columns; a rule under the header), a blank
    line between blocks."""
    key_widths = [max(len(r[i]) for r in keys) for i in range(len(keys[0]))]
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    blocks = _pack(key_widths, widths, SUMMARY_WIDTH)
    limit = SUMMARY_WIDTH  # the narrowest blocks that are no more: the columns spread evenly over them
    while limit > 1 and len(_pack(key_widths, widths, limit - 1)) == len(blocks):
        limit -= 1
    lines: list[str] = []
    for b, block in enumerate(_pack(key_widths, widths, limit)):
        if b:
            lines.append("")
        all_widths = key_widths + [widths[i] for i in block]
        rows = [k + [r[i] for i in block] for k, r in zip(keys, table)]
        text = ["  ".join(v.ljust(w) for v, w in zip(r, all_widths)).rstrip() for r in rows]
        text.insert(1, "  ".join("-" * w for w in all_widths))
        lines += text
    return lines


def _bounded(report: AnalysisReport) -> bool:
    return any(row.get(LOWER_BOUNDS) for row in report.rows)


def _notes(report: AnalysisReport, accuracy: bool) -> list[str]:
    """What a ">=" value means and what the summary's accuracy is (when it has them), and the settings of
    results asked for with settings other than the defaults."""
    lines: list[str] = []
    if _bounded(report):
        lines += _wrapped(">=: S_rho is a lower bound only: no second start of its ascent reached the value, or "
                          "the best start's ascent stopped short of its tolerance (more sharpness.starts confirm "
                          "a maximum; docs/metrics.md 4)")
    if accuracy:
        data = report.data or "the analysis data (--split; by default the union of the clients' training data)"
        lines += _wrapped(f"acc: accuracy of the checkpoint x on {data}, from the loss pass ('accuracy' in "
                          "its JSON); not the test accuracy training logged (metrics.jsonl 'test_acc')")
    # Which results these are, when some were asked for with settings other than the defaults.
    for name, text in sorted(report.settings.items()):
        if text:
            lines += _wrapped(f"{name}: {text}")
    return lines
