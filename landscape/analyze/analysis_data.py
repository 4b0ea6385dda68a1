"""The data an analysis runs on (``AnalysisData``: a fixed set in fixed batches, resident or streamed), read
from tensors, a Dataset or a DataLoader (``as_data``) and checked where it enters (``check_data``) and where it
meets the model's first forward pass (``check_model_data``), each problem one line naming the data."""

from __future__ import annotations

import numbers
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from landscape.core.errors import LandscapeError, shown
from landscape.core.flat import FlatModel

# Analysis sets up to this size live on the GPU; larger ones stay in pinned host memory and stream to it one
# batch at a time (``AnalysisData.place``), so an HVP over them holds one batch on the device.
RESIDENT_BYTES = 2 << 30


@dataclass(frozen=True)
class AnalysisData:
    """A fixed data set in fixed batches (order and batch boundaries never change, so F is deterministic).

    ``device`` / ``dtype``: where and in which dtype batches are delivered when ``x`` and ``y`` live
    elsewhere (a large set kept in host memory and streamed); None: batches are slices of ``x`` and ``y``.
    ``name``: what the data was given as (``data``, ``data factory 'pkg.mod:make'``), the start of every
    message about it.
    """

    x: Tensor
    y: Tensor
    batch_size: int = 512
    device: torch.device | None = None
    dtype: torch.dtype | None = None
    name: str = field(default="the analysis data", compare=False)

    def __post_init__(self) -> None:
        size = self.batch_size
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise LandscapeError(f"batch_size must be a whole number >= 1 (got {size!r})")

    def __len__(self) -> int:
        return int(self.y.shape[0])

    @property
    def streamed(self) -> bool:
        return self.device is not None

    def batch_ranges(self) -> list[tuple[int, int]]:
        """[start, stop) of every batch, in order (the last one shorter)."""
        return [(start, min(start + self.batch_size, len(self))) for start in range(0, len(self), self.batch_size)]

    def batch(self, start: int, stop: int) -> tuple[Tensor, Tensor]:
        return self._deliver(self.x[start:stop], self.y[start:stop])

    def batches(self) -> Iterator[tuple[Tensor, Tensor]]:
        for start, stop in self.batch_ranges():
            yield self.batch(start, stop)

    def take(self, index: Tensor) -> tuple[Tensor, Tensor]:
        """The samples at ``index``, in that order, as one batch on the delivery device."""
        index = index.to(self.x.device)
        return self._deliver(self.x[index], self.y[index])

    def _deliver(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        if self.device is None:
            return x, y
        return x.to(self.device, self.dtype, non_blocking=True), y.to(self.device, non_blocking=True)

    def subset(self, indices: Tensor) -> AnalysisData:
        index = torch.as_tensor(indices, dtype=torch.long, device=self.x.device)
        return AnalysisData(self.x[index], self.y[index], self.batch_size, self.device, self.dtype, self.name)

    def to(self, device: torch.device | str, dtype: torch.dtype | None = None) -> AnalysisData:
        """All of it moved to ``device`` (resident)."""
        return AnalysisData(self.x.to(device, dtype), self.y.to(device), self.batch_size, name=self.name)

    def stream_to(self, device: torch.device | str, dtype: torch.dtype | None = None) -> AnalysisData:
        """Kept in host memory (pinned, for asynchronous copies, when ``device`` is a GPU); batches are
        copied to ``device`` as they are used."""
        device = torch.device(device)
        x, y = self.x.cpu(), self.y.cpu()
        if device.type == "cuda":
            x, y = x.pin_memory(), y.pin_memory()
        return AnalysisData(x, y, self.batch_size, device, dtype, self.name)

    def place(self, device: torch.device | str, dtype: torch.dtype | None = None,
              resident_bytes: int = RESIDENT_BYTES) -> AnalysisData:
        """Resident on ``device`` when it is the CPU or the set is at most ``resident_bytes``; else streamed."""
        device = torch.device(device)
        size = self.x.numel() * (dtype or self.x.dtype).itemsize + self.y.numel() * self.y.element_size()
        if device.type == "cpu" or size <= resident_bytes:
            return self.to(device, dtype)
        return self.stream_to(device, dtype)


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0]}" if text else type(error).__name__


