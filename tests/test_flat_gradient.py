"""Gradients written straight into one flat tensor (``ParameterLeaves``, issue 23): training's and analysis's
gradients equal plain PyTorch's bit for bit, the tensors handed out are never reused, and the products through
the per-parameter leaves equal the flat-vector formulation they replaced and a dense Hessian, for every backend
and ``auto``."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from landscape.core.flat import FlatModel
from landscape.measure.analysis_data import AnalysisData
from landscape.measure.gradient_graphs import product_gradient_graphs
from landscape.measure.objective import Objective
from landscape.measure.operator import BACKENDS, HessianOperator
from landscape.models import build_model


def _plain(module: nn.Module, batches, n: int) -> torch.Tensor:
    """The reference: per-parameter gradients of each batch's summed CE / n by ``torch.autograd.grad`` over
    ``module.parameters()`` (allow_unused: zero), added into zeros batch after batch, flattened at the end."""
    params = [p for p in module.parameters() if p.requires_grad]
    total = [torch.zeros_like(p) for p in params]
    for xb, yb in batches:
        loss = F.cross_entropy(module(xb), yb, reduction="sum") / n
        for t, g in zip(total, torch.autograd.grad(loss, params, allow_unused=True)):
            if g is not None:
                t += g
    return torch.cat([t.reshape(-1) for t in total])


class _Unused(nn.Module):
    """An MLP with a parameter the forward pass never uses (its gradient is zero) and a frozen one."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(64, 12), nn.Tanh(), nn.Linear(12, 10))
        self.spare = nn.Parameter(torch.randn(5))
        self.frozen = nn.Parameter(torch.randn(10), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x) + self.frozen


def _model(name: str) -> nn.Module:
    torch.manual_seed(0)
    if name == "unused":
        return _Unused()
    return build_model(name, (1, 8, 8), 10, {"hidden": [24]} if name == "mlp" else {"width": 4, "hidden": 16})


@pytest.mark.parametrize("name", ["mlp", "cnn", "unused"])
def test_training_gradient_is_plain_pytorchs_bit_for_bit(name):
    module = _model(name)
    flat = FlatModel(module)
    x, y = torch.randn(40, 1, 8, 8), torch.randint(0, 10, (40,))
    w = flat.vector()
    loss, grad = flat.loss_and_grad(w, x, y, flat.buffers())
    assert torch.equal(grad, _plain_mean(module, x, y))
    assert torch.equal(loss, F.cross_entropy(module(x), y).detach())
    assert not grad.requires_grad and grad.shape == (flat.dim,)


