"""The eigenvalue density of a symmetric operator by stochastic Lanczos quadrature (``slq_density``; Ghorbani,
Krishnan & Xiao 2019): Gauss quadrature from Lanczos runs (the process in ``krylov``) started at Rademacher
probes, smoothed by Gaussians, returned as a frozen ``DensityResult`` with the trace estimate it implies.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from landscape.core.errors import LandscapeError
from landscape.measure.krylov import lanczos, tridiagonal
from landscape.measure.lanczos import host_array
from landscape.measure.operator import LinearOperator, Progress
from landscape.measure.probes import (
    float_norm,
    mean_and_stderr,
    progress_reporter,
    rademacher_vectors,
    seeded_generator,
)


@dataclass(frozen=True)
class DensityResult:
    """SLQ spectral density: quadrature nodes and weights per run, and their Gaussian-smoothed density.

    ``weights`` already include the 1/runs factor, so they sum to 1 over all runs; padded entries (a run
    whose Krylov space was exhausted before ``steps``) have weight 0. ``density`` = sum of
    weights * N(grid; node, sigma^2); ``mass`` is its trapezoidal integral over ``grid`` (1 up to the tails
    the grid cuts off). ``trace`` = dim * sum(weights * nodes) (each run's first moment is z^T H z / dim,
    a Hutchinson sample) with ``trace_stderr`` = sd / sqrt(runs) of the runs' dim * first moments: an
    estimate with ``trace_stderr_dof`` = runs - 1 degrees of freedom (1 at runs = 2, where a 95% Student-t
    interval is +- 12.7 stderr; inf at runs = 1, which has no spread to measure). ``nodes``, ``weights``
    ([runs, steps]), ``grid`` and ``density`` are float64 numpy arrays (tensors given are brought to the host,
    their numbers unchanged).
    """

    nodes: np.ndarray
    weights: np.ndarray
    grid: np.ndarray
    density: np.ndarray
    sigma: float
    mass: float
    trace: float
    trace_stderr: float
    trace_stderr_dof: int
    runs: int
    steps: int
    hvp_count: int
    seed: int

    def __post_init__(self) -> None:
        for name in ("nodes", "weights", "grid", "density"):
            object.__setattr__(self, name, host_array(getattr(self, name), np.float64))

    @property
    def mean(self) -> float:
        """The density's first moment, an estimate of trace / dim."""
        return float((self.weights * self.nodes).sum())

    def summary(self) -> dict[str, Any]:
        return {
            "nodes": self.nodes.tolist(),
            "weights": self.weights.tolist(),
            "grid": self.grid.tolist(),
            "density": self.density.tolist(),
            "sigma": self.sigma,
            "mass": self.mass,
            "trace": self.trace,
            "trace_stderr": self.trace_stderr,
            "trace_stderr_dof": self.trace_stderr_dof,
            "runs": self.runs,
            "steps": self.steps,
            "hvp_count": self.hvp_count,
            "seed": self.seed,
        }


def slq_density(
    op: LinearOperator,
    *,
    runs: int = 4,
    steps: int = 80,
    seed: int = 0,
    grid: Tensor | None = None,
    grid_points: int = 2000,
    sigma: float | None = None,
    progress: Progress | None = None,
) -> DensityResult:
    """Stochastic Lanczos quadrature (Ghorbani et al. 2019): the eigenvalue density of ``op``.

    Each of ``runs`` runs starts Lanczos (full reorthogonalisation, ``steps`` products) from a normalised
    Rademacher vector z; the eigen-decomposition T = S diag(theta) S^T of its tridiagonal gives Gauss
    quadrature nodes theta_i and weights s_{1,i}^2 with z^T f(H) z / ||z||^2 ~ sum_i s_{1,i}^2 f(theta_i).
    The density is (1/runs) sum over runs and nodes of s_{1,i}^2 N(t; theta_i, sigma^2) on ``grid``
    (default: ``grid_points`` points over [min node - 6 sigma, max node + 6 sigma]; sigma default: 1% of
    the node range). ``progress(done, runs * steps)`` after each product (a run whose Krylov space is
    exhausted early ends below the total). ``trace`` and ``trace_stderr`` are over the runs, with runs - 1
    degrees of freedom (``DensityResult``).
    """
    if runs < 1 or steps < 1:
        raise LandscapeError(f"SLQ needs runs >= 1 and steps >= 1, got runs={runs}, steps={steps}")
    if sigma is not None and sigma <= 0:
        raise LandscapeError(f"sigma must be > 0, got {sigma}")
    first_count = op.hvp_count
    steps = min(steps, op.dim)
    generator = seeded_generator(seed)
    nodes = torch.zeros(runs, steps, dtype=torch.float64)
    weights = torch.zeros(runs, steps, dtype=torch.float64)
    report = progress_reporter(op, progress, runs * steps)
    for run in range(runs):
        z = rademacher_vectors(op, generator, 1)[:, 0]
        run_ = lanczos(op, z / float_norm(z), steps, generator, restart=False,
                       on_step=None if report is None else lambda _: report())
        theta, s = torch.linalg.eigh(tridiagonal(run_.alphas, run_.betas))
        m = theta.numel()
        nodes[run, :m] = theta
        nodes[run, m:] = theta[-1]  # padding for a run that exhausted its Krylov space: weight 0
        weights[run, :m] = s[0] ** 2 / runs
    first_moments = (weights * nodes).sum(dim=1) * runs  # z^T H z / dim per run
    trace, trace_stderr = mean_and_stderr(first_moments * op.dim)
    lo, hi = float(nodes.min()), float(nodes.max())
    if sigma is None:
        sigma = 0.01 * (hi - lo) if hi > lo else max(1e-2 * abs(hi), 1e-8)
    if grid is None:
        grid = torch.linspace(lo - 6 * sigma, hi + 6 * sigma, grid_points, dtype=torch.float64)
    grid = torch.as_tensor(grid, dtype=torch.float64).flatten()
    gaussians = torch.exp(-0.5 * ((grid[:, None] - nodes.flatten()[None, :]) / sigma) ** 2)
    density = gaussians @ weights.flatten() / (sigma * math.sqrt(2 * math.pi))
    mass = float(torch.trapezoid(density, grid)) if grid.numel() > 1 else 0.0
    return DensityResult(nodes, weights, grid, density, float(sigma), mass, trace, trace_stderr, runs - 1,
                         runs, steps, op.hvp_count - first_count, seed)

