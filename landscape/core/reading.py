"""Data given as tensors, a Dataset or a DataLoader, read into one (inputs, targets) pair of tensors
(``read_data``) and checked where it enters (``check_data``), each problem one line naming the data.

The analysis (``landscape.measure.analysis_data.as_data``) and the data sets made by a user's factory
(``landscape.data.factories``) read data this one way.

Files a run holds are read one way too: every reader of one (a result's JSON and NPZ, a checkpoint's hash,
metrics.jsonl, partition.json) opens it through ``open_regular`` (a directory, FIFO, socket or device where a
file belongs is one line naming it, never a hang: the open does not block and the file is checked to be a
regular one before a byte is read), and a JSON file through ``read_json`` (also one line for text that is not
JSON or is nested too deep to read).
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any, BinaryIO

import torch
from torch import Tensor

from landscape.core.errors import LandscapeError, shown

_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a plain file")


def special_kind(path: str | Path) -> str | None:
    """What ``path`` is where it is something other than a regular file (``'a directory'``, ``'a FIFO (named
    pipe)'``, ...; links followed); None for a regular file, or where nothing is."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    return None if stat.S_ISREG(mode) else _kind(mode)


def open_regular(path: str | Path, what: str) -> BinaryIO:
    """``path`` opened for reading in binary, once it is known to be a regular file: the open never blocks (a
    FIFO), and anything but a regular file, a missing file and an unreadable one are a one-line LandscapeError
    naming it (``what``: what the file should be, 'an analysis result')."""
    try:
        fd = os.open(path, os.O_RDONLY | _NONBLOCK)
    except FileNotFoundError:
        raise LandscapeError(f"{path} not found ({what})") from None
    except OSError as e:
        kind = special_kind(path)
        reason = f"it is {kind}, not a regular file" if kind else (e.strerror or type(e).__name__)
        raise LandscapeError(f"cannot read {path} ({what}): {reason}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise LandscapeError(f"cannot read {path} ({what}): it is {_kind(mode)}, not a regular file")
    if _NONBLOCK:
        os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def read_json(path: str | Path, what: str) -> Any:
    """The JSON value of the file ``path`` (read through ``open_regular``); a file that is not UTF-8 JSON, or
    is nested too deep to read (a hostile file of 200,000 brackets), is one line naming it."""
    try:
        with open_regular(path, what) as f:
            data = f.read()
    except OSError as e:
        raise LandscapeError(f"cannot read {path} ({what}): {e.strerror or type(e).__name__}") from None
    try:
        return json.loads(data.decode("utf-8"))
    except RecursionError:
        raise LandscapeError(f"{path} is not {what}: its JSON is nested too deep to read") from None
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError alike
        raise LandscapeError(f"{path} is not {what}: not JSON ({first_line(e)[:200]})") from None


def first_line(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0]}" if text else type(error).__name__


def tensor_shape(t: Tensor) -> str:
    return f"[{', '.join(map(str, t.shape))}]"


def describe(value: Any) -> str:
    """What an item or a batch is, for a message: ``a dict (keys 'x', 'y')``, ``a tuple of 3``, ``a str``."""
    if isinstance(value, dict):
        keys = ", ".join(shown(repr(k), 40) for k in list(value)[:5])
        return f"a dict (keys {keys}{', ...' if len(value) > 5 else ''})"
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)}"
    return f"a {type(value).__name__}"


def _pair(value: Any, where: str, name: str) -> tuple[Tensor, Tensor]:
    """(input, target) of one Dataset item or DataLoader batch, as tensors."""
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise LandscapeError(f"{name}: {where} is {describe(value)}, not an (input, target) pair")
    try:
        return torch.as_tensor(value[0]), torch.as_tensor(value[1])
    except (TypeError, ValueError, RuntimeError):
        raise LandscapeError(f"{name}: {where} holds {describe(value[0])} and {describe(value[1])}, "
                             "which are not tensors (or numbers, arrays)") from None


def _joined(parts: list[Tensor], what: str, name: str) -> Tensor:
    try:
        return torch.stack(parts) if what == "items" else torch.cat(parts)
    except (RuntimeError, TypeError, IndexError) as e:
        raise LandscapeError(f"{name}: the {what} cannot be joined into one tensor of inputs and one of "
                             f"targets ({first_line(e)})") from None


def _read_items(dataset: torch.utils.data.Dataset, name: str) -> tuple[Tensor, Tensor]:
    if isinstance(dataset, torch.utils.data.IterableDataset):
        raise LandscapeError(f"{name} is an IterableDataset: give it in a DataLoader (read once, in its "
                             "order)")
    try:
        n = len(dataset)  # type: ignore[arg-type]
    except TypeError:
        raise LandscapeError(f"{name}: a Dataset for analysis must have a length and items (input, "
                             "target)") from None
    if n == 0:
        raise LandscapeError(f"{name} is empty (0 samples)")
    xs, ys = [], []
    for i in range(n):
        try:
            item = dataset[i]
        except Exception as e:  # noqa: BLE001 - the user's Dataset failed: one line naming it
            raise LandscapeError(f"{name}: reading item {i} of the Dataset failed: "
                                 f"{first_line(e)}") from None
        x, y = _pair(item, f"item {i} of the Dataset", name)
        xs.append(x)
        ys.append(y)
    return _joined(xs, "items", name), _joined(ys, "items", name)


def _sampled_indices(loader: torch.utils.data.DataLoader) -> list:
    """The dataset indices one pass of ``loader`` reads, sorted: its sampler's (all of them: ``drop_last``
    is not applied), or its own batch sampler's when it has one."""
    batches = loader.batch_sampler
    custom = batches is not None and type(batches) is not torch.utils.data.BatchSampler
    indices = [i for batch in batches for i in batch] if custom else list(loader.sampler)
    try:
        return sorted(indices)
    except TypeError:  # keys that do not sort: their order as drawn
        return indices


