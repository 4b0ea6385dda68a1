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
import shlex
import stat
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
_TEMP = re.compile(r"^\.(recipe\.toml|partition\.json|metrics\.jsonl(\.damaged)?|\.landscape-run"
                   r"|round-\d{4,}(\.clients)?\.pt)\.[a-z0-9_]{8}\.tmp$")
LOCK_NAME = ".lock"
# The file that marks a folder as a run directory this tool made: only such a folder may be replaced
# (--overwrite). Written before recipe.toml, kept when the run is replaced.
RUN_MARKER = ".landscape-run"
# What a run directory holds (its files, folders and leftovers): a folder made before the marker existed may be
# replaced when it holds nothing else.
_RUN_FILES = {"recipe.toml", "partition.json", "metrics.jsonl", LOCK_NAME, RUN_MARKER}
_RUN_FOLDERS = {"checkpoints", "analysis", "figures"}
_SET_ASIDE = re.compile(r"^(metrics\.jsonl|partition\.json|round-\d{4,}(\.clients)?\.pt)\.damaged(\.\d+)?$")
_CHECKPOINT_FILE = re.compile(r"^round-\d{4,}(\.clients)?\.pt$")


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
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)  # files this tool writes are never opened through a symbolic link
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)  # a FIFO in place of a file does not hang the open


def _open_no_follow(path: str, flags: int) -> int:
    return os.open(path, flags | _NOFOLLOW, _FILE_MODE)


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
    (it would run code: refused by the weights_only loader), 'foreign' (loads, but is not a landscape
    checkpoint) or 'non-finite' (loads, but a tensor holds NaN or inf: the state of a diverged run). ``reason``
    is the short why, without the path."""

    def __init__(self, message: str, path: Path, kind: str, reason: str) -> None:
        super().__init__(message)
        self.path, self.kind, self.reason = Path(path), kind, reason


_CODE_OPS = {"GLOBAL", "STACK_GLOBAL", "INST", "OBJ", "REDUCE", "NEWOBJ", "NEWOBJ_EX", "BUILD"}


def _pickle_bytes(path: Path, limit: int) -> bytes | None:
    """The pickle stream of a file: the file itself, or the ``data.pkl`` of torch's zip format."""
    try:
        with open(path, "rb") as f:
            data = f.read(limit)
        if data.startswith(b"PK"):
            with zipfile.ZipFile(path) as archive:
                member = next((n for n in archive.namelist() if n.endswith("data.pkl")), None)
                if member is None:
                    return None
                with archive.open(member) as f:
                    return f.read(limit)
    except (OSError, zipfile.BadZipFile, ValueError, RuntimeError, EOFError):
        return None
    return data


def _pickled_code(path: Path, limit: int = 1 << 22) -> str | None:
    """The first import (``os.system``) or code-running opcode a pickle asks for, read without running
    anything; None when the file is no pickle (junk) or asks for none.

    Pickles of protocol 2+ (starting with PROTO) are read up to their first code; those of protocol 0 and 1
    (text opcodes, no header) count only when the whole stream parses, so that junk is never taken for code."""
    data = _pickle_bytes(path, limit)
    if not data:
        return None
    strings: list[str] = []
    found: str | None = None
    try:
        for op, arg, _ in pickletools.genops(data):
            if isinstance(arg, str):
                strings.append(arg)
            if found is None and op.name == "GLOBAL":
                found = str(arg).replace(" ", ".")
            elif found is None and op.name == "STACK_GLOBAL":
                found = ".".join(strings[-2:]) if len(strings) >= 2 else "a global"
            elif found is None and op.name in _CODE_OPS:
                found = op.name
            if found is not None and data.startswith(b"\x80"):
                return found
    except (ValueError, EOFError, IndexError, OverflowError, struct.error, UnicodeDecodeError):
        return None  # a damaged stream (or no pickle at all)
    return found


