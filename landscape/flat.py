"""A model seen as a function of one flat parameter vector.

Federated SAM rules are written over the whole parameter vector (one global L2 norm, perturbations
``y + e``, averages of client models). ``FlatModel`` lets every rule be written that way: the module's
parameters become views of a single 1-D tensor ``w`` passed through ``torch.func.functional_call``, so the
module itself is never mutated and autograd flows straight to ``w``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call


class FlatModel:
    def __init__(self, module: nn.Module) -> None:
        self.module = module
        named = list(module.named_parameters())
        self.names = [n for n, _ in named]
        self.shapes = [p.shape for _, p in named]
        self.numels = [p.numel() for _, p in named]
        self.buffer_names = [n for n, _ in module.named_buffers()]
        self.dim = sum(self.numels)
        self._forward = self._call_module

    def compile(self) -> None:
        """Run the forward passes through ``torch.compile`` (the training model: ``train.compile = true``)."""
        self._forward = torch.compile(self._call_module)

    def _call_module(self, tensors: dict[str, Tensor], x: Tensor) -> Tensor:
        return functional_call(self.module, tensors, (x,))

    # -- conversions ------------------------------------------------------------------------------------
    def vector(self) -> Tensor:
        """The module's current parameters as one new flat tensor."""
        return torch.cat([p.detach().reshape(-1) for p in self.module.parameters()]).clone()

    def buffers(self) -> dict[str, Tensor]:
        """Copies of the module's buffers (BatchNorm running statistics); empty for GroupNorm models."""
        return {n: b.detach().clone() for n, b in self.module.named_buffers()}

    def params(self, w: Tensor) -> dict[str, Tensor]:
        """Name -> view of ``w`` with the parameter's shape."""
        return {n: t.view(s) for n, t, s in zip(self.names, w.split(self.numels), self.shapes)}

    def state_dict(self, w: Tensor, buffers: dict[str, Tensor]) -> dict[str, Tensor]:
        """A ``module.state_dict()``-shaped dict (CPU copies) for ``w`` and ``buffers``."""
        tensors = {**self.params(w), **buffers}
        return {k: tensors[k].detach().to("cpu", copy=True) for k in self.module.state_dict()}

    def from_state_dict(self, state: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        """(w, buffers) on the module's device and dtype from a state dict written by ``state_dict``."""
        ref = next(self.module.parameters())
        w = torch.cat([state[n].reshape(-1) for n in self.names]).to(ref.device, ref.dtype)
        own = dict(self.module.named_buffers())
        buffers = {n: state[n].to(own[n].device, own[n].dtype) for n in self.buffer_names}
        return w, buffers

    def load_into_module(self, w: Tensor, buffers: dict[str, Tensor]) -> nn.Module:
        """Copy ``w`` and ``buffers`` into the module's own tensors and return the module."""
        with torch.no_grad():
            for p, t in zip(self.module.parameters(), w.split(self.numels)):
                p.copy_(t.view_as(p))
            own = dict(self.module.named_buffers())
            for n, b in buffers.items():
                own[n].copy_(b)
        return self.module

    # -- evaluation -------------------------------------------------------------------------------------
    def logits(self, w: Tensor, x: Tensor, buffers: dict[str, Tensor]) -> Tensor:
        return self._forward({**self.params(w), **buffers}, x)

    def loss_and_grad(
        self, w: Tensor, x: Tensor, y: Tensor, buffers: dict[str, Tensor]
    ) -> tuple[Tensor, Tensor]:
        """Mean cross-entropy on (x, y) at ``w`` and its gradient (both detached)."""
        w = w.detach().requires_grad_(True)
        loss = F.cross_entropy(self.logits(w, x, buffers), y)
        (grad,) = torch.autograd.grad(loss, w)
        return loss.detach(), grad

    @torch.no_grad()
    def evaluate(
        self, w: Tensor, buffers: dict[str, Tensor], x: Tensor, y: Tensor, batch_size: int = 1024
    ) -> tuple[float, float]:
        """(mean cross-entropy, accuracy) over a whole data set, eval mode, batches weighted by size."""
        was_training = self.module.training
        self.module.eval()
        try:
            total_loss = torch.zeros((), dtype=torch.float64, device=w.device)
            correct = torch.zeros((), dtype=torch.long, device=w.device)
            for start in range(0, len(y), batch_size):
                xb, yb = x[start : start + batch_size], y[start : start + batch_size]
                out = self.logits(w, xb, buffers)
                total_loss += F.cross_entropy(out, yb, reduction="sum").double()
                correct += (out.argmax(dim=1) == yb).sum()
        finally:
            self.module.train(was_training)
        n = max(len(y), 1)
        return total_loss.item() / n, correct.item() / n
