"""Helpers for the spectral solver tests (test_lanczos, test_trace, test_density): a 1,210-parameter MLP on
200 digits in float64, its Hessian operator, its dense Hessian computed independently of the operator, and a
recorder of ``progress(done, total)`` calls.

A test module binds the problem as its fixture: ``digits_mlp = pytest.fixture(scope="module",
name="digits_mlp")(digits_mlp_problem)``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch.func import functional_call

from landscape.core.flat import FlatModel
from landscape.measure.analysis_data import AnalysisData
from landscape.measure.objective import Objective
from landscape.measure.operator import HessianOperator
from landscape.models import build_model


def dense_hessian(flat: FlatModel, data: AnalysisData, w: torch.Tensor) -> torch.Tensor:
    """grad^2 of the mean CE over the whole of ``data`` in one piece (no batches): independent of the
    operator."""

    def loss(u):
        return F.cross_entropy(functional_call(flat.module, flat.params(u), (data.x,)), data.y)

    return torch.autograd.functional.hessian(loss, w, vectorize=True)


def digits_mlp_problem():
    """A 1,210-parameter MLP on 200 digits (float64), its objective in batches of 50, and its dense Hessian:
    (flat, data, w, hessian, its eigenvalues ascending)."""
    torch.manual_seed(0)
    module = build_model("mlp", (1, 8, 8), 10, {"hidden": [16]}).double()
    digits = load_digits()
    x = torch.tensor(digits.data[:200] / 16.0).reshape(-1, 1, 8, 8)
    y = torch.tensor(digits.target[:200])
    flat = FlatModel(module)
    data = AnalysisData(x, y, 50)
    w = flat.vector()
    hessian = dense_hessian(flat, data, w)
    return flat, data, w, hessian, torch.linalg.eigvalsh(hessian)


def hessian_op(digits_mlp, backend="double-backward"):
    """A fresh Hessian operator of the problem's objective at its weights (product count 0)."""
    flat, data, w, _, _ = digits_mlp
    return HessianOperator(Objective(flat, flat.buffers(), data), w, backend)


def progress_recorder():
    """(calls, progress): ``progress(done, total)`` appends (done, total) to ``calls``."""
    calls = []
    return calls, lambda done, total: calls.append((done, total))
