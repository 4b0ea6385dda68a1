"""A model seen as a function of one flat parameter vector.

Federated SAM rules are written over the whole parameter vector (one global L2 norm, perturbations
``y + e``, averages of client models). ``FlatModel`` lets every rule be written that way: the module's
parameters become views of a single 1-D tensor ``w`` passed through ``torch.func.functional_call``, so the
module itself is never mutated and autograd flows straight to ``w``.

``w`` holds the **trainable** parameters only (``requires_grad=True`` when the ``FlatModel`` is built), in
``named_parameters()`` order: what PyHessian differentiates and what an optimizer would be given. A parameter
with ``requires_grad=False`` is a constant of the model, like a buffer: it is never perturbed, differentiated,
trained or averaged, and it travels with the buffers (``buffers()``, ``from_state_dict``, ``state_dict``), so a
state dict still holds every parameter. ``dim`` is the number of trainable entries, ``frozen_dim`` that of the
frozen ones. For a model whose parameters are all trainable the layout is every parameter, as before.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator, Mapping, Sequence

import torch
import torch.autograd.forward_ad as forward_ad
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call

from landscape.core.errors import LandscapeError
from landscape.core.memory_format import channels_last_copy


class ParameterLeaves:
    """The trainable parameters at a point w as autograd leaves: one per parameter, each a view (with the
    parameter's shape) of one detached copy of w, in the layout of w.

    Differentiating with respect to these leaves rather than to w itself keeps the split of w out of the
    graph, and with it the cat that assembles a flat gradient in the split's backward (issue 23: 45% of a
    gradient's time on a 657k MLP). A flat gradient is instead written in place: ``accumulate_into(g)``
    points each leaf's ``.grad`` at its slice of the flat tensor g, and ``torch.autograd.backward(...,
    inputs=leaves.tensors)`` (no ``create_graph``) adds every parameter's gradient into g (AccumulateGrad),
    the same additions in the same order as a cat: bit-identical values.
    """

    def __init__(self, flat: FlatModel, w: Tensor) -> None:
        self.flat = flat
        self.vector = w.detach().clone()  # the leaves' own storage: a later in-place change of w cannot reach them
        self.tensors = [t.requires_grad_() for t in self.views(self.vector)]
        self.named = dict(zip(flat.names, self.tensors))

    def views(self, vector: Tensor) -> list[Tensor]:
        """Per-parameter views of a flat ``vector`` (the layout of w), with the parameters' shapes."""
        return list(self.flat.params(vector).values())

    def accumulate_into(self, grad: Tensor) -> Tensor:
        """Make the flat tensor ``grad`` the leaves' ``.grad`` (each leaf its slice); return it."""
        for leaf, view in zip(self.tensors, self.views(grad)):
            leaf.grad = view
        return grad

    def new_gradient(self) -> Tensor:
        """A new zeroed flat gradient the leaves accumulate into: new every call, since callers keep the
        gradients they are handed (a buffer reused by the next call would change under them)."""
        return self.accumulate_into(torch.zeros_like(self.vector))

    def backward(self, outputs: Sequence[Tensor], grad_outputs: Sequence[Tensor] | None = None, *,
                 retain_graph: bool = False) -> None:
        """Back-propagate ``outputs`` (with ``grad_outputs``) into the leaves' ``.grad`` (``accumulate_into``)."""
        torch.autograd.backward(list(outputs), grad_outputs, retain_graph=retain_graph, inputs=self.tensors)

    def release(self) -> None:
        """Detach the leaves from the flat tensor they last accumulated into."""
        for leaf in self.tensors:
            leaf.grad = None


