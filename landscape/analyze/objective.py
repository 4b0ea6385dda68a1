"""The analysis objective F(w): the mean loss of a model over a declared data set (cross-entropy unless a
loss function is given, e.g. mean squared error for a regression model).

Everything ``landscape analyze`` measures is a function of F (or of a client's F_i) at a point w, the flat
parameter vector of a checkpoint. ``Objective`` evaluates F, its gradient and minibatch versions of both,
with batches weighted by their size and with no weight-decay term. The model is used through
``torch.func.functional_call`` (``landscape.flat.FlatModel``), so its parameters, ``requires_grad`` flags
and ``.grad`` fields are never touched; its training flag is set per evaluation and restored afterwards.
w holds the trainable parameters only (``requires_grad=True``); frozen parameters are constants of F at the
values in ``buffers`` (with the BatchNorm buffers), so F, its gradient and its Hessian are functions of the
trainable parameters alone.

BatchNorm modes (docs/metrics.md): ``eval`` (running statistics of the checkpoint), ``train-batch-stats`` (each
batch normalised by its own statistics; the running statistics are not changed) and ``recompute`` (running
statistics recomputed over the analysis data, then eval mode). Models without BatchNorm ignore the mode.
"""

from __future__ import annotations

import contextlib
import numbers
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from landscape.errors import LandscapeError, shown
from landscape.flat import FlatModel

BN_MODES = ("eval", "train-batch-stats", "recompute")

# A loss function: (model outputs of a batch, its targets) -> the mean loss over the batch (a 0-d tensor).
LossFn = Callable[[Tensor, Tensor], Tensor]
LOSSES: dict[str, LossFn] = {"cross-entropy": F.cross_entropy, "mse": F.mse_loss}


def loss_function(loss: str | LossFn | None) -> LossFn | None:
    """None for the default cross-entropy (its own fused sums), else the callable (named: cross-entropy, mse)."""
    if loss is None or loss == "cross-entropy" or loss is F.cross_entropy:
        return None
    if isinstance(loss, str):
        if loss not in LOSSES:
            raise LandscapeError(f"unknown loss '{loss}'; give one of {', '.join(LOSSES)} or a callable "
                                 "(outputs, targets) -> mean loss")
        return LOSSES[loss]
    if not callable(loss):
        raise LandscapeError(f"loss must be a name or a callable (outputs, targets) -> mean loss, not {loss!r}")
    return loss


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


