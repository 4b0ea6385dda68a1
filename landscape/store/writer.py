"""Record a federated run from any training loop (``RunWriter``), in the run format every analysis reads
(docs/reference/run-format.md), and the one way a round's files are written (``write_round_files``), which
landscape's own trainer uses too.

```python
with landscape.RunWriter("runs/myfl", model="mylab.nets:make_net", data="mylab.data:make_train_set",
                         partition={0: [...], 1: [...]}) as w:
    for t in range(1, rounds + 1):
        ...                                              # the loop's own round
        w.round(t, start=sent, clients={i: returned[i] for i in sampled}, end=net.state_dict())
```

Per round it keeps the model the clients started from (``start``, the broadcast), each participating client's
returned model, and the new global model (``end``), so that no analysis needs to know the algorithm. Every file
is written atomically; a writer opened again on its own run continues it (rounds written with the same content
are skipped: a loop run again from its start records nothing twice); whatever does not fit (a model of another
shape, a client not in the partition, a round written again with other content, another run's folder) is
refused in one line, before anything is written.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from landscape.config import recipe as recipes
from landscape.config.sections import TrainSettings
from landscape.config.setup import torch_dtype
from landscape.core.distances import round_distances
from landscape.core.errors import LandscapeError
from landscape.core.flat import FlatModel
from landscape.data.partitions import class_histogram, heterogeneity
from landscape.store.checkpoints import CHECKPOINT_FORMAT, check_model_state, safe_load, save_checkpoint
from landscape.store.directory import RunDir, partition_record
from landscape.store.fileio import RunLock, os_reason, write_text

# The version of the run format (docs/reference/run-format.md) a run directory is written in: recipe.toml's
# tables, partition.json, metrics.jsonl and the two files of a recorded round.
RUN_FORMAT = 2

# The training keys a recorded hyper-parameter may be (the others go to [algorithm]).
TRAIN_KEYS = {f for f in TrainSettings.__dataclass_fields__ if f not in ("rounds", "dtype", "log")}


def write_round_files(run_dir: RunDir, round: int, payload: dict, clients: dict | None) -> None:
    """A recorded round's files: ``round-NNNN.clients.pt`` (the clients' start point and returned models) first,
    then ``round-NNNN.pt`` (the global model), whose presence marks the round as recorded (a kill between the
    two leaves a clients file that the next write of the round replaces)."""
    if clients is not None:
        save_checkpoint(run_dir.clients_checkpoint(round), {"format": CHECKPOINT_FORMAT, "round": round,
                                                            "model": {}, **clients})
    save_checkpoint(run_dir.checkpoint(round), {"format": CHECKPOINT_FORMAT, "round": round, **payload})


def _state(value: Any, what: str) -> dict[str, torch.Tensor]:
    """A model's tensors as a plain state_dict on the CPU (an ``nn.Module`` gives its ``state_dict()``)."""
    if isinstance(value, torch.nn.Module):
        value = value.state_dict()
    if not isinstance(value, Mapping) or not value or not all(
            isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in value.items()):
        raise LandscapeError(f"RunWriter: {what} must be a state_dict (names -> tensors) or an nn.Module, not "
                             f"{type(value).__name__}")
    return {k: v.detach().to("cpu", copy=True).contiguous() for k, v in value.items()}


def _plain(value: Any, what: str) -> Any:
    """``value`` if it is made of what a checkpoint and JSON hold (str, numbers, bools, lists, tables)."""
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        raise LandscapeError(f"RunWriter: {what} must hold only strings, finite numbers, booleans, lists and "
                             f"tables with string keys (got {value!r:.80})") from None
    return value


