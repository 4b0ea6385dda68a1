"""No graph, tensor or operator outlives the call that made it (issue 47, item 1): after ``hessian_eigs``, the
hessian pass (in ``landscape analyze``, and its sequence of solvers on one operator), or a Hessian operator's
kept gradient graphs, the tensors alive after a garbage collection are those alive before, in number and in
bytes. Before the fix every operator left its first batch's gradient graph behind (the saved-tensor pack hook
of ``products.measured_gradient`` kept each saved tensor with its ``grad_fn``: a reference cycle through C++
that no collection frees): 15 tensors (0.27 MiB) per ``hessian_eigs`` on the small CNN here, 59 per hessian
pass on the six-round run, 45 MiB (graph measured, then rebuilt) to 90 MiB (kept graphs) per operator on the
ResNet-18-GN."""

from __future__ import annotations

import gc
import shutil

import pytest
import torch
from support.helpers import analyze_args, invoke
from torch import nn

import landscape
from landscape.measure import functions
from landscape.measure.lanczos import client_lambda_max
from landscape.measure.objective import Problem
from landscape.measure.operator import HessianOperator
from landscape.models import build_model


def live_tensors() -> tuple[int, int]:
    """(tensors alive after a full collection, bytes of their storages, each storage once)."""
    gc.collect()
    count, storages = 0, {}
    for obj in gc.get_objects():
        if issubclass(type(obj), torch.Tensor):  # type(), not isinstance: no __class__ lookup on odd objects
            count += 1
            storage = obj.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
    return count, sum(storages.values())


def held_after_each(call, times: int = 3) -> list[tuple[int, int]]:
    """``live_tensors()`` after one warm-up call (caches, lazy modules) and after each of ``times`` more."""
    call()
    held = [live_tensors()]
    for _ in range(times):
        call()
        held.append(live_tensors())
    return held


def small_cnn() -> Problem:
    torch.manual_seed(0)
    module = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                           nn.Conv2d(8, 8, 3, padding=1), nn.Tanh(), nn.Flatten(), nn.Linear(8 * 8 * 8, 10)).eval()
    g = torch.Generator().manual_seed(0)
    data = (torch.randn(32, 3, 16, 16, generator=g), torch.randint(0, 10, (32,), generator=g))
    return landscape.problem(module, data, batch_size=16)


def resnet18_gn(samples: int = 2) -> Problem:
    """ResNet-18 with GroupNorm (11 M parameters) on ``samples`` random 3x16x16 inputs, one batch: seconds."""
    torch.manual_seed(0)
    module = build_model("resnet18", (3, 16, 16), 10, {"norm": "gn"}).eval()
    g = torch.Generator().manual_seed(0)
    data = (torch.randn(samples, 3, 16, 16, generator=g), torch.randint(0, 10, (samples,), generator=g))
    return landscape.problem(module, data, batch_size=samples)


def test_hessian_eigs_leaves_no_tensor_behind():
    p = small_cnn()
    held = held_after_each(lambda: landscape.hessian_eigs(p, k=2, seed=0))
    assert held == [held[0]] * len(held), held


def test_the_hessian_pass_solvers_on_one_operator_leave_no_tensor_behind():
    """The hessian pass's sequence (``landscape.analyze.passes.hessian``): one operator, its backend decided on a
    measured first-batch graph, then eigenvalues, two traces, a density through its kept graphs, its release,
    and per-client lambda_max operators."""
    p = small_cnn()
    clients = {i: p.objective.with_data(p.objective.data.subset(torch.arange(16 * i, 16 * i + 16)))
               for i in range(2)}

    def hessian_pass() -> None:
        op = functions.hessian_operator(p, hvp="auto")
        backend = op.decide_backend()
        shared = {"seed": 0, "hvp": backend, "operator": op}
        functions.hessian_eigs(p, 2, tol=1e-3, **shared)
        functions.trace(p, hvps=6, method="xtrace", **shared)
        functions.trace(p, hvps=6, method="hutchinson", **shared)
        functions.density(p, runs=1, steps=5, **shared)
        op.release()
        client_lambda_max(clients, p.w, seed=0, backend=backend)

    held = held_after_each(hessian_pass, times=2)
    assert held == [held[0]] * len(held), held


def test_the_hessian_pass_leaves_no_tensor_behind(six_round_run, tmp_path):
    """``landscape analyze --passes hessian`` in process, on a fresh copy of the six-round run each time."""
    copies = iter(range(10))

    def analyze() -> None:
        run = shutil.copytree(six_round_run, tmp_path / f"run-{next(copies)}", ignore=shutil.ignore_patterns("analysis"))
        result = invoke(*analyze_args(run, "--passes", "hessian", "--set", "hessian.top_k=2",
                                      "--set", "hessian.trace_hvps=6", "--set", "hessian.density_steps=5"))
        assert result.exit_code == 0, result.output

    held = held_after_each(analyze, times=2)
    assert held == [held[0]] * len(held), held


@pytest.mark.parametrize("keep_graph", [True, False], ids=["kept-graphs", "rebuilt"])
def test_a_resnet18_gn_operator_leaves_no_graph_behind(keep_graph):
    """ResNet-18-GN at a batch of 2: its backend decided on a measured first-batch graph, one product (through
    the kept graphs, the first of them measured too, or rebuilt), the operator deleted."""
    p = resnet18_gn()
    v = torch.randn(p.flat.dim, generator=torch.Generator().manual_seed(1))

    def product() -> None:
        op = HessianOperator(p.objective, p.w, "auto", keep_graph=keep_graph)
        op.decide_backend()
        op @ v
        assert op.keeps_graph is keep_graph

    held = held_after_each(product, times=2)
    assert held == [held[0]] * len(held), held
