"""Gradient graphs whose second derivatives cost what the arithmetic costs: convolutions, ReLU and max-pooling.

A Hessian-vector product by double-backward (``products``) back-propagates v through the graph of a gradient.
Where that graph holds PyTorch's own backward of an operation, the product runs that backward's derivative,
and for three common operations that derivative does more than it must (issue 23; the resnet-products,
hessian-cnn and gradient-overhead tables of docs/results/index.md measure it):

- a convolution y = conv(x, W) + b: PyTorch's ``_convolution_double_backward`` computes the weight-gradient
  term as a convolution of the transposed input with the transposed output gradient as its kernel (a kernel
  as large as the feature map), on the CPU a far slower call than the kernels a gradient uses;
- ReLU and max-pooling are piecewise linear: their backward, g -> the masked or routed g, is linear in g with
  a mask (the indices) that is constant in x almost everywhere. PyTorch's derivative of that backward with
  respect to the tensor the mask is read from (the ReLU's output, the pool's input) is a tensor of zeros as
  large as it (``zeros_like`` in its derivative formulas), made and then added into that tensor's gradient at
  every ReLU and every pool of every product.

``product_gradient_graphs()`` is a context in which ``torch.nn.functional.conv1d/2d/3d`` (what ``nn.Conv*d``
calls), ``relu`` (``nn.ReLU``, ``torch.relu``, ``Tensor.relu``) and ``max_pool1d/2d`` (``nn.MaxPool1d/2d``) run
as autograd functions with the same forward call (``torch.convolution``, ``torch.relu``,
``max_pool2d_with_indices``: the same numbers) and a backward whose derivative is exact and does only what it
must:

Convolution (``Convolution``): the backward is built from two bilinear functions (``ConvolutionGradient``),

    g_x = the input gradient,  conv^T(g_y, W), bilinear in (g_y, W)
    g_W = the weight gradient, g_y correlated with x summed over the batch, bilinear in (g_y, x)
    g_b = sum of g_y over the batch and spatial axes

each computed by ``convolution_backward`` (the kernels of a plain gradient), and each one's backward, which is
what a product back-propagates through, is again one forward convolution and one ``convolution_backward``:
for a direction V_x of g_x, dg_y = conv(V_x, W) and dW = the weight gradient of (g_y, V_x); for a direction
V_W of g_W, dg_y = conv(x, V_W) and dx = the input gradient of g_y through V_W. These are the derivatives of
bilinear maps.

ReLU (``ReLU``) and max-pooling (``MaxPool``): the backward is PyTorch's own first-order kernel
(``threshold_backward``, ``max_pool2d_with_indices_backward``) with the mask, the ReLU's output or the pool's
input and indices, taken as the constant it is; the graph then holds only the derivative in g (the same mask
again, or PyTorch's gather by the indices). Where the mask changes (x exactly at a kink or a tie), the
Hessian does not exist, and PyTorch's derivative there is the same zero.

The products are PyTorch's up to the rounding of other kernels: bit for bit without convolutions (only zeros
are left out), to rounding with them (tests/measure/test_gradient_graphs.py, against PyTorch and dense
Hessians in float64). The backward of ``ConvolutionGradient`` is not differentiable again (a product needs
second derivatives only).

String padding (``"same"``, ``"valid"``), an in-place ReLU, a pool that returns its indices, and anything that
is not a plain tensor call keep PyTorch's own function. The context is used only where a gradient graph is
built for products (``batch_gradient``); losses, gradients and forward-over-reverse products never see it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd import Function
from torch.overrides import TorchFunctionMode

# (stride, padding, dilation, groups) of one convolution, each per spatial axis but groups
Geometry = tuple[list[int], list[int], list[int], int]

CONVOLUTIONS = (F.conv1d, F.conv2d, F.conv3d)


def _forward(x: Tensor, weight: Tensor, bias: Tensor | None, geometry: Geometry) -> Tensor:
    stride, padding, dilation, groups = geometry
    return torch.convolution(x, weight, bias, stride, padding, dilation, False, [0] * len(stride), groups)


def _input_gradient(g_y: Tensor, x: Tensor, weight: Tensor, geometry: Geometry) -> Tensor:
    """The gradient with respect to the input (of x's shape) of <g_y, conv(x, weight)>."""
    stride, padding, dilation, groups = geometry
    return torch.ops.aten.convolution_backward(g_y, x, weight, None, stride, padding, dilation, False,
                                               [0] * len(stride), groups, [True, False, False])[0]


def _weight_gradient(g_y: Tensor, x: Tensor, weight: Tensor, geometry: Geometry) -> Tensor:
    """The gradient with respect to the weight (of weight's shape) of <g_y, conv(x, weight)>."""
    stride, padding, dilation, groups = geometry
    return torch.ops.aten.convolution_backward(g_y, x, weight, None, stride, padding, dilation, False,
                                               [0] * len(stride), groups, [False, True, False])[1]


class ConvolutionGradient(Function):
    """A convolution's input gradient g_x (``of = "input"``: bilinear in g_y and ``weight``; ``x`` gives the
    shape only) or weight gradient g_W (``of = "weight"``: bilinear in g_y and ``x``; ``weight`` gives the
    shape only); the backward pass is the exact derivative of that bilinear map."""

    @staticmethod
    def forward(ctx: Any, g_y: Tensor, x: Tensor, weight: Tensor, geometry: Geometry, of: str) -> Tensor:
        ctx.save_for_backward(g_y, x, weight)
        ctx.geometry, ctx.of = geometry, of
        return (_input_gradient if of == "input" else _weight_gradient)(g_y, x, weight, geometry)

    @staticmethod
    def backward(ctx: Any, v: Tensor) -> tuple[Tensor | None, ...]:
        g_y, x, weight = ctx.saved_tensors
        geometry, wants = ctx.geometry, ctx.needs_input_grad
        d_x = d_weight = None
        if ctx.of == "input":  # v has x's shape: d g_y = conv(v, W), dW = the weight gradient of (g_y, v)
            d_g_y = _forward(v, weight, None, geometry) if wants[0] else None
            d_weight = _weight_gradient(g_y, v, weight, geometry) if wants[2] else None
        else:  # v has W's shape: d g_y = conv(x, v), dx = the input gradient of g_y through v
            d_g_y = _forward(x, v, None, geometry) if wants[0] else None
            d_x = _input_gradient(g_y, x, v, geometry) if wants[1] else None
        return d_g_y, d_x, d_weight, None, None


class Convolution(Function):
    """y = conv(x, weight) + bias by ``torch.convolution``; its backward is differentiable through
    ``ConvolutionGradient``."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor, bias: Tensor | None, geometry: Geometry) -> Tensor:
        ctx.save_for_backward(x, weight)
        ctx.geometry = geometry
        return _forward(x, weight, bias, geometry)

    @staticmethod
    def backward(ctx: Any, g_y: Tensor) -> tuple[Tensor | None, ...]:
        x, weight = ctx.saved_tensors
        g_x = ConvolutionGradient.apply(g_y, x, weight, ctx.geometry, "input") if ctx.needs_input_grad[0] else None
        g_w = ConvolutionGradient.apply(g_y, x, weight, ctx.geometry, "weight") if ctx.needs_input_grad[1] else None
        g_b = g_y.sum([0, *range(2, g_y.dim())]) if ctx.needs_input_grad[2] else None
        return g_x, g_w, g_b, None


class ReLU(Function):
    """y = relu(x) by ``torch.relu``; its backward, ``threshold_backward`` of g at y, holds y as a constant."""

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        y = torch.relu(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> Tensor:
        (y,) = ctx.saved_tensors
        return torch.ops.aten.threshold_backward(g, y.detach(), 0)


class MaxPool(Function):
    """y = max_pool2d(x) by ``max_pool2d_with_indices`` (a 1-D pool as a 2-D one of height 1, as PyTorch runs
    it); its backward, ``max_pool2d_with_indices_backward`` of g, holds x and the indices as constants."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, geometry: tuple[list[int], list[int], list[int], list[int], bool]) -> Tensor:
        y, indices = torch.ops.aten.max_pool2d_with_indices(x, *geometry)
        ctx.save_for_backward(x, indices)
        ctx.geometry = geometry
        return y

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor, None]:
        x, indices = ctx.saved_tensors
        return torch.ops.aten.max_pool2d_with_indices_backward(g, x.detach(), *ctx.geometry, indices), None


