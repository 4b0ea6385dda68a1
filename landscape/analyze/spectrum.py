"""Spectral solvers over a symmetric linear operator (``landscape.analyze.operator``): top eigenpairs, trace,
spectral density. Plain functions returning frozen result dataclasses that carry residuals, HVP counts,
seeds and settings, so every reported number says how far it can be trusted.

- ``lanczos_topk``: Lanczos with full reorthogonalisation, growing the Krylov space until the wanted Ritz
  pairs' residuals meet the tolerance; ``power_iteration``: deflated power iteration as in PyHessian (the
  baseline it is compared with).
- ``hutchinson_trace`` (Rademacher probes), ``hutchpp_trace`` (Meyer, Musco, Musco & Woodruff 2021) and
  ``xtrace`` (Epperly, Tropp & Webber 2024); ``trace_estimate`` runs the one named (default
  ``DEFAULT_TRACE_METHOD``, the most accurate per product in ``benchmarks/trace_estimators.py``).
- ``slq_density``: stochastic Lanczos quadrature (Ghorbani, Krishnan & Xiao 2019), the eigenvalue density.
- ``client_lambda_max``: lambda_max of each client's F_i (local vs global flatness).

Random vectors come from a CPU ``torch.Generator`` seeded with ``seed``, so a result does not depend on the
device or on the global RNG. Tridiagonal matrices and all reported scalars are float64.

Progress: every solver takes ``progress(done, total)``, called after each product (or block of products)
with the products this call has computed so far and its budget (None where the solver stops on
convergence and the count is not known in advance: ``lanczos_topk``, ``power_iteration``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from landscape.analyze.objective import Objective
from landscape.analyze.operator import HessianOperator, LinearOperator
from landscape.errors import LandscapeError

WHICH = ("largest-algebraic", "smallest-algebraic", "largest-magnitude")
TRACE_METHODS = ("xtrace", "hutch++", "hutchinson")
DEFAULT_TRACE_METHOD = "xtrace"  # the smallest error per product of the three (benchmarks/trace_estimators.py)

# Daniel-Gragg-Kaufman-Stewart criterion: a second Gram-Schmidt pass only when the first removed more than
# 1 - 1/sqrt(2) of the vector's norm, i.e. when cancellation can have left it non-orthogonal.
REORTH_ETA = 1 / math.sqrt(2)

# XTrace's jackknife: below this det of the Gram matrix of two of its leave-one-out directions (an angle under
# ~1e-4 rad, where R is ill-conditioned) the O(s^3) pairwise formula loses digits; a QR per probe is used.
JACKKNIFE_MIN_DET = 1e-8

# progress(done, total): products computed so far by this call and its budget (None: not known in advance).
Progress = Callable[[int, "int | None"], None]


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
    """A stochastic trace estimate and its standard error (see the estimator's docstring).

    ``stderr_method`` says how ``stderr`` was computed: "sample" (Hutchinson: sd / sqrt(n) of the n quadratic
    forms), "conditional" (Hutch++: that of the deflated Hutchinson part, given the sketch), "jackknife"
    (XTrace: delete-one jackknife over its probes) or "exact" (XTrace on a rank-deficient sketch: stderr 0).
    ``stderr_dof``: its degrees of freedom (n - 1, g - 1, s - 1; 0 for "exact"), for a Student-t interval.
    """

    method: str
    estimate: float
    stderr: float
    stderr_method: str
    stderr_dof: int
    samples: int
    hvp_count: int
    seed: int
    settings: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "estimate": self.estimate,
            "stderr": self.stderr,
            "stderr_method": self.stderr_method,
            "stderr_dof": self.stderr_dof,
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
    a Hutchinson sample) with ``trace_stderr`` = sd / sqrt(runs) of the runs' dim * first moments: an
    estimate with ``trace_stderr_dof`` = runs - 1 degrees of freedom (1 at runs = 2, where a 95% Student-t
    interval is +- 12.7 stderr; inf at runs = 1, which has no spread to measure).
    """

    nodes: Tensor
    weights: Tensor
    grid: Tensor
    density: Tensor
    sigma: float
    mass: float
    trace: float
    trace_stderr: float
    trace_stderr_dof: int
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
            "trace_stderr_dof": self.trace_stderr_dof,
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
    """Orthonormal Krylov basis: the rows of a growing [capacity, dim] buffer, so every vector is contiguous
    (appending a vector and reading the last one touch consecutive memory; the projections are two
    matrix-vector products over the rows)."""

    def __init__(self, op: LinearOperator, capacity: int) -> None:
        self.rows = torch.empty(max(capacity, 1), op.dim, dtype=op.dtype, device=op.device)
        self.size = 0

    @property
    def matrix(self) -> Tensor:
        """The basis vectors as rows, [size, dim]."""
        return self.rows[: self.size]

    @property
    def last(self) -> Tensor:
        return self.rows[self.size - 1]

    def append(self, q: Tensor) -> None:
        if self.size == self.rows.shape[0]:
            grown = torch.empty(2 * self.size, self.rows.shape[1], dtype=self.rows.dtype, device=self.rows.device)
            grown[: self.size] = self.rows
            self.rows = grown
        self.rows[self.size].copy_(q)
        self.size += 1

    def _project_out(self, z: Tensor) -> tuple[Tensor, Tensor]:
        """One classical Gram-Schmidt pass: (z - Q^T (Q z), Q z) for the rows Q."""
        q = self.matrix
        coefficients = q @ z
        return torch.addmv(z, q.T, coefficients, alpha=-1), coefficients

    def orthogonalise(self, z: Tensor) -> tuple[Tensor, Tensor, float]:
        """(z minus its projection on the basis, the projection's coefficients Q z, ||z||).

        One classical Gram-Schmidt pass, and a second only where the first cancelled most of z (``REORTH_ETA``,
        "twice is enough"); the coefficients of both passes are summed. One device sync, two after a second pass.
        """
        projected, coefficients = self._project_out(z)
        before, after = torch.stack([torch.linalg.vector_norm(z), torch.linalg.vector_norm(projected)]).tolist()
        if after <= REORTH_ETA * before:
            projected, again = self._project_out(projected)
            coefficients = coefficients + again
        return projected, coefficients, before


@dataclass
class _Krylov:
    """What ``_lanczos`` returns: the basis, T_m = tridiag(alphas, betas), beta_last, and ``projections``
    [m + 1, m] (float64, CPU): column j holds Q_j^T (H q_j) from the Gram-Schmidt passes (both) and, below it,
    the recorded beta_j, so H Q_m = Q_{m+1} projections up to the rounding of the passes."""

    basis: _Basis
    alphas: list[float]
    betas: list[float]
    beta: float
    projections: Tensor


def _lanczos(
    op: LinearOperator,
    start: Tensor,
    steps: int,
    generator: torch.Generator,
    *,
    restart: bool,
    stop: Any = None,
    capacity: int | None = None,
    on_step: Callable[[int], None] | None = None,
) -> _Krylov:
    """Lanczos with full reorthogonalisation from ``start`` (unit norm) for at most ``steps`` products.

    H Q_m = Q_m T_m + beta_last q_{m+1} e_m^T. When the Krylov space becomes invariant (beta ~ 0) the run either
    stops (``restart=False``) or continues from a fresh random vector orthogonal to the basis (``restart=True``,
    recorded as a zero off-diagonal, so T stays block-diagonal and the Lanczos relation still holds).
    ``stop(alphas, betas, beta_last)`` is called after each step and ends the run when it returns True;
    ``on_step(m)`` after each product. ``capacity``: basis rows allocated up front (default steps + 1); the
    buffer doubles when it fills.
    """
    eps = torch.finfo(op.dtype).eps
    basis = _Basis(op, steps + 1 if capacity is None else min(capacity, steps + 1))
    basis.append(start)
    alphas: list[float] = []
    betas: list[float] = []
    columns: list[Tensor] = []
    beta = 0.0
    scale = 0.0  # largest ||H q|| seen: a lower bound on ||H||, the yardstick for "beta ~ 0"
    while len(alphas) < steps:
        q = basis.last
        z = op.matvec(q)
        if on_step is not None:
            on_step(len(alphas) + 1)
        # The three-term recurrence removes the large components alpha q and beta q_prev first; the
        # Gram-Schmidt pass against the whole basis then removes what rounding left in every direction, and
        # needs a second pass only where it still cancels (rarely, once the recurrence has done the bulk).
        alpha = torch.dot(q, z)
        hq_norm = torch.linalg.vector_norm(z)
        z = z - alpha * q
        previous = betas[-1] if betas and basis.size > 1 else 0.0
        if previous:
            z = z - previous * basis.rows[basis.size - 2]
        z, coefficients, _ = basis.orthogonalise(z)
        recurrence = torch.zeros_like(coefficients)
        recurrence[-1] = alpha
        if previous:
            recurrence[-2] = previous
        # the projections of H q on the basis, alpha, beta and ||H q|| reach the host together
        coefficients, alpha, beta, z_norm = torch.cat([(coefficients + recurrence).double(), torch.stack(
            [alpha.double(), torch.linalg.vector_norm(z).double(), hq_norm.double()])]).cpu().split(
            [coefficients.numel(), 1, 1, 1])
        alpha, beta, z_norm = float(alpha), float(beta), float(z_norm)
        columns.append(coefficients)
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
            z, _, _ = basis.orthogonalise(_gaussian(op, generator))
            norm = _norm(z)
            if norm == 0.0:
                break
            betas.append(0.0)
            basis.append(z / norm)
            beta = 0.0
            continue
        betas.append(beta)
        basis.append(z / beta)
    m = len(alphas)
    projections = torch.zeros(m + 1, m, dtype=torch.float64)
    for j, column in enumerate(columns):
        projections[: column.numel(), j] = column
        projections[j + 1, j] = betas[j] if j < len(betas) else beta
    return _Krylov(basis, alphas, betas, beta, projections)


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
    verify: bool = False,
    progress: Progress | None = None,
) -> EigenResult:
    """The k extreme eigenpairs of ``op`` by Lanczos with full reorthogonalisation, without restarts.

    The Krylov space grows one product at a time; from ``krylov`` (default k + 10) dimensions on, the k wanted
    Ritz pairs' residuals |beta_m s_{m,j}| (Lanczos relation, free) are checked after every step, and the run
    stops when all meet ``residual <= tol * |theta_j|`` or after ``max_iter`` products (default
    max(100, 2 * krylov), at most ``dim``). The basis is kept on the operator's device in its dtype, one
    contiguous row per vector: memory dim * (Krylov size, rounded up to krylov + 1 times a power of 2)
    elements. Each new vector is orthogonalised against the whole basis by classical Gram-Schmidt, a second
    pass only where the first cancelled most of it (``REORTH_ETA``).

    Residuals. By default they come free from the products the run computed (``residual_source``
    "lanczos"): H Q_m = Q_{m+1} C with C the recorded Gram-Schmidt coefficients and betas, so
    ||H y - theta y|| = ||C s - theta s|| for y = Q_m s - the Lanczos relation |beta_m s_m| plus whatever
    rounding the reorthogonalisation removed; these are the true residuals to rounding (the tests check them
    against dense Hessians to 1e-6 relative). With ``verify`` the k Ritz vectors are multiplied by ``op`` once
    more (k products, one matmat) and the reported residuals and converged flags use those products
    (``residual_source`` "hvp"): a check of the operator itself, e.g. one that is not deterministic. An invariant Krylov space (beta ~ 0) restarts from a random vector
    orthogonal to the basis, so repeated eigenvalues are found too. ``progress(done, None)`` after each product.
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

    def on_step(_: int) -> None:
        if progress is not None:
            progress(op.hvp_count - first_count, None)

    run = _lanczos(op, start / _norm(start), max_iter, generator, restart=True, stop=wanted_converged,
                   capacity=krylov + 1, on_step=on_step)
    m = len(run.alphas)
    theta, s = torch.linalg.eigh(_tridiagonal(run.alphas, run.betas))
    index = _select(theta, min(k, m), which)
    values = theta[index]
    ritz = s[:, index]
    lanczos_residuals = run.beta * ritz[-1].abs()
    vectors = run.basis.matrix[:m].T @ ritz.to(op.device, op.dtype)  # [dim, k], contiguous
    vectors = vectors / torch.linalg.vector_norm(vectors, dim=0, keepdim=True)
    if verify:
        product = op.matmat(vectors)
        on_step(0)
        residuals = torch.linalg.vector_norm(
            (product - vectors * values.to(op.device, op.dtype)).double(), dim=0
        ).cpu()
    else:
        padded = torch.cat([ritz, torch.zeros(1, ritz.shape[1], dtype=ritz.dtype)])
        residuals = torch.linalg.vector_norm(run.projections @ ritz - padded * values, dim=0)
    relative = residuals / values.abs()
    return EigenResult(
        method="lanczos",
        values=values,
        residuals=residuals,
        relative_residuals=relative,
        converged=residuals <= tol * values.abs(),
        hvp_count=op.hvp_count - first_count,
        iterations=m,
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
    progress: Progress | None = None,
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
            if progress is not None:
                progress(op.hvp_count - first_count, None)
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


def _hutchinson_samples(op: LinearOperator, probes: Tensor, block: int, project: Tensor | None = None,
                        report: Callable[[], None] | None = None) -> Tensor:
    """z_i^T H z_i for the columns z_i of ``probes`` (first projected onto the complement of ``project``'s
    columns, if given), ``block`` products per matmat; float64 on the CPU. ``report()`` after each matmat."""
    samples = []
    for start in range(0, probes.shape[1], block):
        z = probes[:, start : start + block]
        if project is not None:
            z = z - project @ (project.T @ z)
        samples.append((z * op.matmat(z)).sum(dim=0).double().cpu())
        if report is not None:
            report()
    return torch.cat(samples)


def _blocked_matmat(op: LinearOperator, vectors: Tensor, block: int, report: Callable[[], None] | None) -> Tensor:
    """op @ vectors, ``block`` columns per matmat (``report()`` after each)."""
    parts = []
    for start in range(0, vectors.shape[1], block):
        parts.append(op.matmat(vectors[:, start : start + block]))
        if report is not None:
            report()
    return torch.cat(parts, dim=1)


def _reporter(op: LinearOperator, progress: Progress | None, total: int) -> Callable[[], None] | None:
    """A report() that calls progress(products so far, total), or None without a callback."""
    if progress is None:
        return None
    first = op.hvp_count
    return lambda: progress(op.hvp_count - first, total)


def _mean_and_stderr(samples: Tensor) -> tuple[float, float]:
    n = samples.numel()
    stderr = float(samples.std(unbiased=True) / math.sqrt(n)) if n > 1 else math.inf
    return float(samples.mean()), stderr


def hutchinson_trace(op: LinearOperator, *, samples: int = 100, seed: int = 0, block: int = 10,
                     progress: Progress | None = None) -> TraceResult:
    """tr(H) ~ mean of z^T H z over Rademacher probes z (Hutchinson 1989); stderr = sample std / sqrt(n).

    ``block`` probes share one matmat (with the double-backward operator, one gradient graph per batch when
    the graphs are not kept).
    """
    if samples < 2:
        raise LandscapeError(f"Hutchinson needs at least 2 samples for a standard error, got {samples}")
    first_count = op.hvp_count
    probes = _rademacher(op, _generator(seed), samples)
    report = _reporter(op, progress, samples)
    estimate, stderr = _mean_and_stderr(_hutchinson_samples(op, probes, max(block, 1), report=report))
    return TraceResult("hutchinson", estimate, stderr, "sample", samples - 1, samples, op.hvp_count - first_count,
                       seed, {"probes": "rademacher", "block": block})


def hutchpp_trace(op: LinearOperator, *, hvps: int = 99, seed: int = 0, block: int = 10,
                  progress: Progress | None = None) -> TraceResult:
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
    report = _reporter(op, progress, hvps)
    block = max(block, 1)
    # Householder QR: orthonormal columns even if H S is rank-deficient
    q, _ = torch.linalg.qr(_blocked_matmat(op, s, block, report))
    low_rank_part = float((q * _blocked_matmat(op, q, block, report)).sum().double())
    estimate, stderr = _mean_and_stderr(_hutchinson_samples(op, g, block, project=q, report=report))
    return TraceResult("hutch++", low_rank_part + estimate, stderr, "conditional", residual_probes - 1, hvps,
                       op.hvp_count - first_count, seed,
                       {"probes": "rademacher", "sketch": sketch, "residual_probes": residual_probes,
                        "low_rank_part": low_rank_part, "block": block})


def _xtrace_sketch(h: Tensor, r: Tensor, w: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(s, hs, r_s): the normalised columns s_i of R^{-T} (s_i^T r_j = 0 for j != i), H s_i in the
    coordinates of Q (h @ s) and r_i^T s_i."""
    eye = torch.eye(r.shape[-1], dtype=torch.float64)
    s = torch.linalg.solve_triangular(r.T, eye, upper=False)  # R^{-T}
    s = s / torch.linalg.vector_norm(s, dim=0, keepdim=True)
    hs = h @ s
    return s, hs, (r * s).sum(dim=0)


