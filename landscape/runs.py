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

Besides one row per round, metrics.jsonl may hold event rows (``{"round": t, "event": "diverged", ...}``):
``read_metrics`` returns the round rows only, ``read_events`` the event rows. A process that trains into a
run directory holds an exclusive lock on it (``RunLock``: flock on ``<run>/.lock``, gone with the process).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import pickle
import pickletools
import re
import struct
import tempfile
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from landscape.errors import LandscapeError

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no advisory locks, runs are not locked
    fcntl = None

CHECKPOINT_FORMAT = 1
_CKPT = re.compile(r"^round-(\d{4,})\.pt$")
# Temporary files of atomic_write ('.<name>.<random>.tmp') of a run's own files, left by a killed process.
_TEMP = re.compile(r"^\.(recipe\.toml|partition\.json|metrics\.jsonl|round-\d{4,}(\.clients)?\.pt)\.[a-z0-9_]{8}\.tmp$")
LOCK_NAME = ".lock"


def os_reason(error: OSError) -> str:
    """'[Errno 28] No space left on device' (without the file name that OSError's str may append)."""
    if error.errno is not None and error.strerror:
        return f"[Errno {error.errno}] {error.strerror}"
    return str(error) or type(error).__name__


def _file_mode() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


_FILE_MODE = _file_mode()


def atomic_write(path: Path, write: Callable[[Any], None], mode: str = "wb") -> None:
    """Write through ``write(file)`` into a temporary file beside ``path``, then rename it over ``path``.

    Either the whole new file is in place or the old one is untouched, and no temporary file is left (a
    killed process may leave one: ``.<name>.<random>.tmp``, which no reader takes for a result). A failed
    write (full disk, read-only folder) raises a one-line LandscapeError naming the file.
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise LandscapeError(f"cannot write {path}: {os_reason(e)}") from None
    try:
        os.chmod(tmp, _FILE_MODE)  # mkstemp creates 0600; results are ordinary files (0666 less the umask)
        with os.fdopen(fd, mode) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError):
            raise LandscapeError(f"cannot write {path}: {os_reason(e)}") from None
        raise
    try:
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError as e:  # the rename is done; only its durability could not be confirmed
        raise LandscapeError(f"cannot write {path}: {os_reason(e)}") from None


def write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda f: f.write(text), mode="w")


def save_checkpoint(path: Path, payload: dict) -> None:
    atomic_write(path, lambda f: torch.save(payload, f))


class CheckpointError(LandscapeError):
    """A checkpoint that cannot be used. ``kind``: 'missing', 'damaged' (truncated or corrupted), 'unsafe'
    (it would run code: refused by the weights_only loader) or 'foreign' (loads, but is not a landscape
    checkpoint). ``reason`` is the short why, without the path."""

    def __init__(self, message: str, path: Path, kind: str, reason: str) -> None:
        super().__init__(message)
        self.path, self.kind, self.reason = Path(path), kind, reason


_CODE_OPS = {"GLOBAL", "STACK_GLOBAL", "INST", "OBJ", "REDUCE", "NEWOBJ", "NEWOBJ_EX", "BUILD"}


def _pickled_code(path: Path, limit: int = 1 << 22) -> str | None:
    """The first import a plain pickle file asks for (``os.system``), read without running anything; None
    when the file is not a plain pickle (torch's zip format, junk) or asks for none."""
    try:
        with open(path, "rb") as f:
            data = f.read(limit)
    except OSError:
        return None
    if not data.startswith(b"\x80"):  # pickles of protocol 2+ start with PROTO
        return None
    strings: list[str] = []
    try:
        for op, arg, _ in pickletools.genops(data):
            if isinstance(arg, str):
                strings.append(arg)
            if op.name == "GLOBAL":
                return str(arg).replace(" ", ".")
            if op.name == "STACK_GLOBAL":
                return ".".join(strings[-2:]) if len(strings) >= 2 else "a global"
            if op.name in _CODE_OPS:
                return op.name
    except (ValueError, EOFError, IndexError, OverflowError, struct.error):  # a damaged stream ends the scan
        return None
    return None


def _load_failure(path: Path, error: BaseException) -> tuple[str, str]:
    """(kind, short reason) of a torch.load failure; torch's messages run over many lines."""
    text = str(error).strip()
    if isinstance(error, pickle.UnpicklingError) and "Weights only load failed" in text:
        found = re.search(r"GLOBAL (\S+)", text)
        code = found.group(1) if found else _pickled_code(path)
        if code:
            return "unsafe", (f"it would run code ({code}), which a checkpoint never holds; refused by the "
                              "safe loader (weights_only), nothing in it was run")
        reason = next((line.strip() for line in text.splitlines()[1:]
                       if line.strip() and not line.startswith(("Please file", "Check the documentation"))), "")
        return "damaged", f"not a tensor checkpoint, or corrupted: {reason or 'refused by the safe loader'}"
    if isinstance(error, EOFError):
        return "damaged", "truncated (the file ends early)"
    first = text.splitlines()[0] if text else type(error).__name__
    first = first.split(". ")[0].rstrip(".")  # torch adds sentences of advice after the reason
    if isinstance(error, OSError) and error.errno is not None and error.strerror:
        first = os_reason(error)
    return "damaged", f"truncated or corrupted: {first}"


def load_checkpoint(path: Path, map_location: str | torch.device = "cpu") -> dict:
    """Load a checkpoint safely (weights_only: tensors and plain containers, no code runs).

    Every failure is a one-line ``CheckpointError`` naming the file."""
    path = Path(path)
    try:
        with warnings.catch_warnings():  # torch warns about the pickle protocol of files it then refuses
            warnings.filterwarnings("ignore", message=".*(pickle protocol|weights_only).*")
            obj = torch.load(path, map_location=map_location, weights_only=True)
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint not found: {path}", path, "missing", "not found") from None
    except IsADirectoryError:
        raise CheckpointError(f"cannot load checkpoint {path}: it is a directory", path, "foreign",
                              "a directory") from None
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, OSError, KeyError, AttributeError,
            IndexError, TypeError, UnicodeDecodeError, zipfile.BadZipFile) as e:  # truncated, corrupted, unsafe
        kind, reason = _load_failure(path, e)
        raise CheckpointError(f"cannot load checkpoint {path}: {reason}", path, kind, reason) from None
    if not isinstance(obj, dict) or obj.get("format") != CHECKPOINT_FORMAT or "model" not in obj:
        raise CheckpointError(f"{path} is not a landscape checkpoint", path, "foreign",
                              "not a landscape checkpoint")
    return obj


