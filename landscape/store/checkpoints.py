"""Safe loading of what a run stored: its checkpoints (weights_only) and its partition.json, checked.

A checkpoint holds only tensors and plain containers; every failure to load one (missing, damaged, unsafe,
foreign, non-finite) is a one-line ``CheckpointError`` naming the file. ``Checkpoint`` is one loaded
``round-NNNN.pt``; ``read_recipe_text`` reads the recipe it records without loading its weights;
``load_client_models`` reads a ``round-NNNN.clients.pt``. ``read_partition`` and
``partition_problem`` check a partition.json (damaged, tampered with, or another run's).
"""

from __future__ import annotations

import io
import json
import pickle
import pickletools
import re
import struct
import warnings
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from landscape.core.errors import LandscapeError
from landscape.core.reading import open_regular, special_kind
from landscape.store.fileio import atomic_write, os_reason

CHECKPOINT_FORMAT = 1

def _os_error_in(error: BaseException) -> OSError | None:
    """The OSError an exception was raised while handling (its ``__context__`` chain), if any."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, OSError):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def save_checkpoint(path: Path, payload: dict) -> None:
    """``payload`` written atomically to ``path``. A failed write (a full disk) is ``atomic_write``'s one line
    naming the file: torch's zip writer, when a write fails, fails again while closing the archive (``unexpected
    pos ...``); the OSError underneath is the reason, not that second error."""

    def write(f: Any) -> None:
        try:
            torch.save(payload, f)
        except RuntimeError as e:
            cause = _os_error_in(e)
            if cause is None:
                raise
            raise cause from None

    atomic_write(path, write)


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
    kind = special_kind(path)  # a FIFO would block torch.load's open: refused before it
    if kind is not None and kind != "a directory":
        raise CheckpointError(f"cannot load checkpoint {path}: it is {kind}, not a regular file", path, "foreign",
                              kind)
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


class _RecordOnly(pickle.Unpickler):
    """Reads the plain record of a checkpoint's pickle (its dicts, strings and numbers) and nothing else: no
    global is ever imported or called (each becomes a function that gives None, a state_dict's OrderedDict a
    dict) and no tensor is read (its storage is None), so nothing in the file runs and no weight is loaded."""

    def find_class(self, module: str, name: str) -> Any:
        return dict if (module, name) == ("collections", "OrderedDict") else _nothing

    def persistent_load(self, pid: Any) -> None:
        return None


def _nothing(*args: Any, **kwargs: Any) -> None:
    return None


def read_recipe_text(path: Path) -> str | None:
    """The recipe text a checkpoint carries (``Checkpoint.recipe_text``; None when it carries none: a
    ``RunWriter``'s or an imported run's, or one of a version before checkpoints carried it), read without loading
    its weights: torch's zip format keeps the record (``data.pkl``) apart from the tensors, and the record is read
    by ``_RecordOnly`` (no code runs, no tensor is read), so its cost hardly grows with the model. A file in
    another format is loaded safely (``load_checkpoint``, no finite check). A file that cannot be read
    (damaged, unsafe, foreign, not a regular file) is a ``CheckpointError``."""
    path = Path(path)
    kind = special_kind(path)
    if kind is not None:  # a FIFO would block the open: refused before it
        raise CheckpointError(f"cannot load checkpoint {path}: it is {kind}, not a regular file", path, "foreign",
                              kind)
    data = _pickle_bytes(path, 1 << 24) if zipfile.is_zipfile(path) else None
    record = None
    if data:
        try:
            record = _RecordOnly(io.BytesIO(data)).load()
        except Exception:  # noqa: BLE001 - any stream the record reader cannot follow is loaded safely instead
            record = None
    if not (isinstance(record, dict) and record.get("format") == CHECKPOINT_FORMAT and "model" in record):
        record = load_checkpoint(path, finite=False)
    text = record.get("recipe")
    return text if isinstance(text, str) else None


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

    def check_round(self, round: int) -> None:
        """The round it records is ``round``, the one its file name (``round-NNNN.pt``) says: a checkpoint renamed,
        or copied over another round's, is refused in one line, never analysed or loaded under the name's round.
        A file that records no round (a plain state_dict) is not checked."""
        recorded = self.payload.get("round")
        if type(recorded) is int and recorded != round:
            raise LandscapeError(f"{self.path} holds round {recorded}, its name says round {round}: it is not that "
                                 "round's checkpoint (renamed, or copied over another round's); move it back or away")

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
                       dtype: torch.dtype | None = None,
                       num_clients: int | None = None) -> tuple[dict[int, dict], dict | None]:
    """A ``round-NNNN.clients.pt``'s client models {client: state_dict} and their ``start`` (run format 2; None
    before), checked against ``reference`` (and ``dtype``, the run's, when given), each client one of the run's
    ``num_clients``. A damaged, unsafe or foreign file is a one-line error naming it."""
    payload = load_checkpoint(path)
    start = payload.get("start")
    if start is not None:
        check_model_state(start, reference, model_name, f"{path} (start)", dtype)
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
    return out, start


def _partition_from_record(text: str, num_samples: int, num_clients: int | None) -> tuple[list[np.ndarray], str]:
    """(per-client index arrays, '') of partition.json's text, or ([], why it is not a partition of
    ``num_samples`` training samples into ``num_clients`` clients)."""
    try:
        record = json.loads(text)
    except (ValueError, RecursionError):
        return [], "is not JSON"
    clients = record.get("clients") if isinstance(record, dict) else None
    if not isinstance(clients, list) or not clients:
        return [], "holds no list of clients"
    if num_clients is not None and len(clients) != num_clients:
        return [], f"lists {len(clients)} clients, the run has {num_clients}"
    out = []  # a sample may be listed twice (dirichlet-client-reuse, as the reference codes draw, repeats samples)
    for i, client in enumerate(clients):
        indices = client.get("indices") if isinstance(client, dict) else None
        if not isinstance(indices, list) or not all(type(v) is int for v in indices):
            return [], f"client {i}'s indices are not a list of whole numbers"
        if any(not 0 <= v < num_samples for v in indices):
            bad = next(v for v in indices if not 0 <= v < num_samples)
            return [], f"client {i} has sample {bad}, outside the {num_samples} training samples"
        out.append(np.asarray(indices, dtype=np.int64))
    return out, ""


def _partition_text(path: Path) -> str:
    """partition.json's text, read through ``open_regular`` (a FIFO in its place: one line, never a hang)."""
    try:
        with open_regular(path, "a run's partition") as f:
            return f.read().decode("utf-8", errors="replace")
    except OSError as e:
        raise LandscapeError(f"cannot read {path}: {os_reason(e)}") from None