class Objective:
    """F(w) = (1/n) sum_j l(model(w; x_j), y_j) over ``data``, for flat parameter vectors w; l is the
    cross-entropy unless ``loss`` (a name or a callable returning a batch's mean loss) says otherwise."""

    def __init__(self, flat: FlatModel, buffers: dict[str, Tensor], data: AnalysisData, bn_mode: str = "eval",
                 loss: str | LossFn | None = None):
        if bn_mode not in BN_MODES:
            raise LandscapeError(f"unknown BN mode '{bn_mode}'; choose from: {', '.join(BN_MODES)}")
        if len(data) == 0:
            raise LandscapeError(f"{data.name} is empty (0 samples)")
        self.flat = flat
        self.data = data
        self.bn_mode = bn_mode
        self.buffers = dict(buffers)
        self.loss_fn = loss_function(loss)
        self._recomputed_for: Tensor | None = None
        check_model_data(flat, self.buffers, data, self.loss_fn)  # where the model and the data meet

    # -- the loss on model outputs -----------------------------------------------------------------------
    def mean_loss(self, outputs: Tensor, targets: Tensor) -> Tensor:
        """The mean loss of one batch."""
        return F.cross_entropy(outputs, targets) if self.loss_fn is None else self.loss_fn(outputs, targets)

    def summed_loss(self, outputs: Tensor, targets: Tensor) -> Tensor:
        """The loss summed over one batch's samples (the mean times the batch size for a custom loss)."""
        if self.loss_fn is None:
            return F.cross_entropy(outputs, targets, reduction="sum")
        return self.loss_fn(outputs, targets) * targets.shape[0]

    def sample_losses(self, outputs: Tensor, targets: Tensor) -> Tensor:
        """Summed losses of a stack of batches: ``outputs`` [cells, n, ...] against the same ``targets``."""
        if self.loss_fn is None:
            count = outputs.shape[0]
            per_sample = F.cross_entropy(outputs.flatten(0, 1), targets.repeat(count), reduction="none")
            return per_sample.view(count, -1).sum(dim=1)
        return torch.stack([self.summed_loss(out, targets) for out in outputs])

    @property
    def classifies(self) -> bool:
        """Whether accuracy means something: class-index targets (integers)."""
        return not self.data.y.is_floating_point()

    def num_correct(self, outputs: Tensor, targets: Tensor) -> Tensor:
        """Correct argmax predictions over the last-but-one axis of ``outputs`` (0 when not classifying)."""
        if not self.classifies:
            return torch.zeros(outputs.shape[:-2], dtype=torch.long, device=outputs.device)
        return (outputs.argmax(dim=-1) == targets).sum(dim=-1)

    @property
    def module(self) -> nn.Module:
        return self.flat.module

    @property
    def has_batchnorm(self) -> bool:
        return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in self.module.modules())

    @contextlib.contextmanager
    def bn_mode_context(self) -> Iterator[None]:
        """Set the module's training flag for this BN mode; always restore it."""
        was_training = self.module.training
        self.module.train(self.bn_mode == "train-batch-stats")
        try:
            yield
        finally:
            self.module.train(was_training)

    def buffers_for(self, w: Tensor) -> dict[str, Tensor]:
        """The BatchNorm buffers an evaluation at w uses under this BN mode (a throw-away copy, the statistics
        recomputed at w, or the checkpoint's)."""
        if self.bn_mode == "train-batch-stats":
            return {k: v.clone() for k, v in self.buffers.items()}  # updates land in a throw-away copy
        if self.bn_mode == "recompute" and self.has_batchnorm:
            if self._recomputed_for is None or not torch.equal(self._recomputed_for, w):
                self.recomputed_buffers = recompute_bn_statistics(self.flat, w, self.buffers, self.data)
                self._recomputed_for = w.detach().clone()
            return self.recomputed_buffers
        return self.buffers

    # -- evaluations ------------------------------------------------------------------------------------
    def batch_loss(self, w: Tensor, batch: tuple[Tensor, Tensor], buffers: dict[str, Tensor] | None = None) -> Tensor:
        """The mean loss on one batch at w (differentiable in w)."""
        with self.bn_mode_context():
            return self.mean_loss(self.flat.logits(w, batch[0], buffers or self.buffers_for(w)), batch[1])

    def batch_loss_and_grad(self, w: Tensor, batch: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        """(f(w; B), grad f(w; B)), both detached."""
        w = w.detach().requires_grad_(True)
        loss = self.batch_loss(w, batch)
        (grad,) = torch.autograd.grad(loss, w)
        return loss.detach(), grad

    def loss(self, w: Tensor) -> Tensor:
        """F(w) over the whole data set (batches weighted by size), as a 0-d float64 tensor."""
        total = torch.zeros((), dtype=torch.float64, device=w.device)
        buffers = self.buffers_for(w)
        with torch.no_grad(), self.bn_mode_context():
            for xb, yb in self.data.batches():
                total += self.summed_loss(self.flat.logits(w, xb, buffers), yb).double()
        return total / len(self.data)

    def loss_and_grad(self, w: Tensor) -> tuple[Tensor, Tensor]:
        """(F(w), grad F(w)) over the whole data set; batches weighted by size."""
        w = w.detach().requires_grad_(True)
        buffers = self.buffers_for(w.detach())
        total = torch.zeros((), dtype=torch.float64, device=w.device)
        grad = torch.zeros_like(w)
        with self.bn_mode_context():
            for xb, yb in self.data.batches():
                loss = self.summed_loss(self.flat.logits(w, xb, buffers), yb) / len(self.data)
                (g,) = torch.autograd.grad(loss, w)
                grad += g
                total += loss.detach().double()
        return total, grad

    def accuracy(self, w: Tensor) -> float:
        """The fraction of correct argmax predictions; NaN when the targets are not class indices."""
        if not self.classifies:
            return float("nan")
        buffers = self.buffers_for(w)
        correct = torch.zeros((), dtype=torch.long, device=w.device)
        with torch.no_grad(), self.bn_mode_context():
            for xb, yb in self.data.batches():
                correct += (self.flat.logits(w, xb, buffers).argmax(1) == yb).sum()
        return int(correct) / len(self.data)  # one host sync, after the last batch

    def with_data(self, data: AnalysisData) -> Objective:
        """The same model and BN mode over other data (e.g. one client's F_i)."""
        return Objective(self.flat, self.buffers, data, self.bn_mode, loss=self.loss_fn)


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


def check_model_data(flat: FlatModel, buffers: dict[str, Tensor], data: AnalysisData, loss_fn: LossFn | None
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
    was_training = flat.module.training
    try:
        flat.module.train(False)
        with torch.no_grad():
            outputs = flat.logits(w, xb, buffers)
    except LandscapeError:
        raise
    except Exception as e:  # noqa: BLE001 - the user's model failed on the data: one line naming both
        dtype = str(xb.dtype).replace("torch.", "")
        raise LandscapeError(f"{name}: the model's forward pass fails on its first batch (inputs "
                             f"{_shape(xb)} {dtype}): {_first_line(e)}") from None
    finally:
        flat.module.train(was_training)
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


@dataclass(frozen=True)
class Problem:
    """A model at a point on a data set under a loss: the ``Objective`` F and the flat weights w at which it is
    measured. Built by ``problem(model, data, ...)``; ``landscape analyze`` builds one per checkpoint."""

    objective: Objective
    w: Tensor

    @property
    def flat(self) -> FlatModel:
        return self.objective.flat


@torch.no_grad()
def recompute_bn_statistics(
    flat: FlatModel, w: Tensor, buffers: dict[str, Tensor], data: AnalysisData
) -> dict[str, Tensor]:
    """BatchNorm running statistics recomputed at w: the cumulative average over the batches of ``data``."""
    fresh = {k: v.clone() for k, v in buffers.items()}
    bns = [m for m in flat.module.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    saved = [(m, m.momentum) for m in bns]
    buffer_names = set(flat.buffer_names)  # frozen parameters, also in ``buffers``, are not statistics
    for name, value in fresh.items():
        if name not in buffer_names:
            continue
        if name.endswith(("running_mean", "num_batches_tracked")):
            value.zero_()
        elif name.endswith("running_var"):
            value.fill_(1.0)
    was_training = flat.module.training
    try:
        for m in bns:
            m.momentum = None  # cumulative moving average = exact mean over the batches
        flat.module.train()
        for xb, _ in data.batches():
            flat.logits(w, xb, fresh)
    finally:
        for m, momentum in saved:
            m.momentum = momentum
        flat.module.train(was_training)
    return fresh
