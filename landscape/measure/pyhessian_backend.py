"""lambda_max and trace by the PyHessian package (Yao et al. 2020), on the same data, for cross-checking.

``pyhessian_lambda_max_and_trace`` runs ``pyhessian.hessian`` (0.1) on a deep copy of the model holding the
checkpoint's weights, with the analysis data as its "dataloader" (the list of the data's fixed batches).
What PyHessian 0.1 does, read from its source, and how it is handled here:

- it puts the model in eval mode and leaves create_graph tensors in every parameter's ``.grad``: it only
  ever sees the deep copy, so the caller's module (weights, training flag, ``.grad``) is untouched. Eval mode
  means BatchNorm uses the given running statistics: compare with the native ``eval`` BN mode (or pass the
  recomputed statistics as ``buffers``);
- ``cuda=True`` is its default: here it is ``device.type == "cuda"``, and the model and batches are moved to
  ``device`` first;
- its dataloader HVP weights each batch's HVP (of the batch-mean loss) by the batch size and divides by the
  total, i.e. exactly F's weighting, so any batch sizes compare exactly with ``HessianOperator``;
- its random vectors come from the global torch RNG: seeded with ``seed`` inside ``torch.random.fork_rng``,
  so the caller's RNG state is unchanged;
- ``trace()`` stops when |mean_i - mean_{i-1}| / (mean_{i-1} + 1e-6) < tol, which is true at the second
  probe whenever the running mean is negative (negative curvature), and can stop after a few probes by
  chance otherwise. Worked around: ``trace_iters`` Rademacher probes are pushed through PyHessian's own
  HVP (``dataloader_hv_product``), giving mean and standard error; the sample count and estimate its rule
  would have produced on the same probes are reported as ``rule_samples`` / ``rule_trace``;
- ``density()`` calls ``torch.eig``, removed from PyTorch: not used (``density.slq_density`` is the ESD).

HVPs are counted by wrapping the instance's ``dataloader_hv_product`` (one call = one full-data HVP).
"""

from __future__ import annotations

import contextlib
import copy
import math
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from landscape.core.errors import LandscapeError
from landscape.core.flat import FlatModel
from landscape.measure.analysis_data import AnalysisData


@dataclass(frozen=True)
class PyHessianResult:
    """PyHessian's top eigenvalues (power iteration, its order) and Hutchinson trace, with HVP counts and times."""

    eigenvalues: tuple[float, ...]
    trace: float | None
    trace_stderr: float | None
    trace_samples: int
    rule_samples: int | None
    rule_trace: float | None
    eigen_hvp_count: int
    trace_hvp_count: int
    eigen_seconds: float
    trace_seconds: float
    seed: int
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def lambda_max(self) -> float:
        return self.eigenvalues[0]

    @property
    def hvp_count(self) -> int:
        return self.eigen_hvp_count + self.trace_hvp_count

    @property
    def seconds(self) -> float:
        return self.eigen_seconds + self.trace_seconds

    def summary(self) -> dict[str, Any]:
        return {
            "eigenvalues": list(self.eigenvalues),
            "trace": self.trace,
            "trace_stderr": self.trace_stderr,
            "trace_samples": self.trace_samples,
            "rule_samples": self.rule_samples,
            "rule_trace": self.rule_trace,
            "eigen_hvp_count": self.eigen_hvp_count,
            "trace_hvp_count": self.trace_hvp_count,
            "eigen_seconds": self.eigen_seconds,
            "trace_seconds": self.trace_seconds,
            "seed": self.seed,
            "settings": dict(self.settings),
        }


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _pyhessian_trace_rule(samples: list[float], tol: float) -> int:
    """How many of ``samples`` PyHessian 0.1's ``hessian.trace`` would consume before its stopping rule fires."""
    trace = 0.0
    for i in range(len(samples)):
        mean = sum(samples[: i + 1]) / (i + 1)
        if abs(mean - trace) / (trace + 1e-6) < tol:
            return i + 1
        trace = mean
    return len(samples)


