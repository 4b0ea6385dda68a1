"""The report page's HTML parts, rendered from the jinja2 templates in ``templates/``: its plots (``Page``),
notes, cells and tables.

The templates hold all the markup: ``page.html`` the page, ``report.css`` its style sheet, ``parts.html`` the
repeated parts as macros (``parts()``). Autoescape is on, so every value (a run's name, a recipe's value, a
path) is escaped there; what is marked safe is trusted output: plotly's JSON (with every '<' escaped), the
analysis registry's HTML column names and parts already rendered by the templates. Python keeps the numbers:
the cells are text or small records (``Value``, ``Stat``, ``RunCell``) the ``cell`` macro renders.

``Page.plot`` writes a plot as a ``<div class="plot" id="plot-NAME" data-name="NAME">`` followed by a plain
``Plotly.newPlot`` call on its JSON (names unique on the page). The tables: the comparison across runs (one
row per run, or per configuration over its seeds: mean +- standard error and n), each run's analysis
summaries at every analysed round, and its recipe; their numbers come from ``landscape.figures.report.data``.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from markupsafe import Markup
from matplotlib.colors import to_hex

from landscape.analyze.registry import Quantity
from landscape.figures.over_seeds import rounds_text
from landscape.figures.report.data import (
    SAME_DRAWS,
    ComparisonGroup,
    SeedStat,
    comparison_groups,
    metric_at,
    missing_reason,
    quantities,
)
from landscape.figures.rundata import RunData

PLOTLY_CONFIG = {"responsive": True, "displaylogo": False}


@functools.cache
def environment() -> Environment:
    """The templates of ``landscape/figures/templates``, autoescaped (HTML); JSON keeps its keys' order."""
    env = Environment(loader=PackageLoader("landscape.figures", "templates"),
                      autoescape=select_autoescape(("html",)), undefined=StrictUndefined,
                      trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
    env.policies["json.dumps_kwargs"] = {"sort_keys": False}
    env.globals.update(same_draws=SAME_DRAWS, same_draws_title=SAME_DRAWS_TITLE)
    return env


def parts() -> Any:
    """The macros of ``parts.html`` (note, swatch, figure, cell, the tables, the surfaces section): each a
    callable returning Markup."""
    return environment().get_template("parts.html").module


def render_page(**context: Any) -> str:
    """``page.html`` filled in (see its header for what it reads)."""
    return environment().get_template("page.html").render(**context)


# -- page parts ---------------------------------------------------------------------------------------------


def slug_of(text: str) -> str:
    """The text as an HTML id part: letters, digits, '_' and '-' ('plot' for none)."""
    return re.sub(r"[^A-Za-z0-9_-]+", "-", text).strip("-") or "plot"


def _script_json(text: str) -> Markup:
    """JSON safe inside <script>: no '<' can end the element or open a comment."""
    return Markup(text.replace("<", "\\u003c"))


@dataclass
class Page:
    """The plots of a page: unique names, each rendered by a plain Plotly.newPlot call."""

    names: list[str] = field(default_factory=list)

    def plot(self, name: str, fig: Any, caption: str = "", settings: str = "") -> Markup:
        """The plot's div and newPlot call, its caption (what it shows) and its settings line below it."""
        import plotly.io as pio

        slug = base = slug_of(name)
        k = 2
        while slug in self.names:
            slug, k = f"{base}-{k}", k + 1
        self.names.append(slug)
        spec = _script_json(pio.to_json(fig, validate=False))
        return parts().figure(slug, spec, PLOTLY_CONFIG, caption, settings)


def note(text: str) -> Markup:
    """A remark on the page (what is missing, left out or cannot be drawn)."""
    return parts().note(text)


# -- cells --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Value:
    """A number as the tables print it, '+-' its standard error, ' (round N)' where it is not from the row's
    latest analysed round, and a remark (``why``): why there is no number ('n/a', NaN), or that a standard
    error of 0 is no error estimate (every Monte-Carlo draw gave the same value: ``SAME_DRAWS``)."""

    kind: ClassVar[str] = "value"
    text: str
    se: str | None = None
    at: int | None = None
    why: str | None = None


SAME_DRAWS_TITLE = ("the Monte-Carlo standard error is 0: every draw gave this value, so the draws give no error "
                    "estimate (a rate of 0 here: no draw counted)")


@dataclass(frozen=True)
class Stat:
    """A value over seeds: the mean and its standard error (each kept on one line), '(n=2)' when fewer seeds
    than the group's have it, the rounds it was read at when they are not the latest."""

    kind: ClassVar[str] = "stat"
    mean: str
    se: str | None = None
    n: int | None = None
    rounds: str = ""


@dataclass(frozen=True)
class RunCell:
    """A run's (or a configuration's) label after a swatch of its colour, its directory below it."""

    kind: ClassVar[str] = "run"
    colour: str
    label: str
    directory: str | None = None


def _num(value: Any, se: Any = None, at: int | None = None, why: str = "not computed") -> Value:
    """A table's number; NaN is 'n/a' with ``why`` (the result's own reason: ``data.missing_reason``)."""
    if value is None:
        return Value("-", at=at)
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return Value(str(int(value)), at=at)
    try:
        v = float(value)
    except (TypeError, ValueError):
        return Value(str(value), at=at)
    if math.isnan(v):
        return Value("n/a", at=at, why=why)
    try:
        error = float(se) if se is not None else math.nan
    except (TypeError, ValueError):
        error = math.nan
    if error == 0:
        return Value(f"{v:.4g}", None, at, SAME_DRAWS)
    return Value(f"{v:.4g}", f"{error:.2g}" if math.isfinite(error) else None, at)


def _percent(value: float | None) -> Value | str:
    return _num(100 * value) if value is not None else "-"


def _stat(stat: SeedStat, rounds: Sequence[int] = ()) -> Stat | Value | str:
    """A comparison cell of several seeds; ``rounds``: the rounds it was read at, shown when not the latest."""
    if stat.mean is None:
        return "-"
    if math.isnan(stat.mean):
        return Value("n/a", why="not computed for every seed")
    return Stat(f"{stat.mean:.4g}", f"{stat.se:.2g}" if stat.se is not None else None,
                stat.n if stat.n < len(stat.per_seed) else None, rounds_text(rounds) if rounds else "")


# -- tables -------------------------------------------------------------------------------------------------


def _single_row(cg: ComparisonGroup, seeded: bool, shown: Sequence[Quantity]) -> list[Any]:
    (row,) = cg.rows
    run = row.run
    cells = [RunCell(to_hex(run.color), run.label, run.name), *(["1"] if seeded else []),
             _num(row.rounds), _percent(row.final_acc), _percent(row.best_acc), _num(row.final_loss),
             _num(row.online_distance), _num(row.latest)]
    for q, value in zip(shown, row.values):
        if value is None:
            cells.append("-")
            continue
        at = None if value[2] == row.latest else value[2]
        why = missing_reason(run.analyses[value[2]].get(q.pass_name), q)
        cells.append(_num(*value[:2], at=at, why=why))
    return cells


def _group_row(cg: ComparisonGroup, shown: int) -> list[Any]:
    group = cg.group
    rounds = sorted({row.rounds for row in cg.rows if row.rounds is not None})
    latest = sorted({row.latest for row in cg.rows if row.latest is not None})
    cells = [RunCell(to_hex(group.colour), group.label, group.name), str(group.n),
             ", ".join(map(str, rounds)) or "-",
             _stat(cg.stat(lambda row: None if row.final_acc is None else 100 * row.final_acc)),
             _stat(cg.stat(lambda row: None if row.best_acc is None else 100 * row.best_acc)),
             _stat(cg.stat(lambda row: row.final_loss)), _stat(cg.stat(lambda row: row.online_distance)),
             ", ".join(map(str, latest)) or "-"]
    for k in range(shown):
        stat, at, at_latest = cg.quantity(k)
        cells.append(_stat(stat, () if at_latest else at))
    return cells


def comparison_table(runs: Sequence[RunData], rho: float | None) -> Markup:
    """One row per run (per configuration, for runs that differ only in their seed: the mean +- standard
    error over the seeds, and n): training outcome and the latest value of each analysis quantity."""
    shown = [q for q in quantities([rho] if rho is not None else [])
             if any(run.analysed_rounds(q.pass_name) for run in runs)]
    found = comparison_groups(runs, shown)
    seeded = any(cg.group.n > 1 for cg in found)
    rows = [_single_row(cg, seeded, shown) if cg.group.n == 1 else _group_row(cg, len(shown)) for cg in found]
    return parts().comparison_table(seeded, [q.header for q in shown], rows)


def analysis_table(run: RunData, rhos: Sequence[float]) -> Markup:
    """One row per analysed round of the run: test accuracy there and every analysis quantity it has."""
    shown = [q for q in quantities(rhos) if run.analysed_rounds(q.pass_name)]
    rows = []
    for r in sorted(run.analyses):
        row = [str(r), _percent(metric_at(run, "test_acc", r))]
        for q in shown:
            rec = run.analyses[r].get(q.pass_name)
            row.append(_num(*q.read(rec), why=missing_reason(rec, q)) if rec is not None else "-")
        rows.append(row)
    return parts().analysis_table([q.header for q in shown], rows)


def recipe_table(recipe: dict) -> Markup:
    """The recipe as a two-column table, one header row per TOML section."""
    plain = [(k, repr(v)) for k, v in recipe.items() if not isinstance(v, dict)]
    sections = [(name, [(k, _toml_text(v)) for k, v in values.items()])
                for name, values in recipe.items() if isinstance(values, dict)]
    return parts().recipe_table(plain, sections)


def _entries(recipe: dict) -> dict[tuple[str | None, str], Any]:
    """(section, key) -> value of a recipe: its top-level values (section None) and each section's keys."""
    out: dict[tuple[str | None, str], Any] = {}
    for key, value in recipe.items():
        if isinstance(value, dict):
            out.update({(key, inner): v for inner, v in value.items()})
        else:
            out[(None, key)] = value
    return out


def _nested(entries: dict[tuple[str | None, str], Any]) -> dict:
    out: dict[str, Any] = {}
    for (section, key), value in entries.items():
        if section is None:
            out[key] = value
        else:
            out.setdefault(section, {})[key] = value
    return out


def recipe_tables(recipes: Sequence[dict]) -> tuple[Markup | None, list[Markup | None]]:
    """The recipes of the page's runs, each value once: for one run its whole recipe (and no shared table);
    for several, the table of what every run's recipe says alike, and per run the table of its own values,
    the keys where it differs from another run (None where it has none)."""
    if len(recipes) < 2:
        return None, [recipe_table(recipe) for recipe in recipes]
    entries = [_entries(recipe) for recipe in recipes]
    alike = {key: value for key, value in entries[0].items()
             if all(key in other and repr(other[key]) == repr(value) for other in entries[1:])}
    own = [{key: value for key, value in these.items() if key not in alike} for these in entries]
    return recipe_table(_nested(alike)), [recipe_table(_nested(these)) if these else None for these in own]


def _toml_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    return str(value)
