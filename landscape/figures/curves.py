"""Curves and summaries from run directories (matplotlib, Agg canvas; PNG, or PDF / SVG by the file name).

Input is files only, per run directory: ``recipe.toml``, ``metrics.jsonl`` (rows with an ``event`` key, such
as divergence events, are skipped) and every ``analysis/round-NNNN/<pass>.json`` with its ``<pass>.npz``
(opened on first use). A pass value is named by its dotted path in the pass's ``result`` (``"global.rhos"``,
``"gradients.cosine_matrix"``): it is read from the NPZ when the JSON's ``arrays`` list names it (the passes
move arrays of more than 16 values there), else from the JSON, with ``"nan"`` / ``"inf"`` strings restored.

Renderers (each ``plot_*`` saves and returns the path; its ``*_figure`` twin returns the matplotlib Figure):
``plot_accuracy`` (test accuracy over the evaluation rounds), ``plot_metric_over_rounds`` (any metrics.jsonl
key), ``plot_flatness_and_sharpness`` (FedNSAM Fig. 2: online flatness distance Delta_D, and global
sharpness S_rho(x^t) and lambda_1(x^t) at the analysed rounds), ``plot_hessian_summary`` (FedSAM-paper
Hessian figure: lambda_max and lambda_1 / lambda_k bars, SLQ spectral densities), ``plot_incompatibility``
(Delta_FI and its split with standard errors) and ``plot_alignment_heatmaps`` (client x client gradient
cosines on one colour scale [-1, 1]). A run that lacks the analysis a figure needs raises a LandscapeError
that names the run and the ``landscape analyze`` command to run. Every run keeps one colour in every figure.

Seeds: runs that differ only in their recipe's seed (``landscape.figures.seeds``; a figure recipe's seeds of
one run id) are one group with one colour and label. Curves over rounds draw the group's mean with a +-SE band
(error bars at a single round) and "(n=3)" in the legend; the Hessian bars are means with SE error bars and
each seed as a hollow dot; spectral densities draw every seed as a thin line of the group's colour; alignment
heatmaps show the mean cosine matrix (n in the title); incompatibility curves the mean +- SE over seeds. A
single seed is drawn as before. A curve analysed at one round only is drawn as points on an axis with that
round alone.
"""

from __future__ import annotations

import json
import math
import re
import shlex
import textwrap
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from landscape.algorithm_labels import algorithm_label
from landscape.analyze.results import qualified_settings, record_output, record_pass, result_name
from landscape.errors import LandscapeError
from landscape.figures.seeds import (
    SeedGroup,
    flat_recipe,
    groups,
    mean_se,
    recipe_groups,
    series_mean,
    without_seed,
)
from landscape.figures.selection import Chosen, Selection, caption, choose, settings_label, variant_of
from landscape.figures.surfaces import save_figure
from landscape.recipe import read_toml
from landscape.runs import RunDir

COSINE_CMAP = "RdBu_r"  # diverging: -1 blue, 0 white, +1 red

# y-axis labels (with units) of the metrics.jsonl keys
METRIC_LABELS = {
    "train_loss": "train loss (cross-entropy, nats)",
    "test_loss": "test loss (cross-entropy, nats)",
    "test_acc": "test accuracy (fraction)",
    "flatness_distance": r"flatness distance $\Delta_D$ ($\|y_i - \bar y\|^2$, mean over clients)",
    "flatness_distance_normalized": r"$\Delta_D / \|\bar y\|^2$",
    "flatness_distance_to_global": r"distance to the new global model ($\|y_i - x^{t+1}\|^2$, mean over clients)",
    "flatness_distance_to_global_normalized": r"$\|y_i - x^{t+1}\|^2$ / $\|x^{t+1}\|^2$",
    "update_norm": r"server update norm $\|x^{t+1} - x^t\|$",
    "uplink_floats": "uplink floats per round",
    "seconds": "seconds per round (s)",
    "lr": "learning rate",
}

_ROUND_DIR = re.compile(r"^round-(\d{4,})$")
_NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf, "Infinity": math.inf, "-Infinity": -math.inf,
               "NaN": math.nan}
_LABEL_IGNORES = {"name", "train.device", "dataset.root", "dataset.download"}
_MISSING = object()