def check_model_state(state: Any, reference: dict[str, torch.Tensor], model_name: str, where: Path | str) -> None:
    """Every tensor of the reference model, with its shape, or a one-line error naming the first that is not
    (a checkpoint of another model, or of another width)."""
    if not isinstance(state, dict) or not state:
        raise LandscapeError(f"{where} does not match the model '{model_name}': no model tensors")
    for key, ref in reference.items():
        got = state.get(key)
        if not isinstance(got, torch.Tensor):
            raise LandscapeError(f"{where} does not match the model '{model_name}': it has no tensor '{key}'")
        if tuple(got.shape) != tuple(ref.shape):
            raise LandscapeError(f"{where} does not match the model '{model_name}': '{key}' has shape "
                                 f"{list(got.shape)} there, {list(ref.shape)} in this model")
        if ref.is_floating_point() != got.is_floating_point():
            kind = "floating-point" if ref.is_floating_point() else "integer"
            raise LandscapeError(f"{where} does not match the model '{model_name}': '{key}' must hold {kind} "
                                 f"values (it holds {got.dtype})")
    extra = sorted(set(state) - set(reference))
    if extra:
        raise LandscapeError(f"{where} does not match the model '{model_name}': it has tensors this model lacks "
                             f"('{extra[0]}'{' ...' if len(extra) > 1 else ''})")


