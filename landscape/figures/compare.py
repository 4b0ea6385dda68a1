"""``landscape compare``: runs side by side, from their files.

A table (one row per run) of the quantities the papers compare: final test accuracy, lambda_max, the Hutch++
trace, S_rho, the flatness distance Delta_D (the flatness pass where it ran, else the value training logged
at the last round), the flatness incompatibility Delta_FI and the mean client gradient cosine, each at the
latest round its pass analysed; and the runs' loss surfaces (latest analysed round) side by side on ONE
colour scale, as contour maps and 3D panels (PNG + PDF) and as interactive 3D (HTML). The table is printed
and written as CSV. A run that lacks an analysis shows "-" and the command that computes it is named.

Each quantity is read from results of one set of settings (``landscape.figures.selection``): the defaults
(training split, BN mode eval, the surface's global data), or those a ``Selection`` asks for (``landscape
compare --settings split=test``); ``Comparison.settings`` says which, and the surface panels are titled with
the settings they show where those are not the ones asked for.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from landscape.errors import LandscapeError
from landscape.figures import curves, surfaces
from landscape.figures.curves import RunData, RunsLike, as_runs
from landscape.figures.report import ComparisonRow, Quantity, all_rhos, comparison_rows, quantities
from landscape.figures.selection import Selection
from landscape.runs import surface_result_name, write_text

# The columns the papers compare, by the plain name of report.quantities (S_rho is added by radius).
COLUMNS = ["lambda_max", "trace", "Delta_FI", "mean grad cos"]


@dataclass
class Comparison:
    runs: list[RunData]
    header: list[str]
    rows: list[list[str]]  # formatted cells
    missing: list[str]  # one line per run and pass it lacks, with the command
    written: list[Path]
    settings: list[str]  # which settings the table and the surfaces show


def _cell(value: Any, se: Any = None) -> str:
    if value is None:
        return "-"
    v = float(value)
    text = f"{v:.4g}"
    if se is not None and math.isfinite(float(se)):
        text += f" +- {float(se):.2g}"
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


def text_table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths)), "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in rows]
    return "\n".join(line.rstrip() for line in lines)


def compare(runs_in: RunsLike, out: str | Path, *, rho: float | None = None, quantity: str = "loss",
            directions: str = "random", selection: Selection | None = None) -> Comparison:
    """Write ``compare.csv`` and, where the runs have surfaces of these ``directions``, ``surfaces.png|pdf``
    (contours), ``surfaces-3d.png|pdf`` and ``surfaces.html`` under ``out``; return the table and what was
    written. ``selection``: the settings whose results are read (default: the defaults)."""
    runs = as_runs(runs_in, selection if selection is not None else Selection())
    if len(runs) < 2:
        raise LandscapeError("compare needs at least two runs (run directories or folders of runs)")
    out = Path(out)
    shown = _columns(runs, rho)
    header = ["run", "directory", "rounds", "test acc (%)"] + [q.text for q in shown]
    rows = [_format(row, shown) for row in comparison_rows(runs, shown)]
    missing = []
    for run in runs:
        needed = {q.pass_name for q in shown} | {"sharpness"}
        lacking = sorted({name for name in needed if not run.analysed_rounds(name)} - {"flatness"})
        if lacking:
            missing.append(curves.missing_message(run, lacking))
        missing += run.notes([q.pass_name for q in shown])
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerows([header, *rows])
    written = [out / "compare.csv"]
    write_text(written[0], buffer.getvalue())

    name = surface_result_name(directions)
    with_surface = [run for run in runs if run.analysed_rounds(name)]
    for run in runs:
        if run not in with_surface:
            flags = run.selection.analyze_flags("surface")
            others = f" (it has {name} with {'; '.join(run.unwanted[name])})" if name in run.unwanted else ""
            missing.append(f"run {run.name} has no {name} analysis{others}; run `landscape analyze {run.path} "
                           f"--directions {directions}" + (f" {flags}" if flags else "") + "`")
    if with_surface:
        sources = [run.pass_record(name).path.with_suffix(".npz") for run in with_surface]
        titles = [curves.with_settings(f"{run.label}, round {run.analysed_rounds(name)[-1]}", run.shown(name))
                  for run in with_surface]
        flat = [s for s in sources if not surfaces.load_surface(s).is_2d]
        if flat:
            missing.append(f"{', '.join(map(str, flat))}: 1D surfaces; compare draws 2D ones")
        else:
            for kind, stem in (("contour", "surfaces"), ("3d", "surfaces-3d")):
                fig, _ = surfaces.panels_figure(sources, titles, kind=kind, quantity=quantity)
                written += [surfaces.save_figure(fig, out / f"{stem}{suffix}") for suffix in (".png", ".pdf")]
            html = surfaces.surface_figure(sources, titles, quantity=quantity)
            written.append(out / "surfaces.html")
            write_text(written[-1], html.to_html(include_plotlyjs=True, full_html=True))
    outputs = [q.pass_name for q in shown] + [name]
    return Comparison(runs, header, rows, missing, written, curves.settings_lines(runs, outputs))