def _xtrace_samples(h: Tensor, r: Tensor, w: Tensor, omega_sq: Tensor, dim: int, gaussian: bool) -> Tensor:
    """The XTrace samples T_1..T_s of one sketch from its s x s coordinates (float64): h = Q^T H Q, R and
    W = Q^T Omega with H Omega = Q R, and omega_sq = ||w_i||^2. All per-probe quantities are column-wise dot
    products of s x s matrices (see ``xtrace``); no product with H."""
    s, hs, r_s = _xtrace_sketch(h, r, w)
    s_h_s = (s * hs).sum(dim=0)  # s_i^T H s_i
    c = (s * w).sum(dim=0)  # c_i = s_i^T w_i
    r_w = (r * w).sum(dim=0)  # r_i^T w_i = w_i^T H w_i (the probe's own quadratic form)
    w_h_w = (w * (h @ w)).sum(dim=0)  # w_i^T (Q^T H Q) w_i
    w_h_s = (w * hs).sum(dim=0)  # w_i^T (Q^T H Q) s_i
    # u_i = w_i - Q w_i + c_i Q s_i:  u^T H u = -r^T w + w^T H w + 2 c (r^T s - w^T H s) + c^2 s^T H s
    quadratic = -r_w + w_h_w + 2 * c * (r_s - w_h_s) + c * c * s_h_s
    if gaussian:
        u_sq = omega_sq - (w * w).sum(dim=0) + c * c  # ||u_i||^2
        quadratic = (dim - r.shape[-1] + 1) / u_sq * quadratic
    return torch.trace(h) - s_h_s + quadratic