def _partition(partition: Any) -> list[np.ndarray]:
    """Client id -> sample indices as one index array per client 0..N-1, or a one-line error."""
    if not isinstance(partition, Mapping) or not partition:
        raise LandscapeError("RunWriter: partition must map each client (0..N-1) to its sample indices, or be a "
                             f"registered partition's name (got {type(partition).__name__})")
    ids = sorted(partition, key=lambda k: (not isinstance(k, int), str(k)))
    if any(isinstance(k, bool) or not isinstance(k, (int, np.integer)) for k in ids) or ids != list(range(len(ids))):
        raise LandscapeError(f"RunWriter: the partition's clients must be the whole numbers 0..N-1 (got "
                             f"{', '.join(map(repr, ids[:6]))}{' ...' if len(ids) > 6 else ''})")
    out = []
    for client in ids:
        indices = partition[client]
        array = np.asarray(list(indices) if not isinstance(indices, (np.ndarray, torch.Tensor)) else indices)
        if array.ndim != 1 or not (array.size == 0 or np.issubdtype(array.dtype, np.integer)):
            raise LandscapeError(f"RunWriter: client {client}'s samples must be a list of sample indices")
        if array.size == 0:
            raise LandscapeError(f"RunWriter: client {client} has no samples")
        out.append(np.sort(array.astype(np.int64)))
    return out


def _entry(name: str, options: Mapping | None, factory_key: str) -> dict:
    """A recipe table naming a registered entry (with its options) or, for ``package.module:function``, the
    entry ``factory`` with the function under ``factory_key``."""
    if not isinstance(name, str) or not name:
        raise LandscapeError(f"RunWriter: give a registered name or package.module:function (got {name!r:.80})")
    if ":" in name:
        return {"name": "factory", factory_key: name}
    return {"name": name, **dict(options or {})}