def pyhessian_lambda_max_and_trace(
    module: nn.Module,
    data: AnalysisData,
    w: Tensor,
    *,
    buffers: dict[str, Tensor] | None = None,
    top_n: int = 1,
    trace_iters: int = 100,
    max_iter: int = 100,
    tol: float = 1e-3,
    device: torch.device | str | None = None,
    seed: int = 0,
) -> PyHessianResult:
    """PyHessian's top ``top_n`` eigenvalues (``hessian.eigenvalues(maxIter=max_iter, tol=tol)``) and a
    ``trace_iters``-probe Hutchinson trace through its HVP (0: no trace), of mean CE over ``data`` at ``w``.

    ``module`` is deep-copied, moved to ``device`` (default: w's) in w's dtype, and loaded with ``w`` and
    ``buffers`` (default: the module's own buffers and frozen parameters); the caller's module is never modified.
    ``w`` holds the trainable parameters (``FlatModel``): PyHessian differentiates those with requires_grad.
    """
    from pyhessian import hessian as PyHessian  # imported on use: only this backend needs it

    if top_n < 1 or max_iter < 1 or trace_iters < 0:
        raise LandscapeError(
            f"PyHessian needs top_n >= 1, max_iter >= 1 and trace_iters >= 0, got {top_n}, {max_iter}, {trace_iters}"
        )
    device = torch.device(device) if device is not None else w.device
    model = copy.deepcopy(module).to(device=device, dtype=w.dtype)
    # w holds the trainable parameters (FlatModel), exactly those PyHessian differentiates (requires_grad)
    flat = FlatModel(model)
    if w.shape != (flat.dim,):
        raise LandscapeError(f"w must be a flat vector of the model's {flat.dim} trainable parameters, got shape "
                             f"{tuple(w.shape)}")
    flat.load_into_module(w.detach().to(device), flat.buffers() if buffers is None else buffers)
    batches = [
        (x.to(device, w.dtype) if x.is_floating_point() else x.to(device), y.to(device)) for x, y in data.batches()
    ]
    cuda = device.type == "cuda"
    # PyHessian draws its vectors on the CPU (torch.randn(...).to(device)) and means "the current CUDA device"
    # by "cuda": fork the CPU RNG only, and make ``device`` the current CUDA device.
    with (
        torch.random.fork_rng(devices=[]),
        torch.cuda.device(device) if cuda else contextlib.nullcontext(),
        warnings.catch_warnings(),
    ):
        # Its loss.backward(create_graph=True) makes parameter <-> .grad cycles; broken below (zero_grad).
        warnings.filterwarnings("ignore", message=r"Using backward\(\) with create_graph=True")
        torch.manual_seed(seed)
        engine = PyHessian(model, nn.CrossEntropyLoss(), dataloader=batches, cuda=cuda)
        calls = [0]
        hv_product = engine.dataloader_hv_product

        def counted_hv_product(v: list[Tensor]) -> tuple[float, list[Tensor]]:
            calls[0] += 1
            return hv_product(v)

        engine.dataloader_hv_product = counted_hv_product

        _synchronize(device)
        started = time.perf_counter()
        eigenvalues, _ = engine.eigenvalues(maxIter=max_iter, tol=tol, top_n=top_n)
        _synchronize(device)
        eigen_seconds = time.perf_counter() - started
        eigen_hvps = calls[0]

        generator = torch.Generator().manual_seed(seed)
        samples: list[float] = []
        started = time.perf_counter()
        for _ in range(trace_iters):
            probe = [
                (2 * torch.randint(0, 2, p.shape, generator=generator) - 1).to(device, p.dtype) for p in engine.params
            ]
            _, hv = engine.dataloader_hv_product(probe)
            samples.append(float(sum((a * b).sum() for a, b in zip(probe, hv))))
        _synchronize(device)
        trace_seconds = time.perf_counter() - started
        trace_hvps = calls[0] - eigen_hvps
    model.zero_grad(set_to_none=True)  # the copy's .grad fields hold graphs: free them now
    del engine, model

    trace = stderr = rule_trace = None
    rule_samples = None
    if samples:
        trace = sum(samples) / len(samples)
        if len(samples) > 1:
            variance = sum((s - trace) ** 2 for s in samples) / (len(samples) - 1)
            stderr = math.sqrt(variance / len(samples))
        rule_samples = _pyhessian_trace_rule(samples, tol)
        rule_trace = sum(samples[:rule_samples]) / rule_samples
    return PyHessianResult(
        eigenvalues=tuple(float(e) for e in eigenvalues),
        trace=trace,
        trace_stderr=stderr,
        trace_samples=len(samples),
        rule_samples=rule_samples,
        rule_trace=rule_trace,
        eigen_hvp_count=eigen_hvps,
        trace_hvp_count=trace_hvps,
        eigen_seconds=eigen_seconds,
        trace_seconds=trace_seconds,
        seed=seed,
        settings={"top_n": top_n, "max_iter": max_iter, "tol": tol, "trace_iters": trace_iters,
                  "device": str(device), "batches": len(batches), "pyhessian_trace": "rademacher loop via its HVP"},
    )