def _shape(t: Tensor) -> str:
    return f"[{', '.join(map(str, t.shape))}]"


def _describe(value: Any) -> str:
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
        raise LandscapeError(f"{name}: {where} is {_describe(value)}, not an (input, target) pair")
    try:
        return torch.as_tensor(value[0]), torch.as_tensor(value[1])
    except (TypeError, ValueError, RuntimeError):
        raise LandscapeError(f"{name}: {where} holds {_describe(value[0])} and {_describe(value[1])}, "
                             "which are not tensors (or numbers, arrays)") from None


def _joined(parts: list[Tensor], what: str, name: str) -> Tensor:
    try:
        return torch.stack(parts) if what == "items" else torch.cat(parts)
    except (RuntimeError, TypeError, IndexError) as e:
        raise LandscapeError(f"{name}: the {what} cannot be joined into one tensor of inputs and one of "
                             f"targets ({_first_line(e)})") from None


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
                                 f"{_first_line(e)}") from None
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
        raise LandscapeError(f"{name}: reading the DataLoader failed: {_first_line(e)}") from None
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
                             f"{_shape(x)} and {_shape(y)})")
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


def _check_classes(name: str, outputs: Tensor, y: Tensor, n: int) -> None:
    """Targets for the cross-entropy: class indices [n] in 0..C-1, or class probabilities of the outputs'
    shape."""
    if outputs.dim() != 2:
        raise LandscapeError(f"{name}: the cross-entropy takes model outputs [batch, classes]; the model "
                             f"returns {_shape(outputs)} (give loss= for other outputs)")
    classes = outputs.shape[1]
    regression = "for regression targets use loss='mse' (function API)"
    if y.is_floating_point():
        if tuple(y.shape[1:]) != tuple(outputs.shape[1:]):
            raise LandscapeError(f"{name}: the targets are {str(y.dtype).replace('torch.', '')} of shape "
                                 f"{_shape(y)}; the cross-entropy takes class indices (integers: y.long()) "
                                 f"or class probabilities of the outputs' shape [{n}, {classes}]; "
                                 f"{regression}")
        sums = y.double().sum(dim=1)
        if bool((y < 0).any()) or not bool(torch.allclose(sums, torch.ones_like(sums), rtol=0, atol=1e-3)):
            raise LandscapeError(f"{name}: float targets of the outputs' shape are taken as class "
                                 f"probabilities, but a row is negative or does not sum to 1; {regression}")
        return
    if y.dtype != torch.long:
        raise LandscapeError(f"{name}: the targets are {y.dtype}; the cross-entropy takes class indices of "
                             "dtype torch.int64 (y.long())")
    if y.dim() != 1:
        raise LandscapeError(f"{name}: the targets have shape {_shape(y)}; the cross-entropy takes class "
                             f"indices of shape [{n}] (y.view(-1))")
    low, high = int(y.min()), int(y.max())
    if low < 0 or high >= classes:
        raise LandscapeError(f"{name}: class {low if low < 0 else high} is outside 0..{classes - 1} (the "
                             f"model has {classes} outputs)")