def _load_failure(path: Path, error: BaseException) -> tuple[str, str]:
    """(kind, short reason) of a torch.load failure; torch's messages run over many lines."""
    text = str(error).strip()
    if isinstance(error, pickle.UnpicklingError) and "Weights only load failed" in text:
        found = re.search(r"GLOBAL (\S+)", text)
        code = found.group(1) if found else _pickled_code(path)
        if code:
            return "unsafe", (f"it would run code ({code}), which a checkpoint never holds; refused by the "
                              "safe loader (weights_only), nothing in it was run")
        # torch's own reason, never its advice (to load with weights_only=False: the one thing not to do)
        reason = text.split("WeightsUnpickler error:", 1)[-1] if "WeightsUnpickler error:" in text else ""
        reason = next((line.strip() for line in reason.splitlines()
                       if line.strip() and "weights_only" not in line and not line.startswith("Check the")), "")
        return "damaged", f"not a tensor checkpoint, or corrupted: {reason or 'refused by the safe loader'}"
    if isinstance(error, EOFError):
        return "damaged", "truncated (the file ends early)"
    if isinstance(error, struct.error):  # a record's number runs past the end (a short or junk file)
        size = path.stat().st_size if path.is_file() else 0
        return "damaged", f"truncated or corrupted: it ends inside a record, after {size:,} byte{'s' * (size != 1)}"
    first = text.splitlines()[0] if text else type(error).__name__
    first = first.split(". ")[0].rstrip(".")  # torch adds sentences of advice after the reason
    if isinstance(error, OSError) and error.errno is not None and error.strerror:
        first = os_reason(error)
    return "damaged", f"truncated or corrupted: {first}"


def non_finite_tensor(named: Any) -> str | None:
    """The first floating-point tensor of the table ``named`` (in its order) that holds NaN or inf, described
    (``'fc1.weight': 1 NaN of 1,024 values``); None when every one is finite. Entries that are not tensors,
    and a ``named`` that is no table, are left to the checks of their kind."""
    if not isinstance(named, dict):
        return None
    for name, tensor in named.items():
        if isinstance(tensor, torch.Tensor) and (tensor.is_floating_point() or tensor.is_complex()):
            if bool(torch.isfinite(tensor.sum())):  # a NaN or inf reaches the sum (fast); overflow: look closer
                continue
            finite = torch.isfinite(tensor)
            if not bool(finite.all()):
                nan = int(torch.isnan(tensor).sum())
                inf = tensor.numel() - int(finite.sum()) - nan
                counts = " and ".join(f"{n:,} {what}" for n, what in ((nan, "NaN"), (inf, "inf")) if n)
                return f"'{name}': {counts} of {tensor.numel():,} values"
    return None


def _tensor_tables(payload: dict) -> list[tuple[str, Any]]:
    """(what, table of named tensors) of a checkpoint: its model, SWA average, server state, the clients'
    states, and a clients file's models."""
    tables = [("model tensor", payload.get("model")), ("SWA model tensor", payload.get("swa_model")),
              ("server state", payload.get("server_state"))]
    for key, what in (("client_states", "state"), ("clients", "model tensor")):
        per_client = payload.get(key)
        if isinstance(per_client, dict):
            tables += [(f"client {client}'s {what}", table) for client, table in per_client.items()]
    return tables


def check_finite_checkpoint(path: Path, payload: dict) -> None:
    """Every floating-point tensor of a checkpoint is finite, or a one-line ``CheckpointError`` (kind
    'non-finite') naming the file and the first tensor that is not. Training never saves such a state (a
    round whose model, statistics, server or client state is not finite stops the run: divergence)."""
    for what, table in _tensor_tables(payload):
        found = non_finite_tensor(table)
        if found is not None:
            reason = f"it holds non-finite values ({what} {found})"
            raise CheckpointError(f"{path} holds non-finite values ({what} {found}): the state of a diverged run, "
                                  "it has no loss landscape and no round continues from it; use an earlier "
                                  "checkpoint", Path(path), "non-finite", reason)


def non_finite_weights(path: Path, weights: dict[str, torch.Tensor], dtype: torch.dtype) -> CheckpointError | None:
    """The error for an analysed model whose trainable parameters ``weights`` (name: tensor as stored) are not
    all finite in the analysis ``dtype``: a NaN or inf stored in the file, or a value beyond the range of
    ``dtype`` (a float64 file analysed in float32); None when they are finite."""
    stored = non_finite_tensor(weights)
    if stored is not None:
        return CheckpointError(f"{path} holds non-finite weights ({stored}): a model with NaN or inf weights has "
                               "no loss landscape to analyse", Path(path), "non-finite",
                               f"it holds non-finite weights ({stored})")
    converted = non_finite_tensor({name: t.to(dtype) for name, t in weights.items() if t.is_floating_point()})
    if converted is None:
        return None
    name = str(dtype).removeprefix("torch.")
    return CheckpointError(f"{path} holds weights beyond the range of {name}, the analysis dtype ({converted} once "
                           "converted): analyse it in float64 (--dtype float64)", Path(path), "non-finite",
                           f"its weights overflow {name}")