class Checkpoint:
    """One training checkpoint (``round-NNNN.pt``), loaded with the safe loader.

    ``model_state`` is x^t, the global model of training; ``analysed_state`` the model that evaluation and
    analysis use: the server-SWA average x_swa once it exists, else x^t (the one place this rule lives).
    """

    def __init__(self, path: Path, payload: dict) -> None:
        self.path = Path(path)
        self.payload = payload

    @classmethod
    def load(cls, path: str | Path, map_location: str | torch.device = "cpu") -> Checkpoint:
        return cls(Path(path), load_checkpoint(Path(path), map_location))

    @property
    def round(self) -> int:
        return int(self.payload.get("round", -1))

    @property
    def recipe_text(self) -> str | None:
        """The resolved recipe the checkpoint was trained with (TOML), when it carries one."""
        text = self.payload.get("recipe")
        return text if isinstance(text, str) else None

    @property
    def model_state(self) -> dict[str, torch.Tensor]:
        return self.payload["model"]

    @property
    def has_swa(self) -> bool:
        return "swa_model" in self.payload

    @property
    def analysed_state(self) -> dict[str, torch.Tensor]:
        return self.payload["swa_model"] if self.has_swa else self.payload["model"]

    @property
    def dtype(self) -> torch.dtype:
        """The floating-point dtype of the saved model (float32 unless it was trained in float64)."""
        floats = [t.dtype for t in self.model_state.values() if isinstance(t, torch.Tensor) and t.is_floating_point()]
        return floats[0] if floats else torch.float32

    def check_model(self, reference: dict[str, torch.Tensor], model_name: str) -> None:
        """The saved model (and the SWA average) fit ``reference`` (a state_dict of the recipe's model)."""
        check_model_state(self.model_state, reference, model_name, self.path)
        if self.has_swa:
            check_model_state(self.payload["swa_model"], reference, model_name, self.path)


def load_client_models(path: Path, reference: dict[str, torch.Tensor], model_name: str) -> dict[int, dict]:
    """The clients' final local models of a ``round-NNNN.clients.pt`` file: {client: state_dict}, each checked
    against ``reference``. A damaged, unsafe or foreign file is a one-line error naming it."""
    payload = load_checkpoint(path)
    clients = payload.get("clients")
    if not isinstance(clients, dict) or not clients:
        raise CheckpointError(f"{path} holds no client models", path, "foreign", "holds no client models")
    out = {}
    for key, state in clients.items():
        if not (isinstance(key, str) and key.isdigit()):
            raise CheckpointError(f"{path}: client key {key!r} is not a client number", path, "foreign",
                                  "bad client key")
        check_model_state(state, reference, model_name, f"{path} (client {key})")
        out[int(key)] = state
    return out


def surface_result_name(directions: str) -> str:
    """The file name (without suffix) of a surface in ``analysis/round-NNNN/``: ``surface`` for the random
    plane, ``surface-<directions>`` (pca, clients, interpolate) for the others, so they never overwrite one
    another. The analysis writes them under this name and the figures read them by it."""
    return "surface" if directions == "random" else f"surface-{directions}"


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
    def _read_rows(self) -> list[dict]:
        """Every row of metrics.jsonl (round rows and event rows), up to a line cut short by a kill."""
        if not self.metrics.is_file():
            return []
        rows = []
        for line in self.metrics.read_text().splitlines():
            line = line.strip()
            if not line:
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                break  # a line cut short by a kill: everything after it is not trusted
            if not isinstance(row, dict):
                break
            rows.append(row)
        return rows

    def read_metrics(self) -> list[dict]:
        """The per-round rows of metrics.jsonl (event rows such as a divergence are left out: see
        ``read_events``)."""
        return [r for r in self._read_rows() if "event" not in r]

    def read_events(self) -> list[dict]:
        """The event rows of metrics.jsonl: ``{"round": t, "event": "diverged", "algorithm": ..., ...}``."""
        return [r for r in self._read_rows() if "event" in r]

    def append_metrics(self, row: dict) -> None:
        try:
            with open(self.metrics, "a") as f:
                f.write(json.dumps(row, allow_nan=True) + "\n")
                f.flush()
                os.fsync(f.fileno())
        except OSError as e:
            raise LandscapeError(f"cannot write {self.metrics}: {os_reason(e)}") from None

    def append_event(self, event: str, round: int, **fields: Any) -> None:
        """An event row (NaN and inf written as strings, so that the line stays standard JSON)."""
        def plain(v: Any) -> Any:
            return str(v) if isinstance(v, float) and not math.isfinite(v) else v

        self.append_metrics({"round": round, "event": event, **{k: plain(v) for k, v in fields.items()}})

    def truncate_metrics(self, last_round: int) -> None:
        """Keep the rows of rounds <= ``last_round`` (rows after a resumed checkpoint are recomputed) and
        every event row (the run's history: a divergence stays on record)."""
        rows = [r for r in self._read_rows()
                if "event" in r or (isinstance(r.get("round"), int) and r["round"] <= last_round)]
        write_text(self.metrics, "".join(json.dumps(r, allow_nan=True) + "\n" for r in rows))

    # -- leftovers of a killed process ------------------------------------------------------------------
    def stale_temp_files(self) -> list[Path]:
        """Temporary files of interrupted atomic writes in the run folder and checkpoints/ (never results)."""
        found = []
        for folder in (self.path, self.checkpoints):
            if folder.is_dir():
                found += [p for p in folder.iterdir() if _TEMP.match(p.name) and p.is_file()]
        return sorted(found)

    def remove_stale_temp_files(self) -> list[Path]:
        """Remove them (call with the run's lock held: no other process is writing here)."""
        removed = self.stale_temp_files()
        for p in removed:
            p.unlink(missing_ok=True)
        return removed

    def set_aside(self, path: Path, suffix: str = ".damaged") -> Path:
        """Rename a file out of the way (``round-0004.pt`` -> ``round-0004.pt.damaged``), never deleting it."""
        target = path.with_name(path.name + suffix)
        n = 1
        while target.exists():
            target = path.with_name(f"{path.name}{suffix}.{n}")
            n += 1
        try:
            os.replace(path, target)
        except OSError as e:
            raise LandscapeError(f"cannot move {path} aside: {os_reason(e)}") from None
        return target

    def is_empty(self) -> bool:
        """No entries besides what a process killed before writing recipe.toml leaves (its lock file, a
        temporary file)."""
        return not self.path.is_dir() or all(p.name == LOCK_NAME or _TEMP.match(p.name) for p in self.path.iterdir())