def _xtrace_jackknife(h: Tensor, r: Tensor, w: Tensor, omega_sq: Tensor, dim: int, gaussian: bool) -> Tensor:
    """t_(i), i = 1..s: the XTrace estimate of the s - 1 probes other than w_i, from the full sketch's
    coordinates (no product with H), in O(s^3).

    Without w_i, w_j (j != i) is tested against the sketch of the other s - 2 probes: range(Q) less the plane
    spanned by s_i and s_j (the vectors orthogonal to every r_l, l != i, j). With G = [s_i, s_j],
    M = G^T G = [[1, a], [a, 1]] (a = s_i^T s_j), that sketch's projector is P_ij = Q (I - G M^{-1} G^T) Q^T:

        T_j^(i) = tr(h) - tr(M^{-1} G^T h G) + a_j' u^T H u,   u = (I - P_ij) w_j = w_perp + Q G v,

    v = M^{-1} G^T W_j, w_perp = w_j - Q W_j. With H w_j = Q r_j: w_perp^T H w_perp = -r_j^T W_j + W_j^T h W_j,
    w_perp^T H Q s_l = r_j^T s_l - W_j^T h s_l (r_j^T s_i = 0), so u^T H u = w_perp^T H w_perp
    + 2 (w_perp^T H Q G) v + v^T (G^T h G) v and ||u||^2 = ||w_j||^2 - ||W_j||^2 + v^T M v; a_j' = 1
    (Rademacher) or (dim - (s - 1) + 1) / ||u||^2 (Gaussian). t_(i) = mean over j != i of T_j^(i).
    """
    s, hs, r_s = _xtrace_sketch(h, r, w)
    k = r.shape[-1]
    # entries [i, j]: i the left-out probe, j the tested one
    a = s.T @ s  # s_i^T s_j
    b = s.T @ hs  # s_i^T h s_j
    c = s.T @ w  # s_i^T W_j
    f = (w.T @ hs).T  # [l, j]: W_j^T h s_l
    c_jj, b_ii, b_jj = c.diagonal()[None, :], b.diagonal()[:, None], b.diagonal()[None, :]
    det = 1 - a * a  # det M
    v1 = (c - a * c_jj) / det  # v = M^{-1} (s_i^T W_j, s_j^T W_j)
    v2 = (c_jj - a * c) / det
    removed = (b_ii + b_jj - 2 * a * b) / det  # tr(M^{-1} G^T h G)
    own = -(r * w).sum(dim=0) + (w * (h @ w)).sum(dim=0)  # w_perp^T H w_perp, per j
    cross = -f * v1 + (r_s - f.diagonal())[None, :] * v2  # (w_perp^T H Q G) v
    quadratic = own[None, :] + 2 * cross + b_ii * v1 * v1 + 2 * b * v1 * v2 + b_jj * v2 * v2
    if gaussian:
        u_sq = (omega_sq - (w * w).sum(dim=0))[None, :] + v1 * v1 + 2 * a * v1 * v2 + v2 * v2
        quadratic = (dim - k + 2) / u_sq * quadratic
    samples = (torch.trace(h) - removed + quadratic).masked_fill(torch.eye(k, dtype=torch.bool), 0.0)
    if float(det.masked_fill(torch.eye(k, dtype=torch.bool), 1.0).min()) < JACKKNIFE_MIN_DET:
        return _xtrace_jackknife_by_qr(h, r, w, omega_sq, dim, gaussian)
    return samples.sum(dim=1) / (k - 1)


