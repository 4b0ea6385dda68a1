"""Gradient graphs for products (``gradient_graphs``): the same gradients and Hessian-vector products as PyTorch's
own double-backward and as a dense Hessian, for every convolution geometry, ReLU and 1-D and 2-D max-pools."""

import pytest
import torch
import torch.nn.functional as F

from landscape.core.flat import FlatModel
from landscape.measure.analysis_data import AnalysisData
from landscape.measure.gradient_graphs import product_gradient_graphs
from landscape.measure.objective import Objective
from landscape.measure.operator import HessianOperator
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
    with product_gradient_graphs():
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


# (axes, kernel, stride, padding, dilation, ceil_mode) of a max-pool
POOLS = [
    (2, 2, None, 0, 1, False),
    (2, 3, 2, 1, 1, True),
    (2, (2, 3), (1, 2), (1, 0), (2, 1), False),
    (1, 2, None, 0, 1, False),
    (1, 3, 2, 1, 2, True),
]


def _relu_and_pool(axes, kernel, stride, padding, dilation, ceil_mode):
    """A loss of (W1, W2) through a linear map, ReLU, the max-pool and ReLU again, as a function of one float64
    vector, and that vector (the pool's input and the second ReLU's depend on W1 and W2)."""
    g = torch.Generator().manual_seed(axes + 10)
    size = (3, 6, 7)[-axes - 1:] if axes == 1 else (3, 6, 7)
    x = torch.randn(4, 5, dtype=torch.float64, generator=g)
    numels = [5 * int(torch.Size(size).numel()), 2 * 3]
    theta = 0.5 * torch.randn(sum(numels), dtype=torch.float64, generator=g)
    pool = F.max_pool1d if axes == 1 else F.max_pool2d
    options = {"stride": stride, "padding": padding, "dilation": dilation, "ceil_mode": ceil_mode}

    def loss(flat):
        w1, w2 = flat.split(numels)
        h = F.relu(x @ w1.view(5, -1)).view(4, *size)
        p = pool(h, kernel, **options).flatten(1)
        return F.softplus(torch.relu(p[:, :6] * w2) @ torch.ones(6, dtype=torch.float64)).pow(2).sum()

    return loss, theta


@pytest.mark.parametrize("pool", POOLS)
def test_relu_and_max_pool_products_are_pytorchs_bit_for_bit_and_the_dense_hessians(pool):
    loss, theta = _relu_and_pool(*pool)
    v = torch.randn(theta.numel(), dtype=torch.float64, generator=torch.Generator().manual_seed(9))
    leaf = theta.clone().requires_grad_()
    (theirs,) = torch.autograd.grad(loss(leaf), leaf, create_graph=True)
    with product_gradient_graphs():
        (gradient,) = torch.autograd.grad(loss(leaf), leaf, create_graph=True)
    names = _graph_names(gradient)
    assert {"ReLUBackward", "MaxPoolBackward"} <= names and "ThresholdBackward0" not in names, names
    (product,) = torch.autograd.grad(gradient, leaf, v)
    (reference,) = torch.autograd.grad(theirs, leaf, v)
    assert torch.equal(gradient.detach(), theirs.detach())
    assert torch.equal(product, reference)  # only PyTorch's zero terms are left out
    torch.testing.assert_close(product, torch.autograd.functional.hessian(loss, theta) @ v, rtol=1e-10, atol=1e-12)


def test_in_place_relu_and_pools_returning_indices_keep_pytorchs():
    x = torch.randn(2, 3, 6, 6, dtype=torch.float64, requires_grad=True)
    with product_gradient_graphs():
        kept = [F.relu(x * 1.0, inplace=True), F.max_pool2d(x, 2, return_indices=True)[0]]
        ours = [F.relu(x), torch.relu(x), x.relu(), F.max_pool2d(x, 2), torch.nn.MaxPool1d(2)(x[:, :, 0])]
    assert [type(t.grad_fn).__name__ for t in kept] == ["ReluBackward0", "MaxPool2DWithIndicesBackward0"]
    assert [type(t.grad_fn).__name__ for t in ours] == ["ReLUBackward"] * 3 + ["MaxPoolBackward", "SqueezeBackward1"]
    assert type(F.relu(x).grad_fn).__name__ == "ReluBackward0"  # only inside the block


def test_the_graph_runs_on_the_first_order_functions_and_string_padding_keeps_pytorchs():
    x = torch.randn(2, 3, 6, 6, dtype=torch.float64)
    w = torch.randn(4, 3, 3, 3, dtype=torch.float64, requires_grad=True)
    for padding, ours in ((1, True), ("same", False)):
        with product_gradient_graphs():
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
