"""The run directories every figure reads: ``load_runs`` -> ``RunData``, each result a ``PassRecord``.

Input is files only, per run directory: ``recipe.toml``, ``metrics.jsonl`` (rows with an ``event`` key, such
as divergence events, are skipped) and every ``analysis/round-NNNN/<pass>.json`` with its ``<pass>.npz``
(opened on first use). A pass value is named by its dotted path in the pass's ``result`` (``"global.rhos"``,
``"gradients.cosine_matrix"``): it is read from the NPZ when the JSON's ``arrays`` list names it (the passes
move arrays of more than 16 values there), else from the JSON, with ``"nan"`` / ``"inf"`` strings restored.
A run that lacks the analysis a figure needs raises a LandscapeError that names the run and the ``landscape
analyze`` command to run (``require_passes``). Every run keeps one colour in every figure; runs that differ
only in their recipe's seed are one group with one colour and label (``landscape.figures.seeds``).
"""

from __future__ import annotations

import json
import math
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from landscape.analyze.results import qualified_settings, record_output, record_pass, result_name
from landscape.config.recipe import read_toml
from landscape.core.errors import LandscapeError
from landscape.figures.labels import run_labels
from landscape.figures.seeds import recipe_groups, without_seed
from landscape.figures.selection import Chosen, Selection, choose, settings_label, variant_of
from landscape.store.runs import RunDir

_ROUND_DIR = re.compile(r"^round-(\d{4,})$")
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
    """One ``analysis/round-NNNN/<pass>.json`` and, opened on first use, its ``<pass>.npz``."""

    path: Path
    record: dict
    _arrays: dict[str, np.ndarray] | None = field(default=None, repr=False)

    @property
    def name(self) -> str:
        return str(self.record.get("pass", self.path.stem))

    # What the record holds, not what the file is called (files written before results were named by their
    # settings carry the pass's name whatever their settings): the pass, its output, its settings.
    @cached_property
    def pass_name(self) -> str:
        return record_pass(self.record, self.path.stem)

    @cached_property
    def output(self) -> str:
        """sharpness, surface, surface-pca, ...: what the result is of (``results.output_name``)."""
        return record_output(self.record, self.path.stem)

    @property
    def settings(self) -> dict:
        """The settings record ({"analysis": ..., "pass": ...}); {} for a record without one."""
        settings = self.record.get("settings")
        return settings if isinstance(settings, dict) else {}

    @cached_property
    def qualified(self) -> dict[str, Any]:
        return qualified_settings(self.pass_name, self.settings)

    @cached_property
    def variant(self) -> tuple:
        return variant_of(self.pass_name, self.settings)

    @cached_property
    def canonical(self) -> bool:
        """Whether the file has the name its settings give (not a file written before that naming)."""
        return self.path.stem == result_name(self.pass_name, self.settings)

    @property
    def round(self) -> int:
        if "round" in self.record:
            return int(self.record["round"])
        match = _ROUND_DIR.match(self.path.parent.name)
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
            npz = self.path.with_suffix(".npz")
            if not self.record.get("arrays"):
                self._arrays = {}
            elif not npz.is_file():
                raise LandscapeError(f"{self.path} lists arrays but {npz.name} is missing beside it")
            else:
                try:
                    with np.load(npz, allow_pickle=False) as f:
                        self._arrays = {k: f[k] for k in f.files}
                except (OSError, ValueError) as e:
                    raise LandscapeError(f"cannot read {npz}: {e}") from None
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