class RunWriter:
    """Writes a run directory from a federated training loop of your own; see the module's docstring and
    docs/reference/run-format.md.

    ``model``: a registered model name (``model_options``) or ``package.module:function`` returning the
    ``nn.Module``; ``data``: a registered data set (``data_options``) or ``package.module:function`` returning
    the training samples ((inputs, targets) tensors, a Dataset or a DataLoader), ``test_data`` the test set's
    function; ``partition``: {client: sample indices} (clients 0..N-1; the indices into ``data``'s samples), or
    a registered partition's name with ``partition_options`` (``clients``, ``alpha``, ...) drawn from ``seed``.
    ``algorithm``: its name, ``hyperparameters``: the values it ran with (landscape's training keys such as
    ``lr``, ``local_epochs``, ``batch_size`` go to [train], the others to [algorithm]); both are recorded, never
    run. ``overwrite``: replace a run this class or ``landscape train`` wrote there."""

    def __init__(self, path: str | Path, *, model: str, data: str, partition: Mapping | str,
                 test_data: str | None = None, model_options: Mapping | None = None,
                 data_options: Mapping | None = None, partition_options: Mapping | None = None,
                 algorithm: str = "unknown", hyperparameters: Mapping | None = None, seed: int = 0,
                 overwrite: bool = False) -> None:
        from landscape.config.setup import build_module, prepare_data

        self.dir = RunDir(path)
        hyper = dict(_plain(dict(hyperparameters or {}), "hyperparameters"))
        raw = {"name": self._name(), "seed": seed,
               "dataset": _entry(data, data_options, "train"),
               "model": _entry(model, model_options, "factory"),
               "algorithm": {"name": algorithm, **{k: v for k, v in hyper.items() if k not in TRAIN_KEYS}},
               "train": {"rounds": 1, "keep_clients": True, "checkpoint_every": 1,
                         **{k: v for k, v in hyper.items() if k in TRAIN_KEYS}}}
        if test_data is not None:
            if ":" not in data:
                raise LandscapeError("RunWriter: test_data goes with a data factory; a registered data set has its "
                                     "own test split")
            raw["dataset"]["test"] = test_data
        recorded = isinstance(partition, Mapping)
        parts = _partition(partition) if recorded else None
        if recorded:
            raw["partition"] = {"name": "recorded", "clients": len(parts)}
        else:
            raw["partition"] = {"name": partition, **dict(partition_options or {})}
        self.recipe = recipes.resolve(raw, algorithms=False, origin="RunWriter")
        setup = prepare_data(self.recipe) if not recorded else None
        self._bundle = setup.bundle if setup else self._data_bundle()
        self.parts = parts if recorded else setup.client_indices
        self._check_parts(len(self._bundle.train))
        module = build_module(self.recipe, self._bundle)
        self.reference = module.state_dict()
        self.names = FlatModel(module).names  # the trained parameters (Delta_D and the row's norms are of them)
        floats = [t.dtype for t in self.reference.values() if t.is_floating_point()]
        self._with({"train.dtype": str(floats[0] if floats else torch.float32)[6:]})
        self._open(overwrite)

    # -- the run directory --------------------------------------------------------------------------------
    def _with(self, values: dict, write: bool = False) -> None:
        """The recipe with ``values`` set (validated again; the algorithm is recorded, never looked up)."""
        raw = self.recipe.to_dict()
        for key, value in values.items():
            recipes.set_key(raw, key, value)
        self.recipe = recipes.resolve(raw, algorithms=False, origin="RunWriter")
        if write:
            write_text(self.dir.recipe, recipes.to_toml(self.recipe))

    def _name(self) -> str:
        name = self.dir.path.name
        try:
            recipes.check_name(name)
        except LandscapeError:
            return "run"
        return name

    def _data_bundle(self):
        """The data set of a recorded partition (a factory's, or a registered one's)."""
        from landscape.data.datasets import load_dataset

        d = self.recipe.dataset
        return load_dataset(d.name, root=d.root, download=False, augment=False, num_clients=1, seed=self.recipe.seed,
                            options=dict(d.options))

    def _check_parts(self, samples: int) -> None:
        """Every index one of the data's ``samples`` (sorted arrays); a sample may repeat, within a client and
        across clients (the reference codes' Dirichlet partition, dirichlet-client-reuse, repeats samples)."""
        for client, array in enumerate(self.parts):
            if array.size and not (0 <= array[0] and array[-1] < samples):
                bad = array[0] if array[0] < 0 else array[-1]
                raise LandscapeError(f"RunWriter: client {client} has sample {bad}, outside the {samples} samples "
                                     "of the data")

    def _open(self, overwrite: bool) -> None:
        from landscape.store import lifecycle

        path = self.dir.path
        text = recipes.to_toml(self.recipe)
        if self.dir.is_run() and not overwrite:
            self._check_same_run()
        else:
            lifecycle.check_out_dir(self.dir, overwrite)
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise LandscapeError(f"cannot create {path}: {os_reason(e)}") from None
        self._lock = RunLock(self.dir)
        self._lock.__enter__()
        if overwrite:
            lifecycle.clear_run_dir(self.dir)
        self.dir.mark()
        self.dir.checkpoints.mkdir(exist_ok=True)
        if not self.dir.is_run():
            write_text(self.dir.recipe, text)
        else:  # continued: its rounds and participation as recorded so far (the same run: _check_same_run)
            self.recipe = recipes.read_recipe(self.dir.recipe, algorithms=False, trust_imports=True)
        if not self.dir.partition.is_file():
            histogram = class_histogram(self._bundle.train.y.numpy(), self.parts, self._bundle.num_classes)
            settings = {"name": self.recipe.partition.name, **self.recipe.partition.options, "seed": self.recipe.seed}
            shares = heterogeneity(histogram, self.parts, len(self._bundle.train))
            record = partition_record(self.parts, histogram, settings, shares.record())
            write_text(self.dir.partition, json.dumps(record) + "\n")
        self._rows = {row["round"] for row in self.dir.read_metrics()}
        self._last = None

    def _check_same_run(self) -> None:
        """An existing run here is continued only when it is this writer's run: the same recipe (but for how
        many rounds it has and what they are computed in) and partition."""
        ignore = frozenset({"train.rounds", "train.participation", "train.dtype"})
        difference = recipes.difference(self.dir.recipe.read_text(errors="replace"), self.recipe, ignore)
        if difference is not None:
            raise LandscapeError(f"{self.dir.path} holds another run ({difference}); give another path, or "
                                 "overwrite=True to replace it")
        from landscape.store.checkpoints import read_partition

        recorded = read_partition(self.dir.partition, len(self._bundle.train), len(self.parts), recorded=True)
        if any(not np.array_equal(a, b) for a, b in zip(recorded, self.parts)):
            raise LandscapeError(f"{self.dir.path} holds a run of another partition; give another path, or "
                                 "overwrite=True to replace it")

    # -- rounds ---------------------------------------------------------------------------------------------
    def round(self, t: int, *, end: Any, start: Any = None, clients: Mapping | None = None,
              server_state: Mapping | None = None, client_states: Mapping | None = None,
              metrics: Mapping | None = None, metadata: Mapping | None = None) -> None:
        """Record round ``t`` (>= 0; round 0 may be the initial model alone): ``end`` the new global model,
        ``start`` the model the clients started from (what they received), ``clients`` {client: returned
        model}; optional ``server_state`` / ``client_states`` (named tensors, kept as given), ``metrics`` (a
        row for metrics.jsonl, e.g. test_acc) and ``metadata`` (kept in the round's file)."""
        if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or t < 0:
            raise LandscapeError(f"RunWriter.round: the round must be a whole number >= 0 (got {t!r:.40})")
        t = int(t)
        self._settle_dtype(end)
        payload, kept = self._round_files(t, end, start, clients, server_state, client_states, metadata)
        if self.dir.checkpoint(t).is_file():
            self._check_written(t, payload, kept)
        else:
            self._extend_recipe(t, len(kept["clients"]) if kept else 0)
            write_round_files(self.dir, t, payload, kept)
        if t >= 1 and t not in self._rows:
            row = {"round": t, **self._row(t, payload["model"], kept), **_plain(dict(metrics or {}), "metrics")}
            self.dir.append_metrics(row)
            self._rows.add(t)
        self._last = (t, payload["model"])

    def _round_files(self, t, end, start, clients, server_state, client_states, metadata) -> tuple[dict, dict | None]:
        where = f"round {t}"
        payload = {"model": self._checked(end, f"{where}'s end model"), "writer": "RunWriter",
                   "run_format": RUN_FORMAT, "metadata": _plain(dict(metadata or {}), "metadata")}
        if server_state is not None:
            payload["server_state"] = _state(server_state, f"{where}'s server state")
        if clients is None:
            return payload, None
        if start is None:
            raise LandscapeError(f"RunWriter.round: {where} has client models but no start: give start=, the "
                                 "model the clients started from (what they received)")
        if not isinstance(clients, Mapping) or not clients:
            raise LandscapeError(f"RunWriter.round: clients must map client ids to their models ({where})")
        kept = {"start": self._checked(start, f"{where}'s start model"), "clients": {}}
        for client in sorted(clients, key=str):
            if isinstance(client, bool) or not isinstance(client, (int, np.integer)) or not 0 <= client < len(self.parts):
                raise LandscapeError(f"RunWriter.round: {where} has a model of client {client!r:.40}, which is not in "
                                     f"the partition (clients 0..{len(self.parts) - 1})")
            kept["clients"][str(int(client))] = self._checked(clients[client], f"{where}'s model of client {client}")
        if client_states is not None:
            kept["client_states"] = {str(c): _state(s, f"{where}'s state of client {c}")
                                     for c, s in client_states.items()}
        return payload, kept

    def _settle_dtype(self, end: Any) -> None:
        """The run's dtype (train.dtype) is its first recorded model's (float32 or float64): every model of the
        run must hold it (a float16 copy of a float32 model is not that model)."""
        if self.dir.rounds() or not isinstance(end, (Mapping, torch.nn.Module)):
            return
        tensors = end.state_dict().values() if isinstance(end, torch.nn.Module) else end.values()
        floats = [str(v.dtype)[6:] for v in tensors if isinstance(v, torch.Tensor) and v.is_floating_point()]
        if floats and floats[0] in ("float32", "float64") and floats[0] != self.recipe.train.dtype:
            self._with({"train.dtype": floats[0]}, write=True)

    def _checked(self, value: Any, what: str) -> dict[str, torch.Tensor]:
        state = _state(value, what)
        check_model_state(state, self.reference, self.recipe.model.name, f"RunWriter: {what}",
                          torch_dtype(self.recipe.train.dtype))
        return state

    def _extend_recipe(self, t: int, clients: int) -> None:
        """recipe.toml's rounds (the last recorded) and participation (the largest share of clients in a round)."""
        cfg = self.recipe.train
        rounds, share = max(cfg.rounds, t), max(cfg.participation if self.dir.rounds() else 0, clients / len(self.parts))
        if (rounds, share) != (cfg.rounds, cfg.participation) and share > 0:
            self._with({"train.rounds": rounds, "train.participation": share}, write=True)

    def _check_written(self, t: int, payload: dict, kept: dict | None) -> None:
        """A round written again must hold what it holds: else a one-line refusal (nothing is replaced)."""
        def same(a: Any, b: Any) -> bool:
            if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
                return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype \
                    and a.shape == b.shape and torch.equal(a, b)
            if isinstance(a, Mapping) and isinstance(b, Mapping):
                return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
            return a == b

        old = safe_load(self.dir.checkpoint(t))
        old_kept = safe_load(self.dir.clients_checkpoint(t)) if self.dir.clients_checkpoint(t).is_file() else None
        fields = ("start", "clients", "client_states")
        matches = all(same(old.get(k), payload.get(k)) for k in ("model", "server_state", "metadata")) and (
            (kept is None and old_kept is None) or (kept is not None and old_kept is not None
                                                    and all(same(old_kept.get(k), kept.get(k)) for k in fields)))
        if not matches:
            raise LandscapeError(f"RunWriter.round: round {t} is already recorded in {self.dir.path} with other "
                                 "models; a recorded round is never replaced (write to another path, or "
                                 "overwrite=True to start the run again)")

    def _row(self, t: int, end: dict[str, torch.Tensor], kept: dict | None) -> dict:
        """The trainer's per-round numbers of what was recorded (float64): Delta_D around the clients' mean, its
        scale-free companion and the distance to the new global model (``landscape.core.distances``), and the
        global step from the previous recorded round."""
        def flat(state: dict[str, torch.Tensor]) -> torch.Tensor:
            return torch.cat([state[n].reshape(-1).double() for n in self.names])

        x = flat(end)
        row: dict[str, Any] = {}
        if kept is not None:
            models = torch.stack([flat(s) for s in kept["clients"].values()])
            row.update(clients=[int(c) for c in kept["clients"]], **round_distances(models, x, flat(kept["start"])))
        if self._last is not None and self._last[0] == t - 1:
            row["update_norm"] = float((x - flat(self._last[1])).norm())
        return {k: v for k, v in row.items() if not isinstance(v, float) or math.isfinite(v)}

    # -- closing --------------------------------------------------------------------------------------------
    def close(self) -> None:
        """Release the run directory (its lock); the files are complete after every ``round``."""
        lock, self._lock = getattr(self, "_lock", None), None
        if lock is not None:
            lock.__exit__(None, None, None)

    def __enter__(self) -> RunWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RunWriter({str(self.dir.path)!r}, rounds={self.dir.rounds()})"


__all__ = ["RUN_FORMAT", "TRAIN_KEYS", "RunWriter", "write_round_files"]