class FlatModel:
    def __init__(self, module: nn.Module) -> None:
        self.module = module
        named = list(module.named_parameters())
        trainable = [(n, p) for n, p in named if p.requires_grad]
        # the layout of w: the trainable parameters, fixed here (a flag changed later does not move it)
        self.names = [n for n, _ in trainable]
        self.shapes = [p.shape for _, p in trainable]
        self.numels = [p.numel() for _, p in trainable]
        # constants of the model, carried with the buffers: module buffers and frozen parameters
        self.buffer_names = [n for n, _ in module.named_buffers()]
        self.frozen_names = [n for n, p in named if not p.requires_grad]
        self.dim = sum(self.numels)
        self.frozen_dim = sum(p.numel() for _, p in named if not p.requires_grad)
        if self.dim == 0:
            what = "every parameter has requires_grad=False" if named else "it has no parameters"
            raise LandscapeError(f"the model has no trainable parameters ({what})")
        # every forward with 4-D inputs and parameters in channels-last layout: set by the trainer
        # (train.memory_format) and by the analysis (analyze.memory_format) as landscape.core.memory_format chose
        self.channels_last = False
        self._parameter_names = frozenset(n for n, _ in named)  # buffers keep their layout (updated in place)
        # parameter name -> (its source tensor, the source's version, where in it, the channels-last copy):
        # ``_channels_last_parameter`` reuses a copy while its weights are unchanged
        self._layout_copies: dict[str, tuple[weakref.ref, int, tuple, Tensor]] = {}
        self._reuse_layout_copies = True  # not under torch.compile (``compile``)
        self._forward = self._call_module
        self._modules = list(module.modules())  # for ``mode``: every module's training flag
        # functional_call's tie_weights=True looks for tied tensors on every call (a tenth of a millisecond on
        # the digits CNN, as much as the forward pass of a small client): only a model with a tensor under two
        # names, a tie it must keep, pays for it
        self._tied = _has_tied_tensors(module)

    @contextlib.contextmanager
    def mode(self, training: bool) -> Iterator[None]:
        """The module in training (True) or eval (False) mode inside the block (``module.train(training)``),
        every module's own flag restored after; nothing is set when every flag already is ``training`` (an
        evaluation on a small client pays for no mode switch)."""
        if all(m.training == training for m in self._modules):
            yield
            return
        saved = [m.training for m in self._modules]
        self.module.train(training)
        try:
            yield
        finally:
            for m, flag in zip(self._modules, saved):
                m.training = flag

    def call(self, tensors: dict[str, Tensor], x: Tensor) -> Tensor:
        """``torch.func.functional_call`` of the module at ``tensors`` (parameters and constants by name) on
        ``x``: the one way every evaluation calls the model (vmapped ones included)."""
        return functional_call(self.module, tensors, (x,), tie_weights=self._tied)

    @contextlib.contextmanager
    def layout(self, channels_last: bool) -> Iterator[None]:
        """Forwards in channels-last (True) or contiguous (False) layout inside the block, whatever
        ``channels_last`` says outside it (restored after)."""
        before, self.channels_last = self.channels_last, channels_last
        try:
            yield
        finally:
            self.channels_last = before

    def compile(self) -> None:
        """Run the forward passes through ``torch.compile`` (the training model: ``train.compile = true``); the
        compiled forward copies the weights into channels-last layout itself (no reused copies)."""
        self._reuse_layout_copies = False
        self._forward = torch.compile(self._call_module)

    def _call_module(self, tensors: dict[str, Tensor], x: Tensor) -> Tensor:
        """The module's outputs at ``tensors`` on ``x``. With ``channels_last``, a 4-D ``x`` and every 4-D
        parameter (a convolution weight) are first copied into channels-last layout (differentiable copies:
        gradients reach w unchanged in layout), so the CPU's faster channels-last convolution and pooling
        kernels run; the values equal the contiguous ones to float rounding. A weight's copy is made once and
        reused while the weights are unchanged, where that is safe (``_channels_last_parameter``)."""
        if self.channels_last:
            tensors = {n: self._channels_last_parameter(n, t) if n in self._parameter_names else t
                       for n, t in tensors.items()}
            x = channels_last_copy(x)
        return self.call(tensors, x)

    def _channels_last_parameter(self, name: str, tensor: Tensor) -> Tensor:
        """``channels_last_copy(tensor)``, the parameter ``name``'s weights, reused from an earlier forward while
        they are unchanged (issue 47: the copies were 4% of a training round, made again at every forward of the
        same weights: every batch of F(w), every evaluation of a client at w).

        Reused only where nothing can tell a reused copy from a new one: the weights are a view of the same
        source tensor (w, a flat vector: ``params(w)`` makes new views every call) at the same place, and the
        source's version counter is unchanged (an in-place change of w, or of any view of it, bumps it); and the
        copy is not part of a graph: no gradient is recorded for the weights (``torch.no_grad`` or weights that do
        not require one), no torch.func transform wraps them (vmap, grad, jvp) and no forward-mode level is open.
        A gradient's forward, the vmapped surface cells and a compiled forward copy as before. The copy holds the
        same values in the same strides as a new one: every number is bit-identical."""
        if tensor.dim() != 4:
            return tensor
        if (not self._reuse_layout_copies or (tensor.requires_grad and torch.is_grad_enabled())
                or forward_ad._current_level >= 0 or type(tensor) not in (Tensor, nn.Parameter)
                or torch._C._functorch.is_functorch_wrapped_tensor(tensor)):
            return channels_last_copy(tensor)
        source = tensor if tensor._base is None else tensor._base
        place = (tensor.storage_offset(), tuple(tensor.shape), tensor.stride())
        kept = self._layout_copies.get(name)
        if kept is not None and kept[0]() is source and kept[1] == source._version and kept[2] == place:
            return kept[3]
        copy = channels_last_copy(tensor)
        self._layout_copies[name] = (weakref.ref(source), source._version, place, copy)
        return copy

    # -- conversions ------------------------------------------------------------------------------------
    def _constants(self) -> dict[str, Tensor]:
        """The module's own constant tensors: its buffers, then its frozen parameters."""
        parameters = dict(self.module.named_parameters())
        return {**dict(self.module.named_buffers()), **{n: parameters[n] for n in self.frozen_names}}

    def vector(self) -> Tensor:
        """The module's current trainable parameters (the layout of w) as one new flat tensor."""
        parameters = dict(self.module.named_parameters())
        return torch.cat([parameters[n].detach().reshape(-1) for n in self.names]).clone()

    def buffers(self) -> dict[str, Tensor]:
        """Copies of the module's constants: its buffers (BatchNorm running statistics) and its frozen
        parameters; empty for a GroupNorm model whose parameters are all trainable."""
        return {n: b.detach().clone() for n, b in self._constants().items()}

    def params(self, w: Tensor) -> dict[str, Tensor]:
        """Name -> view of ``w`` with the parameter's shape (the trainable parameters)."""
        return {n: t.view(s) for n, t, s in zip(self.names, w.split(self.numels), self.shapes)}

    def state_dict(self, w: Tensor, buffers: dict[str, Tensor]) -> dict[str, Tensor]:
        """A ``module.state_dict()``-shaped dict (CPU copies) for ``w`` and ``buffers`` (which carry the frozen
        parameters): every parameter and buffer of the module."""
        tensors = {**self.params(w), **buffers}
        return {k: tensors[k].detach().to("cpu", copy=True) for k in self.module.state_dict()}

    def from_state_dict(self, state: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        """(w, buffers) on the module's device and dtype from a state dict written by ``state_dict`` (or by
        ``module.state_dict()``): w from the trainable parameters, ``buffers`` the state's buffers and frozen
        parameters (their values are the state's, not the module's)."""
        ref = next(self.module.parameters())
        w = torch.cat([state[n].reshape(-1) for n in self.names]).to(ref.device, ref.dtype)
        own = self._constants()
        buffers = {n: state[n].to(own[n].device, own[n].dtype) for n in own}
        return w, buffers

    def load_into_module(self, w: Tensor, buffers: dict[str, Tensor]) -> nn.Module:
        """Copy ``w`` and ``buffers`` (buffers and frozen parameters) into the module's own tensors and return
        the module."""
        with torch.no_grad():
            parameters = dict(self.module.named_parameters())
            for n, t in zip(self.names, w.split(self.numels)):
                parameters[n].copy_(t.view_as(parameters[n]))
            own = self._constants()
            for n, b in buffers.items():
                own[n].copy_(b)
        return self.module

    # -- evaluation -------------------------------------------------------------------------------------
    def leaves(self, w: Tensor) -> ParameterLeaves:
        """The trainable parameters at ``w`` as per-parameter autograd leaves (``ParameterLeaves``)."""
        return ParameterLeaves(self, w)

    def logits(self, w: Tensor | Mapping[str, Tensor], x: Tensor, buffers: dict[str, Tensor]) -> Tensor:
        """The model's outputs on ``x`` at ``w``: a flat vector, or the trainable parameters by name (e.g.
        ``ParameterLeaves.named``)."""
        params = self.params(w) if isinstance(w, Tensor) else w
        return self._forward({**params, **buffers}, x)

    def loss_and_grad(
        self, w: Tensor, x: Tensor, y: Tensor, buffers: dict[str, Tensor]
    ) -> tuple[Tensor, Tensor]:
        """Mean cross-entropy on (x, y) at ``w`` and its gradient (both detached), the gradient written
        straight into a new flat tensor (``ParameterLeaves``)."""
        leaves = self.leaves(w)
        grad = leaves.new_gradient()
        loss = F.cross_entropy(self.logits(leaves.named, x, buffers), y)
        leaves.backward([loss])
        return loss.detach(), grad

    @torch.no_grad()
    def evaluate(
        self, w: Tensor, buffers: dict[str, Tensor], x: Tensor, y: Tensor, batch_size: int = 1024
    ) -> tuple[float, float]:
        """(mean cross-entropy, accuracy) over a whole data set, eval mode, batches weighted by size."""
        with self.mode(False):
            total_loss = torch.zeros((), dtype=torch.float64, device=w.device)
            correct = torch.zeros((), dtype=torch.long, device=w.device)
            for start in range(0, len(y), batch_size):
                xb, yb = x[start : start + batch_size], y[start : start + batch_size]
                out = self.logits(w, xb, buffers)
                total_loss += F.cross_entropy(out, yb, reduction="sum").double()
                correct += (out.argmax(dim=1) == yb).sum()
        n = max(len(y), 1)
        return total_loss.item() / n, correct.item() / n


def _has_tied_tensors(module: nn.Module) -> bool:
    """Whether one parameter or buffer tensor of ``module`` is reachable under two names (tied weights)."""
    tensors = [t for _, t in module.named_parameters(remove_duplicate=False)]
    tensors += [t for _, t in module.named_buffers(remove_duplicate=False)]
    return len({id(t) for t in tensors}) < len(tensors)
