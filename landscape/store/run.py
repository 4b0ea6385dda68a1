"""The one read model of a run directory (``Run``), shared by the notebook's ``open_run``, the figures, compare,
the report and the claims; each analysis result it holds is a ``PassRecord`` (``landscape.store.results.records``).

A ``Run`` reads each part of the directory once, on first use, and keeps it: the recipe the run was trained
with, the one its checkpoints record (``recipe_table``; ``landscape.store.recorded``: a recipe.toml edited
after training is not used, and a ``RecipeEditedWarning`` says so) and resolved (``recipe``), the metrics rows
and event rows of metrics.jsonl, the checkpointed rounds, and every analysis result of every round
(``records``: ``analysis/round-NNNN/*.json``, whatever its settings, each NPZ opened on first use; ``results``:
their numbers as a pandas DataFrame), only those still current (``landscape.store.results.validity``: the round
their record names is their folder's, the run has that round's checkpoint, and its SHA-256 is the one they
record; ``stale_results`` lists the others). What a result is of (its pass, output and settings) is told by
what its JSON records: ``landscape.store.results.selection`` reads that, this module only the files. A model,
the data sets and the partition are built on demand (``model``, ``data``, ``partition``, ``client_data``).

Reading a run never imports the recipe's ``imports`` (modules that run code when imported): they are imported
only with ``trust_imports=True`` (or inside ``landscape.core.imports.trusted_imports()``); without, the
recipe, metrics, events and results read as recorded, and building a model, data set or partition that only
those modules provide is refused in one line naming them.

``open_run`` of a folder whose sub-folders are run directories gives them all (``Runs``, a list sorted by
name); ``results(paths)`` is the table of many runs.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Iterable
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from landscape.core.errors import LandscapeError
from landscape.store.checkpoints import Checkpoint, read_partition
from landscape.store.directory import RunDir
from landscape.store.recorded import RecipeEditedWarning, RunRecipe, check_recipe, run_recipe, warn_edited
from landscape.store.results.records import (
    Measures,
    PassRecord,
    frame,
    loose_arrays,
    read_results,
    result_rows,
)
from landscape.store.results.validity import (
    CheckpointHashes,
    Stale,
    run_checkpoints,
    split_current,
    split_loose,
    warn_stale,
)

if TYPE_CHECKING:
    import pandas
    import torch

    from landscape.config.recipe import Recipe

__all__ = ["PassRecord", "RecipeEditedWarning", "Run", "Runs", "open_run", "read_results", "results", "run_dirs"]

class Run:
    """One run directory read: ``open_run("runs/x")``, and what every figure, comparison, report and claim
    reads of a run.

    ``.recipe`` (the resolved ``Recipe``), ``.recipe_table()`` (the recipe the run was trained with, its
    tables: the one its checkpoints record; recipe.toml where none records one),
    ``.metrics()`` (per-round rows of metrics.jsonl), ``.events()`` (its event rows, e.g. a divergence),
    ``.rounds()`` (checkpointed rounds), ``.records()`` (round -> every analysis result there, a
    ``PassRecord`` each), each read once, on first use; ``.results()`` (their numbers, a DataFrame);
    ``.model(round)`` (nn.Module with those weights, eval mode), ``.data()`` (train and test sets as the run
    used them), ``.client_data(i)`` and ``.partition()``. Results that are not current (their checkpoint
    changed or is gone since they were analysed, or their folder is not their round's) are left out of
    ``records()`` and ``results()`` with one ``StaleResultWarning``; ``.stale_results()`` lists them.
    """

    def __init__(self, path: str | Path, trust_imports: bool = False, measures: Measures | None = None) -> None:
        self.dir = RunDir(path)
        if not self.dir.is_run():
            raise LandscapeError(f"{self.dir.path} is not a run directory (no recipe.toml)")
        self.trust_imports = trust_imports
        self.measures = measures  # what ``results()`` holds of each pass's results (``landscape.open_run``'s)
        self._setup = None
        self._hashes = CheckpointHashes()  # each checkpoint file hashed once (results are checked against it)

    @property
    def path(self) -> Path:
        return self.dir.path

    def __repr__(self) -> str:
        return f"Run({str(self.path)!r}, rounds={self.rounds()})"

    # -- what is on disk, read once -----------------------------------------------------------------------
    @cached_property
    def _recipe(self) -> RunRecipe:
        from landscape.core.schema import read_toml

        found = run_recipe(self.dir, self.rounds(), read_toml(self.dir.recipe, "recipe"))
        warn_edited(found)  # once: a RecipeEditedWarning (the command line's note)
        return found

    def recipe_table(self) -> dict:
        """The recipe the run was trained with, its tables, not validated (a recipe an older version wrote reads
        too): the one its checkpoints record (``landscape.store.recorded``), recipe.toml where it agrees with
        them but for the keys a resume may change (rounds, device, logging, ``dataset.root``), or where none
        records one (a run without checkpoints, a ``RunWriter``'s or an imported run, checkpoints of a version
        before they carried it). A recipe.toml edited after training in another key is not used, and a
        ``RecipeEditedWarning`` says so once; checkpoints that disagree among themselves are refused."""
        return self._recipe.table

    @cached_property
    def recipe(self) -> Recipe:
        """The recipe the run was trained with (``recipe_table``) resolved (``config.recipe.resolve(recorded=
        True)``; its imports as the class says); a data set, model or partition that only untrusted imports
        provide is refused when built."""
        from landscape.config.recipe import resolve

        return resolve(self._recipe.table, algorithms=False, recorded=True, trust_imports=self.trust_imports or None,
                       defer=True, origin=self._recipe.origin)

    @property
    def recipe_here(self) -> str:
        """How a difference from the run's recipe names it: 'in recipe.toml', or 'in its checkpoints' where
        recipe.toml was edited after training."""
        return self._recipe.here

    @cached_property
    def _rows(self) -> tuple[list[dict], list[dict]]:
        return self.dir.read_rows()

    def metrics(self) -> list[dict]:
        """One row per trained round (event rows are in ``events()``): ``RunDir.read_metrics``."""
        return self._rows[0]

    def events(self) -> list[dict]:
        """What happened to the run besides rounds: ``{"round": t, "event": "diverged", ...}``."""
        return self._rows[1]

    @cached_property
    def _rounds(self) -> list[int]:
        return self.dir.rounds()

    def rounds(self) -> list[int]:
        """The rounds with a checkpoint, ascending."""
        return self._rounds

    @cached_property
    def _checked(self) -> tuple[dict[int, list[PassRecord]], list[tuple[int, Path]], list[Stale]]:
        """The current results, the loose arrays of checkpointed rounds, and what is not current; said once."""
        checkpoints = run_checkpoints(self.path, self.rounds())
        records, stale = split_current(read_results(self.path), checkpoints, self._hashes)
        loose, stale_loose = split_loose(loose_arrays(self.path), checkpoints)
        stale += stale_loose
        if stale:
            warn_stale(self.path, stale)
        return records, loose, stale

    def records(self) -> dict[int, list[PassRecord]]:
        """Round -> the list of every current analysis result stored there, whatever its settings
        (``read_results``): a ``PassRecord`` each (``.name``, ``.settings``, ``.summary``, ``.value(key)``), in
        file-name order. Results that are not current are left out (``stale_results``)."""
        return self._checked[0]

    def stale_results(self) -> list[Stale]:
        """The analysis results of the run that its readers leave out (``records``, ``results``, report, compare,
        figures) because they are not current, a ``Stale`` each: ``(path, reason, round, pass_name)``, the reason
        'checkpoint changed since analysed' (the checkpoint's SHA-256 is not the one the result records),
        'no checkpoint for round 99', or 'its record says round 3' (a round folder copied under another round's
        name). A result written before results recorded their checkpoint's SHA-256 counts as current while its
        round and checkpoint are there. ``landscape analyze RUN --checkpoints R --passes P --force`` recomputes
        those of a checkpointed round; the others go when their folder is removed. Read once, with ``records``."""
        return self._checked[2]

    def results(self) -> pandas.DataFrame:
        """Every analysis result of the run as a tidy pandas DataFrame, one row per measured quantity: columns
        ``run`` (the directory's name), ``round``, ``pass``, ``quantity``, ``value`` (a float), then a column for
        each setting whose value differs between the results (``hessian.top_k`` where a round holds the hessian
        pass at two ``top_k``; a list spelt ``0.01,0.05,0.1``); a setting every result shares is no column. The
        quantities are each pass's summary quantities (``lambda_max``, ``trace``, ``S_rho(0.05)``, ``Delta_D``,
        ...) and every other number its result measured, by dotted path (``trace.stderr``); settings a result
        echoes (``global.seed``), its bookkeeping (``hvp_count``) and arrays (``top.values``) are not quantities:
        ``records()[round]`` (a list of ``PassRecord``) and ``PassRecord.value(key)`` read them. No analysis: no
        rows. ``landscape.store.results.records`` says the rules; which numbers each pass measures is declared
        by the analysis (``measures``: ``landscape.open_run`` gives it; a ``Run`` made without it tabulates every
        number of every result)."""
        return frame(result_rows(self.path.name, self.records(), self.measures))

    def loose_arrays(self) -> list[tuple[int, Path]]:
        """(round, path) of the NPZ files in ``analysis/round-NNNN/`` with no JSON beside them, so no result:
        partial surface grids (``*.partial.npz``) and surfaces written before results had a record; those of a
        round without a checkpoint are left out (``stale_results``)."""
        return self._checked[1]

    # -- built on demand ------------------------------------------------------------------------------------
    def data_setup(self):
        """The data set and the partition as the recipe makes them (``config.setup.DataSetup``; a recorded
        partition read from partition.json), built once; what ``data``, ``client_data`` and the analysis use."""
        if self._setup is None:
            from landscape.config.setup import prepare_data

            self.recipe.require_entries()  # a data set or partition only its untrusted imports provide
            self._setup = prepare_data(self.recipe, self.dir.partition)
        return self._setup

    def data(self):
        """(train, test) ArrayDatasets exactly as the run used them (never augmented)."""
        bundle = self.data_setup().bundle
        return bundle.train, bundle.test

    def partition(self) -> list[np.ndarray]:
        """Per-client train-set index arrays, as recorded in partition.json (checked: a damaged or tampered
        file is a one-line error)."""
        if not self.dir.partition.is_file():
            raise LandscapeError(f"{self.dir.partition} not found (`landscape train --resume "
                                 f"{shlex.quote(str(self.path))}` writes it)")
        setup = self.data_setup()
        return read_partition(self.dir.partition, len(setup.bundle.train), len(setup.client_indices))

    def client_data(self, client: int):
        """Client ``client``'s training samples (a whole number 0..N-1), from the checked partition."""
        parts = self.partition()
        if isinstance(client, bool) or not isinstance(client, (int, np.integer)):
            raise LandscapeError(f"client must be a whole number in 0..{len(parts) - 1} (got {client!r:.80})")
        if not 0 <= client < len(parts):
            raise LandscapeError(f"client {client} does not exist (the run has {len(parts)} clients)")
        train, _ = self.data()
        return train.subset(parts[client])

    def checkpoint(self, round: int | None = None) -> Checkpoint:
        rounds = self.rounds()
        if not rounds:
            raise LandscapeError(f"{self.path} has no checkpoints")
        if round is None:
            round = rounds[-1]
        if round not in rounds:
            raise LandscapeError(f"round {round} has no checkpoint in {self.path}; checkpointed rounds: "
                                 + ", ".join(map(str, rounds)))
        ckpt = Checkpoint.load(self.dir.checkpoint(round))
        check_recipe(ckpt.path, ckpt.recipe_text, self.recipe_table(), self.path.name, self.recipe_here)  # as analyze does
        ckpt.check_round(round)
        return ckpt

    def model(self, round: int | None = None) -> torch.nn.Module:
        """The global model of a checkpointed round (default: the last; x_swa once server SWA has begun),
        on the CPU, in eval mode, in the checkpoint's dtype (a float64 run stays float64)."""
        from landscape.config.setup import build_module, torch_dtype

        self.recipe.require_entries()  # a model only its untrusted imports provide: refused in one line
        module = build_module(self.recipe, self.data_setup().bundle)
        ckpt = self.checkpoint(round)
        module = module.to(ckpt.dtype)
        ckpt.check_model(module.state_dict(), self.recipe.model.name, torch_dtype(self.recipe.train.dtype))
        module.load_state_dict(ckpt.analysed_state)
        return module.eval()


class Runs(list):
    """The runs of a folder of runs (``open_run("runs/demo")``): a list of ``Run``, sorted by name, with
    ``runs["name"]`` the run of that name, ``.names`` and ``.results()`` (all their results, one DataFrame).
    Asking it for what a single ``Run`` has (``runs.recipe``) says to take one first."""

    def __init__(self, folder: str | Path, runs: Iterable[Run]) -> None:
        super().__init__(runs)
        self.folder = Path(folder)

    @property
    def names(self) -> list[str]:
        return [run.path.name for run in self]

    def __getitem__(self, key):
        if isinstance(key, str):
            for run in self:
                if run.path.name == key:
                    return run
            raise KeyError(f"{self.folder} has no run {key!r}; its runs: {', '.join(self.names)}")
        return super().__getitem__(key)

    def __getattr__(self, name: str):
        if not name.startswith("_") and hasattr(Run, name):
            raise AttributeError(f"{self.folder} is a folder of {len(self)} runs ({', '.join(self.names)}), not "
                                 f"one run: take one first, e.g. runs[0].{name} or runs[{self.names[0]!r}].{name}")
        raise AttributeError(f"'Runs' object has no attribute {name!r}")

    def __repr__(self) -> str:
        return f"Runs({str(self.folder)!r}, {self.names})"

    def results(self) -> pandas.DataFrame:
        """Every analysis result of every run (``Run.results``'s columns), in the runs' order."""
        return results(self)


def _has_runs(folder: Path) -> bool:
    return folder.is_dir() and any(p.is_dir() and RunDir(p).is_run() for p in folder.iterdir())


def _what_it_holds(path: Path) -> str:
    """Why ``path`` (a folder) is neither a run directory nor a folder of runs, naming what it holds."""
    entries = sorted(path.iterdir(), key=lambda p: p.name)
    if not entries:
        return f"{path} is an empty folder, not a run directory (no recipe.toml) or a folder of runs"
    nested = [p.name for p in entries if _has_runs(p)]
    if nested:
        return (f"{path} is a folder of folders of runs ({', '.join(nested)}): give one of them, e.g. "
                f"{path / nested[0]}")
    shown = ", ".join(p.name + ("/" if p.is_dir() else "") for p in entries[:6])
    more = f" and {len(entries) - 6} more" if len(entries) > 6 else ""
    return (f"{path} is neither a run directory (no recipe.toml) nor a folder of runs (no sub-folder has one); "
            f"it holds {shown}{more}")


def run_dirs(path: str | Path, who: str = "open_run") -> list[Path]:
    """``[path]`` for a run directory; for a folder of runs, the run directories among its sub-folders, sorted
    by name; anything else is one line naming what it holds (``who``: the function that asks)."""
    where = Path(path)
    if not where.exists():
        raise LandscapeError(f"{who}: {where} does not exist")
    if not where.is_dir():
        raise LandscapeError(f"{who}: {where} is not a directory (give a run directory or a folder of runs)")
    if RunDir(where).is_run():
        return [where]
    found = sorted((p for p in where.iterdir() if p.is_dir() and RunDir(p).is_run()), key=lambda p: p.name)
    if not found:
        raise LandscapeError(f"{who}: {_what_it_holds(where)}")
    return found


def open_run(path: str | Path, trust_imports: bool = False, measures: Measures | None = None) -> Run | Runs:
    """Open a run directory for reading (see ``Run``; its recipe is read and resolved now: the recipe the run was
    trained with, as its checkpoints record it, with a ``RecipeEditedWarning`` where recipe.toml was edited after
    training; recipe.toml for a run without checkpoints, or whose checkpoints carry none: a ``RunWriter``'s, an
    imported run, one of an older version), or every run of a folder of runs (``Runs``: a list of ``Run``, sorted by name, each opened so); ``trust_imports=True``
    imports the modules the recipes' ``imports`` name (their code runs); ``measures``: what their
    ``results()`` hold of each pass's results (``landscape.open_run`` gives the analysis's declaration)."""
    if not isinstance(path, (str, os.PathLike)):
        raise LandscapeError(f"open_run takes the path of a run directory, not {path!r:.80}")
    if not isinstance(trust_imports, bool):
        raise LandscapeError(f"open_run: trust_imports must be True or False, got {trust_imports!r}")
    found = run_dirs(path)
    runs = [Run(where, trust_imports=trust_imports, measures=measures) for where in found]
    for run in runs:
        _ = run.recipe  # a recipe that does not read is an error of open_run, not of a later call
    if found == [Path(path)]:
        return runs[0]
    return Runs(path, runs)


def _runs_of(paths: Any) -> list[Run]:
    """The runs ``paths`` gives (each once): a run directory, a folder of runs, a ``Run``, or a list of them."""
    items = [paths] if isinstance(paths, (str, os.PathLike, Run)) else paths
    if not isinstance(items, Iterable):
        raise LandscapeError(f"results takes run directories, folders of runs or Runs, not {paths!r:.80}")
    found: dict[Path, Run] = {}
    for item in items:
        if isinstance(item, Run):
            found.setdefault(item.path.resolve(), item)
        elif isinstance(item, (str, os.PathLike)):
            for where in run_dirs(item, "results"):
                if where.resolve() not in found:
                    found[where.resolve()] = Run(where)
        else:
            raise LandscapeError(f"results takes run directories, folders of runs or Runs, not {item!r:.80}")
    if not found:
        raise LandscapeError("results: no runs given")
    return list(found.values())


def results(paths: str | Path | Run | Iterable[str | Path | Run], measures: Measures | None = None
            ) -> pandas.DataFrame:
    """Every analysis result of many runs as one tidy pandas DataFrame (the columns of ``Run.results``; a
    column for each setting whose value differs between any of the runs' results, empty where a result does not
    record it): ``paths`` a run directory, a folder of runs, a ``Run``, or a list of them, each run once, in the
    order given (a folder's runs by name). ``run`` is the directory's name, or its path where two runs share a
    name. ``measures``: what the table holds of each pass's results (``landscape.results`` gives the analysis's
    declaration); None: each ``Run``'s own (every number of every result for a run given by its path)."""
    runs = _runs_of(paths)
    names = [run.path.name for run in runs]
    labels = [str(run.path) if names.count(name) > 1 else name for run, name in zip(runs, names)]
    return frame([row for run, label in zip(runs, labels)
                  for row in result_rows(label, run.records(), measures if measures is not None else run.measures)])