def _xtrace_jackknife_by_qr(h: Tensor, r: Tensor, w: Tensor, omega_sq: Tensor, dim: int,
                            gaussian: bool) -> Tensor:
    """The t_(i) of ``_xtrace_jackknife`` by a QR of each reduced sketch, in O(s^4): stable where R is
    ill-conditioned. Without w_i the sketch is Y_(i) = Q R_(i) (R without column i) = (Q U_i) R'_i with
    R_(i) = U_i R'_i (reduced QR), so its coordinates are h' = U_i^T h U_i, R'_i and W' = U_i^T W_(i)."""
    s = r.shape[-1]
    left_out = []
    for i in range(s):
        others = torch.tensor([j for j in range(s) if j != i])
        u, r_sub = torch.linalg.qr(r[:, others])
        samples = _xtrace_samples(u.T @ h @ u, r_sub, u.T @ w[:, others], omega_sq[others], dim, gaussian)
        left_out.append(samples.mean())
    return torch.stack(left_out)


def xtrace(op: LinearOperator, *, hvps: int = 60, seed: int = 0, block: int = 10, probes: str = "gaussian",
           progress: Progress | None = None) -> TraceResult:
    """XTrace (Epperly, Tropp & Webber 2024): every probe serves both as a sketch vector and as a
    Hutchinson probe, by leaving it out of the sketch it is tested against; s = hvps // 2 probes.

    Omega = [w_1 .. w_s] random probes; Y = H Omega = Q R (s products); Z = H Q (s more). Leaving w_i out of
    the sketch removes from range(Q) the one direction Q s_i orthogonal to the other columns of Y: s_i is the
    normalised i-th column of R^{-T} (s_i^T r_j = 0 for j != i). With P_i = Q (I - s_i s_i^T) Q^T:

        T_i = tr(P_i H P_i) + a_i u_i^T H u_i,   u_i = (I - P_i) w_i

    tr(P_i H P_i) = tr(Q^T Z) - s_i^T (Q^T Z) s_i, and u_i^T H u_i follows from the products already made
    (H w_i = y_i = Q r_i, H Q = Z): no product beyond the 2s. P_i does not depend on w_i, so with
    E[w w^T] = I each T_i is unbiased for tr(H). ``probes``: "gaussian" (default; a_i = (dim - s + 1) /
    ||u_i||^2, which puts u_i on the sphere of radius sqrt(dim - s + 1) of the complement: the paper's
    normalisation, unbiased because a Gaussian u_i's direction is uniform there) or "rademacher" (a_i = 1).
    On digits Hessians the Gaussian form had the smaller error at 6 of 8 budgets
    (``benchmarks/trace_estimators.py``). The estimate is mean_i T_i.

    Standard error: the delete-one jackknife over the probes, sqrt((s-1)/s * sum_i (t_(i) - t_(.))^2), where
    t_(i) is the whole XTrace estimate recomputed without probe w_i (its sketch and its test vector; from
    the coordinates of the products already made, no product more) and t_(.) their mean
    (``stderr_method="jackknife"``, s - 1 degrees of freedom). The paper's error estimate
    sqrt(sum_i (T_i - mean T)^2 / (s (s-1))), which treats the T_i as independent although they share
    their probes, is kept as ``settings["paper_stderr"]``: over 200 seeds of 100 x 100 matrices with
    spectra 10 / k^p (p = 0.5, 1, 1.5; the last 20 times -0.3) at 30-60 products, z = (estimate - tr H) /
    stderr had sd 1.16-1.61 and |z| > 3 in 1.5-6.5% of seeds with the paper's (0.3% for a normal z), sd
    0.51-0.84 and 0-0.5% with the jackknife; on the digits-MLP Hessian of the tests at 30 / 60 products
    sd 1.29 / 1.25 against 0.89 / 0.72. The jackknife errs on the large side (by the Efron-Stein inequality
    a jackknife variance is conservative in expectation, and t_(i) has one probe fewer); with few probes its
    few degrees of freedom give heavy tails (12 products, s = 6: 3% of seeds beyond 3). Docs:
    ``docs/metrics.md`` 3.3; test: ``test_trace_standard_errors_are_calibrated_over_seeds``. Where H Omega is
    numerically rank-deficient, range(Q) holds all of range(H) and tr(Q^T H Q) is the trace (stderr 0,
    ``stderr_method="exact"``).
    """
    if hvps < 4:
        raise LandscapeError(f"XTrace needs at least 4 Hessian-vector products (2 probes), got {hvps}")
    if probes not in ("rademacher", "gaussian"):
        raise LandscapeError(f"XTrace probes must be rademacher or gaussian, got '{probes}'")
    first_count = op.hvp_count
    distribution, probes = probes, hvps // 2
    generator = _generator(seed)
    omega = _gaussian(op, generator, probes) if distribution == "gaussian" else _rademacher(op, generator, probes)
    report = _reporter(op, progress, 2 * probes)
    block = max(block, 1)
    q, r = torch.linalg.qr(_blocked_matmat(op, omega, block, report))
    w = (q.T @ omega).double().cpu()  # W = Q^T Omega
    omega_sq = (omega * omega).sum(dim=0).double().cpu()  # ||w_i||^2
    del omega
    h = (q.T @ _blocked_matmat(op, q, block, report)).double().cpu()
    h = (h + h.T) / 2  # Q^T H Q, symmetric up to rounding
    r = r.double().cpu()
    low_rank_part = float(torch.trace(h))
    settings = {"probes": distribution, "test_vectors": probes, "low_rank_part": low_rank_part, "block": block}
    diagonal = r.diagonal().abs()
    if float(diagonal.min()) <= probes * torch.finfo(op.dtype).eps * float(diagonal.max()):
        return TraceResult("xtrace", low_rank_part, 0.0, "exact", 0, probes, op.hvp_count - first_count, seed,
                           {**settings, "rank_deficient": True, "paper_stderr": 0.0})
    gaussian = distribution == "gaussian"
    estimate, paper_stderr = _mean_and_stderr(_xtrace_samples(h, r, w, omega_sq, op.dim, gaussian))
    left_out = _xtrace_jackknife(h, r, w, omega_sq, op.dim, gaussian)
    stderr = float(torch.sqrt((probes - 1) / probes * ((left_out - left_out.mean()) ** 2).sum()))
    return TraceResult("xtrace", estimate, stderr, "jackknife", probes - 1, probes, op.hvp_count - first_count,
                       seed, {**settings, "rank_deficient": False, "paper_stderr": paper_stderr})


