"""Small problems several test modules analyse."""

from __future__ import annotations

import torch

from landscape.core.flat import FlatModel
from landscape.data.datasets import load_dataset
from landscape.data.partitions import make_partition
from landscape.measure.analysis_data import AnalysisData
from landscape.measure.objective import Objective
from landscape.models import build_model
from landscape.models.resnet import ResNet18, norm_factory


def digits_clients(clients: int = 4, alpha: float = 0.3):
    """(flat, F, {client: F_i}, w): a float64 MLP (one hidden layer of 16) after 30 full-batch gradient steps of
    rate 0.5 on the digits training set, and ``clients`` clients of a per-class Dirichlet(``alpha``) split
    (seed 0)."""
    bundle = load_dataset("digits", root="data", download=False, augment=False, num_clients=clients, seed=0,
                          options={})
    parts = make_partition("dirichlet", bundle.train.y.numpy(), num_clients=clients, num_classes=10, seed=0,
                           options={"alpha": alpha})
    torch.manual_seed(0)
    flat = FlatModel(build_model("mlp", (1, 8, 8), 10, {"hidden": [16]}).double())
    data = AnalysisData(bundle.train.x.double(), bundle.train.y, 256)
    glob = Objective(flat, {}, data)
    w = flat.vector()
    for _ in range(30):
        w = w - 0.5 * glob.loss_and_grad(w)[1]
    clients = {k: glob.with_data(data.subset(torch.as_tensor(ix))) for k, ix in enumerate(parts)}
    return flat, glob, clients, w


class NarrowResNet18(ResNet18):
    """ResNet-18's graph (the CIFAR stem, four stages of two BasicBlocks, the 1x1 shortcuts with their norms) at
    widths 4, 8, 8, 16 instead of 64 to 512: what normalisation and residual paths do, at a 1,000th of the
    backward cost."""

    WIDTHS = (4, 8, 8, 16)


def narrow_resnet18(in_channels: int, classes: int, norm: str) -> NarrowResNet18:
    """A :class:`NarrowResNet18` with ``norm`` ("bn", or "gn" in 2 groups as the resnet18 model's default)."""
    return NarrowResNet18(in_channels, classes, norm_factory(norm, 2))
