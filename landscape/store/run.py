"""The one read model of a run directory (``Run``), shared by the notebook's ``open_run``, the figures, compare,
the report and the claims; each analysis result it holds is a ``PassRecord``.

A ``Run`` reads each part of the directory once, on first use, and keeps it: the recipe as recorded
(``recipe_table``) and resolved (``recipe``), the metrics rows and event rows of metrics.jsonl, the
checkpointed rounds, and every analysis result of every round (``results``: ``analysis/round-NNNN/*.json``,
whatever its settings, each NPZ opened on first use). What a result is of (its pass, output and settings) is
told by what its JSON records: ``landscape.figures.selection`` reads that, this module only the files. A
model, the data sets and the partition are built on demand (``model``, ``data``, ``partition``,
``client_data``).

Reading a run never imports the recipe's ``imports`` (modules that run code when imported): they are imported
only with ``trust_imports=True`` (or inside ``landscape.config.imports.trusted_imports()``); without, the
recipe, metrics, events and results read as recorded, and building a model, data set or partition that only
those modules provide is refused in one line naming them.

A result value is named by its dotted path in the pass's ``result`` (``"global.rhos"``,
``"gradients.cosine_matrix"``): it is read from the NPZ when the JSON's ``arrays`` list names it (the passes
move arrays of more than 16 values there), else from the JSON, with ``"nan"`` / ``"inf"`` strings restored.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from landscape.core.errors import LandscapeError
from landscape.store.checkpoints import Checkpoint, read_partition
from landscape.store.runs import RunDir

if TYPE_CHECKING:
    import torch

    from landscape.config.recipe import Recipe

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


def read_results(path: Path) -> dict[int, list[PassRecord]]:
    """Every analysis result of every round of the run directory ``path``, by round, each round's in file-name
    order (the record's settings, not the file's name, say what each is)."""
    analyses: dict[int, list[PassRecord]] = {}
    folder = Path(path) / "analysis"
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


class Run:
    """One run directory read: ``open_run("runs/x")``, and what every figure, comparison, report and claim
    reads of a run.

    ``.recipe`` (the resolved ``Recipe``), ``.recipe_table()`` (recipe.toml as recorded, its tables),
    ``.metrics()`` (per-round rows of metrics.jsonl), ``.events()`` (its event rows, e.g. a divergence),
    ``.rounds()`` (checkpointed rounds), ``.results()`` (round -> every analysis result there, a
    ``PassRecord`` each), each read once, on first use; ``.model(round)`` (nn.Module with those weights, eval
    mode), ``.data()`` (train and test sets as the run used them), ``.client_data(i)`` and ``.partition()``.
    """

    def __init__(self, path: str | Path, trust_imports: bool = False) -> None:
        self.dir = RunDir(path)
        if not self.dir.is_run():
            raise LandscapeError(f"{self.dir.path} is not a run directory (no recipe.toml)")
        self.trust_imports = trust_imports
        self._setup = None

    @property
    def path(self) -> Path:
        return self.dir.path

    def __repr__(self) -> str:
        return f"Run({str(self.path)!r}, rounds={self.rounds()})"

    # -- what is on disk, read once -----------------------------------------------------------------------
    @cached_property
    def _table(self) -> dict:
        from landscape.config.schema import read_toml

        return read_toml(self.dir.recipe, "recipe")

    def recipe_table(self) -> dict:
        """recipe.toml as recorded: its tables, not validated (a recipe an older version wrote reads too)."""
        return self._table

    @cached_property
    def recipe(self) -> Recipe:
        """The recorded recipe resolved (``config.recipe.resolve(recorded=True)``; its imports as the class
        says); a data set, model or partition that only untrusted imports provide is refused when built."""
        from landscape.config.recipe import resolve

        return resolve(self._table, algorithms=False, recorded=True, trust_imports=self.trust_imports or None,
                       defer=True, origin=str(self.dir.recipe))

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
    def _results(self) -> dict[int, list[PassRecord]]:
        return read_results(self.path)

    def results(self) -> dict[int, list[PassRecord]]:
        """Round -> every analysis result stored there, whatever its settings (``read_results``)."""
        return self._results

    @cached_property
    def _loose(self) -> list[tuple[int, Path]]:
        folder = self.path / "analysis"
        rounds = sorted(p for p in folder.iterdir() if _ROUND_DIR.match(p.name) and p.is_dir()) \
            if folder.is_dir() else []
        return [(int(_ROUND_DIR.match(d.name).group(1)), npz) for d in rounds for npz in sorted(d.glob("*.npz"))
                if not npz.with_suffix(".json").is_file()]

    def loose_arrays(self) -> list[tuple[int, Path]]:
        """(round, path) of the NPZ files in ``analysis/round-NNNN/`` with no JSON beside them, so no result:
        partial surface grids (``*.partial.npz``) and surfaces written before results had a record."""
        return self._loose

    # -- built on demand ------------------------------------------------------------------------------------
    def _data_setup(self):
        if self._setup is None:
            from landscape.config.setup import prepare_data

            self.recipe.require_entries()  # a data set or partition only its untrusted imports provide
            self._setup = prepare_data(self.recipe)
        return self._setup

    def data(self):
        """(train, test) ArrayDatasets exactly as the run used them (never augmented)."""
        bundle = self._data_setup().bundle
        return bundle.train, bundle.test

    def partition(self) -> list[np.ndarray]:
        """Per-client train-set index arrays, as recorded in partition.json (checked: a damaged or tampered
        file is a one-line error)."""
        if not self.dir.partition.is_file():
            raise LandscapeError(f"{self.dir.partition} not found (`landscape train --resume "
                                 f"{shlex.quote(str(self.path))}` writes it)")
        setup = self._data_setup()
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
        return Checkpoint.load(self.dir.checkpoint(round))

    def model(self, round: int | None = None) -> torch.nn.Module:
        """The global model of a checkpointed round (default: the last; x_swa once server SWA has begun),
        on the CPU, in eval mode, in the checkpoint's dtype (a float64 run stays float64)."""
        from landscape.config.setup import build_module, torch_dtype

        self.recipe.require_entries()  # a model only its untrusted imports provide: refused in one line
        module = build_module(self.recipe, self._data_setup().bundle)
        ckpt = self.checkpoint(round)
        module = module.to(ckpt.dtype)
        ckpt.check_model(module.state_dict(), self.recipe.model.name, torch_dtype(self.recipe.train.dtype))
        module.load_state_dict(ckpt.analysed_state)
        return module.eval()


def open_run(path: str | Path, trust_imports: bool = False) -> Run:
    """Open a run directory for reading (see ``Run``; its recipe is read and resolved now);
    ``trust_imports=True`` imports the modules its recipe's ``imports`` name (their code runs)."""
    if not isinstance(path, (str, os.PathLike)):
        raise LandscapeError(f"open_run takes the path of a run directory, not {path!r:.80}")
    if not isinstance(trust_imports, bool):
        raise LandscapeError(f"open_run: trust_imports must be True or False, got {trust_imports!r}")
    where = Path(path)
    if not where.exists():
        raise LandscapeError(f"open_run: {where} does not exist")
    if not where.is_dir():
        raise LandscapeError(f"open_run: {where} is not a directory (give a run directory)")
    run = Run(where, trust_imports=trust_imports)
    _ = run.recipe  # a recipe that does not read is an error of open_run, not of a later call
    return run
