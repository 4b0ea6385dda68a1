"""The extreme eigenpairs of a symmetric operator: ``lanczos_topk``, Lanczos with full reorthogonalisation
(Lanczos 1950; the process in ``krylov``), and ``power_iteration``, deflated power iteration as in PyHessian
(Yao, Gholami, Keutzer & Mahoney 2020), the baseline it is compared with; ``client_lambda_max``: lambda_max of
each client's F_i (local vs global flatness).

Each returns a frozen ``EigenResult`` carrying residuals, HVP counts, the seed and the settings, so every
reported value says how far it can be trusted; its scalars and arrays are float64 (``values``,
``residuals``, ``relative_residuals`` numpy arrays on the host; ``converged`` a numpy bool array), the kept
eigenvectors a torch Tensor (flat parameter vectors on the operator's device, as directions are).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from landscape.core.errors import LandscapeError
from landscape.measure.krylov import lanczos, tridiagonal
from landscape.measure.objective import Objective
from landscape.measure.operator import HessianOperator, LinearOperator, Progress
from landscape.measure.probes import float_norm, gaussian_vectors, seeded_generator

WHICH = ("largest-algebraic", "smallest-algebraic", "largest-magnitude")


@dataclass(frozen=True)
class EigenResult:
    """k eigenpair estimates, ordered by ``which`` (largest-algebraic: values descending).

    ``residuals[j]`` = ||H v_j - values[j] v_j|| for unit v_j; ``residual_source`` says how it was obtained:
    ``hvp`` (recomputed with true products, counted in ``hvp_count``), ``lanczos`` (|beta_m s_{m,j}| from the
    Lanczos relation, exact in exact arithmetic) or ``power`` (from the last power step's product).
    ``converged[j]``: Lanczos: residual <= tol * |value|; power iteration: PyHessian's rule, the relative
    change of the Rayleigh quotient fell below tol (a weaker test; the residuals show how much weaker).
    ``values``, ``residuals`` and ``relative_residuals`` are float64 numpy arrays, ``converged`` a bool one
    (tensors given are brought to the host, their numbers unchanged); ``vectors`` ([dim, k], only when kept)
    stays a torch Tensor on the operator's device.
    """

    method: str
    values: np.ndarray
    residuals: np.ndarray
    relative_residuals: np.ndarray
    converged: np.ndarray
    hvp_count: int
    iterations: int
    seed: int
    tol: float
    which: str
    residual_source: str
    settings: dict[str, Any] = field(default_factory=dict)
    vectors: Tensor | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        for name in ("values", "residuals", "relative_residuals"):
            object.__setattr__(self, name, host_array(getattr(self, name), np.float64))
        object.__setattr__(self, "converged", host_array(self.converged, np.bool_))

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


def host_array(values: Tensor | np.ndarray | Any, dtype: Any) -> np.ndarray:
    """``values`` (a tensor on any device, an array or a list) as a numpy array of ``dtype`` on the host."""
    if isinstance(values, Tensor):
        values = values.detach().cpu().numpy()
    return np.asarray(values, dtype=dtype)


def _dot(a: Tensor, b: Tensor) -> float:
    """a . b as a Python float (read in float64)."""
    return float(torch.dot(a, b).double())


def _select(theta: Tensor, k: int, which: str) -> Tensor:
    """Indices of the k wanted Ritz values, in report order."""
    if which == "largest-algebraic":
        order = torch.argsort(theta, descending=True)
    elif which == "smallest-algebraic":
        order = torch.argsort(theta)
    else:
        order = torch.argsort(theta.abs(), descending=True)
    return order[:k]


def _topk_sizes(op: LinearOperator, k: int, krylov: int | None, tol: float, max_iter: int | None,
                which: str) -> tuple[int, int]:
    """The Krylov size and the most products of ``lanczos_topk`` (defaults filled in, then capped at the
    dimension), with every argument checked in one line."""
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
    return min(krylov, op.dim), min(max_iter, op.dim)


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
    pass only where the first cancelled most of it (``krylov.REORTH_ETA``).

    Residuals. By default they come free from the products the run computed (``residual_source``
    "lanczos"): H Q_m = Q_{m+1} C with C the recorded Gram-Schmidt coefficients and betas, so
    ||H y - theta y|| = ||C s - theta s|| for y = Q_m s - the Lanczos relation |beta_m s_m| plus whatever
    rounding the reorthogonalisation removed; these are the true residuals to rounding (the tests check them
    against dense Hessians to 1e-6 relative). With ``verify`` the k Ritz vectors are multiplied by ``op`` once
    more (k products, one matmat) and the reported residuals and converged flags use those products
    (``residual_source`` "hvp"): a check of the operator itself, e.g. one that is not deterministic. An
    invariant Krylov space (beta ~ 0) restarts from a random vector orthogonal to the basis, so repeated
    eigenvalues are found too. ``progress(done, None)`` after each product.
    """
    krylov, max_iter = _topk_sizes(op, k, krylov, tol, max_iter, which)
    first_count = op.hvp_count
    generator = seeded_generator(seed)
    start = gaussian_vectors(op, generator)

    def wanted_converged(alphas: list[float], betas: list[float], beta: float) -> bool:
        if len(alphas) < krylov:
            return False
        theta, s = torch.linalg.eigh(tridiagonal(alphas, betas))
        index = _select(theta, k, which)
        return bool((beta * s[-1, index].abs() <= tol * theta[index].abs()).all())

    def on_step(_: int) -> None:
        if progress is not None:
            progress(op.hvp_count - first_count, None)

    run = lanczos(op, start / float_norm(start), max_iter, generator, restart=True, stop=wanted_converged,
                  capacity=krylov + 1, on_step=on_step)
    m = len(run.alphas)
    theta, s = torch.linalg.eigh(tridiagonal(run.alphas, run.betas))
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
    generator = seeded_generator(seed)
    found: list[Tensor] = []
    values, residuals, converged, steps = [], [], [], 0
    for _ in range(k):
        v = gaussian_vectors(op, generator)
        previous = None
        done = False
        for _ in range(max_iter):
            for u in found:  # deflation (PyHessian: orthnormal(v, eigenvectors))
                v = v - _dot(u, v) * u
            vector = v / float_norm(v)
            hv = op.matvec(vector)
            steps += 1
            if progress is not None:
                progress(op.hvp_count - first_count, None)
            value = _dot(vector, hv)
            residual = float_norm(hv - value * vector)
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
    products: Progress | None = None,
) -> dict[int, EigenResult]:
    """lambda_max(grad^2 F_i(w)) for each client i: ``lanczos_topk`` with k = 1 on each client's objective
    (the same seed, hence the same start vector, for every client). Each client's gradient graphs are freed
    before the next client's are built. ``progress(clients done, clients)`` after each client; ``products(done,
    None)`` after every product of a client's operator (its count starts again with each client)."""
    results = {}
    for done, (client, objective) in enumerate(objectives.items(), start=1):
        op = HessianOperator(objective, w, backend, progress=products)
        results[client] = lanczos_topk(op, 1, krylov=krylov, tol=tol, max_iter=max_iter, seed=seed)
        op.release()
        if progress is not None:
            progress(done, len(objectives))
    return results