def _read_loader(loader: torch.utils.data.DataLoader, name: str) -> tuple[Tensor, Tensor]:
    """A DataLoader's samples in index order: the indices its sampler yields, sorted, read from its dataset
    in batches of its batch size through its ``collate_fn``, in this process. A sampler that draws another
    set of samples on each pass (with replacement, a random subset of a size) is refused. An IterableDataset
    has no indices: it is read in its own order. Torch's global random state is left as it was."""
    with torch.random.fork_rng(devices=[]):  # samplers and loaders draw from torch's global generator
        return _read_ordered(loader, name)


def _read_ordered(loader: torch.utils.data.DataLoader, name: str) -> tuple[Tensor, Tensor]:
    dataset = loader.dataset
    if isinstance(dataset, torch.utils.data.IterableDataset):
        ordered = loader
    else:
        first, second = _sampled_indices(loader), _sampled_indices(loader)
        if first != second:
            raise LandscapeError(f"{name}: the DataLoader's sampler ({type(loader.sampler).__name__}) draws "
                                 "other samples each time; give the Dataset, or a loader whose sampler "
                                 "yields a fixed set of samples (a shuffled one is read in index order)")
        subset = torch.utils.data.Subset(dataset, first)
        if loader.batch_sampler is None:  # no automatic batching: every item is a batch
            ordered = torch.utils.data.DataLoader(subset, batch_size=None, collate_fn=loader.collate_fn)
        else:
            ordered = torch.utils.data.DataLoader(subset, batch_size=loader.batch_size or 1,
                                                  collate_fn=loader.collate_fn)
    xs, ys = [], []
    try:
        for i, batch in enumerate(ordered):
            x, y = _pair(batch, f"batch {i} of the DataLoader", name)
            xs.append(x)
            ys.append(y)
    except LandscapeError:
        raise
    except Exception as e:  # noqa: BLE001 - the user's Dataset or collate_fn failed: one line naming it
        raise LandscapeError(f"{name}: reading the DataLoader failed: {first_line(e)}") from None
    if not xs:
        raise LandscapeError(f"{name} is empty (0 samples)")
    return _joined(xs, "batches", name), _joined(ys, "batches", name)


def _non_finite(t: Tensor) -> tuple[int, int]:
    """(count of NaN / inf values, the first sample holding one), read in chunks of about 16M values."""
    rows = max(1, (1 << 24) // max(1, t[0].numel()))
    count, first = 0, -1
    for start in range(0, t.shape[0], rows):
        bad = ~torch.isfinite(t[start:start + rows]).reshape(min(rows, t.shape[0] - start), -1)
        found = int(bad.sum())
        if found and first < 0:
            first = start + int(bad.any(dim=1).nonzero()[0, 0])
        count += found
    return count, first


def check_data(x: Tensor, y: Tensor, name: str) -> tuple[Tensor, Tensor]:
    """The checks of data where it enters, whatever the model and the loss: a first axis of samples of the
    same length (> 0) in inputs and targets, floating-point inputs, targets that are integers (returned as
    int64 class indices) or floating point, and no NaN or inf in either. One LandscapeError starting with
    ``name`` otherwise."""
    if x.dim() == 0 or y.dim() == 0:
        raise LandscapeError(f"{name}: inputs and targets need a first axis of samples (shapes "
                             f"{tensor_shape(x)} and {tensor_shape(y)})")
    if x.is_meta or y.is_meta:
        raise LandscapeError(f"{name}: the {'inputs' if x.is_meta else 'targets'} are on device 'meta', which "
                             "holds no data (it is for shapes only): give tensors on cpu or cuda")
    if x.shape[0] != y.shape[0]:
        raise LandscapeError(f"{name}: inputs and targets must hold the same number of samples "
                             f"({x.shape[0]} inputs, {y.shape[0]} targets)")
    if x.shape[0] == 0:
        raise LandscapeError(f"{name} is empty (0 samples)")
    if not x.is_floating_point():
        raise LandscapeError(f"{name}: the inputs are {x.dtype}; give floating-point inputs (x.float(), "
                             "images scaled as the model was trained)")
    if y.dtype == torch.bool or y.is_complex():
        raise LandscapeError(f"{name}: the targets are {y.dtype}; give class indices (integers) or float "
                             "targets")
    if not y.is_floating_point():
        y = y.long()  # integer class indices of any width, as the int64 the cross-entropy takes
    for what, t in (("inputs", x), ("targets", y)):
        count, first = _non_finite(t) if t.is_floating_point() else (0, -1)
        if count:
            raise LandscapeError(f"{name}: the {what} hold {count:,} non-finite "
                                 f"value{'s' if count > 1 else ''} (NaN or inf), the first in sample {first}")
    return x, y


def read_data(data: Any, name: str) -> tuple[Tensor, Tensor]:
    """(inputs, targets) of ``data``: an ``(inputs, targets)`` pair of tensors, a map-style ``Dataset`` (items
    ``(input, target)``, read in index order) or a ``DataLoader`` (read once in index order, whatever its
    shuffling: ``_read_loader``), checked (``check_data``); ``name`` starts every message about it."""
    if isinstance(data, torch.utils.data.DataLoader):
        x, y = _read_loader(data, name)
    elif isinstance(data, (tuple, list)) and len(data) == 2 and all(isinstance(t, Tensor) for t in data):
        x, y = data
    elif isinstance(data, torch.utils.data.Dataset):
        x, y = _read_items(data, name)
    else:
        raise LandscapeError(f"{name} must be (inputs, targets) tensors, a Dataset or a DataLoader, not "
                             f"{type(data).__name__}")
    return check_data(x, y, name)
