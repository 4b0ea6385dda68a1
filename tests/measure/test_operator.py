"""The Hessian operator: products equal a dense Hessian, backends agree, counts, nothing on the model moves,
and the determinism probe."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from landscape.core.errors import LandscapeError
from landscape.core.flat import FlatModel
from landscape.measure.analysis_data import AnalysisData
from landscape.measure.objective import Objective, recompute_bn_statistics
from landscape.measure.operator import HessianOperator, MatrixOperator
from landscape.models import build_model

BACKENDS = ("double-backward", "forward-over-reverse")


def _mlp(dtype=torch.float64, n=70, batch=32):
    torch.manual_seed(0)
    module = build_model("mlp", (1, 8, 8), 10, {"hidden": [16]}).to(dtype)  # 1,210 parameters
    x = torch.randn(n, 1, 8, 8, dtype=dtype)
    y = torch.randint(0, 10, (n,))
    flat = FlatModel(module)
    return flat, AnalysisData(x, y, batch)  # batches of 32, 32, 6: unequal sizes


def _bn_net(dtype=torch.float64):
    torch.manual_seed(1)
    module = nn.Sequential(
        nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 3 * 3, 5)
    ).to(dtype)  # 305 parameters
    flat = FlatModel(module)
    with torch.no_grad():  # running statistics unlike any batch's, so the BN modes differ
        module[1].running_mean.uniform_(-1, 1)
        module[1].running_var.uniform_(0.5, 2)
    x = torch.randn(24, 3, 5, 5, dtype=dtype)
    y = torch.randint(0, 5, (24,))
    return flat, AnalysisData(x, y, 10)


def _dense_hessian(flat, data, w, buffers=None, train=False, vectorize=False) -> torch.Tensor:
    """grad^2 of the size-weighted mean CE, written out directly (module in eval or train mode).

    ``vectorize`` (vmap over the rows) is fast for linear layers and very slow for convolutions."""
    fixed = flat.buffers() if buffers is None else buffers

    def loss(u):
        total = 0.0
        for xb, yb in data.batches():
            buffers = {n: b.clone() for n, b in fixed.items()}  # train mode updates a throw-away copy
            out = functional_call(flat.module, {**flat.params(u), **buffers}, (xb,))
            total = total + F.cross_entropy(out, yb, reduction="sum")
        return total / len(data)

    was_training = flat.module.training
    flat.module.train(train)
    try:
        return torch.autograd.functional.hessian(loss, w, vectorize=vectorize)
    finally:
        flat.module.train(was_training)


@pytest.mark.parametrize("backend", BACKENDS)
def test_products_equal_the_dense_hessian_times_v(backend):
    flat, data = _mlp()
    w = flat.vector()
    obj = Objective(flat, flat.buffers(), data)
    hessian = _dense_hessian(flat, data, w, vectorize=True)
    op = HessianOperator(obj, w, backend)
    v = torch.randn(flat.dim, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(op @ v, hessian @ v, rtol=1e-10, atol=1e-12)
    vectors = torch.randn(flat.dim, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    torch.testing.assert_close(op.matmat(vectors), hessian @ vectors, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(op @ vectors, hessian @ vectors, rtol=1e-10, atol=1e-12)
    assert op.hvp_count == 1 + 3 + 3  # a matmat of k columns counts k


def test_backends_agree_in_float32():
    flat, data = _mlp(torch.float32)
    w = flat.vector()
    obj = Objective(flat, flat.buffers(), data)
    v = torch.randn(flat.dim, generator=torch.Generator().manual_seed(5))
    reverse = HessianOperator(obj, w, "double-backward") @ v
    forward = HessianOperator(obj, w, "forward-over-reverse") @ v
    assert reverse.dtype == torch.float32
    assert torch.linalg.vector_norm(reverse - forward) <= 1e-5 * torch.linalg.vector_norm(reverse)


@pytest.mark.parametrize("mode", ["eval", "train-batch-stats", "recompute"])
def test_batchnorm_modes_match_the_dense_hessian_and_leave_the_model_untouched(mode):
    flat, data = _bn_net()
    module = flat.module
    module.train()
    module[0].weight.requires_grad_(False)  # a frozen tensor stays frozen
    before = {k: v.clone() for k, v in module.state_dict().items()}
    flags = [p.requires_grad for p in module.parameters()]
    w = flat.vector()
    obj = Objective(flat, flat.buffers(), data, mode)
    # recompute: the statistics recomputed at w are constants of the Hessian
    buffers = recompute_bn_statistics(flat, w, flat.buffers(), data) if mode == "recompute" else None
    hessian = _dense_hessian(flat, data, w, buffers, train=mode == "train-batch-stats")
    v = torch.randn(flat.dim, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    for backend in BACKENDS:
        op = HessianOperator(obj, w, backend)
        torch.testing.assert_close(op @ v, hessian @ v, rtol=1e-9, atol=1e-11)
        op.check_determinism()
    assert module.training
    assert [p.requires_grad for p in module.parameters()] == flags
    assert all(p.grad is None for p in module.parameters())
    after = module.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_modes_give_different_hessians_on_a_batchnorm_model():
    flat, data = _bn_net()
    w = flat.vector()
    v = torch.randn(flat.dim, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    products = [HessianOperator(Objective(flat, flat.buffers(), data, mode), w) @ v
                for mode in ("eval", "train-batch-stats")]
    assert not torch.allclose(products[0], products[1], rtol=1e-3)


def test_loss_and_grad_is_the_objectives():
    flat, data = _mlp()
    w = flat.vector()
    obj = Objective(flat, flat.buffers(), data)
    op = HessianOperator(obj, w)
    loss, grad = op.loss_and_grad()
    ref_loss, ref_grad = obj.loss_and_grad(w)
    torch.testing.assert_close(loss, ref_loss)
    torch.testing.assert_close(grad, ref_grad)
    assert op.hvp_count == 0


def test_determinism_probe_names_the_causes_of_a_random_operator():
    torch.manual_seed(0)
    module = nn.Sequential(nn.Flatten(), nn.Linear(12, 16), nn.Tanh(), nn.Dropout(0.5), nn.Linear(16, 3)).double()
    module.eval()
    flat = FlatModel(module)
    data = AnalysisData(torch.randn(20, 12, dtype=torch.float64), torch.randint(0, 3, (20,)), 8)
    w = flat.vector()
    deterministic = HessianOperator(Objective(flat, flat.buffers(), data, "eval"), w)
    assert deterministic.check_determinism(seed=1) <= 1e-10
    assert deterministic.hvp_count == 2
    dropout = HessianOperator(Objective(flat, flat.buffers(), data, "train-batch-stats"), w)
    with pytest.raises(LandscapeError) as info:
        dropout.check_determinism(seed=1)
    message = str(info.value)
    assert "\n" not in message
    assert "not deterministic" in message
    for cause in ("dropout", "BatchNorm in train mode", "train-batch-stats", "augmentation", "nondeterministic"):
        assert cause in message
    assert not module.training  # the probe's train mode was the objective's, and is restored


def test_matrix_operator_and_bad_arguments():
    matrix = torch.tensor([[2.0, 1.0], [1.0, 3.0]], dtype=torch.float64)
    op = MatrixOperator(matrix)
    torch.testing.assert_close(op @ torch.tensor([1.0, 0.0], dtype=torch.float64), matrix[:, 0])
    assert op.hvp_count == 1
    with pytest.raises(LandscapeError, match="shape"):
        op @ torch.ones(3, dtype=torch.float64)
    with pytest.raises(LandscapeError, match="not finite"):
        MatrixOperator(torch.full((2, 2), float("nan"), dtype=torch.float64)).check_determinism()
    flat, data = _mlp()
    obj = Objective(flat, flat.buffers(), data)
    with pytest.raises(LandscapeError, match="unknown Hessian backend 'exact'; choose from: auto, double-backward"):
        HessianOperator(obj, flat.vector(), "exact")
    with pytest.raises(LandscapeError, match="flat vector of the model's 1210 parameters"):
        HessianOperator(obj, flat.vector()[:10])


# ----------------------------------------------------------------------------------------------------------
# kept gradient graphs


@pytest.mark.parametrize("mode", ["eval", "train-batch-stats", "recompute"])
def test_kept_graphs_give_the_recomputed_products_and_the_dense_hessian(mode):
    flat, data = _bn_net()
    w = flat.vector()
    obj = Objective(flat, flat.buffers(), data, mode)
    buffers = recompute_bn_statistics(flat, w, flat.buffers(), data) if mode == "recompute" else None
    hessian = _dense_hessian(flat, data, w, buffers, train=mode == "train-batch-stats")
    vectors = torch.randn(flat.dim, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(8))
    kept = HessianOperator(obj, w, keep_graph=True)
    recomputed = HessianOperator(obj, w, keep_graph=False)
    assert kept.keeps_graph is None and recomputed.keeps_graph is False  # decided at the first product
    first = kept.matmat(vectors)
    assert kept.keeps_graph is True and kept.graph_bytes > 0
    torch.testing.assert_close(first, recomputed.matmat(vectors), rtol=1e-6, atol=1e-12)
    torch.testing.assert_close(first, hessian @ vectors, rtol=1e-9, atol=1e-11)
    torch.testing.assert_close(kept @ vectors[:, 1], first[:, 1], rtol=1e-12, atol=0)  # the graph is reused
    assert kept.hvp_count == recomputed.hvp_count + 1 == 4


def test_kept_graphs_in_float32_match_the_recomputed_products_on_a_cnn():
    torch.manual_seed(2)
    module = build_model("cnn", (1, 8, 8), 10, {"width": 4, "hidden": 16})
    flat = FlatModel(module)
    data = AnalysisData(torch.randn(50, 1, 8, 8), torch.randint(0, 10, (50,)), 16)
    obj = Objective(flat, flat.buffers(), data)
    w = flat.vector()
    vectors = torch.randn(flat.dim, 4, generator=torch.Generator().manual_seed(9))
    kept = HessianOperator(obj, w, keep_graph=True).matmat(vectors)
    recomputed = HessianOperator(obj, w, keep_graph=False).matmat(vectors)
    assert torch.linalg.vector_norm(kept - recomputed) <= 1e-6 * torch.linalg.vector_norm(recomputed)


def test_the_memory_rule_keeps_graphs_only_within_the_budget():
    flat, data = _mlp()
    w = flat.vector()
    obj = Objective(flat, flat.buffers(), data)
    v = torch.randn(flat.dim, dtype=torch.float64, generator=torch.Generator().manual_seed(10))
    reference = HessianOperator(obj, w, keep_graph=False) @ v
    measured = HessianOperator(obj, w, keep_graph=True)
    measured @ v
    size = measured.graph_bytes
    # three batches of at most 32 samples: at least the first layer's activations of all of them
    assert 3 * 32 * 16 * 8 <= size <= 50 * 1024 * 1024
    tight = HessianOperator(obj, w, memory_budget=size - 1)
    torch.testing.assert_close(tight @ v, reference, rtol=1e-12, atol=0)
    assert tight.keeps_graph is False and tight.graph_bytes == size  # measured, then not kept
    roomy = HessianOperator(obj, w, memory_budget=size)
    torch.testing.assert_close(roomy @ v, reference, rtol=1e-12, atol=0)
    assert roomy.keeps_graph is True
    roomy.release()
    assert roomy.keeps_graph is None and roomy.graph_bytes is None
    torch.testing.assert_close(roomy @ v, reference, rtol=1e-12, atol=0)  # rebuilt after release
    assert HessianOperator(obj, w, "forward-over-reverse").keeps_graph is False
    with pytest.raises(LandscapeError, match="keep_graph applies to the double-backward backend"):
        HessianOperator(obj, w, "forward-over-reverse", keep_graph=True)
    with pytest.raises(LandscapeError, match="memory_budget must be >= 0 bytes, got -1"):
        HessianOperator(obj, w, memory_budget=-1)


def test_the_determinism_probe_sees_a_dropout_mask_frozen_into_a_kept_graph():
    torch.manual_seed(0)
    module = nn.Sequential(nn.Flatten(), nn.Linear(12, 16), nn.Tanh(), nn.Dropout(0.5), nn.Linear(16, 3)).double()
    flat = FlatModel(module)
    data = AnalysisData(torch.randn(20, 12, dtype=torch.float64), torch.randint(0, 3, (20,)), 8)
    op = HessianOperator(Objective(flat, flat.buffers(), data, "train-batch-stats"), flat.vector(),
                         keep_graph=True)
    v = torch.randn(flat.dim, dtype=torch.float64)
    torch.testing.assert_close(op @ v, op @ v, rtol=0, atol=0)  # one frozen mask: looks deterministic
    with pytest.raises(LandscapeError, match="not deterministic"):
        op.check_determinism(seed=1)


def test_progress_is_called_after_every_product():
    flat, data = _mlp()
    calls = []
    op = HessianOperator(Objective(flat, flat.buffers(), data), flat.vector(),
                         progress=lambda done, total: calls.append((done, total)))
    op @ torch.ones(flat.dim, dtype=torch.float64)
    op.matmat(torch.ones(flat.dim, 3, dtype=torch.float64))
    op.check_determinism()
    assert calls == [(1, None), (4, None), (5, None), (6, None)]


class _TanhWithoutForwardDerivative(torch.autograd.Function):
    """tanh with a backward and no jvp: forward-mode differentiation cannot pass it."""

    @staticmethod
    def forward(x):
        return x.tanh()

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(output)

    @staticmethod
    def backward(ctx, grad):
        (output,) = ctx.saved_tensors
        return grad * (1 - output * output)


@pytest.mark.parametrize("loss", ["mse", nn.MSELoss()])
def test_forward_over_reverse_with_an_mse_loss_equals_double_backward_and_the_dense_hessian(loss):
    # F.mse_loss's mean raised "ZeroTensors are immutable" inside torch.func.jvp of torch.func.grad
    torch.manual_seed(2)
    module = nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 2)).double()  # 37 parameters
    x, y = torch.randn(30, 4, dtype=torch.float64), torch.randn(30, 2, dtype=torch.float64)
    flat, data = FlatModel(module), AnalysisData(x, y, 16)  # batches of 16 and 14
    w = flat.vector()

    def mean_squared_error(u):  # written out: (1 / (n * outputs)) sum of squared residuals
        out = functional_call(module, flat.params(u), (x,))
        return ((out - y) ** 2).sum() / y.numel()

    hessian = torch.autograd.functional.hessian(mean_squared_error, w)
    obj = Objective(flat, flat.buffers(), data, loss=loss)
    vectors = torch.randn(flat.dim, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    forward = HessianOperator(obj, w, "forward-over-reverse").matmat(vectors)
    reverse = HessianOperator(obj, w, "double-backward").matmat(vectors)
    torch.testing.assert_close(forward, hessian @ vectors, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(forward, reverse, rtol=1e-12, atol=1e-14)


def test_forward_over_reverse_names_the_other_backend_where_an_op_has_no_forward_derivative():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.first, self.second = nn.Linear(4, 5), nn.Linear(5, 3)

        def forward(self, x):
            return self.second(_TanhWithoutForwardDerivative.apply(self.first(x)))

    torch.manual_seed(3)
    flat = FlatModel(Net().double())
    data = AnalysisData(torch.randn(12, 4, dtype=torch.float64), torch.randint(0, 3, (12,)), 12)
    obj = Objective(flat, flat.buffers(), data)
    v = torch.randn(flat.dim, dtype=torch.float64)
    HessianOperator(obj, flat.vector(), "double-backward") @ v  # the backward pass exists
    with pytest.raises(LandscapeError, match=r"^the forward-over-reverse Hessian-vector product failed in "
                       r"PyTorch's forward-mode differentiation \(.+\); use hvp = \"double-backward\"$"):
        HessianOperator(obj, flat.vector(), "forward-over-reverse") @ v