def load_checkpoint(path: Path, map_location: str | torch.device = "cpu", *, finite: bool = True) -> dict:
    """Load a checkpoint safely (weights_only: tensors and plain containers, no code runs), and check that
    every floating-point tensor in it is finite (``check_finite_checkpoint``; ``finite=False``: not checked,
    for a reader of its recipe only).

    Every failure is a one-line ``CheckpointError`` naming the file."""
    obj = safe_load(path, map_location)
    if not isinstance(obj, dict) or obj.get("format") != CHECKPOINT_FORMAT or "model" not in obj:
        raise CheckpointError(f"{path} is not a landscape checkpoint", Path(path), "foreign",
                              "not a landscape checkpoint")
    if finite:
        check_finite_checkpoint(Path(path), obj)
    return obj


def load_state_dict_file(path: Path) -> dict[str, torch.Tensor]:
    """A plain ``torch.save(model.state_dict())`` file (or a dict holding one under ``state_dict`` or ``model``),
    loaded safely; a landscape checkpoint gives its analysed model (x_swa once it exists)."""
    obj = safe_load(path)
    if isinstance(obj, dict) and obj.get("format") == CHECKPOINT_FORMAT and "model" in obj:
        return obj.get("swa_model", obj["model"])
    for key in ("state_dict", "model"):
        if isinstance(obj, dict) and isinstance(obj.get(key), dict):
            obj = obj[key]
            break
    if not isinstance(obj, dict) or not obj or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                                       for k, v in obj.items()):
        raise CheckpointError(f"{path} holds no state_dict (a dict of named tensors)", Path(path), "foreign",
                              "no state_dict")
    return obj


def safe_load(path: Path, map_location: str | torch.device = "cpu") -> Any:
    """torch.load with weights_only (no code runs); every failure a one-line ``CheckpointError``."""
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
            IndexError, TypeError, UnicodeDecodeError, zipfile.BadZipFile,
            struct.error) as e:  # truncated, corrupted (a short or junk file: struct.error), unsafe
        kind, reason = _load_failure(path, e)
        raise CheckpointError(f"cannot load checkpoint {path}: {reason}", path, kind, reason) from None
    return obj


def check_model_state(state: Any, reference: dict[str, torch.Tensor], model_name: str, where: Path | str,
                      dtype: torch.dtype | None = None) -> None:
    """Every tensor of the reference model, with its shape, or a one-line error naming the first that is not
    (a checkpoint of another model, or of another width). With ``dtype`` (the run's train.dtype) every
    floating-point tensor must hold it: a float16 copy of a float32 run is not that run's model."""
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
        if dtype is not None and got.is_floating_point() and got.dtype != dtype:
            raise LandscapeError(f"{where} does not match the run: '{key}' holds {str(got.dtype)[6:]}, the run "
                                 f"trains in {str(dtype)[6:]} (train.dtype)")
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
    def load(cls, path: str | Path, map_location: str | torch.device = "cpu", *, finite: bool = True) -> Checkpoint:
        """``load_checkpoint``: safely, every tensor finite unless ``finite=False`` (for its recipe alone)."""
        return cls(Path(path), load_checkpoint(Path(path), map_location, finite=finite))

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

    def check_model(self, reference: dict[str, torch.Tensor], model_name: str, dtype: torch.dtype | None = None) -> None:
        """The saved model (and the SWA average) fit ``reference`` (a state_dict of the recipe's model), in
        ``dtype`` (the run's) when given."""
        check_model_state(self.model_state, reference, model_name, self.path, dtype)
        if self.has_swa:
            check_model_state(self.payload["swa_model"], reference, model_name, self.path, dtype)


