"""A plain PyTorch federated loop of its own (FedAvg or FedSAM, no landscape.train) that records its run with
``landscape.RunWriter`` and, if asked, saves its models as loose state_dict files (for ``landscape import``), and
the package ``rwlab`` (a float64 model factory and a digits data factory) it names. The tests of the run format
(tests/store/test_run_writer.py, tests/workflows/test_import.py) share it."""

from __future__ import annotations

import copy
import json
import sys
import textwrap
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.func import functional_call

import landscape

NETS = """
import torch
from torch import nn


def make_net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 8), nn.Tanh(), nn.Linear(8, 10)).double()


def make_wide_net():
    return nn.Sequential(nn.Linear(64, 9), nn.Tanh(), nn.Linear(9, 10)).double()
"""
DATA = """
import torch
from sklearn.datasets import load_digits


def make_train_set():
    d = load_digits()
    return torch.tensor(d.data[:240] / 16.0), torch.tensor(d.target[:240])


def make_test_set():
    d = load_digits()
    return torch.tensor(d.data[240:300] / 16.0), torch.tensor(d.target[240:300])
"""
CLIENTS, ROUNDS, LR, RHO, BATCH = 4, 3, 0.2, 0.05, 20


def write_lab(root: Path) -> None:
    """The package ``rwlab`` under ``root``, put first on sys.path (``forget_lab`` takes it away)."""
    (root / "rwlab").mkdir()
    (root / "rwlab" / "__init__.py").write_text("")
    (root / "rwlab" / "nets.py").write_text(textwrap.dedent(NETS))
    (root / "rwlab" / "data.py").write_text(textwrap.dedent(DATA))
    sys.path.insert(0, str(root))


def forget_lab(root: Path) -> None:
    sys.path.remove(str(root))
    for name in [m for m in sys.modules if m == "rwlab" or m.startswith("rwlab.")]:
        del sys.modules[name]


def partition_of(y: torch.Tensor) -> dict[int, list[int]]:
    """Label-skewed equal shares: the samples sorted by label, cut into CLIENTS blocks."""
    order = np.argsort(y.numpy(), kind="stable")
    return {i: sorted(int(v) for v in block) for i, block in enumerate(np.array_split(order, CLIENTS))}


def local_epoch(net, x, y, sam: bool, order: torch.Tensor | None = None):
    """One epoch of plain SGD (FedAvg's client) or SAM (FedSAM's: the gradient at w + rho g/||g||)."""
    for b in (torch.arange(len(y)) if order is None else order).split(BATCH):
        params = dict(net.named_parameters())
        loss = F.cross_entropy(net(x[b]), y[b])
        grads = torch.autograd.grad(loss, list(params.values()))
        if sam:
            norm = torch.sqrt(sum((g ** 2).sum() for g in grads))
            shifted = {n: p + RHO * g / norm for (n, p), g in zip(params.items(), grads)}
            loss = F.cross_entropy(functional_call(net, shifted, (x[b],)), y[b])
            grads = torch.autograd.grad(loss, list(params.values()))
        with torch.no_grad():
            for p, g in zip(params.values(), grads):
                p -= LR * g


def train(path, sam: bool, files: Path | None = None, rounds: int = ROUNDS, shuffle: int | None = None,
          **writer) -> dict[int, list[int]]:
    """A plain federated loop of its own: every client every round, the global model the clients' average;
    recorded at ``path`` (None: not recorded), its models saved under ``files`` too when given
    (global/round-{round}.pt, clients/round-{round}/client-{client}.pt) with partition.json beside them.
    ``shuffle``: the seed of the clients' minibatch order (None: in index order)."""
    from rwlab.data import make_train_set
    from rwlab.nets import make_net

    x, y = make_train_set()
    x = x.double()
    parts = partition_of(y)
    net = make_net()
    saved = _Files(files, parts)
    generator = torch.Generator().manual_seed(shuffle or 0)  # the clients' minibatch order, when shuffled
    with _writer(path, sam, parts, **writer) as w:
        w.round(0, end=net)
        saved.round(0, net.state_dict(), {})
        for t in range(1, rounds + 1):
            start = copy.deepcopy(net.state_dict())
            returned = {}
            for i, idx in parts.items():
                local = make_net()
                local.load_state_dict(start)
                order = None if shuffle is None else torch.randperm(len(idx), generator=generator)
                local_epoch(local, x[idx], y[idx], sam, order)
                returned[i] = local.state_dict()
            net.load_state_dict({k: torch.stack([returned[i][k] for i in parts]).mean(0) for k in start})
            w.round(t, start=start, clients=returned, end=net, metrics={"local_epochs_done": t})
            saved.round(t, net.state_dict(), returned)
    return parts


class _Nothing:
    def round(self, *args, **kwargs) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass


def _writer(path, sam: bool, parts: dict, **writer):
    if path is None:
        return _Nothing()
    return landscape.RunWriter(path, model="rwlab.nets:make_net", data="rwlab.data:make_train_set",
                               test_data="rwlab.data:make_test_set", partition=parts,
                               algorithm="fedsam" if sam else "fedavg",
                               hyperparameters={"lr": LR, "batch_size": BATCH, "local_epochs": 1,
                                                **({"rho": RHO} if sam else {})}, **writer)


class _Files:
    """The loop's models as loose state_dict files, as a research code base saves them."""

    def __init__(self, folder: Path | None, parts: dict) -> None:
        self.folder = folder
        if folder is not None:
            (folder / "global").mkdir(parents=True)
            (folder / "partition.json").write_text(json.dumps({str(k): v for k, v in parts.items()}))

    def round(self, t: int, end: dict, clients: dict) -> None:
        if self.folder is None:
            return
        torch.save(end, self.folder / "global" / f"round-{t}.pt")
        for i, state in clients.items():
            (self.folder / "clients" / f"round-{t}").mkdir(parents=True, exist_ok=True)
            torch.save(state, self.folder / "clients" / f"round-{t}" / f"client-{i}.pt")
