"""Gradient graphs of convolutions whose second derivatives run on first-order convolution kernels.

A Hessian-vector product by double-backward (``products``) back-propagates v through the graph of a gradient.
For a convolution y = conv(x, W) + b that graph holds PyTorch's ``ConvolutionBackward``, whose own derivative,
``_convolution_double_backward``, computes the weight-gradient term as a convolution of the transposed input
with the transposed output gradient as its kernel (a kernel as large as the feature map). On the CPU that
call runs far slower than the kernels a gradient uses for the same arithmetic (issue 23; the resnet-products
and gradient-overhead tables of docs/results/index.md measure both derivatives side by side).

``conv_gradient_graphs()`` is a context in which ``torch.nn.functional.conv1d/2d/3d`` (what ``nn.Conv*d``
calls) run as ``Convolution``, an autograd function with the same forward call (``torch.convolution``, bias
included: the same numbers) whose backward is built from two bilinear functions (``ConvolutionGradient``):

    g_x = the input gradient,  conv^T(g_y, W), bilinear in (g_y, W)
    g_W = the weight gradient, g_y correlated with x summed over the batch, bilinear in (g_y, x)
    g_b = sum of g_y over the batch and spatial axes

Each is computed by ``convolution_backward`` (the kernels of a plain gradient), and each one's backward,
which is what a product back-propagates through, is again one forward convolution and one
``convolution_backward``: for a direction V_x of g_x, dg_y = conv(V_x, W) and dW = the weight gradient of
(g_y, V_x); for a direction V_W of g_W, dg_y = conv(x, V_W) and dx = the input gradient of g_y through V_W.
These are the derivatives of bilinear maps, exact: the products are PyTorch's up to the rounding of other
kernels (tests/analyze/test_conv_graphs.py, against dense Hessians in float64). The backward of
``ConvolutionGradient`` is not differentiable again (a product needs second derivatives only).

String padding (``"same"``, ``"valid"``) and anything that is not a plain tensor call keeps PyTorch's own
convolution. The context is used only where a gradient graph is built for products (``batch_gradient``);
losses, gradients and forward-over-reverse products never see it.
"""

from __future__ import annotations

from collections.abc import Iterator
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


def _per_axis(value: Any, axes: int) -> list[int]:
    return [int(value)] * axes if isinstance(value, int) else [int(v) for v in value]


class _ConvolutionMode(TorchFunctionMode):
    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func in CONVOLUTIONS:
            named = dict(zip(("input", "weight", "bias", "stride", "padding", "dilation", "groups"), args))
            named.update(kwargs)
            x, weight, bias = named["input"], named["weight"], named.get("bias")
            padding = named.get("padding", 0)
            if (isinstance(x, Tensor) and isinstance(weight, Tensor) and not isinstance(padding, str)
                    and (bias is None or isinstance(bias, Tensor))):
                axes = weight.dim() - 2
                geometry = (_per_axis(named.get("stride", 1), axes), _per_axis(padding, axes),
                            _per_axis(named.get("dilation", 1), axes), int(named.get("groups", 1)))
                return Convolution.apply(x, weight, bias, geometry)
        return func(*args, **kwargs)


@contextmanager
def conv_gradient_graphs() -> Iterator[None]:
    """Inside the block, convolutions build gradient graphs whose derivatives run on first-order kernels."""
    with _ConvolutionMode():
        yield
