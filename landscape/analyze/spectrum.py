"""Spectral solvers over a symmetric linear operator (``landscape.analyze.operator``): top eigenpairs, trace,
spectral density. Plain functions returning frozen result dataclasses that carry residuals, HVP counts,
seeds and settings, so every reported number says how far it can be trusted.

- ``lanczos_topk``: Lanczos with full reorthogonalisation, growing the Krylov space until the wanted Ritz
  pairs' residuals meet the tolerance; ``power_iteration``: deflated power iteration as in PyHessian (the
  baseline it is compared with).
- ``hutchinson_trace`` (Rademacher probes) and ``hutchpp_trace`` (Meyer, Musco, Musco & Woodruff 2021).
- ``slq_density``: stochastic Lanczos quadrature (Ghorbani, Krishnan & Xiao 2019), the eigenvalue density.
- ``client_lambda_max``: lambda_max of each client's F_i (local vs global flatness).

Random vectors come from a CPU ``torch.Generator`` seeded with ``seed``, so a result does not depend on the
device or on the global RNG. Tridiagonal matrices and all reported scalars are float64.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from landscape.analyze.objective import Objective
from landscape.analyze.operator import HessianOperator, LinearOperator
from landscape.errors import LandscapeError

WHICH = ("largest-algebraic", "smallest-algebraic", "largest-magnitude")


# ----------------------------------------------------------------------------------------------------------
# results


@dataclass(frozen=True)
class EigenResult:
    """k eigenpair estimates, ordered by ``which`` (largest-algebraic: values descending).

    ``residuals[j]`` = ||H v_j - values[j] v_j|| for unit v_j; ``residual_source`` says how it was obtained:
    ``hvp`` (recomputed with true products, counted in ``hvp_count``), ``lanczos`` (|beta_m s_{m,j}| from the
    Lanczos relation, exact in exact arithmetic) or ``power`` (from the last power step's product).
    ``converged[j]``: Lanczos: residual <= tol * |value|; power iteration: PyHessian's rule, the relative
    change of the Rayleigh quotient fell below tol (a weaker test; the residuals show how much weaker).
    """

    method: str
    values: Tensor
    residuals: Tensor
    relative_residuals: Tensor
    converged: Tensor
    hvp_count: int
    iterations: int
    seed: int
    tol: float
    which: str
    residual_source: str
    settings: dict[str, Any] = field(default_factory=dict)
    vectors: Tensor | None = field(default=None, repr=False)

    @property
    def top_ratio(self) -> float:
        """lambda_1 / lambda_k (the FedSAM-paper flatness indicator)."""
        return float(self.values[0] / self.values[-1])

    def summary(self) -> dict[str, Any]:
        """JSON-ready fields (no vectors)."""
        return {
            "method": self.method,
            "values": self.values.tolist(),
            "residuals": self.residuals.tolist(),
            "relative_residuals": self.relative_residuals.tolist(),
            "converged": self.converged.tolist(),
            "hvp_count": self.hvp_count,
            "iterations": self.iterations,
            "seed": self.seed,
            "tol": self.tol,
            "which": self.which,
            "residual_source": self.residual_source,
            "settings": dict(self.settings),
        }


@dataclass(frozen=True)
class TraceResult:
    """A stochastic trace estimate and its standard error (see the estimator's docstring)."""

    method: str
    estimate: float
    stderr: float
    samples: int
    hvp_count: int
    seed: int
    settings: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "estimate": self.estimate,
            "stderr": self.stderr,
            "samples": self.samples,
            "hvp_count": self.hvp_count,
            "seed": self.seed,
            "settings": dict(self.settings),
        }


@dataclass(frozen=True)
class DensityResult:
    """SLQ spectral density: quadrature nodes and weights per run, and their Gaussian-smoothed density.

    ``weights`` already include the 1/runs factor, so they sum to 1 over all runs; padded entries (a run
    whose Krylov space was exhausted before ``steps``) have weight 0. ``density`` = sum of
    weights * N(grid; node, sigma^2); ``mass`` is its trapezoidal integral over ``grid`` (1 up to the tails
    the grid cuts off). ``trace`` = dim * sum(weights * nodes) (each run's first moment is z^T H z / dim,
    a Hutchinson sample) with ``trace_stderr`` from the spread of the runs.
    """

    nodes: Tensor
    weights: Tensor
    grid: Tensor
    density: Tensor
    sigma: float
    mass: float
    trace: float
    trace_stderr: float
    runs: int
    steps: int
    hvp_count: int
    seed: int

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
            "runs": self.runs,
            "steps": self.steps,
            "hvp_count": self.hvp_count,
            "seed": self.seed,
        }