def trace_estimate(op: LinearOperator, *, hvps: int = 60, method: str = DEFAULT_TRACE_METHOD, seed: int = 0,
                   block: int = 10, progress: Progress | None = None) -> TraceResult:
    """tr(H) by ``method`` (one of ``TRACE_METHODS``) with a budget of ``hvps`` products."""
    if method == "xtrace":
        return xtrace(op, hvps=hvps, seed=seed, block=block, progress=progress)
    if method == "hutch++":
        return hutchpp_trace(op, hvps=hvps, seed=seed, block=block, progress=progress)
    if method == "hutchinson":
        return hutchinson_trace(op, samples=hvps, seed=seed, block=block, progress=progress)
    raise LandscapeError(f"unknown trace estimator '{method}'; choose from: {', '.join(TRACE_METHODS)}")


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
    generator = _generator(seed)
    nodes = torch.zeros(runs, steps, dtype=torch.float64)
    weights = torch.zeros(runs, steps, dtype=torch.float64)
    report = _reporter(op, progress, runs * steps)
    for run in range(runs):
        z = _rademacher(op, generator, 1)[:, 0]
        run_ = _lanczos(op, z / _norm(z), steps, generator, restart=False,
                        on_step=None if report is None else lambda _: report())
        theta, s = torch.linalg.eigh(_tridiagonal(run_.alphas, run_.betas))
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
    return DensityResult(nodes, weights, grid, density, float(sigma), mass, trace, trace_stderr, runs - 1, runs,
                         steps, op.hvp_count - first_count, seed)


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
    progress: Progress | None = None,
) -> dict[int, EigenResult]:
    """lambda_max(grad^2 F_i(w)) for each client i: ``lanczos_topk`` with k = 1 on each client's objective
    (the same seed, hence the same start vector, for every client). Each client's gradient graphs are freed
    before the next client's are built. ``progress(clients done, clients)`` after each client."""
    results = {}
    for done, (client, objective) in enumerate(objectives.items(), start=1):
        op = HessianOperator(objective, w, backend)
        results[client] = lanczos_topk(op, 1, krylov=krylov, tol=tol, max_iter=max_iter, seed=seed)
        op.release()
        if progress is not None:
            progress(done, len(objectives))
    return results