def load_client_models(path: Path, reference: dict[str, torch.Tensor], model_name: str,
                       dtype: torch.dtype | None = None, num_clients: int | None = None) -> dict[int, dict]:
    """The clients' final local models of a ``round-NNNN.clients.pt`` file: {client: state_dict}, each checked
    against ``reference`` (and ``dtype``, the run's, when given), each client one of the run's ``num_clients``.
    A damaged, unsafe or foreign file is a one-line error naming it."""
    payload = load_checkpoint(path)
    clients = payload.get("clients")
    if not isinstance(clients, dict) or not clients:
        raise CheckpointError(f"{path} holds no client models", path, "foreign", "holds no client models")
    out = {}
    for key, state in clients.items():
        if not (isinstance(key, str) and key.isdigit()):
            raise CheckpointError(f"{path}: client key {key!r} is not a client number", path, "foreign",
                                  "bad client key")
        if num_clients is not None and int(key) >= num_clients:
            raise CheckpointError(f"{path} holds a model of client {int(key)}, which does not exist (the run has "
                                  f"{num_clients} clients)", path, "foreign", "a client that does not exist")
        check_model_state(state, reference, model_name, f"{path} (client {key})", dtype)
        out[int(key)] = state
    return out


def surface_result_name(directions: str) -> str:
    """The output name of a surface: ``surface`` for the random plane, ``surface-<directions>`` (pca, clients,
    interpolate) for the others, so they never overwrite one another. It is the file name (without suffix) in
    ``analysis/round-NNNN/`` at the default settings; ``analyze.results.result_name`` adds the settings off
    their defaults (``surface@grid-21``), and readers go by what each result records."""
    return "surface" if directions == "random" else f"surface-{directions}"