# ----------------------------------------------------------------------------------------------------------
# helpers


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(int(seed))


def _gaussian(op: LinearOperator, generator: torch.Generator, columns: int | None = None) -> Tensor:
    shape = (op.dim,) if columns is None else (op.dim, columns)
    return torch.randn(shape, generator=generator, dtype=torch.float64).to(op.device, op.dtype)


def _rademacher(op: LinearOperator, generator: torch.Generator, columns: int) -> Tensor:
    signs = torch.randint(0, 2, (op.dim, columns), generator=generator, dtype=torch.int8)
    return (2 * signs - 1).to(op.device, op.dtype)


def _dot(a: Tensor, b: Tensor) -> float:
    return float(torch.dot(a, b).double())


def _norm(a: Tensor) -> float:
    return float(torch.linalg.vector_norm(a).double())


def _tridiagonal(alphas: list[float], betas: list[float]) -> Tensor:
    """The symmetric tridiagonal T (float64) with diagonal ``alphas`` and off-diagonal ``betas``."""
    t = torch.diag(torch.tensor(alphas, dtype=torch.float64))
    if betas:
        off = torch.tensor(betas, dtype=torch.float64)
        t += torch.diag(off, 1) + torch.diag(off, -1)
    return t


def _select(theta: Tensor, k: int, which: str) -> Tensor:
    """Indices of the k wanted Ritz values, in report order."""
    if which == "largest-algebraic":
        order = torch.argsort(theta, descending=True)
    elif which == "smallest-algebraic":
        order = torch.argsort(theta)
    else:
        order = torch.argsort(theta.abs(), descending=True)
    return order[:k]


class _Basis:
    """Orthonormal Krylov basis stored as the columns of a growing [dim, capacity] buffer."""

    def __init__(self, op: LinearOperator, capacity: int) -> None:
        self.columns = torch.empty(op.dim, max(capacity, 1), dtype=op.dtype, device=op.device)
        self.size = 0

    @property
    def matrix(self) -> Tensor:
        return self.columns[:, : self.size]

    def append(self, q: Tensor) -> None:
        if self.size == self.columns.shape[1]:
            grown = torch.empty(self.columns.shape[0], 2 * self.size, dtype=q.dtype, device=q.device)
            grown[:, : self.size] = self.columns
            self.columns = grown
        self.columns[:, self.size] = q
        self.size += 1

    def orthogonalise(self, z: Tensor) -> Tensor:
        """z minus its projection on the basis, by two passes of classical Gram-Schmidt ("twice is enough")."""
        q = self.matrix
        for _ in range(2):
            z = z - q @ (q.T @ z)
        return z


