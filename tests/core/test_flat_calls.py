"""How ``FlatModel`` calls its module (issues 23 and 47: the per-call costs a small client pays on every
evaluation): the training flags are switched only where one differs and every module's own flag comes back, and
the models an analysis owns (the CLI's, the API's copy) are put in the BN mode's flags once, so that no evaluation
switches one, with the same numbers; a convolution weight's channels-last copy is reused while the weights are
unchanged and nothing records a gradient through it; the search for tied tensors runs only on a model that has
them, and a tie is kept."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.utils.stateless as stateless
from torch import nn

import landscape
from landscape.analyze.context import CheckpointContext
from landscape.analyze.settings import AnalysisSettings
from landscape.analyze.source import find_sources
from landscape.core import flat as flat_module
from landscape.core.flat import FlatModel
from landscape.measure.analysis_data import AnalysisData
from landscape.measure.objective import BN_MODES, Objective
from landscape.models import build_model


def _bn_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(6, 5), nn.BatchNorm1d(5), nn.ReLU(), nn.Linear(5, 3))


def _count_train_calls(module: nn.Module) -> list[bool]:
    calls: list[bool] = []
    original = module.train

    def train(mode: bool = True) -> nn.Module:
        calls.append(mode)
        return original(mode)

    module.train = train  # an instance attribute: what FlatModel.mode calls
    return calls


def test_mode_switches_nothing_when_every_flag_already_matches():
    module = _bn_model().eval()
    flat = FlatModel(module)
    calls = _count_train_calls(module)
    data = AnalysisData(torch.randn(8, 6), torch.randint(0, 3, (8,)))
    objective = Objective(flat, flat.buffers(), data, "eval")
    objective.loss_and_grad(flat.vector())
    objective.loss(flat.vector())
    assert calls == []  # already in eval mode: no switch, no restore
    batch_stats = Objective(flat, flat.buffers(), data, "train-batch-stats")
    seen = []
    hook = module[2].register_forward_pre_hook(lambda m, args: seen.append(m.training))
    batch_stats.loss(flat.vector())
    hook.remove()
    assert calls == [True] and seen == [True]  # switched for the evaluation ...
    assert not any(m.training for m in module.modules())  # ... and set back


def test_mode_restores_each_modules_own_flag():
    """A model in training mode with its BatchNorm held in eval mode (frozen statistics) gets both back."""
    module = _bn_model().train()
    module[2].eval()
    flat = FlatModel(module)
    with flat.mode(False):
        assert not any(m.training for m in module.modules())
    assert module.training and not module[2].training
    with flat.mode(True):
        assert all(m.training for m in module.modules())
    assert module.training and not module[2].training
    with pytest.raises(RuntimeError), flat.mode(False):
        raise RuntimeError("a failing evaluation")
    assert module.training and not module[2].training


class _Tied(nn.Module):
    """Two linear maps sharing one weight tensor (``b.weight`` is ``a.weight``)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4, bias=False)
        self.b = nn.Linear(4, 4, bias=False)
        self.b.weight = self.a.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.tanh(self.a(x)))


def test_tied_weights_stay_tied_and_only_a_tied_model_searches_for_ties(monkeypatch):
    torch.manual_seed(0)
    tied = FlatModel(_Tied())
    assert tied.names == ["a.weight"]  # one tensor under two names: one entry of w
    untie = stateless._untie_named_tensors_map
    searches = []

    def counted(module, tensors):
        searches.append(type(module).__name__)
        return untie(module, tensors)

    monkeypatch.setattr(stateless, "_untie_named_tensors_map", counted)
    x = torch.randn(3, 4)
    v = torch.randn(16)
    got = tied.logits(v, x, {})
    m = v.view(4, 4)
    torch.testing.assert_close(got, torch.tanh(x @ m.T) @ m.T)  # the new weight in both maps
    assert searches == ["_Tied"]
    plain = FlatModel(_bn_model().eval())
    w = plain.vector() + 0.1
    with torch.no_grad():
        want = plain.load_into_module(w, plain.buffers())(x_plain := torch.randn(4, 6))
    assert torch.equal(plain.logits(w, x_plain, plain.buffers()), want)
    assert searches == ["_Tied"]  # no tie to search for in the BatchNorm MLP


