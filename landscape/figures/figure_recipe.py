"""Figure recipe files (``figures/*.toml``) read and checked: the runs a paper figure needs, their
analyses and its plots.

A figure recipe names its runs as changes to one training recipe, the analysis passes (with options and the
rounds to analyse) and one or more plots. Everything that depends on the scale sits in a ``[digits]`` table
(the default: minutes on a laptop CPU) and a ``[paper]`` table (the papers' setting, GPU scale); the
recipe's ``scale`` key, or ``landscape figures --scale``, picks one, and that table is merged over the rest::

    name = "fednsam-fig1-surfaces"
    title = "Loss surfaces of FedSAM and FedNSAM"
    scale = "digits"                      # or "paper"
    seeds = [0, 1, 2]                     # (optional) every run once per seed, aggregated in the plots

    [train]                               # what every run shares, at both scales
    set = { "train.keep_clients" = true }

    [[runs]]                              # one run per entry: an id (its folder), a label, its own keys
    id = "fedsam-alpha0.6"
    label = "FedSAM, alpha = 0.6"
    set = { "algorithm.name" = "fedsam", "partition.alpha" = 0.6 }
    digits = { "train.server_lr" = 1.0 }  # (optional) keys of this run at one scale only

    [analyze]                             # analysis settings (those of `landscape analyze`)
    analysis_samples = 0
    [analyze.surface]                     # a pass's options, and the rounds it analyses (last, all, 10,20)
    grid = "21"

    [[plots]]                             # what is drawn: a kind, the file name, the runs (default: all)
    kind = "surfaces-3d"

    [digits.train]                        # the digits-scale training recipe ...
    recipe = "../train/digits-fedavg.toml"
    [paper.train]                         # ... and the paper's (paths are relative to this file)
    recipe = "../train/cifar100-fednsam.toml"

Seeds. Without ``seeds`` each run is trained once, in ``<out>/runs/<id>``, with the seed its keys give. With
``seeds = [0, 1, 2]`` (top level, or in ``[digits]`` / ``[paper]``; ``landscape figures --seeds 0,1,2``
overrides it) every run id is trained once per seed, in ``<out>/runs/<id>-seed<s>`` with the recipe key
``seed = s`` (over the run's own); all seeds of an id keep its label and colour, and the plots draw their mean
with the standard error (``landscape.figures.seeds``). ``FigureRecipe.seed_runs`` lists the run folders.

``load_figure_recipe`` reads one (``parse_figure_recipe`` checks its plots against the plot kinds of
``landscape.figures.book``), ``landscape.figures.figure_rounds`` checks the rounds it asks for, and
``figure_runs`` gives a plot its loaded runs. This module reads only TOML, as every figure module does.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from landscape.config.recipe import read_toml
from landscape.core.errors import LandscapeError
from landscape.figures.book import PLOT_KINDS, PlotSpec
from landscape.figures.rundata import RunData
from landscape.store.runs import surface_result_name

SCALES = ("digits", "paper")
ANALYSIS_SETTINGS = {"split": str, "analysis_samples": int, "bn_mode": str, "hvp": str, "dtype": str, "seed": int,
                     "batch_size": int}
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_TOP_KEYS = {"name", "title", "scale", "seeds", "train", "runs", "analyze", "plots", *SCALES}
SEED_MAX = 2**32 - 1  # recipes take 32-bit seeds
# The numbers of a metrics.jsonl row, in the order the trainer writes them (landscape/train/loop.py,
# run_round; docs/metrics.md section 9); `round` and `clients` (the sampled ids) are not quantities.
METRIC_KEYS = ("lr", "train_loss", "flatness_distance", "flatness_distance_normalized",
               "flatness_distance_to_global", "flatness_distance_to_global_normalized", "update_norm",
               "uplink_floats", "swa_models", "test_loss", "test_acc", "seconds")


@dataclass(frozen=True)
class RunSpec:
    id: str
    label: str
    set: dict[str, Any]


@dataclass
class FigureRecipe:
    path: Path
    name: str
    title: str
    scale: str
    train_recipe: Path | None  # the training recipe every run starts from (None: the defaults)
    train_set: dict[str, Any]
    runs: list[RunSpec]
    settings: dict[str, Any]  # analysis settings
    pass_options: dict[str, dict[str, Any]]  # pass -> its options (from [analyze.<pass>])
    pass_rounds: dict[str, str]  # pass -> rounds to analyse
    plots: list[PlotSpec] = field(default_factory=list)
    forced: dict[str, Any] = field(default_factory=dict)  # training keys from --set, over every run's own
    seeds: list[int] | None = None  # each run once per seed (None: once, with its own seed)

    def set_seeds(self, seeds: list[int] | None) -> None:
        """Train every run once per seed (``landscape figures --seeds`` over the recipe's ``seeds``)."""
        self.seeds = None if seeds is None else _seeds(seeds, "--seeds")

    def seed_runs(self, out: Path) -> dict[str, list[tuple[int | None, Path]]]:
        """Run id -> its (seed, run directory) under the figure's folder ``out``, in order: ``(None,
        out/runs/<id>)`` without seeds, else ``(s, out/runs/<id>-seed<s>)`` per seed."""
        if self.seeds is None:
            return {run.id: [(None, Path(out) / "runs" / run.id)] for run in self.runs}
        found = {run.id: [(s, Path(out) / "runs" / f"{run.id}-seed{s}") for s in self.seeds] for run in self.runs}
        folders = [path.name for entries in found.values() for _, path in entries]
        clashes = sorted({name for name in folders if folders.count(name) > 1})
        if clashes:
            raise LandscapeError(f"{self.path}: with seeds, run folders {_names(clashes)} would be used twice; "
                                 "rename a run id")
        return found

    def surface_name(self) -> str:
        """The result name of the figure's surfaces (by the surface pass's directions)."""
        return surface_result_name(self.pass_options.get("surface", {}).get("directions", "random"))

    def run(self, run_id: str) -> RunSpec:
        return next(r for r in self.runs if r.id == run_id)

    def overrides(self, run: RunSpec, seed: int | None = None) -> list[tuple[str, Any]]:
        """The recipe keys of one run: the shared ones, the run's own, then those given on the command line
        (and ``seed``, one of the figure's seeds, over all of them)."""
        if seed is not None and "seed" in self.forced:
            raise LandscapeError(f"--set seed={self.forced['seed']} and the figure's seeds: give the seeds with "
                                 "--seeds")
        keys = list(self.train_set.items()) + list(run.set.items()) + list(self.forced.items())
        return keys + ([("seed", seed)] if seed is not None else [])

    def assign(self, key: str, value: Any, pass_names: Sequence[str]) -> None:
        """A command-line ``--set``: ``analyze.<setting>``, ``<pass>.<option>`` (``<pass>.rounds`` too) for a
        pass this figure runs, or any training recipe key (applied to every run, over its own keys)."""
        head, _, rest = key.partition(".")
        if head == "analyze":
            if rest not in ANALYSIS_SETTINGS:
                raise LandscapeError(f"--set {key}: analysis settings are {', '.join(ANALYSIS_SETTINGS)}")
            self.settings[rest] = value
        elif head in pass_names:
            if head not in self.pass_rounds:
                raise LandscapeError(f"--set {key}: this figure runs no {head} pass (it runs "
                                     f"{', '.join(self.pass_rounds) or 'none'})")
            if not rest:
                raise LandscapeError(f"--set {key}: give {head}.<option>=VALUE")
            if rest == "rounds":
                self.pass_rounds[head] = _rounds_text(value, f"--set {key}")
            else:
                self.pass_options.setdefault(head, {})[rest] = value
        else:
            self.forced[key] = value


def _names(keys: Sequence[Any]) -> str:
    """Keys for a message: plain when they are plain names, else quoted (a message stays one line)."""
    return ", ".join(k if isinstance(k, str) and re.fullmatch(r"[\w.-]+", k) else repr(k) for k in keys)


def _merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _table(raw: dict, key: str, where: str) -> dict:
    value = raw.get(key, {})
    if not isinstance(value, dict):
        raise LandscapeError(f"{where}: '{key}' must be a table")
    return value


def _tables(raw: dict, key: str, fields: str, where: str) -> list[dict]:
    """A non-empty array of tables ([[runs]], [[plots]])."""
    value = raw.get(key)
    if not isinstance(value, list) or not value or not all(isinstance(v, dict) for v in value):
        raise LandscapeError(f"{where}: give the figure's {key} as [[{key}]] tables ({fields})")
    return value


def _string(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise LandscapeError(f"{what} must be a non-empty string (got {value!r})")
    return value


def _seeds(value: Any, what: str) -> list[int]:
    """A non-empty list of different seeds, each in 0..2**32-1."""
    ok = (isinstance(value, list) and value
          and all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= SEED_MAX for v in value))
    if not ok:
        raise LandscapeError(f"{what} must be a non-empty list of seeds in 0..{SEED_MAX} (got {value!r})")
    if len(set(value)) != len(value):
        raise LandscapeError(f"{what} must not repeat a seed (got {value!r})")
    return list(value)


def parse_seeds(text: str, what: str = "--seeds") -> list[int]:
    """'0,1,2' -> [0, 1, 2] (``landscape figures --seeds``)."""
    parts = [p.strip() for p in text.split(",")]
    if not all(re.fullmatch(r"\d{1,10}", p) for p in parts):
        shown = text if text.isprintable() else repr(text)
        raise LandscapeError(f"{what} takes a comma list of seeds such as 0,1,2 (got {shown})")
    return _seeds([int(p) for p in parts], what)


def _rounds_text(value: Any, what: str) -> str:
    if isinstance(value, list) and value and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                                                 for v in value):
        return ",".join(str(v) for v in value)
    if isinstance(value, str) and (value in ("last", "all") or re.fullmatch(r"\d+(,\d+)*", value)):
        return value
    raise LandscapeError(f"{what} must be last, all, a comma list of rounds or a list of rounds (got {value!r})")