def _lanczos(
    op: LinearOperator,
    start: Tensor,
    steps: int,
    generator: torch.Generator,
    *,
    restart: bool,
    stop: Any = None,
    capacity: int | None = None,
) -> tuple[_Basis, list[float], list[float], float]:
    """Lanczos with full reorthogonalisation from ``start`` (unit norm) for at most ``steps`` products.

    Returns (basis, alphas, betas, beta_last): T_m = tridiag(alphas, betas) and H Q_m = Q_m T_m +
    beta_last q_{m+1} e_m^T. When the Krylov space becomes invariant (beta ~ 0) the run either stops
    (``restart=False``) or continues from a fresh random vector orthogonal to the basis (``restart=True``,
    recorded as a zero off-diagonal, so T stays block-diagonal and the Lanczos relation still holds).
    ``stop(alphas, betas, beta_last)`` is called after each step and ends the run when it returns True.
    ``capacity``: basis columns allocated up front (default steps + 1); the buffer doubles when it fills.
    """
    eps = torch.finfo(op.dtype).eps
    basis = _Basis(op, steps + 1 if capacity is None else min(capacity, steps + 1))
    basis.append(start)
    alphas: list[float] = []
    betas: list[float] = []
    beta = 0.0
    scale = 0.0  # largest ||H q|| seen: a lower bound on ||H||, the yardstick for "beta ~ 0"
    while len(alphas) < steps:
        q = basis.matrix[:, -1]
        z = op.matvec(q)
        z_norm, alpha = torch.linalg.vector_norm(z).double(), torch.dot(q, z).double()
        z = basis.orthogonalise(z)  # removes alpha q + beta q_prev and every rounding-error component
        # ||H q||, alpha and beta reach the host together: one device sync per step
        z_norm, alpha, beta = torch.stack([z_norm, alpha, torch.linalg.vector_norm(z).double()]).tolist()
        scale = max(scale, z_norm)
        alphas.append(alpha)
        if stop is not None and stop(alphas, betas, beta):
            break
        if len(alphas) == steps or basis.size == op.dim:
            if basis.size == op.dim:
                beta = 0.0  # the whole space is spanned: T is similar to H
            break
        if beta <= 100 * eps * scale:  # invariant subspace found
            if not restart:
                beta = 0.0
                break
            z = basis.orthogonalise(_gaussian(op, generator))
            norm = _norm(z)
            if norm == 0.0:
                break
            betas.append(0.0)
            basis.append(z / norm)
            beta = 0.0
            continue
        betas.append(beta)
        basis.append(z / beta)
    return basis, alphas, betas, beta


# ----------------------------------------------------------------------------------------------------------
# eigenvalues