def _current_row(row: dict) -> dict:
    """A metrics row under today's names (``RunDir.read_metrics``)."""
    if "flatness_distance" not in row or "flatness_distance_to_global" in row:
        return row
    row = dict(row)
    row["flatness_distance_to_global"] = row.pop("flatness_distance")
    if "flatness_distance_normalized" in row:
        row["flatness_distance_to_global_normalized"] = row.pop("flatness_distance_normalized")
    return row


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

    @property
    def marker(self) -> Path:
        return self.path / RUN_MARKER

    def mark(self) -> None:
        """Mark the folder as a run directory this tool made (``--overwrite`` may replace it)."""
        if not self.marker.is_file() or self.marker.is_symlink():
            write_text(self.marker, "a run directory made by `landscape train`: --overwrite may replace it\n")

    def foreign_entries(self) -> list[str]:
        """What a run directory made before the marker existed holds besides a run's files and folders (its
        own or a user's files: --overwrite leaves such a folder alone). Empty for a marked run."""
        if self.marker.is_file() and not self.marker.is_symlink():
            return []
        foreign = []
        for entry in sorted(self.path.iterdir()):
            name = entry.name
            if entry.is_symlink():
                foreign.append(name)
            elif entry.is_dir() and name in _RUN_FOLDERS:
                if name == "checkpoints":
                    foreign += [f"checkpoints/{p.name}" for p in sorted(entry.iterdir())
                                if p.is_symlink() or not p.is_file() or not (
                                    _CHECKPOINT_FILE.match(p.name) or _SET_ASIDE.match(p.name) or _TEMP.match(p.name))]
            elif not (entry.is_file() and (name in _RUN_FILES or _SET_ASIDE.match(name) or _TEMP.match(name))):
                foreign.append(name)
        return foreign

    def holds_run_files(self) -> bool:
        """A recipe.toml and something a run writes after it (partition.json, metrics, checkpoints)."""
        return self.is_run() and any(p.exists() for p in (self.partition, self.metrics, self.checkpoints))

    # -- metrics.jsonl ----------------------------------------------------------------------------------
    def scan_metrics(self) -> tuple[list[dict], list[tuple[int, str]]]:
        """The intact rows of metrics.jsonl (round rows and event rows: JSON objects with an integer
        ``round``) and its damaged lines as (line number, text). A last line without its newline is what a
        killed process leaves: it is neither (a resume drops it and recomputes its round)."""
        if not self.metrics.is_file():
            return [], []
        try:
            text = self.metrics.read_bytes().decode("utf-8", errors="replace")
        except OSError as e:
            raise LandscapeError(f"cannot read {self.metrics}: {os_reason(e)}") from None
        lines = text.split("\n")
        rows: list[dict] = []
        damaged: list[tuple[int, str]] = []
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError:
                row = None
            if isinstance(row, dict) and isinstance(row.get("round"), int) and not isinstance(row["round"], bool):
                rows.append(row)
            elif number < len(lines):  # a whole line (the last one has no newline after it)
                damaged.append((number, line + "\n"))
        return rows, damaged

    def _read_rows(self) -> list[dict]:
        """Every intact row of metrics.jsonl (round rows and event rows); damaged lines are skipped."""
        return self.scan_metrics()[0]

    def read_metrics(self) -> list[dict]:
        """The per-round rows of metrics.jsonl (event rows such as a divergence are left out: see
        ``read_events``). A row written before the flatness distance was taken around the clients' mean
        (it has ``flatness_distance`` but no ``flatness_distance_to_global``) logged the distance to the new
        global model under that name: it is read under its own name, ``flatness_distance_to_global``."""
        return [_current_row(r) for r in self._read_rows() if "event" not in r]

    def read_events(self) -> list[dict]:
        """The event rows of metrics.jsonl: ``{"round": t, "event": "diverged", "algorithm": ..., ...}``."""
        return [r for r in self._read_rows() if "event" in r]

    def append_metrics(self, row: dict) -> None:
        try:  # never through a symbolic link (a resume writes the file anew first: a link is replaced)
            with open(self.metrics, "a", opener=_open_no_follow) as f:
                f.write(json.dumps(row, allow_nan=True) + "\n")
                f.flush()
                os.fsync(f.fileno())
        except OSError as e:
            if self.metrics.is_symlink():
                raise LandscapeError(f"cannot write {self.metrics}: it is a symbolic link; metrics.jsonl is a "
                                     "plain file this tool writes") from None
            raise LandscapeError(f"cannot write {self.metrics}: {os_reason(e)}") from None

    def append_event(self, event: str, round: int, **fields: Any) -> None:
        """An event row (NaN and inf written as strings, so that the line stays standard JSON)."""
        def plain(v: Any) -> Any:
            return str(v) if isinstance(v, float) and not math.isfinite(v) else v

        self.append_metrics({"round": round, "event": event, **{k: plain(v) for k, v in fields.items()}})

    def truncate_metrics(self, last_round: int, recomputed: list[dict] = ()) -> None:
        """Keep the rows of rounds <= ``last_round`` (rows after a resumed checkpoint are recomputed) and
        every event row (the run's history: a divergence stays on record), in their order; put the
        ``recomputed`` rows of rounds that had none in their place. Damaged lines are left out (see
        ``set_aside_lines``)."""
        rows = [r for r in self._read_rows() if "event" in r or r["round"] <= last_round]
        for new in sorted(recomputed, key=lambda r: r["round"]):
            at = next((i for i, r in enumerate(rows) if "event" not in r and r["round"] > new["round"]), len(rows))
            rows.insert(at, new)
        write_text(self.metrics, "".join(json.dumps(r, allow_nan=True) + "\n" for r in rows))

    def set_aside_lines(self, lines: list[tuple[int, str]]) -> Path:
        """Add damaged metrics lines to ``metrics.jsonl.damaged`` (never deleted); returns that file."""
        target = self.path / "metrics.jsonl.damaged"
        try:
            before = target.read_text(errors="replace") if target.is_file() and not target.is_symlink() else ""
        except OSError as e:
            raise LandscapeError(f"cannot read {target}: {os_reason(e)}") from None
        write_text(target, before + "".join(text for _, text in lines))
        return target

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
        return not self.path.is_dir() or all(p.name in (LOCK_NAME, RUN_MARKER) or _TEMP.match(p.name)
                                             for p in self.path.iterdir())


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
            try:  # never through a symbolic link: the lock file is written (the pid)
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | _NOFOLLOW | _NONBLOCK, 0o644)
            except OSError as e:
                if self.path.is_symlink():
                    raise LandscapeError(f"cannot lock {where}: {self.path.name} is a symbolic link; a lock file is "
                                         "a plain file this tool makes: remove the link") from None
                raise LandscapeError(f"cannot lock {where}: {os_reason(e)}") from None
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                os.close(fd)
                raise LandscapeError(f"cannot lock {where}: {self.path.name} is not a plain file; a lock file is a "
                                     "plain file this tool makes: remove it")
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


