"""Convolution gradient graphs on first-order kernels (``conv_graphs``): the same gradients and Hessian-vector
products as PyTorch's own double-backward and as a dense Hessian, for every convolution geometry."""

import pytest
import torch
import torch.nn.functional as F

from landscape.analyze.analysis_data import AnalysisData
from landscape.analyze.conv_graphs import conv_gradient_graphs
from landscape.analyze.objective import Objective
from landscape.analyze.operator import HessianOperator
from landscape.core.flat import FlatModel
from landscape.models import build_model

CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}

# (spatial axes, stride, padding, dilation, groups, bias)
GEOMETRIES = [
    (2, 1, 1, 1, 1, True),
    (2, 2, 0, 1, 1, False),
    (2, (2, 1), (1, 2), (1, 2), 2, True),
    (1, 2, 1, 2, 2, True),
    (3, 1, 1, 1, 1, True),
]


def _two_convolutions(axes, stride, padding, dilation, groups, bias):
    """A loss of (W1, b1, W2) through two convolutions of the geometry (the second one's input depends on W1,
    so both of its derivatives are exercised), as a function of one float64 vector, and that vector."""
    g = torch.Generator().manual_seed(axes)
    size = (7,) * axes
    x = torch.randn(3, 4, *size, dtype=torch.float64, generator=g)
    shapes = [(4, 4 // groups, *(3,) * axes), (4,), (2 * groups, 4 // groups, *(2,) * axes)]
    numels = [int(torch.Size(s).numel()) for s in shapes]
    theta = 0.3 * torch.randn(sum(numels), dtype=torch.float64, generator=g)
    options = {"stride": stride, "padding": padding, "dilation": dilation, "groups": groups}

    def loss(flat):
        w1, b1, w2 = (t.view(s) for t, s in zip(flat.split(numels), shapes))
        h = torch.tanh(CONV[axes](x, w1, b1 if bias else None, **options))
        return F.softplus(CONV[axes](h, w2, None, **options)).pow(2).sum()

    return loss, theta


@pytest.mark.parametrize("geometry", GEOMETRIES)
def test_gradients_and_products_equal_the_dense_hessian(geometry):
    loss, theta = _two_convolutions(*geometry)
    v = torch.randn(theta.numel(), dtype=torch.float64, generator=torch.Generator().manual_seed(9))
    hessian = torch.autograd.functional.hessian(loss, theta)  # PyTorch's own double-backward, outside
    plain = torch.func.grad(loss)(theta)
    leaf = theta.clone().requires_grad_()
    with conv_gradient_graphs():
        (gradient,) = torch.autograd.grad(loss(leaf), leaf, create_graph=True)
    (product,) = torch.autograd.grad(gradient, leaf, v)
    torch.testing.assert_close(gradient.detach(), plain, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(product, hessian @ v, rtol=1e-10, atol=1e-12)


def _graph_names(tensor):
    """The names of every node of the graph that computes ``tensor``."""
    seen, todo, names = set(), [tensor.grad_fn], set()
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        names.add(type(node).__name__)
        todo.extend(next_node for next_node, _ in node.next_functions)
    return names


def test_the_graph_runs_on_the_first_order_functions_and_string_padding_keeps_pytorchs():
    x = torch.randn(2, 3, 6, 6, dtype=torch.float64)
    w = torch.randn(4, 3, 3, 3, dtype=torch.float64, requires_grad=True)
    for padding, ours in ((1, True), ("same", False)):
        with conv_gradient_graphs():
            (g,) = torch.autograd.grad(F.conv2d(x, w, padding=padding).pow(2).sum(), w, create_graph=True)
        names = _graph_names(g)
        assert ("ConvolutionGradientBackward" in names) == ours, names
        (want,) = torch.autograd.grad(F.conv2d(x, w, padding=padding).pow(2).sum(), w)
        torch.testing.assert_close(g.detach(), want, rtol=1e-12, atol=1e-12)
    outside = torch.autograd.grad(F.conv2d(x, w, padding=1).pow(2).sum(), w, create_graph=True)[0]
    assert "ConvolutionGradientBackward" not in _graph_names(outside)  # only inside the block


def test_the_operator_on_a_cnn_equals_its_dense_hessian():
    torch.manual_seed(0)
    flat = FlatModel(build_model("cnn", (1, 8, 8), 3, {"width": 2, "hidden": 4}).double())  # 179 parameters
    g = torch.Generator().manual_seed(1)
    data = AnalysisData(torch.randn(20, 1, 8, 8, dtype=torch.float64, generator=g),
                        torch.randint(0, 3, (20,), generator=g), 8)  # batches of 8, 8, 4
    w = flat.vector()

    def loss(u):
        total = 0.0
        for xb, yb in data.batches():
            total = total + F.cross_entropy(flat.logits(u, xb, {}), yb, reduction="sum")
        return total / len(data)

    hessian = torch.autograd.functional.hessian(loss, w)
    vectors = torch.randn(flat.dim, 2, dtype=torch.float64, generator=g)
    for keep in (True, False):
        op = HessianOperator(Objective(flat, {}, data), w, "double-backward", keep_graph=keep)
        torch.testing.assert_close(op.matmat(vectors), hessian @ vectors, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(op @ vectors[:, 0], hessian @ vectors[:, 0], rtol=1e-10, atol=1e-12)
