"""Analysis results as stored, and as a table: each ``analysis/round-NNNN/<name>.json`` of a run directory read
as a ``PassRecord`` (``read_results``), and every scalar they hold as rows of a pandas DataFrame
(``result_rows``, ``frame``: ``Run.results()``, ``landscape.results``).

A result value is named by its dotted path in the pass's ``result`` (``"global.rhos"``,
``"gradients.cosine_matrix"``): it is read from the NPZ when the JSON's ``arrays`` list names it (the passes
move arrays of more than 16 values there), else from the JSON, with ``"nan"`` / ``"inf"`` strings restored.

The table is tidy: one row per measured quantity of a result, its columns ``run``, ``round``, ``pass``,
``quantity``, ``value`` (a float), then one column per setting whose value differs between the table's results
(``analysis_samples`` where two runs were analysed on different samples, ``hessian.top_k`` where a round holds
the hessian pass at two ``top_k``; the analysis settings by their name, each pass's options as
``<pass>.<option>``, the names ``landscape compare --settings`` takes), a list spelt ``0.01,0.05,0.1``, empty
where a result does not record the setting. A setting every result shares (or records alone) tells no two rows
apart and is no column: ``PassRecord.settings`` holds them all.

The quantities are what each pass declares it measures (``Measures``: the analysis's declaration,
``PassSpec.measures``, passed in by the notebook API, ``landscape.open_run`` and ``landscape.results``): its
summary quantities (``lambda_max``, ``trace``, ``S_rho(0.05)``, ``Delta_D``: the numbers the tables and figures
show, named as there), then the other numbers of its result that it declares, each under the one name of its
concept (the flatness result's ``distance`` is ``Delta_D``, the loss result's ``accuracy`` and its summary's
``acc`` are ``accuracy``; other numbers by their dotted path, ``trace.stderr``). What else a result records is
no quantity: the settings it echoes (``global.seed``, ``top.tol``), its bookkeeping (seeds, counts of work and
samples, ``hvp_count``, ``trace.samples``, the model's size ``dim``) and what another pass's quantity gives
(the ``F(w)`` the sharpness pass records is the loss pass's ``loss``): the pass declares those too
(``PassSpec.bookkeeping``) and its test checks that every number of its result is declared one or the other. A
pass that declares no quantities (a pass of a module of your own, one no longer declared, or a table read
without the declarations) gives its summary and every number of its result. Arrays are left out, short ones
in the JSON (``top.values``, ``global.sharpness``) and the NPZ's alike: the summary quantities carry their
headline numbers (``lambda_max`` is ``top.values[0]``, ``S_rho(rho)`` one per radius of ``global.sharpness``).
``PassRecord.value(key)`` reads any value, arrays and left-out numbers alike. Text (``top.method``),
true/false flags and nulls are not quantities; NaN and infinities are kept.
"""

from __future__ import annotations

import json
import math
import numbers
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from landscape.core.errors import LandscapeError
from landscape.store.results.files import REDO, read_arrays, read_record

if TYPE_CHECKING:
    import pandas

COLUMNS = ("run", "round", "pass", "quantity", "value")

ROUND_DIR = re.compile(r"^round-(\d{4,})$")
_NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf, "Infinity": math.inf,
               "-Infinity": -math.inf, "NaN": math.nan}
_MISSING = object()


def _restore(value: Any) -> Any:
    """JSON values as the pass produced them: "nan" / "inf" strings back to floats (passes._json_ready)."""
    if isinstance(value, str) and value in _NON_FINITE:
        return _NON_FINITE[value]
    if isinstance(value, list):
        return [_restore(v) for v in value]
    if isinstance(value, dict):
        return {k: _restore(v) for k, v in value.items()}
    return value