@dataclass
class RunData:
    """Everything a figure reads from one run directory.

    ``results`` holds every analysis result of every round, whatever its settings; ``analyses`` (round ->
    output -> result) the ones read, one set of settings per output (sharpness, surface, surface-pca, ...)
    as ``selection`` chooses (``landscape.figures.selection``). ``select`` chooses again."""

    path: Path
    recipe: dict
    metrics: list[dict]  # metrics.jsonl rows without event rows
    results: dict[int, list[PassRecord]]  # round -> every result there
    label: str = ""
    index: int = 0  # position in the loaded list: the run's colour
    selection: Selection = field(default_factory=Selection)
    # runs with one group key are seeds of one configuration (landscape.figures.seeds)
    group: str | None = None
    group_label: str = ""  # the label of that configuration (without the seed)
    analyses: dict[int, dict[str, PassRecord]] = field(init=False)  # round -> output -> the result read
    chosen: dict[str, Chosen] = field(init=False)  # output -> the settings read and the rounds left out
    unwanted: dict[str, list[str]] = field(init=False)  # output -> settings it has, none of them wanted

    def __post_init__(self) -> None:
        self.select(self.selection)

    def select(self, selection: Selection) -> RunData:
        """Read the results ``selection`` wants (see ``landscape.figures.selection``)."""
        self.selection = selection
        self.analyses, self.chosen, self.unwanted = choose(self.results, selection)
        return self

    def shown(self, output: str) -> str:
        """The settings of the ``output`` results read where they are not those asked for ('' when they
        are)."""
        chosen = self.chosen.get(output)
        return chosen.shown if chosen is not None else ""

    def notes(self, outputs: Sequence[str] | None = None) -> list[str]:
        """One line per output whose results of some analysed rounds are left out (other settings)."""
        lines = []
        for output, chosen in self.chosen.items():
            if chosen.left_out and (outputs is None or output in outputs):
                rounds = ", ".join(map(str, chosen.left_out))
                there = "; ".join(sorted({text for texts in chosen.left_out.values() for text in texts}))
                flags = self.selection.analyze_flags(chosen.pass_name)
                shown = settings_label(chosen.pass_name, chosen.settings)
                checkpoints = ",".join(map(str, chosen.left_out))
                lines.append(f"run {self.name}: {output} of round(s) {rounds} left out, computed there only "
                             f"with {there} (shown: {shown}); "
                             f"`landscape analyze {shlex.quote(str(self.path))} "
                             f"--checkpoints {checkpoints} --passes {chosen.pass_name}"
                             + (f" {flags}" if flags else "") + "` computes them")
        return lines

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def color(self) -> str:
        return f"C{self.index % 10}"

    def has_metric(self, key: str) -> bool:
        return any(row.get(key) is not None for row in self.metrics)

    def series(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        """(rounds, values) of the metrics.jsonl rows that carry ``key`` (e.g. test_acc: eval rounds only)."""
        rows = [(row["round"], row[key]) for row in self.metrics
                if row.get(key) is not None and "round" in row]
        if not rows:
            return np.zeros(0, dtype=int), np.zeros(0)
        rounds, values = zip(*rows)
        return np.asarray(rounds, dtype=int), np.asarray(values, dtype=float)

    def analysed_rounds(self, pass_name: str) -> list[int]:
        return sorted(r for r, passes in self.analyses.items() if pass_name in passes)

    def pass_records(self, pass_name: str) -> list[PassRecord]:
        """The pass's records at every analysed round, ascending; an error naming the command when none."""
        rounds = self.analysed_rounds(pass_name)
        if not rounds:
            raise LandscapeError(missing_message(self, [pass_name]))
        return [self.analyses[r][pass_name] for r in rounds]

    def pass_record(self, pass_name: str, round: int | None = None) -> PassRecord:
        """The pass's record at ``round`` (default: the latest analysed round)."""
        rounds = self.analysed_rounds(pass_name)
        if not rounds:
            raise LandscapeError(missing_message(self, [pass_name]))
        if round is None:
            return self.analyses[rounds[-1]][pass_name]
        if round not in rounds:
            raise LandscapeError(
                f"run {self.name} has no {pass_name} analysis at round {round} (analysed rounds: "
                f"{', '.join(map(str, rounds))}); run `landscape analyze {shlex.quote(str(self.path))} "
                f"--checkpoints {round} "
                f"--passes {pass_name}`")
        return self.analyses[round][pass_name]


def missing_message(run: RunData, passes: Sequence[str]) -> str:
    names = ", ".join(passes)
    flags = " ".join(dict.fromkeys(f for f in (run.selection.analyze_flags(p) for p in passes) if f))
    others = [f"{p} with {'; '.join(run.unwanted[p])}" for p in passes if p in run.unwanted]
    what = f" with {run.selection.describe()}" if run.selection.filters else ""
    return (f"run {run.name} has no {names} analysis{what}"
            + (f" (it has {', '.join(others)}: --settings KEY=VALUE picks other settings)" if others else "")
            + f"; run `landscape analyze {shlex.quote(str(run.path))} --passes {','.join(passes)}"
            + (f" {flags}" if flags else "")
            + "`")


def require_passes(runs: Sequence[RunData], passes: Sequence[str]) -> None:
    """One error listing every run that lacks one of ``passes`` (with the command for each)."""
    problems = []
    for run in runs:
        missing = [p for p in passes if not run.analysed_rounds(p)]
        if missing:
            problems.append(missing_message(run, missing))
    if problems:
        raise LandscapeError("; ".join(problems))


def require_metric(runs: Sequence[RunData], key: str, hint: str = "") -> None:
    missing = [run for run in runs if not run.has_metric(key)]
    if missing:
        names = ", ".join(run.name for run in missing)
        known = sorted({k for row in missing[0].metrics for k in row})
        raise LandscapeError(f"run {names} has no '{key}' in metrics.jsonl" + (f" ({hint})" if hint else "")
                             + (f"; keys there: {', '.join(known)}" if known else "; the file has no rows"))


def _read_analyses(path: Path) -> dict[int, list[PassRecord]]:
    """Every result of every round, indexed by the round (the record's settings, not the file's name, say
    what each is)."""
    analyses: dict[int, list[PassRecord]] = {}
    folder = path / "analysis"
    if not folder.is_dir():
        return analyses
    for round_dir in sorted(folder.iterdir()):
        match = _ROUND_DIR.match(round_dir.name)
        if not match or not round_dir.is_dir():
            continue
        for json_path in sorted(round_dir.glob("*.json")):
            try:
                record = json.loads(json_path.read_text())
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise LandscapeError(f"{json_path}: not a readable analysis record ({e})") from None
            if not isinstance(record, dict):
                continue
            analyses.setdefault(int(match.group(1)), []).append(PassRecord(json_path, record))
    return analyses


def _run_dirs(path: Path) -> list[Path]:
    """A run directory, or a folder whose sub-folders are run directories."""
    if not path.exists():
        raise LandscapeError(f"{path} does not exist")
    if RunDir(path).is_run():
        return [path]
    subs = sorted(p for p in path.iterdir() if p.is_dir() and RunDir(p).is_run()) if path.is_dir() else []
    if not subs:
        raise LandscapeError(f"{path} is not a run directory (no recipe.toml) and holds none")
    return subs


def _load_run(path: Path, selection: Selection | None = None) -> RunData:
    run_dir = RunDir(path)
    metrics = [row for row in run_dir.read_metrics() if "event" not in row]
    return RunData(path, read_toml(run_dir.recipe), metrics, _read_analyses(path),
                   selection=selection or Selection())


def load_runs(paths: str | Path | Sequence[str | Path], selection: Selection | None = None) -> list[RunData]:
    """Read run directories (or folders of them): recipe, metrics rows, analysis records; unique labels.
    ``selection`` says which settings' results to read (default: ``Selection()``, the defaults)."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    dirs: list[Path] = []
    for p in paths:
        dirs += [d for d in _run_dirs(Path(p)) if d not in dirs]
    if not dirs:
        raise LandscapeError("no run directories given")
    runs = [_load_run(d, selection) for d in dirs]
    for i, (run, label) in enumerate(zip(runs, run_labels([r.recipe for r in runs], [r.name for r in runs]))):
        run.label, run.index = label, i
    mark_seed_groups(runs)
    return runs


def mark_seed_groups(runs: Sequence[RunData]) -> None:
    """Runs that differ only in their recipe's seed become one group (``landscape.figures.seeds``): one
    ``group`` key, a label without the seed and one colour per group. Nothing changes when no two runs do."""
    found = recipe_groups([run.recipe for run in runs])
    if all(len(members) == 1 for members in found):
        return
    firsts = [runs[members[0]] for members in found]
    labels = run_labels([without_seed(run.recipe) for run in firsts], [run.name for run in firsts])
    for k, (members, label) in enumerate(zip(found, labels)):
        for i in members:
            runs[i].index, runs[i].group, runs[i].group_label = k, f"recipe-{k}", label


RunsLike = Sequence["RunData | str | Path"] | str | Path


def as_runs(runs: RunsLike, selection: Selection | None = None) -> list[RunData]:
    """RunData as given (choosing again when a ``selection`` is given), or loaded from paths."""
    if isinstance(runs, (str, Path)):
        return load_runs(runs, selection)
    runs = list(runs)
    if runs and all(isinstance(r, RunData) for r in runs):
        return runs if selection is None else [run.select(selection) for run in runs]
    return load_runs([r.path if isinstance(r, RunData) else r for r in runs], selection)
