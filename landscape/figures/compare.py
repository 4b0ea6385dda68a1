"""``landscape compare``: runs side by side, from their files.

A table (one row per run) of the quantities the papers compare: final test accuracy, lambda_max, the Hutch++
trace, S_rho, the flatness distance Delta_D (the flatness pass where it ran, else the value training logged
at the last round), the flatness incompatibility Delta_FI and the mean client gradient cosine, each at the
latest round its pass analysed; and the runs' loss surfaces (latest analysed round) side by side on ONE
colour scale, as contour maps and 3D panels (PNG + PDF, each with its caption file ``<stem>.caption.txt``)
and as interactive 3D (HTML). The table is printed
and written as CSV. A run that lacks an analysis shows "-" and the command that computes it is named.

Seeds. Runs that differ only in their recipe's ``seed`` (``landscape.figures.seeds``) are one row: each cell
the mean over the seeds +- its standard error (``std(ddof=1) / sqrt(n)``; it replaces the passes' own
Monte-Carlo error there), a column ``n`` after the directory (a compact ``prefix{a,b,c}suffix`` of the run
folders). A cell read from fewer seeds than the row has says ``(n=k)``.

``compare.csv`` holds numbers only (the display text, ``58.78 +- 3.8``, ``(round 2)``, ``(online, ...)``, is
the printed table's): ``run`` and ``directory`` (the row's names), ``n`` (its seeds, where some row has several),
``rounds`` (the rounds trained; a row of seeds: the most of its seeds'), then per quantity (``test acc (%)`` and
each of the table's) ``<q> mean``, ``<q> se`` (the standard error the cell shows: over the seeds in a row of
seeds, else the pass's own estimate where it has one, such as the trace's), ``<q> n`` (how many runs have the
value; 0 where none has) and, where some row has several seeds, ``<q> seed <s>`` for every seed value ``s`` of the
runs: that seed's value. Where the value comes from, in columns of its own: ``<q> round`` (the round it was
read at, the latest of the seeds'; the table marks it where that is not the latest analysed round) and
``Delta_D online`` (1 where Delta_D is the value training logged at its last round because the flatness pass did
not run, else 0). A cell without a value is empty. Numbers are written in full (``repr``): read back they equal
the values in the runs' files.

Surfaces that compare. A filter-normalised plane (Li et al. 2018, the surface pass's default) is scaled to each
model's own filters, so the panels' axes are another distance for every model and their widths also compare
weight norms. Where every run with a surface has one of a mode whose directions do not depend on the model
(``surface.normalization`` = ``euclidean``, one stated length, tried first, or ``filter-reference``, one
reference model), with the same length or reference for all, those are drawn instead (``comparable_surfaces``);
otherwise the per-model ones are, and a note names the command that computes comparable ones. A line under
the table (``Comparison.settings``) and the panels' caption files say which, with every model's weight norm
||x|| (under each panel's title too; on the figure itself where the planes are not one distance) (``landscape.figures.surface.data.compare_planes``). A ``--settings`` filter on ``normalization``
(or a figure recipe's exact settings) is followed as given.

Each quantity is read from results of one set of settings (``landscape.store.results.selection``): the defaults
(training split, BN mode eval, the surface's global data), or those a ``Selection`` asks for (``landscape
compare --settings split=test``); ``Comparison.settings`` says which, and the surface panels' caption files
name the settings they show where those are not the ones asked for (their titles stay plain).
"""

from __future__ import annotations

import copy
import csv
import io
import math
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from landscape.analyze.passes import RESULT_NAMES
from landscape.analyze.registry import Quantity
from landscape.core.errors import LandscapeError
from landscape.figures.labels import (
    caption_of,
    figure_caption,
    rounds_span,
    set_caption,
    settings_caption,
    settings_lines,
)
from landscape.figures.report.data import (
    SAME_DRAWS,
    ComparisonGroup,
    ComparisonRow,
    SeedStat,
    all_rhos,
    comparison_groups,
    quantities,
    seed_stat,
)
from landscape.figures.rundata import RunData, RunsLike, as_runs, missing_message
from landscape.figures.surface import data as surface_data
from landscape.figures.surface import draw as surfaces
from landscape.store.fileio import write_text
from landscape.store.results.names import surface_output_name
from landscape.store.results.selection import Selection

