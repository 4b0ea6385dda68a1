"""F = (1/N) sum_i F_i (``incompatibility.ClientMean``) evaluated with the clients' batches together
(``joint_batches``): against each client's loss computed by hand, against each client evaluated alone, the
forward passes it packs (whole batches, in client order, at most the analysis batch size) and where it must not
pack them (BatchNorm on batch statistics or recomputed per client)."""

import pytest
import torch
import torch.nn.functional as F
from support.problems import narrow_resnet18

from landscape.core.flat import FlatModel
from landscape.measure.analysis_data import AnalysisData
from landscape.measure.incompatibility import ClientMean, joint_batches
from landscape.measure.objective import Objective
from landscape.models import build_model

SIZES = (300, 300, 700, 5, 1)  # client 2 spans two analysis batches; 3 and 4 share a pass with its second
BATCH = 512


def clients(module: torch.nn.Module, bn_mode: str = "eval", sizes=SIZES, shape=(1, 8, 8), classes=10):
    torch.manual_seed(0)
    flat = FlatModel(module.double())
    buffers = flat.buffers()
    out = {}
    for i, n in enumerate(sizes):
        data = AnalysisData(torch.randn(n, *shape, dtype=torch.float64), torch.randint(0, classes, (n,)), BATCH)
        out[i] = Objective(flat, buffers, data, bn_mode)
    return flat, out


def alone(mean: ClientMean, w: torch.Tensor) -> torch.Tensor:
    """The same F with every client evaluated alone (the path without joint passes)."""
    return sum(o.loss(w).double() for o in mean.objectives) / len(mean.objectives)


def test_the_joint_mean_is_each_clients_mean_loss_averaged():
    flat, objectives = clients(build_model("cnn", (1, 8, 8), 10))
    w = flat.vector() + 0.01
    mean = ClientMean(objectives)
    assert mean.joint is not None
    by_hand = torch.stack([F.cross_entropy(flat.logits(w, o.data.x, {}), o.data.y).double()
                           for o in objectives.values()]).mean()  # every client counts once
    joint = mean.loss(w)
    torch.testing.assert_close(joint, by_hand, rtol=1e-12, atol=0)
    torch.testing.assert_close(joint, alone(mean, w), rtol=1e-12, atol=0)


def test_the_passes_pack_whole_batches_in_client_order():
    _, objectives = clients(build_model("cnn", (1, 8, 8), 10))
    passes = joint_batches(list(objectives.values()))
    assert passes == [[(0, 0, 300)], [(1, 0, 300)], [(2, 0, 512)], [(2, 512, 700), (3, 0, 5), (4, 0, 1)]]
    module_calls = []
    mean = ClientMean(objectives)
    flat = mean.objectives[0].flat
    handle = flat.module.register_forward_hook(lambda m, i, o: module_calls.append(i[0].shape[0]))
    try:
        mean.loss(flat.vector())
    finally:
        handle.remove()
    assert module_calls == [300, 300, 512, 194]  # one forward pass per packed pass, not one per client batch


def test_many_small_clients_share_a_forward_pass():
    sizes = (14,) * 100
    _, objectives = clients(build_model("cnn", (1, 8, 8), 10), sizes=sizes)
    passes = joint_batches(list(objectives.values()))
    assert [sum(stop - start for _, start, stop in p) for p in passes] == [504, 504, 392]
    assert [piece[0] for p in passes for piece in p] == list(range(100))


@pytest.mark.parametrize("bn_mode", ["train-batch-stats", "recompute"])
def test_batch_statistics_keep_every_client_alone(bn_mode):
    """A client's BatchNorm statistics are its own batch's (or its own data's): no joint pass, the loss is
    that of each client evaluated alone, to the last bit."""
    flat, objectives = clients(narrow_resnet18(3, 5, "bn"), bn_mode, sizes=(6, 9, 4), shape=(3, 8, 8), classes=5)
    mean = ClientMean(objectives)
    assert mean.joint is None
    w = flat.vector()
    assert mean.loss(w).item() == alone(mean, w).item()


def test_batchnorm_in_eval_mode_packs_and_agrees():
    flat, objectives = clients(narrow_resnet18(3, 5, "bn"), "eval", sizes=(6, 9, 4), shape=(3, 8, 8), classes=5)
    mean = ClientMean(objectives)
    assert mean.joint == [[(0, 0, 6), (1, 0, 9), (2, 0, 4)]]
    w = flat.vector()
    torch.testing.assert_close(mean.loss(w), alone(mean, w), rtol=1e-12, atol=0)


def test_objectives_of_other_models_are_evaluated_alone():
    _, first = clients(build_model("cnn", (1, 8, 8), 10), sizes=(5, 6))
    _, second = clients(build_model("cnn", (1, 8, 8), 10), sizes=(7,))
    assert joint_batches([first[0], first[1], second[0]]) is None
    assert joint_batches([first[0], first[1]]) == [[(0, 0, 5), (1, 0, 6)]]
