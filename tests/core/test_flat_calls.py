"""How ``FlatModel`` calls its module (issue 23: the per-call costs a small client pays on every evaluation):
the training flags are switched only where one differs and every module's own flag comes back; the search for
tied tensors runs only on a model that has them, and a tie is kept."""

from __future__ import annotations

import pytest
import torch
import torch.nn.utils.stateless as stateless
from torch import nn

from landscape.core.flat import FlatModel
from landscape.measure.analysis_data import AnalysisData
from landscape.measure.objective import Objective


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