def lanczos_topk(
    op: LinearOperator,
    k: int = 5,
    *,
    krylov: int | None = None,
    tol: float = 1e-3,
    max_iter: int | None = None,
    seed: int = 0,
    which: str = "largest-algebraic",
    keep_vectors: bool = False,
    verify: bool = True,
) -> EigenResult:
    """The k extreme eigenpairs of ``op`` by Lanczos with full reorthogonalisation, without restarts.

    The Krylov space grows one product at a time; from ``krylov`` (default k + 10) dimensions on, the k wanted
    Ritz pairs' residuals |beta_m s_{m,j}| (Lanczos relation, free) are checked after every step, and the run
    stops when all meet ``residual <= tol * |theta_j|`` or after ``max_iter`` products (default
    max(100, 2 * krylov), at most ``dim``). The basis is kept on the operator's device in its dtype: memory
    dim * (Krylov size, rounded up to krylov + 1 times a power of 2) elements. With ``verify`` (default) the k Ritz vectors are multiplied by ``op`` once
    more (k products, one matmat) and the reported residuals and converged flags use these true residuals.
    An invariant Krylov space (beta ~ 0) restarts from a random vector orthogonal to the basis, so repeated
    eigenvalues are found too.
    """
    if which not in WHICH:
        raise LandscapeError(f"unknown eigenvalue selection '{which}'; choose from: {', '.join(WHICH)}")
    if not 1 <= k <= op.dim:
        raise LandscapeError(f"k must be between 1 and the dimension {op.dim}, got {k}")
    if tol <= 0:
        raise LandscapeError(f"tol must be > 0, got {tol}")
    krylov = k + 10 if krylov is None else krylov
    if krylov <= k:
        raise LandscapeError(f"the Krylov size must exceed k={k}, got {krylov}")
    max_iter = max(100, 2 * krylov) if max_iter is None else max_iter
    if max_iter < krylov:
        raise LandscapeError(f"max_iter ({max_iter}) must be at least the Krylov size ({krylov})")
    krylov, max_iter = min(krylov, op.dim), min(max_iter, op.dim)
    first_count = op.hvp_count
    generator = _generator(seed)
    start = _gaussian(op, generator)

    def wanted_converged(alphas: list[float], betas: list[float], beta: float) -> bool:
        if len(alphas) < krylov:
            return False
        theta, s = torch.linalg.eigh(_tridiagonal(alphas, betas))
        index = _select(theta, k, which)
        return bool((beta * s[-1, index].abs() <= tol * theta[index].abs()).all())

    basis, alphas, betas, beta = _lanczos(
        op, start / _norm(start), max_iter, generator, restart=True, stop=wanted_converged, capacity=krylov + 1
    )
    theta, s = torch.linalg.eigh(_tridiagonal(alphas, betas))
    index = _select(theta, min(k, len(alphas)), which)
    values = theta[index]
    lanczos_residuals = beta * s[-1, index].abs()
    vectors = basis.matrix[:, : len(alphas)] @ s[:, index].to(op.device, op.dtype)
    vectors = vectors / torch.linalg.vector_norm(vectors, dim=0, keepdim=True)
    if verify:
        product = op.matmat(vectors)
        residuals = torch.linalg.vector_norm(
            (product - vectors * values.to(op.device, op.dtype)).double(), dim=0
        ).cpu()
    else:
        residuals = lanczos_residuals
    relative = residuals / values.abs()
    return EigenResult(
        method="lanczos",
        values=values,
        residuals=residuals,
        relative_residuals=relative,
        converged=residuals <= tol * values.abs(),
        hvp_count=op.hvp_count - first_count,
        iterations=len(alphas),
        seed=seed,
        tol=tol,
        which=which,
        residual_source="hvp" if verify else "lanczos",
        settings={"k": k, "krylov": krylov, "max_iter": max_iter, "verify": verify,
                  "lanczos_residuals": lanczos_residuals.tolist()},
        vectors=vectors if keep_vectors else None,
    )


def power_iteration(
    op: LinearOperator,
    k: int = 1,
    *,
    tol: float = 1e-3,
    max_iter: int = 100,
    seed: int = 0,
    keep_vectors: bool = False,
) -> EigenResult:
    """The baseline: PyHessian's deflated power iteration (``hessian.eigenvalues``), for comparison.

    For each of the k eigenvalues: a Gaussian start vector; each step orthogonalises v against the
    eigenvectors found so far, normalises, multiplies and takes the Rayleigh quotient v^T H v; it stops when
    that changes by less than tol relative to the previous one, or after ``max_iter`` products. Finds the
    eigenvalues of largest magnitude (a negative one can come first). The residual of each (value, vector)
    pair comes free from its last product.
    """
    if not 1 <= k <= op.dim:
        raise LandscapeError(f"k must be between 1 and the dimension {op.dim}, got {k}")
    if max_iter < 1:
        raise LandscapeError(f"max_iter must be >= 1, got {max_iter}")
    first_count = op.hvp_count
    generator = _generator(seed)
    found: list[Tensor] = []
    values, residuals, converged, steps = [], [], [], 0
    for _ in range(k):
        v = _gaussian(op, generator)
        previous = None
        done = False
        for _ in range(max_iter):
            for u in found:  # deflation (PyHessian: orthnormal(v, eigenvectors))
                v = v - _dot(u, v) * u
            vector = v / _norm(v)
            hv = op.matvec(vector)
            steps += 1
            value = _dot(vector, hv)
            residual = _norm(hv - value * vector)
            if previous is not None and abs(value - previous) / (abs(previous) + 1e-6) < tol:
                done = True
                break
            previous = value
            v = hv
        found.append(vector)
        values.append(value)
        residuals.append(residual)
        converged.append(done)
    values_t = torch.tensor(values, dtype=torch.float64)
    residuals_t = torch.tensor(residuals, dtype=torch.float64)
    return EigenResult(
        method="power",
        values=values_t,
        residuals=residuals_t,
        relative_residuals=residuals_t / values_t.abs(),
        converged=torch.tensor(converged),
        hvp_count=op.hvp_count - first_count,
        iterations=steps,
        seed=seed,
        tol=tol,
        which="largest-magnitude",
        residual_source="power",
        settings={"k": k, "max_iter": max_iter},
        vectors=torch.stack(found, dim=1) if keep_vectors else None,
    )