def load_figure_recipe(path: str | Path, scale: str | None = None) -> FigureRecipe:
    """Read and check a figure recipe; ``scale`` (digits or paper) overrides the recipe's own."""
    path = Path(path)
    return parse_figure_recipe(read_toml(path), path, scale)


def parse_figure_recipe(raw: dict, path: Path, scale: str | None = None) -> FigureRecipe:
    """A figure recipe from its TOML tables (``path``: where it was read, for messages and relative paths)."""
    where = str(path)
    unknown = sorted(set(raw) - _TOP_KEYS)
    if unknown:
        raise LandscapeError(f"{where}: unknown key(s) {_names(unknown)}; a figure recipe has "
                             f"{', '.join(sorted(_TOP_KEYS))}")
    for other in SCALES:
        wrong = sorted(set(_table(raw, other, where)) - (_TOP_KEYS - {"scale", *SCALES}))
        if wrong:
            raise LandscapeError(f"{where}: [{other}] may hold train, analyze, runs, plots, seeds, name and "
                                 f"title (got {_names(wrong)})")
    chosen = scale or raw.get("scale", "digits")
    if chosen not in SCALES:
        raise LandscapeError(f"{where}: scale must be one of {', '.join(SCALES)} (got {chosen!r})")
    merged = _merge({k: v for k, v in raw.items() if k not in SCALES}, _table(raw, chosen, where))
    name = _string(merged.get("name", path.stem), f"{where}: name")
    if not _ID.match(name):
        raise LandscapeError(f"{where}: name {name!r} must be letters, digits, '.', '_' or '-'")

    train = _table(merged, "train", where)
    extra = sorted(set(train) - {"recipe", "set"})
    if extra:
        raise LandscapeError(f"{where}: [train] takes recipe and set (got {_names(extra)})")
    recipe_path = None
    if "recipe" in train:
        recipe_path = (path.parent / _string(train["recipe"], f"{where}: train.recipe")).resolve()
        if not recipe_path.is_file():
            raise LandscapeError(f"{where}: train.recipe {train['recipe']!r} not found ({recipe_path})")
    train_set = _table(train, "set", f"{where}: [train]")

    runs = []
    for k, entry in enumerate(_tables(merged, "runs", "id, label, set", where)):
        what = f"{where}: runs[{k}]"
        extra = sorted(set(entry) - {"id", "label", "set", *SCALES})
        if extra:
            raise LandscapeError(f"{what} takes id, label, set, digits and paper (got {_names(extra)})")
        run_id = _string(entry.get("id"), f"{what}.id")
        if not _ID.match(run_id):
            raise LandscapeError(f"{what}.id {run_id!r} must be letters, digits, '.', '_' or '-' (it is a folder)")
        for other in SCALES:
            _table(entry, other, what)
        keys = {**_table(entry, "set", what), **_table(entry, chosen, what)}  # the run's keys at this scale
        runs.append(RunSpec(run_id, str(entry.get("label", run_id)), keys))
    ids = [r.id for r in runs]
    if len(set(ids)) != len(ids):
        raise LandscapeError(f"{where}: run ids must be unique (got {_names(ids)})")

    plots = []
    for k, entry in enumerate(_tables(merged, "plots", "kind, file, runs", where)):
        what = f"{where}: plots[{k}]"
        kind = entry.get("kind")
        if kind not in PLOT_KINDS:
            raise LandscapeError(f"{what}.kind must be one of {', '.join(PLOT_KINDS)} (got {kind!r})")
        allowed = {"kind", "file", "runs", "title", *PLOT_KINDS[kind].options}
        extra = sorted(set(entry) - allowed)
        if extra:
            raise LandscapeError(f"{what} ({kind}) takes {', '.join(sorted(allowed))} (got {_names(extra)})")
        if kind == "metric" and not isinstance(entry.get("key"), str):
            raise LandscapeError(f"{what}: a metric plot needs key = '<metrics.jsonl key>'")
        if kind == "metric" and entry["key"] not in METRIC_KEYS:
            raise LandscapeError(f"{what}.key {_names([entry['key']])} is not a metrics.jsonl key; the keys: "
                                 f"{', '.join(METRIC_KEYS)}")
        file = _string(entry.get("file", name if k == 0 else f"{name}-{k + 1}"), f"{what}.file")
        if not _ID.match(file):
            raise LandscapeError(f"{what}.file {file!r} must be letters, digits, '.', '_' or '-' (no suffix)")
        chosen_runs = entry.get("runs", ids)
        if not isinstance(chosen_runs, list) or not chosen_runs:
            raise LandscapeError(f"{what}.runs must be a non-empty list of run ids")
        missing = [r for r in chosen_runs if r not in ids]
        if missing:
            raise LandscapeError(f"{what}.runs names unknown run(s) {_names(missing)} "
                                 f"(runs: {', '.join(ids)})")
        options = {key: entry[key] for key in PLOT_KINDS[kind].options if key in entry}
        plots.append(PlotSpec(kind, file, tuple(chosen_runs), options, str(entry.get("title", ""))))
    files = [p.file for p in plots]
    if len(set(files)) != len(files):
        raise LandscapeError(f"{where}: plot files must be unique (got {_names(files)})")

    analyze = _table(merged, "analyze", where)
    settings, pass_options = {}, {}
    for key, value in analyze.items():
        if isinstance(value, dict):
            pass_options[key] = dict(value)
        elif key in ANALYSIS_SETTINGS:
            if not isinstance(value, ANALYSIS_SETTINGS[key]) or isinstance(value, bool):
                raise LandscapeError(f"{where}: analyze.{key} must be a {ANALYSIS_SETTINGS[key].__name__}")
            settings[key] = value
        else:
            raise LandscapeError(f"{where}: analyze.{_names([key])} is not an analysis setting "
                                 f"({', '.join(ANALYSIS_SETTINGS)}) nor a [analyze.<pass>] table")
    pass_rounds: dict[str, str] = {}
    for plot in plots:
        for pass_name, rounds in PLOT_KINDS[plot.kind].passes.items():
            if pass_rounds.get(pass_name) != "all":
                pass_rounds[pass_name] = rounds
    for pass_name, values in pass_options.items():
        if "rounds" in values:
            pass_rounds[pass_name] = _rounds_text(values.pop("rounds"), f"{where}: analyze.{pass_name}.rounds")
        elif pass_name not in pass_rounds:
            pass_rounds[pass_name] = "last"
    seeds = _seeds(merged["seeds"], f"{where}: seeds") if "seeds" in merged else None
    return FigureRecipe(path, name, str(merged.get("title", name)), chosen, recipe_path, dict(train_set), runs,
                        settings, pass_options, pass_rounds, plots, seeds=seeds)


def figure_runs(recipe: FigureRecipe, plot: PlotSpec, runs: dict[str, list[RunData]]) -> list[RunData]:
    """The plot's runs in its order (every seed of a run id), each labelled as the recipe says and coloured
    by its place in the recipe (so a run keeps one colour across the plots of a figure); the seeds of one id
    are one group (``landscape.figures.seeds``), whatever else their recipes share."""
    out = []
    ids = [r.id for r in recipe.runs]
    for run_id in plot.runs:
        label = recipe.run(run_id).label
        for run in runs[run_id]:
            run.label, run.group_label = label, label
            run.index = ids.index(run_id)
            run.group = f"id:{run_id}"
            out.append(run)
    return out