# The columns the papers compare, by the plain name of report.data.quantities (S_rho is added by radius).
COLUMNS = ["lambda_max", "trace", "Delta_FI", "mean grad cos"]
# Surface normalisations whose planes do not depend on the model, in the order compare tries them.
COMPARABLE = ("euclidean", "filter-reference")
COMPARABLE_HINT = "--set surface.normalization=filter-reference --set surface.reference=round:0"


def _asks_normalization(selection: Selection) -> bool:
    return bool(selection.exact) or any(key in ("normalization", "surface.normalization")
                                        for key, _ in selection.filters)


def comparable_surfaces(runs: list[RunData], name: str) -> tuple[list[RunData], str | None]:
    """The runs read again for their surfaces ``name`` in the first mode of ``COMPARABLE`` that every one of
    them has with one length (euclidean) or reference (filter-reference), and that mode; ``(runs, None)`` when
    there is none, or when the selection names the normalization itself (it is followed as given). The other
    outputs of the copies are read as the runs' selection says; the runs themselves are not changed."""
    if not runs or name != surface_output_name("random") or _asks_normalization(runs[0].selection):
        return runs, None
    for mode in COMPARABLE:
        picked = []
        for run in runs:
            selection = Selection(run.selection.names, run.selection.filters + (("surface.normalization", mode),))
            again = copy.copy(run).select(selection)
            if not again.analysed_rounds(name):
                break
            picked.append(again)
        else:
            sources = [run.pass_record(name).path.with_suffix(".npz") for run in picked]
            if surface_data.compare_planes(sources).comparable:
                return picked, mode
    return runs, None


@dataclass
class Comparison:
    runs: list[RunData]
    header: list[str]
    rows: list[list[str]]  # formatted cells
    missing: list[str]  # one line per run and pass it lacks, with the command
    written: list[Path]
    settings: list[str]  # which settings the table and the surfaces show
    numbers_header: list[str] = field(default_factory=list)  # compare.csv's columns after run and directory
    numbers: list[list[float | int | None]] = field(default_factory=list)  # their cells, one list per row


def _cell(value: Any, se: Any = None) -> str:
    """A number of one run as the printed table shows it (as the report does): '0.1234 +- 0.0056'; 'n/a' for
    NaN; a standard error of 0 as ``SAME_DRAWS``; '-' for none."""
    if value is None:
        return "-"
    v = float(value)
    if math.isnan(v):
        return "n/a"
    text = f"{v:.4g}"
    if se is not None and math.isfinite(float(se)):
        text += f" +- {float(se):.2g}" if float(se) else f" ({SAME_DRAWS})"
    return text