# ----------------------------------------------------------------------------------------------------------
# trace


def _hutchinson_samples(op: LinearOperator, probes: Tensor, block: int, project: Tensor | None = None) -> Tensor:
    """z_i^T H z_i for the columns z_i of ``probes`` (first projected onto the complement of ``project``'s
    columns, if given), ``block`` products per matmat; float64 on the CPU."""
    samples = []
    for start in range(0, probes.shape[1], block):
        z = probes[:, start : start + block]
        if project is not None:
            z = z - project @ (project.T @ z)
        samples.append((z * op.matmat(z)).sum(dim=0).double().cpu())
    return torch.cat(samples)


def _mean_and_stderr(samples: Tensor) -> tuple[float, float]:
    n = samples.numel()
    stderr = float(samples.std(unbiased=True) / math.sqrt(n)) if n > 1 else math.inf
    return float(samples.mean()), stderr


def hutchinson_trace(op: LinearOperator, *, samples: int = 100, seed: int = 0, block: int = 10) -> TraceResult:
    """tr(H) ~ mean of z^T H z over Rademacher probes z (Hutchinson 1989); stderr = sample std / sqrt(n).

    ``block`` probes share one matmat (with the double-backward operator, one gradient graph per batch).
    """
    if samples < 2:
        raise LandscapeError(f"Hutchinson needs at least 2 samples for a standard error, got {samples}")
    first_count = op.hvp_count
    probes = _rademacher(op, _generator(seed), samples)
    estimate, stderr = _mean_and_stderr(_hutchinson_samples(op, probes, max(block, 1)))
    return TraceResult("hutchinson", estimate, stderr, samples, op.hvp_count - first_count, seed,
                       {"probes": "rademacher", "block": block})


def hutchpp_trace(op: LinearOperator, *, hvps: int = 99, seed: int = 0, block: int = 10) -> TraceResult:
    """Hutch++ (Meyer et al. 2021, Algorithm 1) with ``hvps`` products split in three equal parts.

    S, G: Rademacher [dim, s] and [dim, g] (s = hvps // 3, g = hvps - 2s); Q = orth(H S) (s products);
    tr(H) ~ tr(Q^T H Q) (s products) + mean_i g_i^T (I - QQ^T) H (I - QQ^T) g_i (g products). The first
    term is exact given Q, so the standard error is the Hutchinson part's: the sample std of the g deflated
    quadratic forms / sqrt(g) (conditional on Q).
    """
    if hvps < 6:
        raise LandscapeError(f"Hutch++ needs at least 6 Hessian-vector products, got {hvps}")
    first_count = op.hvp_count
    generator = _generator(seed)
    sketch = hvps // 3
    residual_probes = hvps - 2 * sketch
    s = _rademacher(op, generator, sketch)
    g = _rademacher(op, generator, residual_probes)
    q, _ = torch.linalg.qr(op.matmat(s))  # Householder QR: orthonormal columns even if H S is rank-deficient
    low_rank_part = float((q * op.matmat(q)).sum().double())
    estimate, stderr = _mean_and_stderr(_hutchinson_samples(op, g, max(block, 1), project=q))
    return TraceResult("hutch++", low_rank_part + estimate, stderr, hvps, op.hvp_count - first_count, seed,
                       {"probes": "rademacher", "sketch": sketch, "residual_probes": residual_probes,
                        "low_rank_part": low_rank_part, "block": block})