# -- reading ----------------------------------------------------------------------------------------------


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
    group: str | None = None  # runs with one group key are seeds of one configuration (landscape.figures.seeds)
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
        """The settings of the ``output`` results read where they are not those asked for ('' when they are)."""
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
                lines.append(f"run {self.name}: {output} of round(s) {rounds} left out, computed there only with "
                             f"{there} (shown: {shown}); `landscape analyze {shlex.quote(str(self.path))} "
                             f"--checkpoints {','.join(map(str, chosen.left_out))} --passes {chosen.pass_name}"
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
        rows = [(row["round"], row[key]) for row in self.metrics if row.get(key) is not None and "round" in row]
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
    return RunData(path, read_toml(run_dir.recipe), metrics, _read_analyses(path), selection=selection or Selection())


def _fmt(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def run_label(recipe: dict) -> str:
    """'FedSAM alpha=0.1': the algorithm's name and the partition's heterogeneity."""
    algorithm = str(recipe.get("algorithm", {}).get("name", "?"))
    label = algorithm_label(algorithm)
    partition = recipe.get("partition", {})
    kind = partition.get("name")
    if kind == "dirichlet" and "alpha" in partition:
        label += f" alpha={_fmt(partition['alpha'])}"
    elif kind == "pathological" and "classes_per_client" in partition:
        label += f" {partition['classes_per_client']} classes/client"
    elif kind:
        label += f" {kind}"
    return label


def run_labels(recipes: Sequence[dict], names: Sequence[str]) -> list[str]:
    """Labels per run, unique: runs sharing a label get the recipe keys they differ in (e.g. seed=1), and
    the directory name when even those are the same."""
    base = [run_label(r) for r in recipes]
    labels = list(base)
    for label in set(base):
        group = [i for i, b in enumerate(base) if b == label]
        if len(group) < 2:
            continue
        flats = [flat_recipe(recipes[i]) for i in group]
        keys = sorted(set().union(*flats) - _LABEL_IGNORES)
        differing = [k for k in keys if len({repr(f.get(k)) for f in flats}) > 1]
        tails = Counter(k.rsplit(".", 1)[-1] for k in differing)
        short = {k: k.rsplit(".", 1)[-1] if tails[k.rsplit(".", 1)[-1]] == 1 else k for k in differing}
        for i, flat in zip(group, flats):
            extra = ", ".join(f"{short[k]}={_fmt(flat.get(k))}" for k in differing)
            labels[i] = f"{label} {extra}" if extra else label
    counts = Counter(labels)
    return [f"{label} ({name})" if counts[label] > 1 else label for label, name in zip(labels, names)]


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


def settings_caption(runs: Sequence[RunData], output: str) -> str:
    """The settings of the ``output`` results a figure of ``runs`` shows, where they are not those asked for
    (the defaults, or a figure recipe's): '' when they are; shared settings once; else run by run."""
    return caption([(run.label, run.shown(output)) for run in runs if run.analysed_rounds(output)],
                   "as in the recipe" if any(run.selection.exact for run in runs) else "defaults")


def settings_lines(runs: Sequence[RunData], outputs: Sequence[str]) -> list[str]:
    """Which settings the results read of ``runs`` have: the selection, then each output read with other
    settings than asked (``settings_caption``)."""
    selection = runs[0].selection if runs else Selection()
    if selection.exact:
        head = "settings: those the figure recipe analyses with"
    elif selection.filters:
        head = f"settings: {selection.describe()} (the rest at their defaults where computed)"
    else:
        head = "settings: the defaults where computed (training split, BN mode eval, global surface data)"
    lines = [head]
    for output in dict.fromkeys(outputs):
        text = settings_caption(runs, output)
        if text:
            lines.append(f"{output} read with {text}")
    return lines


def with_settings(title: str, settings: str, sep: str = " ", *, matplotlib: bool = True, width: int = 60) -> str:
    """A title with the settings it shows in brackets (for matplotlib a '$' is escaped: it starts maths, and
    settings on a line of their own are wrapped at ``width`` characters, so panel titles side by side do not
    meet)."""
    if matplotlib:
        settings = settings.replace("$", "\\$")
        if sep == "\n" and len(settings) > width:
            settings = "\n".join(textwrap.wrap(settings, width, break_on_hyphens=False))
    return f"{title}{sep}[{settings}]" if settings else title


# -- writing ----------------------------------------------------------------------------------------------


def _new_figure(width: float, height: float) -> Figure:
    return Figure(figsize=(width, height), layout="constrained")


def _round_axis(ax: Any, rounds: set[int] | None = None) -> None:
    """A rounds axis with whole-number ticks; ``rounds``: the rounds drawn there, and when that is one round,
    that round alone in the middle (points, not a line on a fractional axis)."""
    ax.set_xlabel("round")
    ax.grid(alpha=0.3)
    if rounds is not None and len(rounds) == 1:
        (only,) = rounds
        ax.set_xticks([only])
        ax.set_xlim(only - 1, only + 1)
        return
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _marker(points: int) -> str | None:
    return "o" if points <= 40 else None


def _over_rounds(ax: Any, group: SeedGroup, series: Any, *, marker: str | None = None, ms: float = 3,
                 scale: float = 1.0, legend: bool = True) -> set[int]:
    """The group's ``series(run) -> (rounds, values)`` over rounds: one seed its line as before; several their
    mean with a +-SE band (an error bar at a single round). A single round is drawn as a point. Returns the
    rounds drawn."""
    rounds, mean, se, _ = series_mean(group, series)
    if rounds.size == 0:
        return set()
    shown = marker if marker is not None else _marker(len(rounds))
    style = {"color": group.colour, "label": group.legend if legend else None, "ms": ms,
             "marker": (shown or "o") if len(rounds) == 1 else shown}
    if se is not None and len(rounds) == 1:
        ax.errorbar(rounds, scale * mean, yerr=scale * se, capsize=4, ls="none", **style)
    else:
        ax.plot(rounds, scale * mean, ls="none" if len(rounds) == 1 else "-", **style)
        if se is not None:
            ax.fill_between(rounds, scale * (mean - se), scale * (mean + se), color=group.colour, alpha=0.2, lw=0)
    return {int(r) for r in rounds}


def _seed_note(seed_groups: Sequence[SeedGroup]) -> str:
    """A caption for figures that aggregate seeds ('' when every group is one run)."""
    return "mean over seeds, band / bars: standard error" if any(g.n > 1 for g in seed_groups) else ""


# -- curves from metrics.jsonl ----------------------------------------------------------------------------


def accuracy_figure(runs: RunsLike) -> Figure:
    runs = as_runs(runs)
    require_metric(runs, "test_acc", "it is logged on evaluation rounds; train with --eval-every N")
    fig = _new_figure(6.4, 4.2)
    ax = fig.add_subplot()
    seed_groups = groups(runs)
    drawn: set[int] = set()
    for group in seed_groups:
        drawn |= _over_rounds(ax, group, lambda run: run.series("test_acc"), scale=100.0)
    _round_axis(ax, drawn)
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(with_settings("Test accuracy of the global model", _seed_note(seed_groups)))
    ax.legend()
    return fig


def plot_accuracy(runs: RunsLike, out: str | Path) -> Path:
    """Test accuracy (%) over the evaluation rounds, one line per run."""
    return save_figure(accuracy_figure(runs), out)


def metric_figure(runs: RunsLike, key: str, ylabel: str | None = None, *, log: bool = False) -> Figure:
    runs = as_runs(runs)
    require_metric(runs, key)
    fig = _new_figure(6.4, 4.2)
    ax = fig.add_subplot()
    seed_groups = groups(runs)
    drawn: set[int] = set()
    for group in seed_groups:
        drawn |= _over_rounds(ax, group, lambda run: run.series(key))
    _round_axis(ax, drawn)
    label = ylabel or METRIC_LABELS.get(key, key)
    ax.set_ylabel(label)
    if log:
        ax.set_yscale("log")
    title = label.split(" (")[0]
    ax.set_title(with_settings(f"{title[:1].upper()}{title[1:]} over rounds", _seed_note(seed_groups)))
    ax.legend()
    return fig


def plot_metric_over_rounds(runs: RunsLike, key: str, out: str | Path, ylabel: str | None = None, *,
                            log: bool = False) -> Path:
    """Any metrics.jsonl key over rounds (flatness_distance, train_loss, update_norm, ...), one line per run."""
    return save_figure(metric_figure(runs, key, ylabel, log=log), out)


# -- FedNSAM Fig. 2: flatness distance and global sharpness ------------------------------------------------


def sharpness_rhos(runs: Sequence[RunData]) -> list[float]:
    """The radii every analysed round of every run has S_rho for."""
    common: set[float] | None = None
    for run in runs:
        for rec in run.pass_records("sharpness"):
            rhos = {round(float(r), 12) for r in np.atleast_1d(rec.array("global.rhos"))}
            common = rhos if common is None else common & rhos
    return sorted(common or ())


def choose_rho(runs: Sequence[RunData], rho: float | None) -> float:
    """``rho`` when given (checked), else 0.05 when every run has it, else the middle common radius."""
    common = sharpness_rhos(runs)
    if rho is not None:
        if not any(math.isclose(rho, r, rel_tol=1e-9) for r in common):
            raise LandscapeError(f"S_rho was not computed at rho={rho:g} for every analysed round (radii "
                                 f"everywhere: {', '.join(f'{r:g}' for r in common) or 'none'}); rerun "
                                 f"`landscape analyze RUN --passes sharpness --set sharpness.rhos=[{rho:g}]`")
        return rho
    if not common:
        raise LandscapeError("the runs' sharpness analyses share no radius rho; rerun them with the same "
                             "--set sharpness.rhos=[...]")
    return 0.05 if any(math.isclose(0.05, r) for r in common) else common[len(common) // 2]


def global_sharpness_series(run: RunData, rho: float) -> tuple[np.ndarray, np.ndarray]:
    """(rounds, S_rho(x^t)) over the rounds analysed by the sharpness pass."""
    rounds, values = [], []
    for rec in run.pass_records("sharpness"):
        rhos = np.atleast_1d(rec.array("global.rhos"))
        hit = np.flatnonzero(np.isclose(rhos, rho, rtol=1e-9, atol=0))
        rounds.append(rec.round)
        values.append(float(np.atleast_1d(rec.array("global.sharpness"))[hit[0]]))
    return np.asarray(rounds, dtype=int), np.asarray(values)


def lambda_max_series(run: RunData) -> tuple[np.ndarray, np.ndarray]:
    """(rounds, lambda_1(x^t)) over the rounds analysed by the hessian pass."""
    recs = run.pass_records("hessian")
    return (np.asarray([rec.round for rec in recs], dtype=int),
            np.asarray([float(np.atleast_1d(rec.array("top.values"))[0]) for rec in recs]))


def flatness_and_sharpness_figure(runs: RunsLike, *, rho: float | None = None) -> Figure:
    runs = as_runs(runs)
    require_metric(runs, "flatness_distance")
    require_passes(runs, ["sharpness", "hessian"])
    rho = choose_rho(runs, rho)
    fig = _new_figure(14, 4.4)
    ax_d, ax_s, ax_l = fig.subplots(1, 3)
    seed_groups = groups(runs)
    drawn: dict[Any, set[int]] = {ax_d: set(), ax_s: set(), ax_l: set()}
    for group in seed_groups:
        drawn[ax_d] |= _over_rounds(ax_d, group, lambda run: run.series("flatness_distance"))
        drawn[ax_s] |= _over_rounds(ax_s, group, lambda run: global_sharpness_series(run, rho), marker="o", ms=6,
                                    legend=False)
        drawn[ax_l] |= _over_rounds(ax_l, group, lambda_max_series, marker="s", ms=6, legend=False)
    ax_d.set_title(r"(a) flatness distance $\Delta_D$ (online, every round)")
    ax_d.set_ylabel(r"$\Delta_D$ = mean$_i \|y_{i,K}^t - \bar y^t\|^2$")
    ax_s.set_title(with_settings(rf"(b) global sharpness $S_\rho(x^t)$, $\rho$ = {rho:g}",
                                 settings_caption(runs, "sharpness"), "\n"))
    ax_s.set_ylabel(r"$S_\rho$ = max$_{\|e\| \leq \rho}\, F(x+e) - F(x)$ (nats)")
    ax_l.set_title(with_settings(r"(c) top Hessian eigenvalue $\lambda_1(x^t)$", settings_caption(runs, "hessian"),
                                 "\n"))
    ax_l.set_ylabel(r"$\lambda_1(\nabla^2 F)$")
    for ax in (ax_d, ax_s, ax_l):
        _round_axis(ax, drawn[ax])
    note = _seed_note(seed_groups)
    if note:
        fig.suptitle(f"({note})", fontsize="medium")
    fig.legend(*ax_d.get_legend_handles_labels(), loc="outside lower center", ncols=min(len(seed_groups), 4))
    return fig


def plot_flatness_and_sharpness(runs: RunsLike, out: str | Path, *, rho: float | None = None) -> Path:
    """FedNSAM Fig. 2: (a) Delta_D over rounds from metrics.jsonl; (b) S_rho(x^t) (sharpness pass) and (c)
    lambda_1(x^t) (hessian pass) at each analysed round."""
    return save_figure(flatness_and_sharpness_figure(runs, rho=rho), out)


# -- the Hessian figure --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HessianSummary:
    run: RunData
    round: int
    values: np.ndarray  # Lanczos top-k eigenvalues, descending
    ratio: float  # lambda_1 / lambda_k
    trace: float  # Hutch++
    client_lambda_max: np.ndarray  # empty when the pass skipped the clients
    grid: np.ndarray
    density: np.ndarray


def hessian_summaries(runs: RunsLike, round: int | None = None) -> list[HessianSummary]:
    runs = as_runs(runs)
    require_passes(runs, ["hessian"])
    out = []
    for run in runs:
        rec = run.pass_record("hessian", round)
        out.append(HessianSummary(
            run, rec.round, np.atleast_1d(rec.array("top.values")), float(rec.value("lambda_ratio")),
            float(rec.value("trace.estimate", rec.value("trace_hutchpp.estimate", math.nan))),
            np.atleast_1d(np.asarray(rec.value("clients.lambda_max", []), dtype=float)),
            np.atleast_1d(rec.array("density_grid")), np.atleast_1d(rec.array("density"))))
    return out


def _seed_bars(ax: Any, groups_values: Sequence[tuple[SeedGroup, list[float]]]) -> bool:
    """One bar per group: its value (one seed, labelled as before) or the mean over seeds with a +-SE error bar,
    each seed's value as a hollow dot and "mean +- SE" above. Returns whether seed dots were drawn."""
    x = np.arange(len(groups_values))
    stats = [mean_se(values) for _, values in groups_values]
    bars = ax.bar(x, [mean for mean, _, _ in stats], color=[g.colour for g, _ in groups_values], alpha=0.85)
    ax.bar_label(bars, labels=[f"{mean:.3g}" if se is None else "" for mean, se, _ in stats], padding=2)
    dots = False
    for i, ((mean, se, n), (_, values)) in enumerate(zip(stats, groups_values)):
        if se is None:
            continue
        ax.errorbar([i], [mean], yerr=[se], color="black", capsize=5, lw=1.2, zorder=3)
        ax.scatter(i + np.linspace(-0.12, 0.12, n), values, s=22, facecolor="white", edgecolor="black", zorder=4,
                   label="each seed" if not dots else None)
        dots = True
        top = max(mean + se, *values)
        ax.annotate(f"{mean:.3g} ± {se:.2g}", (i, top), xytext=(0, 6), textcoords="offset points", ha="center",
                    va="bottom")
    return dots


def hessian_figure(runs: RunsLike, *, round: int | None = None) -> Figure:
    summaries = hessian_summaries(runs, round)
    by_run = {id(s.run): s for s in summaries}
    grouped = [(g, [by_run[id(run)] for run in g.runs]) for g in groups([s.run for s in summaries])]
    fig = _new_figure(15, 4.8)
    ax_max, ax_ratio, ax_density = fig.subplots(1, 3, width_ratios=[1, 1, 1.6])
    x = np.arange(len(grouped))
    rounds = {s.round for s in summaries}
    same_round = len(rounds) == 1  # then the round goes in the title, once

    def tick(group: SeedGroup, members: list[HessianSummary]) -> str:
        text = group.label + (f"\n(n={group.n})" if group.n > 1 else "")
        if not same_round:
            theirs = sorted({s.round for s in members})
            text += f"\nround{'s' if len(theirs) > 1 else ''} {', '.join(map(str, theirs))}"
        return text

    ticks = [tick(g, members) for g, members in grouped]
    dots = _seed_bars(ax_max, [(g, [s.values[0] for s in members]) for g, members in grouped])
    shown_clients = False
    for i, (_, members) in enumerate(grouped):
        local = np.concatenate([s.client_lambda_max for s in members])  # every seed's clients
        if local.size:
            jitter = np.linspace(-0.25, 0.25, local.size) if local.size > 1 else 0.0
            ax_max.scatter(i + jitter, local, s=12, color="black", zorder=3,
                           label=r"clients' $\lambda_{max}(\nabla^2 F_i)$" if not shown_clients else None)
            shown_clients = True
    if shown_clients or dots:
        ax_max.legend(loc="best", fontsize="small")
    ax_max.set_title(r"(a) $\lambda_{max}(\nabla^2 F)$ (lower: flatter)"
                     + ("\n" + r"bars; dots: the clients' local $\lambda_{max}$" if shown_clients else ""))
    ax_max.set_ylabel(r"$\lambda_{max}$")
    ks = sorted({s.values.size for s in summaries})
    k_text = str(ks[0]) if len(ks) == 1 else "k"
    ratio_dots = _seed_bars(ax_ratio, [(g, [s.ratio for s in members]) for g, members in grouped])
    if ratio_dots:
        ax_ratio.legend(loc="best", fontsize="small")
    # Not "lower: flatter": a run can have the smaller ratio and the larger lambda_max (panel a).
    ax_ratio.set_title(rf"(b) eigenvalue ratio $\lambda_1 / \lambda_{{{k_text}}}$" + "\n(the FedSAM paper's proxy)")
    ax_ratio.set_ylabel(rf"$\lambda_1 / \lambda_{{{k_text}}}$")
    for ax in (ax_max, ax_ratio):
        tilt = len(grouped) > 3
        ax.set_xticks(x, ticks, rotation=30 if tilt else 0, ha="right" if tilt else "center",
                      rotation_mode="anchor", fontsize="small")
        ax.margins(y=0.3 if ax.get_legend() is not None else 0.15)  # room for the legend above the bars
        ax.grid(axis="y", alpha=0.3)
    peak = max((float(np.nanmax(s.density)) for s in summaries if s.density.size), default=1.0)
    floor = peak * 1e-7 if peak > 0 else 1e-12
    for group, members in grouped:
        for k, s in enumerate(members):  # several seeds: each a thin line of the group's colour, one legend entry
            label = group.legend if same_round else f"{group.legend} (round {s.round})"
            ax_density.semilogy(s.grid, np.maximum(s.density, floor), color=group.colour,
                                lw=0.9 if group.n > 1 else None,
                                label=label if k == 0 or not same_round else None)
    ax_density.set_ylim(bottom=floor)
    if same_round:
        fig.suptitle(f"Hessian of the global loss at round {summaries[0].round}"
                     + (" (bars: mean over seeds +- standard error)" if any(g.n > 1 for g, _ in grouped) else ""))
    ax_density.set_title(with_settings("(c) Hessian spectral density (SLQ)",
                                       settings_caption([s.run for s in summaries], "hessian"), "\n"))
    ax_density.set_xlabel(r"eigenvalue $\lambda$")
    ax_density.set_ylabel("density (log scale)")
    ax_density.grid(alpha=0.3)
    ax_density.legend(fontsize="small")
    return fig


def plot_hessian_summary(runs: RunsLike, out: str | Path, *, round: int | None = None) -> Path:
    """lambda_max (with the clients' local lambda_max) and lambda_1 / lambda_k per run, and the spectral
    densities on a log scale, from each run's hessian pass (latest analysed round unless ``round``)."""
    return save_figure(hessian_figure(runs, round=round), out)


# -- flatness incompatibility --------------------------------------------------------------------------------

# (result key, its standard-error key or None, scale, legend label, style)
_INCOMPATIBILITY_PARTS = [
    ("incompatibility", "incompatibility_se", 1.0, r"$\Delta_{FI}$ = mean$_i$ E$_B\|e_i^B - e^*\|^2$",
     {"color": "black", "marker": "o", "lw": 2}),
    ("heterogeneity", None, 1.0, r"heterogeneity mean$_i\|e_i - e^*\|^2$", {"color": "C0", "marker": "s"}),
    ("batch_part", "batch_part_se", 1.0, r"batch part mean$_i$ E$_B\|e_i^B - e_i\|^2$",
     {"color": "C1", "marker": "^"}),
    ("cross", "cross_se", 2.0, "2 × cross term", {"color": "C2", "marker": "v", "ls": "--"}),
]


def incompatibility_series(run: RunData) -> dict[str, np.ndarray]:
    """rounds, rho and each part of Delta_FI (and its standard error) over the analysed rounds."""
    recs = run.pass_records("incompatibility")
    out = {"rounds": np.asarray([r.round for r in recs], dtype=int),
           "rho": np.asarray([float(r.value("rho")) for r in recs])}
    for key, se_key, scale, _, _ in _INCOMPATIBILITY_PARTS:
        out[key] = scale * np.asarray([float(r.value(key)) for r in recs])
        if se_key:
            out[se_key] = scale * np.asarray([float(r.value(se_key)) for r in recs])
    return out


def incompatibility_figure(runs: RunsLike) -> Figure:
    runs = as_runs(runs)
    require_passes(runs, ["incompatibility"])
    seed_groups = groups(runs)
    cols = min(len(seed_groups), 3)
    rows = math.ceil(len(seed_groups) / cols)
    fig = _new_figure(4.8 * cols + 0.5, 3.8 * rows + 0.8)
    axes = np.atleast_1d(fig.subplots(rows, cols, sharey=True, squeeze=False)).ravel()
    for ax, group in zip(axes, seed_groups):
        data = [incompatibility_series(run) for run in group.runs]
        by_run = dict(zip((id(run) for run in group.runs), data))
        drawn: set[int] = set()
        for key, se_key, _, label, style in _INCOMPATIBILITY_PARTS:
            if group.n == 1:  # one seed: the pass's Monte-Carlo standard error
                rounds, values = data[0]["rounds"], data[0][key]
                error = data[0][se_key] if se_key else None
            else:  # several: the mean over seeds and its standard error
                rounds, values, error, _ = series_mean(group, lambda run, k=key, d=by_run: (d[id(run)]["rounds"],
                                                                                            d[id(run)][k]))
            ax.errorbar(rounds, values, yerr=error, capsize=3, ms=5, label=label, **style)
            drawn |= {int(r) for r in rounds}
        ax.axhline(0.0, color="grey", lw=0.8)
        rhos = sorted({float(r) for d in data for r in d["rho"]})
        rho_text = ", ".join(f"{r:g}" for r in rhos)
        ax.set_title(with_settings(rf"{group.legend} ($\rho$ = {rho_text}, $\Delta_{{FI}} \leq 4\rho^2$)",
                                   group.runs[0].shown("incompatibility"), "\n"), fontsize="medium")
        _round_axis(ax, drawn)
    for ax in axes[len(seed_groups):]:
        ax.set_visible(False)
    for ax in axes[::cols]:
        ax.set_ylabel(r"squared perturbation distance $\|\cdot\|^2$")
    several = any(g.n > 1 for g in seed_groups)
    bars = ("error bars: standard error over seeds (n > 1), Monte-Carlo standard error (one seed)"
            if several and any(g.n == 1 for g in seed_groups)
            else "mean over seeds, error bars: standard error over seeds" if several
            else "error bars: Monte-Carlo standard error")
    fig.suptitle(r"Flatness incompatibility $\Delta_{FI}$ = heterogeneity + batch part + 2 × cross"
                 + ("\n" if several else " ") + f"({bars})")
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", ncols=4, fontsize="small")
    return fig


def plot_incompatibility(runs: RunsLike, out: str | Path) -> Path:
    """Delta_FI over the analysed rounds per run (one panel each, shared y), with its heterogeneity, batch
    part and 2 x cross term, error bars from the passes' standard errors."""
    return save_figure(incompatibility_figure(runs), out)


# -- gradient alignment ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CosineMatrix:
    run: RunData
    round: int
    clients: list[int]
    matrix: np.ndarray  # [N, N] cos(grad F_i, grad F_j)
    mean_off_diagonal: float


def alignment_matrices(runs: RunsLike, round: int | None = None) -> list[CosineMatrix]:
    runs = as_runs(runs)
    require_passes(runs, ["alignment"])
    out = []
    for run in runs:
        rec = run.pass_record("alignment", round)
        matrix = np.atleast_2d(rec.array("gradients.cosine_matrix"))
        clients = [int(c) for c in rec.value("gradients.clients", list(range(len(matrix))))]
        out.append(CosineMatrix(run, rec.round, clients, matrix,
                                float(rec.value("gradients.mean_off_diagonal", math.nan))))
    return out


def _client_ticks(ax: Any, clients: list[int]) -> None:
    step = max(1, math.ceil(len(clients) / 20))
    positions = list(range(0, len(clients), step))
    ax.set_xticks(positions, [str(clients[p]) for p in positions], fontsize="small")
    ax.set_yticks(positions, [str(clients[p]) for p in positions], fontsize="small")


def alignment_figure(runs: RunsLike, *, round: int | None = None) -> Figure:
    """Heatmaps of C_ij = cos(grad F_i, grad F_j), all on the one colour scale [-1, 1] with one colour bar;
    several seeds of a configuration: the mean matrix over them (n in the title)."""
    matrices = alignment_matrices(runs, round)
    by_run = {id(m.run): m for m in matrices}
    grouped = [(g, [by_run[id(run)] for run in g.runs]) for g in groups([m.run for m in matrices])]
    cols = min(len(grouped), 4)
    rows = math.ceil(len(grouped) / cols)
    fig = _new_figure(3.9 * cols + 1.2, 3.9 * rows + 0.6)
    axes = np.atleast_1d(fig.subplots(rows, cols, squeeze=False)).ravel()
    norm = Normalize(vmin=-1.0, vmax=1.0)
    image = None
    for ax, (group, members) in zip(axes, grouped):
        shapes = {m.matrix.shape for m in members}
        if len(shapes) > 1:
            raise LandscapeError(f"the seeds of {group.label} ({group.name}) have alignment matrices of different "
                                 f"sizes ({', '.join(f'{a}x{b}' for a, b in sorted(shapes))}); analyse them with "
                                 "the same alignment.clients")
        matrix, _, _ = mean_se([m.matrix for m in members])
        off, off_se, _ = mean_se([m.mean_off_diagonal for m in members])
        same_clients = all(m.clients == members[0].clients for m in members)
        clients = members[0].clients if same_clients else list(range(len(matrix)))
        image = ax.imshow(matrix, cmap=COSINE_CMAP, norm=norm, interpolation="nearest")
        _client_ticks(ax, clients)
        if len(clients) <= 8:
            for (i, j), v in np.ndenumerate(matrix):
                ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize="x-small",
                        color="white" if abs(v) > 0.6 else "black")
        which = "client" if same_clients else "client (position: the seeds analysed other clients)"
        ax.set_xlabel(f"{which} j")
        ax.set_ylabel(f"{which} i")
        theirs = sorted({m.round for m in members})
        when = f"round{'s' if len(theirs) > 1 else ''} {', '.join(map(str, theirs))}"
        if group.n == 1:
            head = f"{group.label}, {when}\nmean off-diagonal = {off:.3f}"
        else:
            head = f"{group.label}, {when}, mean of n={group.n} seeds\nmean off-diagonal = {off:.3f} ± {off_se:.2g}"
        ax.set_title(with_settings(head, group.runs[0].shown("alignment"), "\n"), fontsize="medium")
    for ax in axes[len(grouped):]:
        ax.set_visible(False)
    fig.colorbar(image, ax=list(axes[: len(grouped)]), label=r"$\cos(\nabla F_i, \nabla F_j)$", shrink=0.85)
    fig.suptitle("Client gradient alignment")
    return fig


def plot_alignment_heatmaps(runs: RunsLike, out: str | Path, *, round: int | None = None) -> Path:
    """Client x client gradient cosines side by side on one diverging colour scale [-1, 1], one colour bar,
    client ids on the axes (alignment pass, latest analysed round unless ``round``)."""
    return save_figure(alignment_figure(runs, round=round), out)
