"""One batch's Hessian-vector products H_b v, the two ways ``HessianOperator`` computes them, and the timing
by which its ``auto`` backend picks one.

Both differentiate with respect to the trainable parameters by name, never through a split of the flat vector
w: the split's backward is a cat of the per-parameter gradients, and a split/cat pair in every product's graph
was most of the overhead of a product over the arithmetic (issue 23).

- double-backward (Pearlmutter): ``batch_gradient`` differentiates f_b once with ``create_graph`` with respect
  to per-parameter leaves (``landscape.core.flat.ParameterLeaves``), inside ``product_gradient_graphs``
  (``gradient_graphs``: convolutions differentiable on first-order kernels, PyTorch's own derivative being slow
  on the CPU; ReLU and max-pools without PyTorch's zero terms);
  ``hvps_through`` back-propagates each v through that graph with the leaves' ``.grad`` pointed at one row of a
  preallocated [k, dim] tensor, so the product is added in place where it belongs (AccumulateGrad), with no
  cat and no stack of columns.
- forward-over-reverse: ``torch.func.jvp`` of ``torch.func.grad`` over the dict of parameters, the tangent a
  dict of views of v; each product is written by one cat into its row of the [k, dim] tensor. ``F.mse_loss``
  with its mean is taken as its sum over the element count there (``MeanSquaredErrorBySum``: PyTorch's forward
  derivative of the mean's backward fails); an op without a forward derivative is a one-line LandscapeError.

The values are those of the flat-vector formulation bit for bit (the same operations on the same numbers;
the split and cat only move them). Also the memory free on a device (``free_memory``), for the rule by which
the operator keeps gradient graphs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.overrides import TorchFunctionMode

from landscape.core.errors import LandscapeError
from landscape.core.flat import FlatModel, ParameterLeaves
from landscape.core.machine import free_cpu_memory
from landscape.measure.gradient_graphs import product_gradient_graphs

# A batch's gradient with its graph: one tensor per parameter (None: constant in w), or None where H_b = 0.
Gradient = list[Tensor | None] | None

# f_b as a function of the trainable parameters by name.
BatchLoss = Callable[[Mapping[str, Tensor]], Tensor]


def batch_gradient(loss: BatchLoss, leaves: ParameterLeaves) -> Gradient:
    """grad f_b at the leaves with its graph (``create_graph``), one tensor per parameter, None for a parameter
    whose gradient is constant in w; None where all are (f_b (piecewise) linear in w: H_b = 0)."""
    with product_gradient_graphs():  # derivatives of convolutions on first-order kernels, no zero terms
        grads = torch.autograd.grad(loss(leaves.named), leaves.tensors, create_graph=True, allow_unused=True)
    kept = [g if g is not None and g.requires_grad else None for g in grads]
    return kept if any(g is not None for g in kept) else None


def measured_gradient(loss: BatchLoss, leaves: ParameterLeaves, existing: set[int]) -> tuple[Gradient, int]:
    """(``batch_gradient``, the bytes of the tensors its graph saves, with the gradient itself): every storage
    counted once, except those whose ``data_ptr`` is in ``existing`` (tensors that exist anyway).

    The pack hook keeps ``t.detach()``, never ``t``: a saved tensor that is an output of the node saving it
    carries that node as its ``grad_fn``, so keeping ``t`` would make node -> saved tensor -> node a reference
    cycle through C++ that no garbage collection frees (the graph, and everything it saves, would outlive its
    operator: issue 47; PyTorch's saved-tensor hooks documentation, pytorch/pytorch#115255). Autograd gives an
    unpacked tensor its ``grad_fn`` back itself, so the graph and its numbers are the same."""
    saved: dict[int, int] = {}

    def pack(t: Tensor) -> Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in existing:
            saved[storage.data_ptr()] = storage.nbytes()
        return t.detach()

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        grad = batch_gradient(loss, leaves)
    gradient_bytes = sum(g.numel() * g.element_size() for g in grad or () if g is not None)
    return grad, sum(saved.values()) + gradient_bytes


def hvps_through(grad: Gradient, leaves: ParameterLeaves, vectors: Tensor, *, keep: bool,
                 out: Tensor | None = None) -> Tensor:
    """H_b v for each column v of ``vectors`` [dim, k], by back-propagating v through the graph of ``grad``
    (Pearlmutter): product j lands in place in row j of one [k, dim] tensor, returned transposed ([dim, k]):
    ``out``, a [k, dim] tensor of zeros the caller reuses (a new one of tens of MB costs its page faults on
    the CPU every time), else a new one. ``keep``: keep the graph for later products
    (else it is freed after the last column)."""
    if out is None:
        out = vectors.new_zeros(vectors.shape[1], vectors.shape[0])
    if grad is None:
        return out.T
    rows = vectors.T.contiguous()  # a strided column as grad_outputs makes the backward pass several times slower
    used = [i for i, g in enumerate(grad) if g is not None]  # the others have constant gradients: H v = 0 there
    outputs = [grad[i] for i in used]
    count = vectors.shape[1]
    try:
        for j in range(count):
            tangents = leaves.views(rows[j])
            leaves.accumulate_into(out[j])
            leaves.backward(outputs, [tangents[i] for i in used], retain_graph=keep or j < count - 1)
    finally:
        leaves.release()  # the leaves never hold on to (or add into) a tensor handed out
    return out.T


class MeanSquaredErrorBySum(TorchFunctionMode):
    """``F.mse_loss(input, target)`` with reduction "mean" (``nn.MSELoss`` and the loss "mse" included) computed
    as its "sum" over ``input.numel()``, the same function: the forward derivative of the mean's backward
    (``mse_loss_double_backward``) divides a zero tangent, the targets', in place, and PyTorch raises
    "ZeroTensors are immutable" (the sum's has no such step)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        kwargs = dict(kwargs or {})
        if func is F.mse_loss and len(args) == 2 and kwargs.get("reduction", "mean") == "mean" and \
                all(kwargs.get(key) is None for key in ("size_average", "reduce", "weight")):
            return F.mse_loss(*args, reduction="sum") / args[0].numel()
        return func(*args, **kwargs)


def forward_over_reverse(loss: BatchLoss, flat: FlatModel, w: Tensor, vectors: Tensor) -> Tensor:
    """H_b v for each column v of ``vectors`` [dim, k] as ``torch.func.jvp`` of ``torch.func.grad`` at w, over
    the parameters by name; each product written into its row of one [k, dim] tensor, returned transposed.
    An op PyTorch cannot differentiate forward (no forward derivative) is a LandscapeError naming the other
    backend."""
    gradient = torch.func.grad(loss)
    rows = vectors.T.contiguous()
    out = torch.empty_like(rows)
    primals = flat.params(w)
    try:
        with MeanSquaredErrorBySum():
            for j in range(vectors.shape[1]):
                product = torch.func.jvp(gradient, (primals,), (flat.params(rows[j]),))[1]
                torch.cat([product[name].reshape(-1) for name in flat.names], out=out[j])
    except (RuntimeError, NotImplementedError) as error:
        if isinstance(error, torch.OutOfMemoryError):
            raise
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise LandscapeError(f"the forward-over-reverse Hessian-vector product failed in PyTorch's forward-mode "
                             f"differentiation ({reason}); use hvp = \"double-backward\"") from error
    return out.T


def free_memory(device: torch.device) -> int | None:
    """Bytes free on ``device`` now: CUDA's ``mem_get_info``, the CPU's MemAvailable; None where unknown."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    if device.type == "cpu":
        return free_cpu_memory()
    return None