@pytest.mark.parametrize("bn_mode", BN_MODES)
def test_the_api_copy_is_set_to_the_bn_modes_flags_once_and_gives_the_same_numbers(bn_mode):
    """Issue 47: the analysed model rested in training mode, so every evaluation flipped every flag and back."""
    module = _bn_model().train()
    x, y = torch.randn(12, 6), torch.randint(0, 3, (12,))
    p = landscape.problem(module, (x, y), bn_mode=bn_mode, batch_size=8)
    assert {m.training for m in p.flat.module.modules()} == {bn_mode == "train-batch-stats"}
    assert module.training  # the caller's model keeps its flag
    calls = _count_train_calls(p.flat.module)
    loss, grad = p.objective.loss_and_grad(p.w)
    value, accuracy = p.objective.loss(p.w), p.objective.accuracy(p.w)
    # recompute: the statistics are recomputed (once per w) in training mode, the one switch left
    assert calls == ([True] if bn_mode == "recompute" else [])
    # the same numbers as an objective over a model resting in training mode, which switched at every call
    resting = FlatModel(copy.deepcopy(module))
    before = Objective(resting, resting.buffers(), AnalysisData(x, y, 8), bn_mode)
    old_loss, old_grad = before.loss_and_grad(p.w)
    assert torch.equal(loss, old_loss) and torch.equal(grad, old_grad)
    assert torch.equal(value, before.loss(p.w)) and accuracy == before.accuracy(p.w)


@pytest.mark.parametrize("bn_mode", ["eval", "train-batch-stats"])
def test_the_analysis_model_is_set_to_the_bn_modes_flags_where_it_is_built(one_round_run, bn_mode):
    sources, _ = find_sources(one_round_run)
    ctx = CheckpointContext(sources[0], 1, AnalysisSettings(device="cpu", analysis_samples=50, bn_mode=bn_mode))
    assert {m.training for m in ctx.flat.module.modules()} == {bn_mode == "train-batch-stats"}
    calls = _count_train_calls(ctx.flat.module)
    glob, client = ctx.objective, ctx.client_objective(0)
    checks = len(calls)  # building an objective checks the data against the model once, in eval mode
    assert checks == (2 if bn_mode == "train-batch-stats" else 0)
    for _ in range(3):
        glob.loss_and_grad(ctx.w)
        client.loss(ctx.w)
    assert len(calls) == checks  # no evaluation switches a flag


def test_a_channels_last_weight_copy_is_reused_while_the_weights_are_unchanged(monkeypatch):
    """Issue 47: the convolution weights were copied to channels-last at every forward, the same weights too."""
    copies: list[tuple[int, ...]] = []
    original = flat_module.channels_last_copy

    def counted(tensor):
        if tensor.dim() == 4 and tensor.shape[0] != 5:  # the weights' copies, not the inputs' (5 samples)
            copies.append(tuple(tensor.shape))
        return original(tensor)

    monkeypatch.setattr(flat_module, "channels_last_copy", counted)
    torch.manual_seed(0)
    flat = FlatModel(build_model("cnn", (3, 8, 8), 10, {}))
    flat.channels_last = True
    x, y = torch.randn(5, 3, 8, 8), torch.randint(0, 10, (5,))
    w = flat.vector()
    with torch.no_grad():
        first = flat.logits(w, x, {})
        assert len(copies) == 2  # the two convolution weights
        again = flat.logits(w, x, {})
        assert len(copies) == 2 and torch.equal(first, again)  # the same w, unchanged: the copies reused
        w.mul_(1.5)  # changed in place (its version counter moves): new copies of the new values
        moved = flat.logits(w, x, {})
        assert len(copies) == 4
        other = w.clone()
        assert torch.equal(flat.logits(other, x, {}), moved) and len(copies) == 6  # another tensor: new copies
    with flat.layout(False), torch.no_grad():
        plain = flat.logits(w, x, {})
    torch.testing.assert_close(moved, plain)  # the reused copies hold the new weights (to the layout's rounding)
    fresh = FlatModel(flat.module)
    fresh.channels_last = True
    with torch.no_grad():
        assert torch.equal(fresh.logits(w, x, {}), moved)  # bit for bit a new copy's forward
    # a gradient's forward copies every time (the copy is part of its graph), and its gradient is the same
    count = len(copies)
    grads = [flat.loss_and_grad(w, x, y, {})[1] for _ in range(2)]
    assert len(copies) == count + 4 and torch.equal(grads[0], grads[1])
    w.requires_grad_(True)
    flat.logits(w, x, {}).sum().backward()  # through a copy of this forward's own
    assert len(copies) == count + 6 and w.grad is not None