def _partition_from_record(text: str, num_samples: int, num_clients: int | None) -> tuple[list[np.ndarray], str]:
    """(per-client index arrays, '') of partition.json's text, or ([], why it is not a partition of
    ``num_samples`` training samples into ``num_clients`` clients)."""
    try:
        record = json.loads(text)
    except ValueError:
        return [], "is not JSON"
    clients = record.get("clients") if isinstance(record, dict) else None
    if not isinstance(clients, list) or not clients:
        return [], "holds no list of clients"
    if num_clients is not None and len(clients) != num_clients:
        return [], f"lists {len(clients)} clients, the run has {num_clients}"
    seen = np.zeros(num_samples, dtype=bool)
    out = []
    for i, client in enumerate(clients):
        indices = client.get("indices") if isinstance(client, dict) else None
        if not isinstance(indices, list) or not all(type(v) is int for v in indices):
            return [], f"client {i}'s indices are not a list of whole numbers"
        if any(not 0 <= v < num_samples for v in indices):
            bad = next(v for v in indices if not 0 <= v < num_samples)
            return [], f"client {i} has sample {bad}, outside the {num_samples} training samples"
        array = np.asarray(indices, dtype=np.int64)
        again = array[seen[array]] if array.size else array
        if again.size or np.unique(array).size != array.size:
            twice = int(again[0]) if again.size else int(next(v for v in array if (array == v).sum() > 1))
            return [], f"sample {twice} is listed twice (client {i})"
        seen[array] = True
        out.append(array)
    return out, ""


def read_partition(path: Path, num_samples: int, num_clients: int | None = None) -> list[np.ndarray]:
    """The per-client index arrays of a partition.json, checked (JSON, one list of whole numbers per client,
    every index one of the ``num_samples`` training samples, no sample twice); else a one-line error."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError as e:
        raise LandscapeError(f"cannot read {path}: {os_reason(e)}") from None
    parts, problem = _partition_from_record(text, num_samples, num_clients)
    if problem:
        raise LandscapeError(f"{path} {problem}; it is not this run's partition (the recipe's seed makes it: "
                             "`landscape train --resume` writes it again)")
    return parts


def partition_problem(path: Path, client_indices: list[np.ndarray], num_samples: int) -> str | None:
    """Why the partition.json at ``path`` is not the partition the recipe makes (``client_indices``): damaged,
    tampered with or another run's; None when it is."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError as e:
        return f"cannot be read ({os_reason(e)})"
    parts, problem = _partition_from_record(text, num_samples, len(client_indices))
    if problem:
        return problem
    for i, (recorded, made) in enumerate(zip(parts, client_indices)):
        if not np.array_equal(recorded, np.asarray(made)):
            return f"gives client {i} other samples than the recipe's seeded partition"
    return None


def partition_record(
    client_indices: list[np.ndarray], histogram: np.ndarray, settings: dict, heterogeneity: dict
) -> dict:
    return {
        "settings": settings,
        "num_clients": len(client_indices),
        "heterogeneity": heterogeneity,
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

    The recipe's ``imports`` (modules that run code when imported) are imported only with ``trust_imports=True``
    (or inside ``landscape.imports.trusted_imports()``); without, the recipe, metrics and events read as
    recorded, and building a model, data set or partition that only those modules provide is refused in one
    line naming them.
    """

    def __init__(self, path: str | Path, trust_imports: bool = False) -> None:
        from landscape import recipe as recipes

        if not isinstance(path, (str, os.PathLike)):
            raise LandscapeError(f"open_run takes the path of a run directory, not {path!r:.80}")
        if not isinstance(trust_imports, bool):
            raise LandscapeError(f"open_run: trust_imports must be True or False, got {trust_imports!r}")
        self.dir = RunDir(path)
        if not self.dir.path.exists():
            raise LandscapeError(f"open_run: {self.dir.path} does not exist")
        if not self.dir.path.is_dir():
            raise LandscapeError(f"open_run: {self.dir.path} is not a directory (give a run directory)")
        if not self.dir.is_run():
            raise LandscapeError(f"{self.dir.path} is not a run directory (no recipe.toml)")
        self.recipe = recipes.read_recipe(self.dir.recipe, algorithms=False, trust_imports=trust_imports or None,
                                          defer=True)
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
        from landscape.setup import build_module, torch_dtype

        self.recipe.require_entries()  # a model only its untrusted imports provide: refused in one line
        module = build_module(self.recipe, self._data_setup().bundle)
        ckpt = self.checkpoint(round)
        module = module.to(ckpt.dtype)
        ckpt.check_model(module.state_dict(), self.recipe.model.name, torch_dtype(self.recipe.train.dtype))
        module.load_state_dict(ckpt.analysed_state)
        return module.eval()


def open_run(path: str | Path, trust_imports: bool = False) -> Run:
    """Open a run directory for reading (see ``Run``); ``trust_imports=True`` imports the modules its recipe's
    ``imports`` name (their code runs)."""
    return Run(path, trust_imports=trust_imports)
