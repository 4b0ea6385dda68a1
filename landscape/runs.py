"""The run directory: paths, atomic writes, checkpoints, metrics.jsonl, and the notebook API ``open_run``.

```
runs/<name>/
  recipe.toml                      fully resolved recipe
  partition.json                   client -> sample indices, class histogram
  metrics.jsonl                    one JSON line per round
  checkpoints/round-0050.pt        global model, server and client state, round, RNG scheme
  checkpoints/round-0050.clients.pt  that round's clients' final local models (--keep-clients)
```
Every file is written atomically (temporary file in the same folder, fsync, rename), and checkpoints load
with ``torch.load(weights_only=True)``: they hold only tensors and plain containers.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from landscape.errors import LandscapeError

CHECKPOINT_FORMAT = 1
_CKPT = re.compile(r"^round-(\d{4,})\.pt$")


def atomic_write(path: Path, write: Callable[[Any], None], mode: str = "wb") -> None:
    """Write through ``write(file)`` into a temporary file beside ``path``, then rename it over ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, mode) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda f: f.write(text), mode="w")


def save_checkpoint(path: Path, payload: dict) -> None:
    atomic_write(path, lambda f: torch.save(payload, f))


def load_checkpoint(path: Path, map_location: str | torch.device = "cpu") -> dict:
    """Load a checkpoint safely (weights_only: tensors and plain containers, no code runs)."""
    path = Path(path)
    try:
        obj = torch.load(path, map_location=map_location, weights_only=True)
    except FileNotFoundError:
        raise LandscapeError(f"checkpoint not found: {path}") from None
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, OSError, KeyError, AttributeError,
            zipfile.BadZipFile) as e:  # truncated, foreign or unsafe files
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise LandscapeError(f"cannot load checkpoint {path}: {first}") from None
    if not isinstance(obj, dict) or obj.get("format") != CHECKPOINT_FORMAT or "model" not in obj:
        raise LandscapeError(f"{path} is not a landscape checkpoint")
    return obj


class RunDir:
    """Paths of one run directory."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    recipe = property(lambda self: self.path / "recipe.toml")
    partition = property(lambda self: self.path / "partition.json")
    metrics = property(lambda self: self.path / "metrics.jsonl")
    checkpoints = property(lambda self: self.path / "checkpoints")

    def checkpoint(self, round: int) -> Path:
        return self.checkpoints / f"round-{round:04d}.pt"

    def clients_checkpoint(self, round: int) -> Path:
        return self.checkpoints / f"round-{round:04d}.clients.pt"

    def rounds(self) -> list[int]:
        """Rounds with a checkpoint file, ascending."""
        if not self.checkpoints.is_dir():
            return []
        found = (_CKPT.match(p.name) for p in self.checkpoints.iterdir())
        return sorted(int(m.group(1)) for m in found if m)

    def is_run(self) -> bool:
        return self.recipe.is_file()

    # -- metrics.jsonl ----------------------------------------------------------------------------------
    def read_metrics(self) -> list[dict]:
        if not self.metrics.is_file():
            return []
        rows = []
        for line in self.metrics.read_text().splitlines():
            line = line.strip()
            if not line:
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                break  # a line cut short by a kill: everything after it is not trusted
        return rows

    def append_metrics(self, row: dict) -> None:
        with open(self.metrics, "a") as f:
            f.write(json.dumps(row, allow_nan=True) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def truncate_metrics(self, last_round: int) -> None:
        """Keep the rows of rounds <= ``last_round`` (rows after a resumed checkpoint are recomputed)."""
        rows = [r for r in self.read_metrics() if r.get("round", 0) <= last_round]
        write_text(self.metrics, "".join(json.dumps(r, allow_nan=True) + "\n" for r in rows))


def partition_record(
    client_indices: list[np.ndarray], histogram: np.ndarray, settings: dict
) -> dict:
    return {
        "settings": settings,
        "num_clients": len(client_indices),
        "clients": [
            {"client": i, "size": len(idx), "histogram": histogram[i].tolist(), "indices": idx.tolist()}
            for i, idx in enumerate(client_indices)
        ],
    }


# ----------------------------------------------------------------------------------------------------------
# notebook API


class Run:
    """An existing run directory: ``open_run("runs/x")``.

    ``.recipe`` (resolved recipe dict), ``.metrics()`` (rows of metrics.jsonl), ``.rounds()`` (checkpointed
    rounds), ``.model(round)`` (nn.Module with those weights, eval mode), ``.data()`` (train and test sets as
    the run used them), ``.client_data(i)`` and ``.partition()``.
    """

    def __init__(self, path: str | Path) -> None:
        from landscape import recipe as recipes

        self.dir = RunDir(path)
        if not self.dir.path.is_dir():
            raise LandscapeError(f"not a directory: {self.dir.path}")
        if not self.dir.is_run():
            raise LandscapeError(f"{self.dir.path} is not a run directory (no recipe.toml)")
        self.recipe = recipes.resolve(recipes.read_toml(self.dir.recipe))
        self._setup = None

    @property
    def path(self) -> Path:
        return self.dir.path

    def __repr__(self) -> str:
        return f"Run({str(self.path)!r}, rounds={self.rounds()})"

    def metrics(self) -> list[dict]:
        return self.dir.read_metrics()

    def rounds(self) -> list[int]:
        return self.dir.rounds()

    def _data_setup(self):
        if self._setup is None:
            from landscape.train.loop import prepare_data

            self._setup = prepare_data(self.recipe)
        return self._setup

    def data(self):
        """(train, test) ArrayDatasets exactly as the run used them (never augmented)."""
        bundle = self._data_setup().bundle
        return bundle.train, bundle.test

    def partition(self) -> list[np.ndarray]:
        """Per-client train-set index arrays, as recorded in partition.json."""
        record = json.loads(self.dir.partition.read_text())
        return [np.asarray(c["indices"], dtype=np.int64) for c in record["clients"]]

    def client_data(self, client: int):
        parts = self.partition()
        if not 0 <= client < len(parts):
            raise LandscapeError(f"client {client} does not exist (the run has {len(parts)} clients)")
        train, _ = self.data()
        return train.subset(parts[client])

    def checkpoint(self, round: int | None = None) -> dict:
        rounds = self.rounds()
        if not rounds:
            raise LandscapeError(f"{self.path} has no checkpoints")
        if round is None:
            round = rounds[-1]
        if round not in rounds:
            raise LandscapeError(f"round {round} has no checkpoint in {self.path}; checkpointed rounds: "
                                 + ", ".join(map(str, rounds)))
        return load_checkpoint(self.dir.checkpoint(round))

    def model(self, round: int | None = None) -> torch.nn.Module:
        """The global model of a checkpointed round (default: the last; x_swa once server SWA has begun),
        on the CPU, in eval mode."""
        from landscape.train.loop import build_module

        setup = self._data_setup()
        module = build_module(self.recipe, setup.bundle)
        ckpt = self.checkpoint(round)
        state = ckpt.get("swa_model", ckpt["model"])  # analysis uses the SWA average once it exists
        try:
            module.load_state_dict(state)
        except RuntimeError as e:
            raise LandscapeError(
                f"checkpoint does not match the recipe's model '{self.recipe['model']['name']}': "
                + str(e).strip().splitlines()[0]
            ) from None
        return module.eval()


def open_run(path: str | Path) -> Run:
    """Open a run directory for reading (see ``Run``)."""
    return Run(path)