def _per_axis(value: Any, axes: int) -> list[int]:
    return [int(value)] * axes if isinstance(value, int) else [int(v) for v in value]


def _arguments(names: tuple[str, ...], args: tuple, kwargs: dict) -> dict[str, Any]:
    named = dict(zip(names, args))
    named.update(kwargs)
    return named


def _convolution(args: tuple, kwargs: dict) -> Tensor | None:
    """A call of F.conv1d/2d/3d as ``Convolution``; None where PyTorch's own must run."""
    named = _arguments(("input", "weight", "bias", "stride", "padding", "dilation", "groups"), args, kwargs)
    x, weight, bias = named["input"], named["weight"], named.get("bias")
    padding = named.get("padding", 0)
    if not (isinstance(x, Tensor) and isinstance(weight, Tensor) and not isinstance(padding, str)
            and (bias is None or isinstance(bias, Tensor))):
        return None
    axes = weight.dim() - 2
    geometry = (_per_axis(named.get("stride", 1), axes), _per_axis(padding, axes),
                _per_axis(named.get("dilation", 1), axes), int(named.get("groups", 1)))
    return Convolution.apply(x, weight, bias, geometry)


def _relu(args: tuple, kwargs: dict) -> Tensor | None:
    """A call of F.relu, torch.relu or Tensor.relu as ``ReLU``; None for an in-place one."""
    named = _arguments(("input", "inplace"), args, kwargs)
    x = named["input"]
    return ReLU.apply(x) if isinstance(x, Tensor) and not named.get("inplace", False) else None