@dataclass
class PassRecord:
    """One analysis result as stored: ``analysis/round-NNNN/<name>.json`` and, opened on first use, its
    ``<name>.npz``."""

    path: Path
    record: dict
    _arrays: dict[str, np.ndarray] | None = field(default=None, repr=False)

    @property
    def name(self) -> str:
        return str(self.record.get("pass", self.path.stem))

    @property
    def settings(self) -> dict:
        """The settings record ({"analysis": ..., "pass": ...}); {} for a record without one."""
        settings = self.record.get("settings")
        return settings if isinstance(settings, dict) else {}

    @property
    def round(self) -> int:
        if "round" in self.record:
            return int(self.record["round"])
        match = ROUND_DIR.match(self.path.parent.name)
        if match is None:
            raise LandscapeError(f"{self.path}: no round in the record and not in a round-NNNN folder")
        return int(match.group(1))

    @property
    def summary(self) -> dict[str, Any]:
        return _restore(self.record.get("summary", {}))

    @property
    def result(self) -> dict[str, Any]:
        return self.record.get("result", {})

    def arrays(self) -> dict[str, np.ndarray]:
        if self._arrays is None:
            listed = self.record.get("arrays")
            npz = self.path.with_suffix(".npz")
            if not listed:
                self._arrays = {}
            elif not npz.exists() and not npz.is_symlink():
                raise LandscapeError(f"{self.path} lists arrays but {npz.name} is missing beside it; {REDO}")
            else:
                self._arrays = read_arrays(npz, listed)
        return self._arrays

    def value(self, key: str, default: Any = _MISSING) -> Any:
        """The result value at a dotted path: from the NPZ when it holds it, else from the JSON."""
        if key in self.record.get("arrays", ()):
            arrays = self.arrays()
            if key in arrays:
                return arrays[key]
        node: Any = self.result
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                if default is _MISSING:
                    raise LandscapeError(f"{self.path}: the {self.name} result has no '{key}' (written by an "
                                         "older or different version of the pass; rerun it with --force)")
                return default
            node = node[part]
        return _restore(node)

    def array(self, key: str) -> np.ndarray:
        return np.asarray(self.value(key), dtype=float)


def read_results(path: Path) -> dict[int, list[PassRecord]]:
    """Every analysis result of every round of the run directory ``path``, by round, each round's in file-name
    order (the record's settings, not the file's name, say what each is)."""
    analyses: dict[int, list[PassRecord]] = {}
    folder = Path(path) / "analysis"
    if not folder.is_dir():
        return analyses
    for round_dir in sorted(folder.iterdir()):
        match = ROUND_DIR.match(round_dir.name)
        if not match or not round_dir.is_dir():
            continue
        for json_path in sorted(round_dir.glob("*.json")):
            record = read_record(json_path)  # a damaged or special file: one line naming it
            analyses.setdefault(int(match.group(1)), []).append(PassRecord(json_path, record))
    return analyses


def loose_arrays(path: Path) -> list[tuple[int, Path]]:
    """(round, path) of the NPZ files in the run directory ``path``'s ``analysis/round-NNNN/`` with no JSON
    beside them, so no result: partial surface grids (``*.partial.npz``) and surfaces written before results
    had a record."""
    folder = Path(path) / "analysis"
    rounds = sorted(p for p in folder.iterdir() if ROUND_DIR.match(p.name) and p.is_dir()) if folder.is_dir() else []
    return [(int(ROUND_DIR.match(d.name).group(1)), npz) for d in rounds for npz in sorted(d.glob("*.npz"))
            if not npz.with_suffix(".json").is_file()]


@dataclass(frozen=True)
class Indexed:
    """Numbers a result holds as a short array (``values``, a dotted key) beside the array of what each is at
    (``at``): each a quantity of its own, named ``name`` with its ``at`` value formatted in (the adaptive S_rho
    per radius: ``Indexed("adaptive.sharpness", "adaptive.rhos", "adaptive S_rho({:g})")``)."""

    values: str
    at: str
    name: str


class Measures(Protocol):
    """What the table holds of each pass's results (the analysis declares it: ``PassSpec.measures`` and
    ``PassSpec.indexed``)."""

    def measures(self, pass_name: str) -> Mapping[str, str] | None:
        """{key of the result (dotted) or of its summary: its name in the table} of the pass; None for a pass
        that declares none (every number of its result is then a quantity)."""

    def indexed(self, pass_name: str) -> Sequence[Indexed]:
        """The pass's numbers held as arrays, a quantity each (``Indexed``); () for none."""