def check_model_data(flat: FlatModel, buffers: dict[str, Tensor], data: AnalysisData, loss_fn: Callable[[Tensor, Tensor], Tensor] | None
                     ) -> None:
    """Where the model and the data meet: the first batch through the model (eval mode, no gradient, at the
    module's own weights) and the loss on it. The model must return a floating-point tensor whose first
    axis is the batch; for the cross-entropy (``loss_fn`` None) outputs [batch, C] and targets that are
    class indices [n] in 0..C-1 (every target is checked) or class probabilities of the outputs' shape
    (rows >= 0 summing to 1); for ``mse``, float targets of the outputs' shape (no broadcasting); a loss
    callable must return a 0-d floating tensor. One LandscapeError naming the data (``data.name``) or the
    loss otherwise."""
    name = data.name
    start, stop = data.batch_ranges()[0]
    xb, yb = data.batch(start, stop)
    w = flat.vector()
    xb = xb.to(w.device, w.dtype) if xb.is_floating_point() else xb.to(w.device)
    yb = yb.to(w.device)
    try:
        with flat.mode(False), torch.no_grad():
            outputs = flat.logits(w, xb, buffers)
    except LandscapeError:
        raise
    except Exception as e:  # noqa: BLE001 - the user's model failed on the data: one line naming both
        dtype = str(xb.dtype).replace("torch.", "")
        raise LandscapeError(f"{name}: the model's forward pass fails on its first batch (inputs "
                             f"{_shape(xb)} {dtype}): {_first_line(e)}") from None
    batch = stop - start
    if not isinstance(outputs, Tensor) or not outputs.is_floating_point():
        what = f"{outputs.dtype} outputs" if isinstance(outputs, Tensor) else _describe(outputs)
        raise LandscapeError(f"{name}: the model returns {what}; the analysis needs a floating-point tensor "
                             "of outputs [batch, ...]")
    if outputs.dim() == 0 or outputs.shape[0] != batch:
        raise LandscapeError(f"{name}: the model returns outputs of shape {_shape(outputs)} for a batch of "
                             f"{batch}; their first axis must be the batch")
    if loss_fn is None:
        _check_classes(name, outputs, data.y, len(data))
    elif loss_fn is F.mse_loss and (not yb.is_floating_point() or yb.shape != outputs.shape):
        hint = (f" (class indices: use the cross-entropy, or one-hot them, F.one_hot(y, {outputs.shape[1]}))"
                if not yb.is_floating_point() and outputs.dim() == 2 else "")
        raise LandscapeError(f"loss 'mse' needs float targets shaped like the outputs {_shape(outputs)}; "
                             f"{name} has {yb.dtype} targets of shape {_shape(yb)} per batch{hint}")
    try:
        with torch.no_grad():
            value = F.cross_entropy(outputs, yb) if loss_fn is None else loss_fn(outputs, yb)
    except Exception as e:  # noqa: BLE001 - the user's loss failed: one line naming it
        raise LandscapeError(f"loss failed on the first batch: {_first_line(e)}") from None
    if not isinstance(value, Tensor):
        raise LandscapeError(f"loss returned {_describe(value)}, not a tensor: it must return the batch's "
                             "mean loss (a 0-d tensor)")
    if value.dim() != 0 or not value.is_floating_point():
        raise LandscapeError(f"loss returned a tensor of shape {_shape(value)} ({value.dtype}) on a batch of "
                             f"{batch}: it must return the batch's mean loss, a 0-d floating tensor (reduce "
                             "it: .mean())")


def as_data(data: Any, batch_size: int | None = None, *, name: str = "data") -> AnalysisData:
    """The data as a fixed set in fixed batches, checked where it enters (``check_data``): ``AnalysisData``,
    an ``(inputs, targets)`` pair of tensors, a map-style ``Dataset`` (items ``(input, target)``, read in
    index order) or a ``DataLoader`` (read once in index order, whatever its shuffling: ``_read_loader``;
    its batch size is kept unless ``batch_size`` is given). Default batch size 512. ``name`` starts every
    message about it."""
    whole = isinstance(batch_size, numbers.Integral) and not isinstance(batch_size, bool)
    if batch_size is not None and not (whole and batch_size >= 1):
        raise LandscapeError(f"batch_size must be a whole number >= 1 (got {shown(repr(batch_size))})")
    size = None if batch_size is None else int(batch_size)
    if isinstance(data, AnalysisData):
        x, y = check_data(data.x, data.y, name)
        return AnalysisData(x, y, size or data.batch_size, data.device, data.dtype, name)
    if isinstance(data, torch.utils.data.DataLoader):
        x, y = _read_loader(data, name)
        size = size or data.batch_size
    elif isinstance(data, (tuple, list)) and len(data) == 2 and all(isinstance(t, Tensor) for t in data):
        x, y = data
    elif isinstance(data, torch.utils.data.Dataset):
        x, y = _read_items(data, name)
    else:
        raise LandscapeError(f"{name} must be (inputs, targets) tensors, a Dataset or a DataLoader, not "
                             f"{type(data).__name__}")
    x, y = check_data(x, y, name)
    return AnalysisData(x, y, size or 512, name=name)
