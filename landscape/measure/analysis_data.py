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
from landscape.core.reading import check_data, describe, first_line, read_data, tensor_shape

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


def _check_classes(name: str, outputs: Tensor, y: Tensor, n: int) -> None:
    """Targets for the cross-entropy: class indices [n] in 0..C-1, or class probabilities of the outputs'
    shape."""
    if outputs.dim() != 2:
        raise LandscapeError(f"{name}: the cross-entropy takes model outputs [batch, classes]; the model "
                             f"returns {tensor_shape(outputs)} (give loss= for other outputs)")
    classes = outputs.shape[1]
    regression = "for regression targets use loss='mse' (function API)"
    if y.is_floating_point():
        if tuple(y.shape[1:]) != tuple(outputs.shape[1:]):
            raise LandscapeError(f"{name}: the targets are {str(y.dtype).replace('torch.', '')} of shape "
                                 f"{tensor_shape(y)}; the cross-entropy takes class indices (integers: y.long()) "
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
        raise LandscapeError(f"{name}: the targets have shape {tensor_shape(y)}; the cross-entropy takes class "
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
                             f"{tensor_shape(xb)} {dtype}): {first_line(e)}") from None
    batch = stop - start
    if not isinstance(outputs, Tensor) or not outputs.is_floating_point():
        what = f"{outputs.dtype} outputs" if isinstance(outputs, Tensor) else describe(outputs)
        raise LandscapeError(f"{name}: the model returns {what}; the analysis needs a floating-point tensor "
                             "of outputs [batch, ...]")
    if outputs.dim() == 0 or outputs.shape[0] != batch:
        raise LandscapeError(f"{name}: the model returns outputs of shape {tensor_shape(outputs)} for a batch of "
                             f"{batch}; their first axis must be the batch")
    if loss_fn is None:
        _check_classes(name, outputs, data.y, len(data))
    elif loss_fn is F.mse_loss and (not yb.is_floating_point() or yb.shape != outputs.shape):
        hint = (f" (class indices: use the cross-entropy, or one-hot them, F.one_hot(y, {outputs.shape[1]}))"
                if not yb.is_floating_point() and outputs.dim() == 2 else "")
        raise LandscapeError(f"loss 'mse' needs float targets shaped like the outputs {tensor_shape(outputs)}; "
                             f"{name} has {yb.dtype} targets of shape {tensor_shape(yb)} per batch{hint}")
    try:
        with torch.no_grad():
            value = F.cross_entropy(outputs, yb) if loss_fn is None else loss_fn(outputs, yb)
    except Exception as e:  # noqa: BLE001 - the user's loss failed: one line naming it
        raise LandscapeError(f"loss failed on the first batch: {first_line(e)}") from None
    if not isinstance(value, Tensor):
        raise LandscapeError(f"loss returned {describe(value)}, not a tensor: it must return the batch's "
                             "mean loss (a 0-d tensor)")
    if value.dim() != 0 or not value.is_floating_point():
        raise LandscapeError(f"loss returned a tensor of shape {tensor_shape(value)} ({value.dtype}) on a batch of "
                             f"{batch}: it must return the batch's mean loss, a 0-d floating tensor (reduce "
                             "it: .mean())")


def as_data(data: Any, batch_size: int | None = None, *, name: str = "data") -> AnalysisData:
    """The data as a fixed set in fixed batches, checked where it enters (``check_data``): ``AnalysisData``,
    an ``(inputs, targets)`` pair of tensors, a map-style ``Dataset`` (items ``(input, target)``, read in
    index order) or a ``DataLoader`` (read once in index order, whatever its shuffling: ``landscape.core.reading``;
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
        size = size or data.batch_size
    x, y = read_data(data, name)
    return AnalysisData(x, y, size or 512, name=name)