def read_partition(path: Path, num_samples: int, num_clients: int | None = None, *,
                   recorded: bool = False) -> list[np.ndarray]:
    """The per-client index arrays of a partition.json, checked (JSON, one list of whole numbers per client,
    every index one of the ``num_samples`` training samples; a sample may repeat); else a one-line error.
    ``recorded``: the partition is the run's record (partition ``recorded``), not drawn from its seed."""
    text = _partition_text(path)
    parts, problem = _partition_from_record(text, num_samples, num_clients)
    if problem and recorded:
        raise LandscapeError(f"{path} {problem}: the clients' split recorded with the run is damaged or is "
                             "another data set's")
    if problem:
        raise LandscapeError(f"{path} {problem}; it is not this run's partition (the recipe's seed makes it: "
                             "`landscape train --resume` writes it again)")
    return parts


def partition_problem(path: Path, client_indices: list[np.ndarray], num_samples: int) -> str | None:
    """Why the partition.json at ``path`` is not the partition the recipe makes (``client_indices``): damaged,
    tampered with or another run's; None when it is."""
    try:
        text = _partition_text(path)
    except LandscapeError as e:
        return f"cannot be read ({str(e).rpartition(': ')[2]})"
    parts, problem = _partition_from_record(text, num_samples, len(client_indices))
    if problem:
        return problem
    for i, (recorded, made) in enumerate(zip(parts, client_indices)):
        if not np.array_equal(recorded, np.asarray(made)):
            return f"gives client {i} other samples than the recipe's seeded partition"
    return None