class RunLock:
    """The exclusive lock of a process that trains into a run directory: ``flock`` on ``<run>/.lock``.

    A second process is refused with a one-line error naming the directory. The lock dies with its process
    (also on SIGKILL); a clean exit removes the lock file too. Analysis does not take it: it only adds files
    under analysis/.
    """

    def __init__(self, run_dir: RunDir) -> None:
        self.run_dir = run_dir
        self.path = run_dir.path / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> RunLock:
        if fcntl is None or self._fd is not None:
            return self
        where = self.run_dir.path
        for _ in range(10):
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as e:
                raise LandscapeError(f"cannot lock {where}: {os_reason(e)}") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
                os.close(fd)
                pid = f" (pid {holder})" if holder.isdigit() else ""
                raise LandscapeError(f"{where} is in use by another landscape process{pid}: two processes never "
                                     "train into one run directory; wait for it to finish") from None
            except OSError as e:
                os.close(fd)
                raise LandscapeError(f"cannot lock {where}: {os_reason(e)}") from None
            try:  # the file may have been removed by a holder that released it meanwhile: lock the new one
                st = os.stat(self.path)
                same = (st.st_ino, st.st_dev) == (os.fstat(fd).st_ino, os.fstat(fd).st_dev)
            except FileNotFoundError:
                same = False
            if same:
                with contextlib.suppress(OSError):  # the pid is only a hint for the message of others
                    os.ftruncate(fd, 0)
                    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
                self._fd = fd
                return self
            os.close(fd)
        raise LandscapeError(f"cannot lock {where}: its lock file keeps changing")

    def release(self) -> None:
        if self._fd is None:
            return
        with contextlib.suppress(OSError):  # while still held: a process that waits then locks a new file
            self.path.unlink(missing_ok=True)
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> None:
        self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


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

    ``.recipe`` (the resolved ``Recipe``), ``.metrics()`` (per-round rows of metrics.jsonl), ``.events()`` (its
    event rows, e.g. a divergence), ``.rounds()`` (checkpointed
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
        self.recipe = recipes.read_recipe(self.dir.recipe, algorithms=False)
        self._setup = None

    @property
    def path(self) -> Path:
        return self.dir.path

    def __repr__(self) -> str:
        return f"Run({str(self.path)!r}, rounds={self.rounds()})"

    def metrics(self) -> list[dict]:
        """One row per trained round (event rows are in ``events()``)."""
        return self.dir.read_metrics()

    def events(self) -> list[dict]:
        """What happened to the run besides rounds: ``{"round": t, "event": "diverged", ...}``."""
        return self.dir.read_events()

    def rounds(self) -> list[int]:
        return self.dir.rounds()

    def _data_setup(self):
        if self._setup is None:
            from landscape.setup import prepare_data

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
        from landscape.setup import build_module

        module = build_module(self.recipe, self._data_setup().bundle)
        ckpt = self.checkpoint(round)
        module = module.to(ckpt.dtype)
        ckpt.check_model(module.state_dict(), self.recipe.model.name)
        module.load_state_dict(ckpt.analysed_state)
        return module.eval()


def open_run(path: str | Path) -> Run:
    """Open a run directory for reading (see ``Run``)."""
    return Run(path)
