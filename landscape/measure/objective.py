"""The analysis objective F(w): the mean loss of a model over a declared data set (cross-entropy unless a
loss function is given, e.g. mean squared error for a regression model).

Everything ``landscape analyze`` measures is a function of F (or of a client's F_i) at a point w, the flat
parameter vector of a checkpoint. ``Objective`` evaluates F, its gradient and minibatch versions of both,
with batches weighted by their size and with no weight-decay term. The model is used through
``torch.func.functional_call`` (``landscape.core.flat.FlatModel``), so its parameters, ``requires_grad`` flags
and ``.grad`` fields are never touched; its training flag is set per evaluation and restored afterwards, a
switch that costs nothing where the flags already are the BN mode's (``evaluation_mode``): the model an analysis
owns (``landscape analyze``'s, the function API's copy) is put in that mode once, where it is made.
w holds the trainable parameters only (``requires_grad=True``); frozen parameters are constants of F at the
values in ``buffers`` (with the BatchNorm buffers), so F, its gradient and its Hessian are functions of the
trainable parameters alone.

BatchNorm modes (docs/metrics.md): ``eval`` (running statistics of the checkpoint), ``train-batch-stats`` (each
batch normalised by its own statistics; the running statistics are not changed) and ``recompute`` (running
statistics recomputed over the analysis data, then eval mode). Models without BatchNorm ignore the mode.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from landscape.core.errors import LandscapeError
from landscape.core.flat import FlatModel
from landscape.measure.analysis_data import AnalysisData, check_model_data

BN_MODES = ("eval", "train-batch-stats", "recompute")


def evaluation_mode(bn_mode: str) -> bool:
    """The modules' training flag every evaluation under ``bn_mode`` runs with: True for "train-batch-stats"
    (each batch normalised by its own statistics), False for "eval" and "recompute" (running statistics).

    The owner of an analysis model sets it once (``module.train(evaluation_mode(bn_mode))``: the analysis
    context per checkpoint, the function API per copy), so that the switch each evaluation makes
    (``Objective.bn_mode_context``, ``FlatModel.mode``) finds every flag set and switches nothing: flipping
    every module's flag and back cost about 60 us a call against 4 us for the check, on the digits CNN
    (issue 47; the sharpness pass makes 14,081 calls at 100 clients). The numbers are the same either way.
    """
    return bn_mode == "train-batch-stats"


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
        """The module's training flag for this BN mode inside the block (``FlatModel.mode``; restored after)."""
        with self.flat.mode(evaluation_mode(self.bn_mode)):
            yield

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
    def batch_loss(self, w: Tensor | Mapping[str, Tensor], batch: tuple[Tensor, Tensor],
                   buffers: dict[str, Tensor] | None = None) -> Tensor:
        """The mean loss on one batch at w (differentiable in w): a flat vector, or the trainable parameters by
        name (``ParameterLeaves.named``; then ``buffers`` must be given for a BN mode that depends on w)."""
        if buffers is None:
            buffers = self.buffers_for(w)
        with self.bn_mode_context():
            return self.mean_loss(self.flat.logits(w, batch[0], buffers), batch[1])

    def batch_losses(self, w: Tensor, batches: Sequence[tuple[Tensor, Tensor]]) -> Tensor:
        """The mean loss of each batch at w, as a float64 tensor [len(batches)] (no gradient): one forward of
        the batches together where that gives each batch its own value (the cross-entropy's per-sample
        losses summed per batch; no BatchNorm batch statistics), else one forward per batch."""
        with torch.no_grad():
            if self.loss_fn is not None or (self.bn_mode == "train-batch-stats" and self.has_batchnorm):
                return torch.stack([self.batch_loss(w, b).double() for b in batches])
            sizes = [int(b[1].shape[0]) for b in batches]
            x, y = torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])
            buffers = self.buffers_for(w)
            with self.bn_mode_context():
                per_sample = F.cross_entropy(self.flat.logits(w, x, buffers), y, reduction="none").double()
            sums = torch.stack([part.sum() for part in per_sample.split(sizes)])
            return sums / torch.tensor(sizes, dtype=torch.float64, device=sums.device)

    def batch_loss_and_grad(self, w: Tensor, batch: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        """(f(w; B), grad f(w; B)), both detached; the gradient written straight into a new flat tensor."""
        leaves = self.flat.leaves(w)
        grad = leaves.new_gradient()
        loss = self.batch_loss(leaves.named, batch, self.buffers_for(w.detach()))
        leaves.backward([loss])
        return loss.detach(), grad

    def loss(self, w: Tensor) -> Tensor:
        """F(w) over the whole data set (batches weighted by size), as a 0-d float64 tensor."""
        total = torch.zeros((), dtype=torch.float64, device=w.device)
        buffers = self.buffers_for(w)
        with torch.no_grad(), self.bn_mode_context():
            for xb, yb in self.data.batches():
                total += self.summed_loss(self.flat.logits(w, xb, buffers), yb).double()
        return total / len(self.data)

    def _batch_term(self, w: Tensor | Mapping[str, Tensor], batch: tuple[Tensor, Tensor],
                    buffers: dict[str, Tensor]) -> Tensor:
        """One batch's term of F in ``loss_and_grad``'s arithmetic: its summed loss over the size of the data."""
        return self.summed_loss(self.flat.logits(w, batch[0], buffers), batch[1]) / len(self.data)

    def loss_and_grad(self, w: Tensor) -> tuple[Tensor, Tensor]:
        """(F(w), grad F(w)) over the whole data set; batches weighted by size. Every batch's gradient is added
        in place into one new flat tensor (``ParameterLeaves``): the additions of a sum over batches, in order."""
        buffers = self.buffers_for(w.detach())
        leaves = self.flat.leaves(w)
        grad = leaves.new_gradient()
        total = torch.zeros((), dtype=torch.float64, device=w.device)
        with self.bn_mode_context():
            for batch in self.data.batches():
                loss = self._batch_term(leaves.named, batch, buffers)
                leaves.backward([loss])
                total += loss.detach().double()
        return total, grad

    def loss_and_deferred_grad(self, w: Tensor,
                               expect_gradient: bool = False) -> tuple[Tensor, Callable[[], Tensor]]:
        """(F(w), gradient) where ``gradient()`` (called at most once) returns grad F(w): both bit for bit what
        ``loss_and_grad(w)`` returns, the backward pass paid only when the gradient is asked for (a trial point
        an ascent rejects never needs it).

        Data of one batch: the forward pass keeps its graph until ``gradient()`` back-propagates it (or the
        function is dropped), so F(w) costs a forward pass and the gradient its backward pass, as in
        ``loss_and_grad``. Data of several batches: keeping every batch's graph would hold the activations of
        the whole data set, so F(w) comes from forward passes without graphs, in the same arithmetic, and
        ``gradient()`` is ``loss_and_grad(w)``'s, a second forward pass; ``expect_gradient`` (the caller will
        most likely ask) computes ``loss_and_grad(w)`` at once instead."""
        ranges = self.data.batch_ranges()
        if len(ranges) != 1:
            if expect_gradient:
                loss, grad = self.loss_and_grad(w)
                return loss, lambda: grad
            buffers = self.buffers_for(w.detach())
            total = torch.zeros((), dtype=torch.float64, device=w.device)
            with torch.no_grad(), self.bn_mode_context():
                for batch in self.data.batches():
                    total += self._batch_term(w, batch, buffers).double()
            return total, lambda: self.loss_and_grad(w)[1]
        buffers = self.buffers_for(w.detach())
        leaves = self.flat.leaves(w)
        with self.bn_mode_context():
            loss = self._batch_term(leaves.named, self.data.batch(*ranges[0]), buffers)
        total = torch.zeros((), dtype=torch.float64, device=w.device) + loss.detach().double()

        def gradient() -> Tensor:
            grad = leaves.new_gradient()
            leaves.backward([loss])
            return grad

        return total, gradient

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
    try:
        for m in bns:
            m.momentum = None  # cumulative moving average = exact mean over the batches
        with flat.mode(True):
            for xb, _ in data.batches():
                flat.logits(w, xb, fresh)
    finally:
        for m, momentum in saved:
            m.momentum = momentum
    return fresh