def _columns(runs: list[RunData], rho: float | None) -> list[Quantity]:
    rhos = all_rhos(runs)
    if rho is None and rhos:
        rho = 0.05 if any(math.isclose(r, 0.05) for r in rhos) else rhos[len(rhos) // 2]
    by_text = {q.text: q for q in quantities([rho] if rho is not None else [])}
    names = COLUMNS[:2] + ([f"S_rho({rho:g})"] if rho is not None else []) + ["Delta_D"] + COLUMNS[2:]
    return [by_text[name] for name in names]


def _format(row: ComparisonRow, shown: list[Quantity]) -> list[str]:
    cells = [row.run.label, row.run.name, _cell(row.rounds),
             _cell(100 * row.final_acc) if row.final_acc is not None else "-"]
    for q, value in zip(shown, row.values):
        if value is None:
            if q.text == "Delta_D" and row.online_distance is not None:
                cells.append(f"{row.online_distance:.4g} (online, round {row.rounds})")
            else:
                cells.append("-")
            continue
        cell = _cell(value[0], value[1])
        cells.append(cell if value[2] == row.latest else f"{cell} (round {value[2]})")
    return cells


def _format_group(cg: ComparisonGroup, shown: list[Quantity]
                  ) -> tuple[list[str], list[SeedStat], list[Provenance]]:
    """A row of several seeds: the table's cells (mean +- SE), the numbers they show (test accuracy, then
    each quantity) and where each quantity's come from."""
    rounds = sorted({row.rounds for row in cg.rows if row.rounds is not None})
    acc = cg.stat(lambda row: None if row.final_acc is None else 100 * row.final_acc)
    cells = [cg.group.label, cg.group.name, str(cg.group.n), ", ".join(map(str, rounds)) or "-", acc.text()]
    stats: list[SeedStat] = [acc]
    where: list[Provenance] = []
    for k, q in enumerate(shown):
        stat, at, at_latest = cg.quantity(k)
        if stat.mean is None and q.text == "Delta_D":
            online = cg.stat(lambda row: row.online_distance)
            if online.mean is not None:
                cells.append(f"{online.text()} (online, round{'s' if len(rounds) > 1 else ''} "
                             f"{', '.join(map(str, rounds))})")
                stats.append(online)
                where.append(Provenance(max(rounds, default=None), True))
                continue
        text = stat.text()
        if stat.mean is not None and not at_latest:
            text += f" (round{'s' if len(at) > 1 else ''} {', '.join(map(str, at))})"
        cells.append(text)
        stats.append(stat)
        where.append(Provenance(max(at, default=None), False))
    return cells, stats, where


def _finite(value: Any) -> float | None:
    return float(value) if value is not None and math.isfinite(float(value)) else None


def _single_stats(row: ComparisonRow, shown: list[Quantity]) -> tuple[list[SeedStat], list[Provenance]]:
    """A row of one run: the numbers its cells show (test accuracy, then each quantity), each with the pass's
    own standard error where it has one, and where each quantity's comes from."""
    stats = [seed_stat([None if row.final_acc is None else 100 * row.final_acc])]
    where: list[Provenance] = []
    for q, value in zip(shown, row.values):
        if value is None:
            online = row.online_distance if q.text == "Delta_D" else None
            stats.append(seed_stat([online]))
            where.append(Provenance(row.rounds if online is not None else None, online is not None))
        else:
            stats.append(SeedStat(float(value[0]), _finite(value[1]), 1, [float(value[0])]))
            where.append(Provenance(value[2], False))
    return stats, where


@dataclass(frozen=True)
class Provenance:
    """Where a quantity's value in a row comes from: the round it was read at (the latest of a row of seeds';
    None where there is no value) and whether it is the Delta_D training logged (the flatness pass did not
    run)."""

    round: int | None
    online: bool


def _numbers(stats: list[SeedStat], where: list[Provenance], seeds: list[int | None], columns: list[int],
             shown: list[Quantity]) -> list[float | int | None]:
    """compare.csv's numeric cells of a row after its names and rounds: per quantity (test accuracy, then
    ``shown``) mean, se and n, its value for each seed of ``columns`` (the row's ``seeds`` in the order of its
    stats' per-seed values), then for a shown quantity the round it was read at (and Delta_D's online flag)."""
    cells: list[float | int | None] = []
    for k, stat in enumerate(stats):
        by_seed = dict(zip(seeds, stat.per_seed))
        cells += [stat.mean, stat.se, stat.n] + [by_seed.get(s) for s in columns]
        if k:
            q, at = shown[k - 1], where[k - 1]
            cells.append(at.round if stat.mean is not None else None)
            if q.text == "Delta_D":
                cells.append(None if stat.mean is None else int(at.online))
    return cells


def _csv_number(value: float | int | None) -> str:
    """A number in full, so that it reads back equal: ``repr`` of the float, an int as it is; '' for none."""
    if value is None:
        return ""
    return str(int(value)) if isinstance(value, int) else repr(float(value))


# A text cell that is a decimal number as written (a run named "-3"): OWASP's CSV injection rule leaves it
# alone, so that numbers stay numbers (compare.csv's number cells are written by _csv_number and stay as they are).
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
# What a spreadsheet takes for the start of a formula (OWASP: = + - @, tab and carriage return).
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def csv_text(cell: str) -> str:
    """A text cell of compare.csv (a run's name or folder, a column's name) that no spreadsheet evaluates:
    OWASP's rule, a cell starting with ``= + - @`` (or a tab or carriage return) gets a leading ``'``; a number
    as written (``-0.5``, ``1e-3``) is kept as it is."""
    if cell.startswith(_FORMULA_START) and not _NUMBER.fullmatch(cell):
        return "'" + cell
    return cell


def _numbers_header(names: list[str], shown: list[Quantity], columns: list[int]) -> list[str]:
    header = []
    for k, name in enumerate(names):
        header += [f"{name} {part}" for part in ["mean", "se", "n"] + [f"seed {s}" for s in columns]]
        if k:
            header.append(f"{name} round")
            if shown[k - 1].text == "Delta_D":
                header.append("Delta_D online")
    return header


def text_table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths)), "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in rows]
    return "\n".join(line.rstrip() for line in lines)