def _max_pool(axes: int) -> Callable[[tuple, dict], Tensor | None]:
    def rule(args: tuple, kwargs: dict) -> Tensor | None:
        """A call of F.max_pool1d/2d as ``MaxPool``; None where it returns indices."""
        named = _arguments(("input", "kernel_size", "stride", "padding", "dilation", "ceil_mode", "return_indices"),
                           args, kwargs)
        x = named["input"]
        if (not isinstance(x, Tensor) or named.get("return_indices", False)
                or x.dim() not in (axes + 1, axes + 2)):  # batched (N, C, ...) or unbatched (C, ...) input
            return None
        kernel = _per_axis(named["kernel_size"], axes)
        stride = named.get("stride")
        geometry = [kernel, kernel if stride is None or stride == [] else _per_axis(stride, axes),
                    _per_axis(named.get("padding", 0), axes), _per_axis(named.get("dilation", 1), axes)]
        if axes == 1:  # as PyTorch's max_pool1d: a 2-D pool of height 1
            geometry = [[1, geometry[0][0]], [1, geometry[1][0]], [0, geometry[2][0]], [1, geometry[3][0]]]
            return MaxPool.apply(x.unsqueeze(-2), (*geometry, bool(named.get("ceil_mode", False)))).squeeze(-2)
        return MaxPool.apply(x, (*geometry, bool(named.get("ceil_mode", False))))

    return rule


_RULES: dict[Any, Callable[[tuple, dict], Tensor | None]] = {
    **{conv: _convolution for conv in CONVOLUTIONS}, F.relu: _relu, torch.relu: _relu, Tensor.relu: _relu,
    F.max_pool1d: _max_pool(1), F.max_pool2d: _max_pool(2)}


class _GradientGraphMode(TorchFunctionMode):
    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        rule = _RULES.get(func)
        out = rule(args, kwargs) if rule is not None else None
        return func(*args, **kwargs) if out is None else out


@contextmanager
def product_gradient_graphs() -> Iterator[None]:
    """Inside the block, convolutions, ReLU and max-pooling build gradient graphs whose derivatives run on
    first-order kernels and leave out PyTorch's zero terms."""
    with _GradientGraphMode():
        yield