def _plain_mean(module: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The mean CE's gradient over the module's trainable parameters by ``torch.autograd.grad``."""
    params = [p for p in module.parameters() if p.requires_grad]
    grads = torch.autograd.grad(F.cross_entropy(module(x), y), params, allow_unused=True)
    return torch.cat([(torch.zeros_like(p) if g is None else g).reshape(-1) for p, g in zip(params, grads)])


def test_training_gradient_equals_plain_pytorch_exactly_and_under_autocast():
    module = _model("cnn")
    flat = FlatModel(module)
    x, y = torch.randn(30, 1, 8, 8), torch.randint(0, 10, (30,))
    w = flat.vector()
    assert torch.equal(flat.loss_and_grad(w, x, y, {})[1], _plain_mean(module, x, y))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, grad = flat.loss_and_grad(w, x, y, {})
        reference = _plain_mean(module, x, y)
    assert grad.dtype == torch.float32 and torch.equal(grad, reference)


def test_every_call_hands_out_a_new_gradient_and_batchnorm_statistics_still_update():
    torch.manual_seed(1)
    module = nn.Sequential(nn.Conv2d(1, 3, 3), nn.BatchNorm2d(3), nn.ReLU(), nn.Flatten(), nn.Linear(108, 10))
    flat = FlatModel(module)
    buffers = flat.buffers()
    x, y = torch.randn(16, 1, 8, 8), torch.randint(0, 10, (16,))
    w = flat.vector()
    _, first = flat.loss_and_grad(w, x, y, buffers)
    kept = first.clone()
    _, second = flat.loss_and_grad(w + 0.1, x, y, buffers)
    assert torch.equal(first, kept) and not torch.equal(first, second)  # the first answer was not overwritten
    assert first.untyped_storage().data_ptr() != second.untyped_storage().data_ptr()
    assert int(buffers["1.num_batches_tracked"]) == 2  # train mode: the statistics update in place, as before
    assert torch.equal(w, flat.vector())  # w itself is never touched


@pytest.mark.parametrize("mode", ["eval", "train-batch-stats"])
def test_analysis_gradients_are_the_plain_sum_over_batches_bit_for_bit(mode):
    module = _model("unused")
    flat = FlatModel(module)
    data = AnalysisData(torch.randn(70, 1, 8, 8), torch.randint(0, 10, (70,)), 32)  # batches of 32, 32, 6
    objective = Objective(flat, flat.buffers(), data, mode)
    w = flat.vector()
    total, grad = objective.loss_and_grad(w)
    module.train(mode == "train-batch-stats")
    assert torch.equal(grad, _plain(module, data.batches(), len(data)))
    reference = sum((F.cross_entropy(module(xb), yb, reduction="sum") / 70).double() for xb, yb in data.batches())
    assert torch.equal(total, reference.detach())
    xb, yb = next(iter(data.batches()))
    loss, batch_grad = objective.batch_loss_and_grad(w, (xb, yb))
    assert torch.equal(batch_grad, _plain_mean(module, xb, yb))
    assert torch.equal(loss, F.cross_entropy(module(xb), yb).detach())


def _flat_vector_products(flat: FlatModel, data: AnalysisData, w: torch.Tensor, vectors: torch.Tensor):
    """H @ V in the flat-vector layout the operator used before issue 23: gradients with respect to one flat w that
    requires grad (a split in the forward, a cat in the backward), v back-propagated into w, columns stacked;
    gradient graphs as the operator builds them now (``gradient_graphs``), so only the layout differs."""
    out = torch.zeros_like(vectors)
    for xb, yb in data.batches():
        u = w.clone().requires_grad_(True)
        with product_gradient_graphs():
            (grad,) = torch.autograd.grad(F.cross_entropy(functional_call(flat.module, flat.params(u), (xb,)), yb),
                                          u, create_graph=True)
        columns = [torch.autograd.grad(grad, u, grad_outputs=vectors[:, j].contiguous(), retain_graph=True)[0]
                   for j in range(vectors.shape[1])]
        out += len(yb) / len(data) * torch.stack(columns, dim=1)
    return out


@pytest.mark.parametrize("keep", [True, False])
def test_double_backward_products_equal_the_flat_vector_ones_bit_for_bit(keep):
    module = _model("cnn")
    flat = FlatModel(module)
    data = AnalysisData(torch.randn(40, 1, 8, 8), torch.randint(0, 10, (40,)), 16)
    w = flat.vector()
    vectors = torch.randn(flat.dim, 3, generator=torch.Generator().manual_seed(2))
    op = HessianOperator(Objective(flat, flat.buffers(), data), w, "double-backward", keep_graph=keep)
    first = op.matmat(vectors)
    assert torch.equal(first, _flat_vector_products(flat, data, w, vectors))
    kept = first.clone()
    op @ vectors[:, 0]
    assert torch.equal(first, kept)  # a later product does not add into an earlier answer
    assert op._leaves is None or all(leaf.grad is None for leaf in op._leaves.tensors)


def _tiny():
    torch.manual_seed(3)
    module = _Unused().double()
    flat = FlatModel(module)
    data = AnalysisData(torch.randn(30, 1, 8, 8, dtype=torch.float64), torch.randint(0, 10, (30,)), 12)
    return flat, data


def _dense(flat: FlatModel, data: AnalysisData, w: torch.Tensor) -> torch.Tensor:
    def loss(u):
        tensors = {**flat.params(u), **flat.buffers()}
        return sum(F.cross_entropy(functional_call(flat.module, tensors, (xb,)), yb, reduction="sum")
                   for xb, yb in data.batches()) / len(data)

    return torch.autograd.functional.hessian(loss, w, vectorize=True)  # vmap over rows: fast for linear layers


@pytest.fixture(scope="module")
def tiny_hessian():
    flat, data = _tiny()
    return _dense(flat, data, flat.vector())


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("budget", [None, 0])
def test_every_backend_and_auto_give_the_dense_hessian(backend, budget, tiny_hessian):
    flat, data = _tiny()
    w = flat.vector()
    hessian = tiny_hessian
    vectors = torch.randn(flat.dim, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    op = HessianOperator(Objective(flat, flat.buffers(), data), w, backend, memory_budget=budget)
    torch.testing.assert_close(op.matmat(vectors), hessian @ vectors, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(op @ vectors[:, 1], hessian @ vectors[:, 1], rtol=1e-10, atol=1e-12)
    if backend != "auto":
        assert op.backend_used == backend
    else:  # double-backward, through kept graphs where they fit (budget None), rebuilt where not (budget 0)
        assert op.backend_used == "double-backward" and op.keeps_graph is (budget is None)
    assert op.hvp_count == 3


def test_auto_decides_without_a_product_and_never_by_a_timing():
    flat, data = _tiny()
    objective = Objective(flat, flat.buffers(), data)
    w = flat.vector()
    roomy = HessianOperator(objective, w)
    assert roomy.backend == "auto" and roomy.backend_used is None
    assert roomy.decide_backend() == "double-backward" and roomy.graph_bytes > 0 and roomy.hvp_count == 0
    assert roomy.keeps_graph is None  # decided, nothing kept yet
    never = HessianOperator(objective, w, keep_graph=False)
    assert never.decide_backend() == "double-backward" and never.keeps_graph is False
    assert HessianOperator(objective, w, "forward-over-reverse").decide_backend() == "forward-over-reverse"