def quantities(rec: PassRecord, measures: Mapping[str, str] | None = None,
               indexed: Sequence[Indexed] = ()) -> dict[str, float]:
    """Quantity -> value of one result: its summary's numbers, by the name ``measures`` gives them or their own,
    then the numbers of its result that ``measures`` names, under that name, then those ``indexed`` names (a
    name once, the first value found); with ``measures`` None, every number of its result by its dotted path."""
    names = measures if measures is not None else {}
    found: dict[str, float] = {}
    for key, value in _numbers(rec.summary):
        found.setdefault(names.get(key, key), value)
    for key, value in _numbers(_restore(rec.result)):
        if measures is None:
            found.setdefault(key, value)
        elif key in measures:
            found.setdefault(measures[key], value)
    for each in indexed:
        values, at = rec.value(each.values, None), rec.value(each.at, None)
        if values is None or at is None:
            continue  # a result without them (the sharpness pass's adaptive = false)
        for where, value in zip(np.atleast_1d(_restore(at)), np.atleast_1d(_restore(values))):
            found.setdefault(each.name.format(float(where)), float(value))
    return found


def _numbers(node: Any, key: str = "") -> Iterator[tuple[str, float]]:
    """(dotted path, float) of every number in nested dicts; lists, text, flags and nulls left out."""
    if isinstance(node, Mapping):
        for name, value in node.items():
            yield from _numbers(value, f"{key}.{name}" if key else str(name))
    elif key and isinstance(node, numbers.Real) and not isinstance(node, (bool, np.bool_)):
        yield key, float(node)


def _spelt(value: Any) -> Any:
    """A setting as one cell: a scalar as it is, a list as ``a,b`` (true / false for flags), a table as JSON."""
    if isinstance(value, (list, tuple)):
        return ",".join(("true" if v else "false") if isinstance(v, bool) else str(_spelt(v)) for v in value)
    if isinstance(value, Mapping):
        return json.dumps(value, sort_keys=True, default=str)
    return value


def settings_columns(pass_name: str, settings: Any) -> dict[str, Any]:
    """A settings record ({"analysis": ..., "pass": ...}) as columns: the analysis settings by name, the
    pass's options as ``<pass>.<option>``."""
    settings = settings if isinstance(settings, Mapping) else {}
    analysis, options = settings.get("analysis"), settings.get("pass")
    columns = {key: _spelt(v) for key, v in (analysis if isinstance(analysis, Mapping) else {}).items()
               if key not in COLUMNS}
    columns.update({f"{pass_name}.{key}": _spelt(v)
                    for key, v in (options if isinstance(options, Mapping) else {}).items()})
    return columns


def result_rows(run: str, records: Mapping[int, Sequence[PassRecord]],
                measures: Measures | None = None) -> list[dict[str, Any]]:
    """The table's rows of one run's results (round -> its ``PassRecord``s): one per quantity (``quantities``,
    by what ``measures`` says of each pass; None: every number of every result), rounds ascending, each round's
    results in file-name order."""
    rows = []
    for round_number, recs in sorted(records.items()):
        for rec in recs:
            settings = settings_columns(rec.name, rec.settings)
            declared = measures.measures(rec.name) if measures is not None else None
            # a Measures of its own that predates ``indexed`` tabulates no arrays
            indexed = measures.indexed(rec.name) if hasattr(measures, "indexed") else ()
            rows += [{"run": run, "round": round_number, "pass": rec.name, "quantity": quantity, "value": value,
                      **settings} for quantity, value in quantities(rec, declared, indexed).items()]
    return rows


def frame(rows: Sequence[Mapping[str, Any]]) -> pandas.DataFrame:
    """The rows as a DataFrame: ``COLUMNS``, then the settings columns that tell rows apart (two values or more
    among the rows that record the setting), in the order they first appear."""
    import pandas as pd

    columns = list(COLUMNS) + list(dict.fromkeys(key for row in rows for key in row if key not in COLUMNS))
    table = pd.DataFrame.from_records(list(rows), columns=columns)
    same = [c for c in columns[len(COLUMNS):] if table[c].map(_cell).nunique(dropna=True) < 2]
    return table.drop(columns=same).astype({"round": "int64", "value": "float64"})


def _cell(value: Any) -> Any:
    """A settings cell as compared: 2 and 2.0 alike, a missing one as missing."""
    if value is None or isinstance(value, float) and math.isnan(value):
        return None
    return float(value) if isinstance(value, numbers.Real) and not isinstance(value, bool) else str(value)