def _table(runs: list[RunData], shown: list[Quantity]
           ) -> tuple[list[str], list[list[str]], list[str], list[list[float | int | None]]]:
    """The printed table's header and rows (one per seed group), and compare.csv's columns after ``run`` and
    ``directory`` and their cells (numbers only)."""
    found = comparison_groups(runs, shown)
    seeded = any(cg.group.n > 1 for cg in found)
    header = ["run", "directory"] + (["n"] if seeded else []) + ["rounds", "test acc (%)"] + [q.text for q in shown]
    columns = sorted({s for cg in found for s in cg.group.seeds if s is not None}) if seeded else []
    rows, numbers = [], []
    for cg in found:
        if cg.group.n == 1:
            cells = _format(cg.rows[0], shown)
            stats, where = _single_stats(cg.rows[0], shown)
            rows.append(cells[:2] + ["1"] + cells[2:] if seeded else cells)
        else:
            cells, stats, where = _format_group(cg, shown)
            rows.append(cells)
        trained = [row.rounds for row in cg.rows if row.rounds is not None]
        numbers.append(([cg.group.n] if seeded else []) + [max(trained, default=None)]
                       + _numbers(stats, where, cg.group.seeds, columns, shown))
    names = header[header.index("test acc (%)"):]
    return header, rows, (["n"] if seeded else []) + ["rounds"] + _numbers_header(names, shown, columns), numbers


def _lacking(runs: list[RunData], shown: list[Quantity]) -> list[str]:
    """One line per run and analysis of the table it lacks (the command), and the rounds it leaves out."""
    missing = []
    for run in runs:
        needed = {q.pass_name for q in shown} | {"sharpness"}
        lacking = sorted({name for name in needed if not run.analysed_rounds(name)} - {"flatness"})
        if lacking:
            missing.append(missing_message(run, lacking))
        missing += run.notes([q.pass_name for q in shown])
    return missing


