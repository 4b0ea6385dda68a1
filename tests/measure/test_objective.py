"""The analysis objective: F over batches equals F over the whole set; BN modes; nothing on the model moves."""

import torch
import torch.nn.functional as F
from support.problems import narrow_resnet18

from landscape.core.flat import FlatModel
from landscape.measure.analysis_data import AnalysisData
from landscape.measure.objective import Objective
from landscape.models import build_model


def _setup(norm="bn", n=40, batch=16, dtype=torch.float64):
    torch.manual_seed(0)
    module = narrow_resnet18(3, 5, norm).to(dtype) if norm else None
    if module is None:
        module = build_model("cnn", (1, 8, 8), 10).to(dtype)
    shape = (n, 3, 8, 8) if norm else (n, 1, 8, 8)
    x = torch.randn(shape, dtype=dtype)
    y = torch.randint(0, 5, (n,))
    return FlatModel(module), AnalysisData(x, y, batch)


def test_whole_set_loss_and_gradient_weight_batches_by_size():
    flat, data = _setup(norm=None, n=37, batch=16)
    w = flat.vector()
    obj = Objective(flat, flat.buffers(), data)
    loss, grad = obj.loss_and_grad(w)
    ref_w = w.clone().requires_grad_(True)
    ref = F.cross_entropy(flat.logits(ref_w, data.x, {}), data.y)
    (ref_grad,) = torch.autograd.grad(ref, ref_w)
    torch.testing.assert_close(loss, ref.detach().double(), rtol=1e-12, atol=0)
    torch.testing.assert_close(obj.loss(w), ref.detach().double(), rtol=1e-12, atol=0)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-10, atol=1e-14)


def test_bn_modes_leave_the_model_untouched():
    flat, data = _setup()
    module = flat.module
    module.train()
    before = {k: v.clone() for k, v in module.state_dict().items()}
    flags = [p.requires_grad for p in module.parameters()]
    w = flat.vector()
    losses = {}
    for mode in ("eval", "train-batch-stats", "recompute"):
        obj = Objective(flat, flat.buffers(), data, mode)
        losses[mode] = obj.loss_and_grad(w)[0].item()
        assert obj.loss(w).item() == losses[mode] or abs(obj.loss(w).item() - losses[mode]) < 1e-12
        assert module.training  # restored
    after = module.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert [p.requires_grad for p in module.parameters()] == flags
    assert all(p.grad is None for p in module.parameters())
    assert len({round(v, 10) for v in losses.values()}) == 3  # the three modes differ on a BN model


def test_recompute_uses_the_analysis_data_statistics():
    flat, data = _setup(n=32, batch=32)
    w = flat.vector()
    obj = Objective(flat, flat.buffers(), data, "recompute")
    # One batch holding all the data: the recomputed statistics are that batch's (up to PyTorch's unbiased
    # running variance, n/(n-1)), so recompute ~ train-batch-stats, and far from the initial statistics.
    train_mode = Objective(flat, flat.buffers(), data, "train-batch-stats")
    eval_mode = Objective(flat, flat.buffers(), data, "eval")
    recomputed, batch_stats, initial = obj.loss(w).item(), train_mode.loss(w).item(), eval_mode.loss(w).item()
    assert abs(recomputed - batch_stats) < 0.02 * batch_stats
    assert abs(recomputed - batch_stats) < 0.2 * abs(initial - batch_stats)


def test_batch_losses_are_each_batchs_own_mean_loss():
    """One forward of several batches together gives each its own loss; where batch statistics or a custom
    loss tie the batches together, each batch is evaluated alone."""
    for norm, mode, loss in ((None, "eval", None), ("bn", "eval", None), ("bn", "train-batch-stats", None),
                             (None, "eval", "mse")):
        flat, data = _setup(norm=norm, n=30)
        if loss == "mse":  # regression targets
            data = AnalysisData(data.x, F.one_hot(data.y, 10).double())
        obj = Objective(flat, flat.buffers(), data, mode, loss=loss)
        w = flat.vector() + 0.01
        batches = [obj.data.take(torch.arange(a, b)) for a, b in ((0, 7), (7, 19), (3, 30))]
        got = obj.batch_losses(w, batches)
        want = torch.stack([obj.batch_loss(w, b).double() for b in batches])
        assert got.dtype == torch.float64 and got.shape == (3,)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=0)
        if mode == "train-batch-stats":  # each batch normalised by its own statistics: not one forward
            together = obj.batch_loss(w, (torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])))
            assert abs(float(together) - float(want.mean())) > 1e-6


def _bits(a, b):
    return torch.equal(a, b) and a.dtype == b.dtype


def test_deferred_gradient_is_loss_and_grad_bit_for_bit():
    models = ((None, ("eval",)), ("bn", ("eval", "train-batch-stats", "recompute")), ("gn", ("eval",)))
    for norm, modes in models:
        for n, batch in ((40, 64), (40, 16)):  # one batch; three batches
            flat, data = _setup(norm=norm, n=n, batch=batch, dtype=torch.float32)
            w = flat.vector() + 0.01
            for mode in modes:
                obj = Objective(flat, flat.buffers(), data, mode)
                loss, grad = obj.loss_and_grad(w)
                for expect in (False, True):
                    deferred, gradient = obj.loss_and_deferred_grad(w, expect_gradient=expect)
                    assert _bits(deferred, loss), (norm, n, mode, expect)
                    assert _bits(gradient(), grad), (norm, n, mode, expect)


def test_deferred_gradient_that_is_never_asked_for_costs_no_backward_pass():
    flat, data = _setup(norm=None, n=40, batch=16)
    w = flat.vector()
    obj = Objective(flat, flat.buffers(), data)
    calls = []
    real = flat.leaves

    def counting_leaves(v):
        leaves = real(v)
        original = leaves.backward
        leaves.backward = lambda *a, **k: (calls.append(1), original(*a, **k))[1]
        return leaves

    flat.leaves = counting_leaves
    loss, gradient = obj.loss_and_deferred_grad(w)
    assert calls == [] and torch.isfinite(loss)
    gradient()
    assert len(calls) == 3  # one per batch, only when asked (a second forward pass on several batches)
    calls.clear()
    obj.loss_and_deferred_grad(w, expect_gradient=True)
    assert len(calls) == 3  # expected: at once
    one = Objective(flat, flat.buffers(), AnalysisData(data.x, data.y, 64))  # one batch: the graph is kept
    calls.clear()
    loss, gradient = one.loss_and_deferred_grad(w, expect_gradient=True)
    assert calls == []
    gradient()
    assert len(calls) == 1