# ----------------------------------------------------------------------------------------------------------
# spectral density


def slq_density(
    op: LinearOperator,
    *,
    runs: int = 4,
    steps: int = 80,
    seed: int = 0,
    grid: Tensor | None = None,
    grid_points: int = 2000,
    sigma: float | None = None,
) -> DensityResult:
    """Stochastic Lanczos quadrature (Ghorbani et al. 2019): the eigenvalue density of ``op``.

    Each of ``runs`` runs starts Lanczos (full reorthogonalisation, ``steps`` products) from a normalised
    Rademacher vector z; the eigen-decomposition T = S diag(theta) S^T of its tridiagonal gives Gauss
    quadrature nodes theta_i and weights s_{1,i}^2 with z^T f(H) z / ||z||^2 ~ sum_i s_{1,i}^2 f(theta_i).
    The density is (1/runs) sum over runs and nodes of s_{1,i}^2 N(t; theta_i, sigma^2) on ``grid``
    (default: ``grid_points`` points over [min node - 6 sigma, max node + 6 sigma]; sigma default: 1% of
    the node range).
    """
    if runs < 1 or steps < 1:
        raise LandscapeError(f"SLQ needs runs >= 1 and steps >= 1, got runs={runs}, steps={steps}")
    if sigma is not None and sigma <= 0:
        raise LandscapeError(f"sigma must be > 0, got {sigma}")
    first_count = op.hvp_count
    steps = min(steps, op.dim)
    generator = _generator(seed)
    nodes = torch.zeros(runs, steps, dtype=torch.float64)
    weights = torch.zeros(runs, steps, dtype=torch.float64)
    for run in range(runs):
        z = _rademacher(op, generator, 1)[:, 0]
        _, alphas, betas, _ = _lanczos(op, z / _norm(z), steps, generator, restart=False)
        theta, s = torch.linalg.eigh(_tridiagonal(alphas, betas))
        m = theta.numel()
        nodes[run, :m] = theta
        nodes[run, m:] = theta[-1]  # padding for a run that exhausted its Krylov space: weight 0
        weights[run, :m] = s[0] ** 2 / runs
    first_moments = (weights * nodes).sum(dim=1) * runs  # z^T H z / dim per run
    trace, trace_stderr = _mean_and_stderr(first_moments * op.dim)
    lo, hi = float(nodes.min()), float(nodes.max())
    if sigma is None:
        sigma = 0.01 * (hi - lo) if hi > lo else max(1e-2 * abs(hi), 1e-8)
    if grid is None:
        grid = torch.linspace(lo - 6 * sigma, hi + 6 * sigma, grid_points, dtype=torch.float64)
    grid = torch.as_tensor(grid, dtype=torch.float64).flatten()
    gaussians = torch.exp(-0.5 * ((grid[:, None] - nodes.flatten()[None, :]) / sigma) ** 2)
    density = gaussians @ weights.flatten() / (sigma * math.sqrt(2 * math.pi))
    mass = float(torch.trapezoid(density, grid)) if grid.numel() > 1 else 0.0
    return DensityResult(nodes, weights, grid, density, float(sigma), mass, trace, trace_stderr, runs, steps,
                         op.hvp_count - first_count, seed)


# ----------------------------------------------------------------------------------------------------------
# local curvature


def client_lambda_max(
    objectives: dict[int, Objective],
    w: Tensor,
    *,
    tol: float = 1e-3,
    seed: int = 0,
    backend: str = "double-backward",
    krylov: int | None = None,
    max_iter: int | None = None,
) -> dict[int, EigenResult]:
    """lambda_max(grad^2 F_i(w)) for each client i: ``lanczos_topk`` with k = 1 on each client's objective
    (the same seed, hence the same start vector, for every client)."""
    results = {}
    for client, objective in objectives.items():
        op = HessianOperator(objective, w, backend)
        results[client] = lanczos_topk(op, 1, krylov=krylov, tol=tol, max_iter=max_iter, seed=seed)
    return results