def _surfaces(runs: list[RunData], out: Path, name: str, quantity: str, missing: list[str], draw: bool = True
              ) -> tuple[list[RunData], list[Path], list[str]]:
    """Draw the runs' surfaces ``name`` side by side (``draw`` False: only read them): (the runs drawn, the
    files written, the line saying which planes they are); what is missing is added to ``missing``."""
    with_surface = [run for run in runs if run.analysed_rounds(name)]
    if not with_surface:
        return [], [], []
    with_surface, mode = comparable_surfaces(with_surface, name)
    sources = [run.pass_record(name).path.with_suffix(".npz") for run in with_surface]
    titles = [f"{run.label}, round {run.analysed_rounds(name)[-1]}" for run in with_surface]  # settings: caption
    flat = [s for s in sources if not surface_data.load_surface(s).is_2d]
    lines: list[str] = []
    if not flat and len(sources) > 1:
        planes = surface_data.compare_planes(sources, [run.label for run in with_surface])
        lines.append(f"surfaces: {planes.text}")
        if mode is None and "filter" in planes.normalizations and not _asks_normalization(runs[0].selection):
            missing.append("the surfaces are filter-normalised to each model's own weights; planes that "
                           "compare across models: `landscape analyze RUN --passes surface "
                           f"{COMPARABLE_HINT}` (or normalization=euclidean with a length) for each run")
    if flat:
        missing.append(f"{', '.join(map(str, flat))}: 1D surfaces; compare draws 2D ones")
        return with_surface, [], lines
    if not draw:
        return with_surface, [], lines
    written = []
    for kind, stem in (("contour", "surfaces"), ("3d", "surfaces-3d")):
        # contours of the loss on log-spaced levels (as figures/fednsam-fig1-surfaces.toml): linear ones
        # paint every flat basin one dark colour
        log = kind == "contour" and quantity != "accuracy"
        fig, _ = surfaces.panels_figure(sources, titles, kind=kind, quantity=quantity, log_levels=log)
        what = (f"{'3D surfaces' if kind == '3d' else 'Contour maps'} of the {quantity} ({name} pass) of the runs "
                "side by side on one colour scale" + (", log-spaced levels" if log else ""))
        rounds = rounds_span(run.analysed_rounds(name)[-1] for run in with_surface)
        set_caption(fig, figure_caption(what, with_surface, rounds, outputs=[name], notes=[caption_of(fig)]))
        written += surfaces.save_figures(fig, out / stem)
    html = surfaces.surface_figure(sources, titles, quantity=quantity)
    written.append(out / "surfaces.html")
    write_text(written[-1], html.to_html(include_plotlyjs=True, full_html=True))
    return with_surface, written, lines


def _no_surface(run: RunData, name: str, directions: str) -> str:
    flags = run.selection.analyze_flags("surface")
    others = f" (it has {name} with {'; '.join(run.unwanted[name])})" if name in run.unwanted else ""
    command = (f"`landscape analyze {shlex.quote(str(run.path))} --directions {directions}"
               + (f" {flags}" if flags else "") + "`")
    busy = run.lacks_while_in_use(f"{name} analysis")
    if busy:
        return f"{busy}; when it is done, run {command}"
    return f"run {run.name} has no {name} analysis{others}; run {command}"


def compare(runs_in: RunsLike, out: str | Path, *, rho: float | None = None, quantity: str = "loss",
            directions: str = "random", selection: Selection | None = None,
            draw_surfaces: bool = True) -> Comparison:
    """Write ``compare.csv`` and, where the runs have surfaces of these ``directions`` (and ``draw_surfaces``:
    the demo's figure recipe draws its own), ``surfaces.png|pdf`` (contours), ``surfaces-3d.png|pdf`` (each with its
    ``.caption.txt``) and ``surfaces.html`` under ``out``; return the table and what was written. ``selection``: the settings whose
    results are read (default: the defaults)."""
    runs = as_runs(runs_in, selection if selection is not None else Selection(RESULT_NAMES))
    if len(runs) < 2:
        raise LandscapeError("compare needs at least two runs (run directories or folders of runs)")
    out = Path(out)
    shown = _columns(runs, rho)
    header, rows, numbers_header, numbers = _table(runs, shown)
    missing = _lacking(runs, shown)
    buffer = io.StringIO()
    cells = [[csv_text(c) for c in row[:2]] + [_csv_number(v) for v in extra]  # names, numbers
             for row, extra in zip(rows, numbers)]
    csv.writer(buffer, lineterminator="\n").writerows([[csv_text(c) for c in header[:2] + numbers_header], *cells])
    written = [out / "compare.csv"]
    write_text(written[0], buffer.getvalue())

    name = surface_output_name(directions)
    missing += [_no_surface(run, name, directions) for run in runs if not run.analysed_rounds(name)]
    with_surface, drawn, surface_lines = _surfaces(runs, out, name, quantity, missing, draw_surfaces)
    lines = settings_lines(runs, [q.pass_name for q in shown])
    caption = settings_caption(with_surface, name)
    if caption:
        lines.append(f"{name} read with {caption}")
    return Comparison(runs, header, rows, missing, written + drawn, lines + surface_lines, numbers_header,
                      numbers)
