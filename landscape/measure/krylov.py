"""The Lanczos process with full reorthogonalisation (Lanczos 1950), shared by the top-k eigensolver
(``lanczos.lanczos_topk``) and stochastic Lanczos quadrature (``density.slq_density``).

``lanczos`` grows an orthonormal Krylov basis Q_m of a symmetric operator H and the tridiagonal
T_m = Q_m^T H Q_m, with H Q_m = Q_m T_m + beta_m q_{m+1} e_m^T. Every new vector is orthogonalised against the
whole basis (``KrylovBasis``) by classical Gram-Schmidt, a second pass only where the first cancelled most of
it (the Daniel-Gragg-Kaufman-Stewart criterion, 1976: "twice is enough"). Tridiagonal matrices and the
recorded projections are float64; the basis stays on the operator's device in its dtype.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from landscape.measure.operator import LinearOperator
from landscape.measure.probes import float_norm, gaussian_vectors

# Daniel-Gragg-Kaufman-Stewart criterion: a second Gram-Schmidt pass only when the first removed more than
# 1 - 1/sqrt(2) of the vector's norm, i.e. when cancellation can have left it non-orthogonal.
REORTH_ETA = 1 / math.sqrt(2)


def tridiagonal(alphas: list[float], betas: list[float]) -> Tensor:
    """The symmetric tridiagonal T (float64) with diagonal ``alphas`` and off-diagonal ``betas``."""
    t = torch.diag(torch.tensor(alphas, dtype=torch.float64))
    if betas:
        off = torch.tensor(betas, dtype=torch.float64)
        t += torch.diag(off, 1) + torch.diag(off, -1)
    return t


class KrylovBasis:
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
            grown = torch.empty(2 * self.size, self.rows.shape[1], dtype=self.rows.dtype,
                                device=self.rows.device)
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

        One classical Gram-Schmidt pass, and a second only where the first cancelled most of z
        (``REORTH_ETA``, "twice is enough"); the coefficients of both passes are summed. One device sync, two
        after a second pass.
        """
        projected, coefficients = self._project_out(z)
        before, after = torch.stack([torch.linalg.vector_norm(z),
                                     torch.linalg.vector_norm(projected)]).tolist()
        if after <= REORTH_ETA * before:
            projected, again = self._project_out(projected)
            coefficients = coefficients + again
        return projected, coefficients, before


@dataclass
class Krylov:
    """What ``lanczos`` returns: the basis, T_m = tridiag(alphas, betas), beta_last, and ``projections``
    [m + 1, m] (float64, CPU): column j holds Q_j^T (H q_j) from the Gram-Schmidt passes (both) and, below it,
    the recorded beta_j, so H Q_m = Q_{m+1} projections up to the rounding of the passes."""

    basis: KrylovBasis
    alphas: list[float]
    betas: list[float]
    beta: float
    projections: Tensor


def _orthogonal_step(basis: KrylovBasis, q: Tensor, z: Tensor,
                     betas: list[float]) -> tuple[Tensor, Tensor, float, float, float]:
    """From z = H q for the basis's last vector q: (z orthogonalised against the basis, the projections of H q
    on the basis (float64, CPU), alpha = q^T H q, beta = ||z||, ||H q||).

    The three-term recurrence removes the large components alpha q and beta q_prev first; the Gram-Schmidt
    pass against the whole basis then removes what rounding left in every direction, and needs a second pass
    only where it still cancels (rarely, once the recurrence has done the bulk)."""
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
    return z, coefficients, float(alpha), float(beta), float(z_norm)


def _restart(op: LinearOperator, basis: KrylovBasis, generator: torch.Generator, betas: list[float]) -> bool:
    """Continue the basis from a fresh random vector orthogonal to it (recorded as a zero off-diagonal);
    False when none is left (the random vector lies in the basis's span)."""
    z, _, _ = basis.orthogonalise(gaussian_vectors(op, generator))
    norm = float_norm(z)
    if norm == 0.0:
        return False
    betas.append(0.0)
    basis.append(z / norm)
    return True


def lanczos(
    op: LinearOperator,
    start: Tensor,
    steps: int,
    generator: torch.Generator,
    *,
    restart: bool,
    stop: Any = None,
    capacity: int | None = None,
    on_step: Callable[[int], None] | None = None,
) -> Krylov:
    """Lanczos with full reorthogonalisation from ``start`` (unit norm) for at most ``steps`` products.

    H Q_m = Q_m T_m + beta_last q_{m+1} e_m^T. When the Krylov space becomes invariant (beta ~ 0) the run
    either stops (``restart=False``) or continues from a fresh random vector orthogonal to the basis
    (``restart=True``, recorded as a zero off-diagonal, so T stays block-diagonal and the Lanczos relation
    still holds). ``stop(alphas, betas, beta_last)`` is called after each step and ends the run when it
    returns True; ``on_step(m)`` after each product. ``capacity``: basis rows allocated up front (default
    steps + 1); the buffer doubles when it fills.
    """
    eps = torch.finfo(op.dtype).eps
    basis = KrylovBasis(op, steps + 1 if capacity is None else min(capacity, steps + 1))
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
        z, coefficients, alpha, beta, z_norm = _orthogonal_step(basis, q, z, betas)
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
            if not _restart(op, basis, generator, betas):
                break
            beta = 0.0
            continue
        betas.append(beta)
        basis.append(z / beta)
    m = len(alphas)
    projections = torch.zeros(m + 1, m, dtype=torch.float64)
    for j, column in enumerate(columns):
        projections[: column.numel(), j] = column
        projections[j + 1, j] = betas[j] if j < len(betas) else beta
    return Krylov(basis, alphas, betas, beta, projections)
