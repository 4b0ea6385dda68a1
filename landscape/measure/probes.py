"""Random probe vectors, their sample statistics and per-product progress: what the stochastic spectral solvers
(``lanczos``, ``trace``, ``density``) share.

Random vectors come from a CPU ``torch.Generator`` seeded with ``seed`` (``seeded_generator``), so a result does
not depend on the device or on the global RNG: Gaussian vectors (Lanczos start vectors, XTrace probes) and
Rademacher vectors (the probes of Hutchinson 1989, Hutch++ and SLQ) are drawn on the CPU and moved to the
operator's device and dtype.

Progress: every solver takes ``progress(done, total)`` (``operator.Progress``), called after each product (or
block of products) with the products this call has computed so far and its budget (None where the solver stops
on convergence and the count is not known in advance: ``lanczos_topk``, ``power_iteration``).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from landscape.measure.operator import LinearOperator, Progress


def seeded_generator(seed: int) -> torch.Generator:
    """A CPU generator seeded with ``seed``: the only source of a solver's random vectors."""
    return torch.Generator().manual_seed(int(seed))


def gaussian_vectors(op: LinearOperator, generator: torch.Generator, columns: int | None = None) -> Tensor:
    """A standard normal vector [dim] (``columns`` None) or matrix [dim, columns] in the operator's dtype."""
    shape = (op.dim,) if columns is None else (op.dim, columns)
    return torch.randn(shape, generator=generator, dtype=torch.float64).to(op.device, op.dtype)


def rademacher_vectors(op: LinearOperator, generator: torch.Generator, columns: int) -> Tensor:
    """A [dim, columns] matrix of independent random signs +-1 in the operator's dtype."""
    signs = torch.randint(0, 2, (op.dim, columns), generator=generator, dtype=torch.int8)
    return (2 * signs - 1).to(op.device, op.dtype)


def float_norm(a: Tensor) -> float:
    """||a|| as a Python float (computed in ``a``'s dtype, read in float64)."""
    return float(torch.linalg.vector_norm(a).double())


def progress_reporter(op: LinearOperator, progress: Progress | None, total: int) -> Callable[[], None] | None:
    """A report() that calls progress(products so far, total), or None without a callback."""
    if progress is None:
        return None
    first = op.hvp_count
    return lambda: progress(op.hvp_count - first, total)


def mean_and_stderr(samples: Tensor) -> tuple[float, float]:
    """The mean of ``samples`` and its standard error sd / sqrt(n) (inf for a single sample)."""
    n = samples.numel()
    stderr = float(samples.std(unbiased=True) / math.sqrt(n)) if n > 1 else math.inf
    return float(samples.mean()), stderr
