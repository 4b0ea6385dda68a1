"""Figure recipe files (``figures/*.toml``) read and checked: the runs a paper figure needs, their
analyses and its plots.

A figure recipe names its runs as changes to one training recipe, the analysis passes (with options and the
rounds to analyse) and one or more plots. Everything that depends on the scale sits in a ``[digits]`` table
(the default: minutes on a laptop CPU) and a ``[paper]`` table (the papers' setting, GPU scale); the
recipe's ``scale`` key, or ``landscape figures --scale``, picks one, and that table is merged over the rest (a
recipe without a table for a scale other than its own is drawn at its own scale only: asking for the other is
refused)::

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
    [analyze.surface]                     # a pass's options, and the rounds it analyses (core.rounds: last,
                                          # last N, all, a round or a list of rounds: 10,20 or [10, 20])
    grid = "21"

    [[plots]]                             # what is drawn: a kind (its options: figures/plot_kinds.py), the file
                                          # name, the runs (default: all)
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

``load_figure_recipe`` reads one: every table is checked by its schema (``landscape.figures.recipe.tables``:
``FigureFile`` at the top level, then ``FigureTables`` with the chosen scale's table merged over the rest; each
``[[plots]]`` table by its kind's options, ``landscape.figures.plot_kinds``) through
``landscape.core.schema.load``, a bad key or value
refused in one line naming the file and the key. ``landscape.figures.recipe.rounds`` checks the rounds it asks
for, and ``figure_runs`` gives a plot its loaded runs. This module reads only TOML, as every figure module does.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from landscape.analyze.settings import AnalysisSettings
from landscape.config.overrides import ANALYSIS_SETTING, PASS_OPTION, classify_assignment, parse_assignment
from landscape.core.errors import LandscapeError
from landscape.core.rounds import ALL, LAST, Rounds
from landscape.core.schema import load, read_toml, unknown_key_message
from landscape.figures.book import PlotSpec
from landscape.figures.plot_kinds import METRIC_KEYS, PLOT_KINDS
from landscape.figures.recipe.tables import (
    SCALES,
    SEED_MAX,
    FigureFile,
    FigureTables,
    TrainTable,
)
from landscape.figures.rundata import RunData
from landscape.store.results.names import surface_output_name

__all__ = ["METRIC_KEYS", "SCALES", "FigureRecipe", "RunRequest", "figure_runs", "load_figure_recipe",
           "parse_figure_recipe", "parse_seeds"]

# -- the figure recipe ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunRequest:
    """A run a figure recipe asks for: its id (its folder under the figure's ``runs/``), its label and its
    recipe keys at the figure's scale. A request, not a run: the figure workflow trains it into a run
    directory (``store.directory.RunDir``), once per seed when the figure has seeds."""

    id: str
    label: str
    set: dict[str, Any]


@dataclass(frozen=True)
class FigureRecipe:
    """A figure recipe read and checked (``load_figure_recipe``): frozen; ``with_sets``, ``with_seeds`` and
    ``only`` return a changed copy (the command line's ``--set`` and ``--seeds``, a claim's runs and passes)."""

    path: Path
    name: str
    title: str
    scale: str
    train_recipe: Path | None  # the training recipe every run starts from (None: the defaults)
    train_set: dict[str, Any]
    runs: list[RunRequest]
    settings: dict[str, Any]  # analysis settings
    pass_options: dict[str, dict[str, Any]]  # pass -> its options (from [analyze.<pass>])
    pass_rounds: dict[str, Rounds]  # pass -> rounds to analyse
    plots: list[PlotSpec] = field(default_factory=list)
    forced: dict[str, Any] = field(default_factory=dict)  # training keys from --set, over every run's own
    seeds: list[int] | None = None  # each run once per seed (None: once, with its own seed)

    def with_seeds(self, seeds: list[int] | None) -> FigureRecipe:
        """The recipe with every run trained once per seed (``landscape figures --seeds`` over the recipe's
        ``seeds``)."""
        return replace(self, seeds=None if seeds is None else _seeds(seeds, "--seeds"))

    def only(self, runs: Sequence[str] | None = None, passes: Sequence[str] | None = None) -> FigureRecipe:
        """The recipe with only these run ids and passes (their options and rounds as they are): what a claim
        trains and reads of its figure."""
        keep_runs = [spec for spec in self.runs if runs is None or spec.id in runs]
        keep = (lambda name: True) if passes is None else (lambda name: name in passes)
        return replace(self, runs=keep_runs,
                       pass_rounds={name: r for name, r in self.pass_rounds.items() if keep(name)},
                       pass_options={name: o for name, o in self.pass_options.items() if keep(name)})

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
        return surface_output_name(self.pass_options.get("surface", {}).get("directions", "random"))

    def run(self, run_id: str) -> RunRequest:
        return next(r for r in self.runs if r.id == run_id)

    def overrides(self, run: RunRequest, seed: int | None = None) -> list[tuple[str, Any]]:
        """The recipe keys of one run: the shared ones, the run's own, then those given on the command line
        (and ``seed``, one of the figure's seeds, over all of them)."""
        if seed is not None and "seed" in self.forced:
            raise LandscapeError(f"--set seed={self.forced['seed']} and the figure's seeds: give the seeds with "
                                 "--seeds")
        keys = list(self.train_set.items()) + list(run.set.items()) + list(self.forced.items())
        return keys + ([("seed", seed)] if seed is not None else [])

    def with_sets(self, assignments: Sequence[str], command: str) -> FigureRecipe:
        """The recipe with the ``--set KEY=VALUE`` texts of ``landscape figures``, ``claims`` or ``demo``
        (``command``) applied, each read by the one grammar of every command (``overrides.classify_assignment``):
        an analysis setting (``analyze.<setting>``), an option of a pass this figure runs (``<pass>.rounds``
        too), or a training recipe key (every run's, over its own keys)."""
        from landscape.analyze.catalog import load_passes

        settings, forced = dict(self.settings), dict(self.forced)
        options = {name: dict(values) for name, values in self.pass_options.items()}
        rounds = dict(self.pass_rounds)
        for text in assignments:
            key, value = parse_assignment(text)
            kind = classify_assignment(key, load_passes().names, command)
            head, _, rest = key.partition(".")
            if kind == ANALYSIS_SETTING:
                settings = _analysis_settings({**settings, rest: value}, f"--set {key}")
            elif kind == PASS_OPTION:
                if head not in rounds:
                    raise LandscapeError(f"--set {key}: this figure runs no {head} pass (it runs "
                                         f"{', '.join(rounds) or 'none'})")
                if not rest:
                    raise LandscapeError(f"--set {key}: give {head}.<option>=VALUE")
                if rest == "rounds":
                    rounds[head] = Rounds.parse(value, f"--set {key}")
                else:
                    options.setdefault(head, {})[rest] = value
            else:
                forced[key] = value
        return replace(self, settings=settings, forced=forced, pass_options=options, pass_rounds=rounds)


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


def _thawed(value: Any) -> Any:
    """Recipe keys and pass options as TOML gave them: the schema's frozen tuples back to lists (a recipe's list
    values, ``model.hidden = [16]``, are lists)."""
    if isinstance(value, (list, tuple)):
        return [_thawed(v) for v in value]
    if isinstance(value, dict):
        return {k: _thawed(v) for k, v in value.items()}
    return value


def _load(cls: type, raw: Any, what: str, where: str = "", noun: str = "figure recipe key") -> Any:
    """``schema.load`` with the file (or the --set) named first in its one-line message."""
    try:
        return load(cls, raw, where, noun=noun)
    except LandscapeError as e:
        raise LandscapeError(f"{what}: {e}") from None


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


def load_figure_recipe(path: str | Path, scale: str | None = None) -> FigureRecipe:
    """Read and check a figure recipe; ``scale`` (digits or paper) overrides the recipe's own."""
    path = Path(path)
    return parse_figure_recipe(read_toml(path, "figure recipe"), path, scale)


def parse_figure_recipe(raw: dict, path: Path, scale: str | None = None) -> FigureRecipe:
    """A figure recipe from its TOML tables (``path``: where it was read, for messages and relative paths)."""
    chosen, tables = _at_scale(raw, path, scale)
    runs = _run_requests(tables, chosen, path)
    plots = _plots(tables, [run.id for run in runs], path)
    settings, pass_options, pass_rounds = _analysis(tables.analyze, plots, path)
    seeds = _seeds(list(tables.seeds), f"{path}: seeds") if tables.seeds is not None else None
    return FigureRecipe(path, tables.name, tables.name if tables.title is None else tables.title, chosen,
                        _train_recipe(tables.train, path), _thawed(tables.train.set), runs, settings, pass_options,
                        pass_rounds, plots, seeds=seeds)


def _at_scale(raw: dict, path: Path, scale: str | None) -> tuple[str, FigureTables]:
    """The scale (``scale`` over the recipe's own) and the recipe's tables with that scale's merged over them:
    first the file's keys, then the merged tables, checked."""
    top = _load(FigureFile, raw, str(path))
    chosen = scale or top.scale
    if chosen not in SCALES:
        raise LandscapeError(f"{path}: scale must be one of {', '.join(SCALES)} (got {chosen!r})")
    if chosen != top.scale and chosen not in raw:
        raise LandscapeError(f"{path}: no [{chosen}] table: this figure is drawn at {top.scale} scale only")
    merged = _merge({k: v for k, v in raw.items() if k not in ("scale", *SCALES)}, raw.get(chosen, {}))
    merged.setdefault("name", path.stem)
    return chosen, _load(FigureTables, merged, str(path))


def _train_recipe(train: TrainTable, path: Path) -> Path | None:
    """The training recipe every run starts from, found relative to the figure recipe (None: the defaults)."""
    if train.recipe is None:
        return None
    found = (path.parent / train.recipe).resolve()
    if not found.is_file():
        raise LandscapeError(f"{path}: train.recipe {train.recipe!r} not found ({found})")
    _recorded_imports(found, train.recipe, path)
    return found


def _recorded_imports(found: Path, given: str, path: Path) -> None:
    """A training recipe that is a run's recorded one (its folder holds ``.landscape-run``) is someone's output,
    not the user's own recipe, even when a figure or claim names it: its ``imports`` (and factory modules) are
    imported only with --trust-imports, then as a run's are (never from the current folder), before anything
    else reads it; without, one line naming them (``--dry-run`` included: nothing is imported)."""
    from landscape.config.recipe import recipe_modules
    from landscape.core.imports import import_recipe_modules, imports_trusted
    from landscape.store.fileio import RUN_MARKER

    if not (found.parent / RUN_MARKER).is_file():
        return
    modules = recipe_modules(read_toml(found, "recipe"))
    if not modules:
        return
    if not imports_trusted():
        raise LandscapeError(f"{path}: train.recipe {given!r} is a run's recorded recipe ({found.parent} holds "
                             f"{RUN_MARKER}) whose imports ({', '.join(modules)}) run code: they are not imported "
                             "from a recipe a figure or claim reaches in a run; pass --trust-imports if you trust "
                             "that code, or name a recipe of your own")
    import_recipe_modules(modules, search_cwd=False)


def _run_requests(tables: FigureTables, scale: str, path: Path) -> list[RunRequest]:
    """The runs the figure asks for, each with its keys at ``scale``; their ids unique."""
    if not tables.runs:
        raise LandscapeError(f"{path}: give the figure's runs as [[runs]] tables (id, label, set)")
    runs = [RunRequest(t.id, t.id if t.label is None else t.label, _thawed({**t.set, **getattr(t, scale)}))
            for t in tables.runs]
    ids = [run.id for run in runs]
    if len(set(ids)) != len(ids):
        raise LandscapeError(f"{path}: run ids must be unique (got {_names(ids)})")
    return runs


def _plots(tables: FigureTables, ids: list[str], path: Path) -> list[PlotSpec]:
    """Every [[plots]] table, checked by its kind's options; their files unique."""
    if not tables.plots:
        raise LandscapeError(f"{path}: give the figure's plots as [[plots]] tables (kind, file, runs)")
    plots = [_plot(entry, k, tables.name, ids, path) for k, entry in enumerate(tables.plots)]
    files = [plot.file for plot in plots]
    if len(set(files)) != len(files):
        raise LandscapeError(f"{path}: plot files must be unique (got {_names(files)})")
    return plots


def _plot(entry: dict[str, Any], k: int, name: str, ids: list[str], path: Path) -> PlotSpec:
    """One [[plots]] table, by its kind's options (``plot_kinds.PLOT_KINDS``); the file defaults to the
    figure's name (``<name>-<k+1>`` after the first plot), the runs to all of them."""
    where = f"plots[{k}]"
    kind = entry.get("kind")
    if not isinstance(kind, str) or kind not in PLOT_KINDS:
        raise LandscapeError(f"{path}: {where}.kind must be one of {', '.join(PLOT_KINDS)} (got {kind!r})")
    try:
        options = PLOT_KINDS.get(kind).make_options(entry, where, noun=f"{kind} plot key")
    except LandscapeError as e:
        raise LandscapeError(f"{path}: {e}") from None
    missing = [run for run in options.runs or () if run not in ids]
    if missing:
        raise LandscapeError(f"{path}: {where}.runs names unknown run(s) {_names(missing)} (runs: {', '.join(ids)})")
    file = options.file if options.file is not None else (name if k == 0 else f"{name}-{k + 1}")
    return PlotSpec(kind, file, tuple(options.runs or ids), options, options.title or "")


# The analysis settings a figure recipe may hold: those that change its numbers (the device, the backend, the
# threads and the memory layout are the command line's).
RECIPE_SETTINGS = ("split", "analysis_samples", "bn_mode", "hvp", "dtype", "seed", "batch_size")


def _analysis_settings(values: dict[str, Any], what: str) -> dict[str, Any]:
    """The analysis settings given (an [analyze] table's, or with a --set): one of ``RECIPE_SETTINGS`` each,
    checked by ``AnalysisSettings``' own schema (kinds, choices, ranges) before anything is trained."""
    unknown = [key for key in values if key not in RECIPE_SETTINGS]
    if unknown:
        raise LandscapeError(f"{what}: " + unknown_key_message(f"analyze.{unknown[0]}", list(RECIPE_SETTINGS),
                                                               "in [analyze]", "analysis setting"))
    checked = _load(AnalysisSettings, values, what, "analyze", "analysis setting")
    return {key: getattr(checked, key) for key in values}


def _analysis(analyze: dict[str, Any], plots: list[PlotSpec], path: Path
              ) -> tuple[dict[str, Any], dict[str, dict[str, Any]], dict[str, Rounds]]:
    """The [analyze] table: its settings, each pass's options, and the rounds each pass analyses (those its
    plots need, "all" over "last"; a pass's ``rounds`` key over them; "last" for a pass no plot reads)."""
    settings = _analysis_settings({k: v for k, v in analyze.items() if not isinstance(v, dict)}, str(path))
    pass_options = {name: _thawed(values) for name, values in analyze.items() if isinstance(values, dict)}
    pass_rounds: dict[str, Rounds] = {}
    for plot in plots:
        for pass_name, rounds in PLOT_KINDS.get(plot.kind).passes.items():
            if pass_rounds.get(pass_name) != Rounds(ALL):
                pass_rounds[pass_name] = Rounds.parse(rounds, f"plot kind {plot.kind}: {pass_name} rounds")
    for pass_name, values in pass_options.items():
        if "rounds" in values:
            pass_rounds[pass_name] = Rounds.parse(values.pop("rounds"), f"{path}: analyze.{pass_name}.rounds")
        elif pass_name not in pass_rounds:
            pass_rounds[pass_name] = Rounds(LAST)
    return settings, pass_options, pass_rounds


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
