"""Stochastic estimates of tr(H) from products with H: ``hutchinson_trace`` (Rademacher probes, Hutchinson
1989), ``hutchpp_trace`` (Hutch++: Meyer, Musco, Musco & Woodruff 2021) and ``xtrace`` (XTrace: Epperly, Tropp
& Webber 2024); ``trace_estimate`` runs the one named (default ``DEFAULT_TRACE_METHOD``, the most accurate per
product in ``benchmarks/trace_estimators.py``).

Each returns a frozen ``TraceResult``: the estimate, its standard error and how that was computed, the product
count, the seed and the settings.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from landscape.core.errors import LandscapeError
from landscape.measure.operator import LinearOperator, Progress
from landscape.measure.probes import (
    gaussian_vectors,
    mean_and_stderr,
    progress_reporter,
    rademacher_vectors,
    seeded_generator,
)

TRACE_METHODS = ("xtrace", "hutch++", "hutchinson")
# the smallest error per product of the three (benchmarks/trace_estimators.py)
DEFAULT_TRACE_METHOD = "xtrace"

# XTrace's pairs T_j^(i): below this det of the Gram matrix of two of its leave-one-out directions (an angle
# under ~1e-4 rad, where R is ill-conditioned) the O(s^3) pairwise formula loses digits; a QR per probe is used.
JACKKNIFE_MIN_DET = 1e-8


@dataclass(frozen=True)
class TraceResult:
    """A stochastic trace estimate and its standard error (see the estimator's docstring).

    ``stderr_method`` says how ``stderr`` was computed: "sample" (Hutchinson: sd / sqrt(n) of the n quadratic
    forms), "conditional" (Hutch++: that of the deflated Hutchinson part, given the sketch), "pairwise"
    (XTrace: the sample variance of its T_i plus their pairwise covariance, see ``xtrace``), "jackknife"
    (XTrace results written before "pairwise": delete-one jackknife over its probes) or "exact" (XTrace on a
    rank-deficient sketch: stderr 0).
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


def _blocked_matmat(op: LinearOperator, vectors: Tensor, block: int,
                    report: Callable[[], None] | None) -> Tensor:
    """op @ vectors, ``block`` columns per matmat (``report()`` after each)."""
    parts = []
    for start in range(0, vectors.shape[1], block):
        parts.append(op.matmat(vectors[:, start : start + block]))
        if report is not None:
            report()
    return torch.cat(parts, dim=1)


def hutchinson_trace(op: LinearOperator, *, samples: int = 100, seed: int = 0, block: int = 10,
                     progress: Progress | None = None) -> TraceResult:
    """tr(H) ~ mean of z^T H z over Rademacher probes z (Hutchinson 1989); stderr = sample std / sqrt(n).

    ``block`` probes share one matmat (with the double-backward operator, one gradient graph per batch when
    the graphs are not kept).
    """
    if samples < 2:
        raise LandscapeError(f"Hutchinson needs at least 2 samples for a standard error, got {samples}")
    first_count = op.hvp_count
    probes = rademacher_vectors(op, seeded_generator(seed), samples)
    report = progress_reporter(op, progress, samples)
    estimate, stderr = mean_and_stderr(_hutchinson_samples(op, probes, max(block, 1), report=report))
    return TraceResult("hutchinson", estimate, stderr, "sample", samples - 1, samples,
                       op.hvp_count - first_count, seed, {"probes": "rademacher", "block": block})


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
    generator = seeded_generator(seed)
    sketch = hvps // 3
    residual_probes = hvps - 2 * sketch
    s = rademacher_vectors(op, generator, sketch)
    g = rademacher_vectors(op, generator, residual_probes)
    report = progress_reporter(op, progress, hvps)
    block = max(block, 1)
    # Householder QR: orthonormal columns even if H S is rank-deficient
    q, _ = torch.linalg.qr(_blocked_matmat(op, s, block, report))
    low_rank_part = float((q * _blocked_matmat(op, q, block, report)).sum().double())
    estimate, stderr = mean_and_stderr(_hutchinson_samples(op, g, block, project=q, report=report))
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


def _xtrace_pairs(h: Tensor, r: Tensor, w: Tensor, omega_sq: Tensor, dim: int, gaussian: bool) -> Tensor:
    """[i, j]: T_j^(i), the XTrace sample of w_j with w_i left out of its sketch too (i != j; the diagonal
    is 0), from the full sketch's coordinates (no product with H), in O(s^3).

    Without w_i, w_j (j != i) is tested against the sketch of the other s - 2 probes: range(Q) less the plane
    spanned by s_i and s_j (the vectors orthogonal to every r_l, l != i, j). With G = [s_i, s_j],
    M = G^T G = [[1, a], [a, 1]] (a = s_i^T s_j), that sketch's projector is P_ij = Q (I - G M^{-1} G^T) Q^T:

        T_j^(i) = tr(h) - tr(M^{-1} G^T h G) + a_j' u^T H u,   u = (I - P_ij) w_j = w_perp + Q G v,

    v = M^{-1} G^T W_j, w_perp = w_j - Q W_j. With H w_j = Q r_j:
    w_perp^T H w_perp = -r_j^T W_j + W_j^T h W_j,
    w_perp^T H Q s_l = r_j^T s_l - W_j^T h s_l (r_j^T s_i = 0), so u^T H u = w_perp^T H w_perp
    + 2 (w_perp^T H Q G) v + v^T (G^T h G) v and ||u||^2 = ||w_j||^2 - ||W_j||^2 + v^T M v; a_j' = 1
    (Rademacher) or (dim - (s - 2)) / ||u||^2 (Gaussian).
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
    if float(det.masked_fill(torch.eye(k, dtype=torch.bool), 1.0).min()) < JACKKNIFE_MIN_DET:
        return _xtrace_pairs_by_qr(h, r, w, omega_sq, dim, gaussian)
    return (torch.trace(h) - removed + quadratic).masked_fill(torch.eye(k, dtype=torch.bool), 0.0)


def _xtrace_pairs_by_qr(h: Tensor, r: Tensor, w: Tensor, omega_sq: Tensor, dim: int, gaussian: bool) -> Tensor:
    """The T_j^(i) of ``_xtrace_pairs`` by a QR of each reduced sketch, in O(s^4): stable where R is
    ill-conditioned. Without w_i the sketch is Y_(i) = Q R_(i) (R without column i) = (Q U_i) R'_i with
    R_(i) = U_i R'_i (reduced QR), so its coordinates are h' = U_i^T h U_i, R'_i and W' = U_i^T W_(i)."""
    s = r.shape[-1]
    pairs = torch.zeros(s, s, dtype=torch.float64)
    for i in range(s):
        others = torch.tensor([j for j in range(s) if j != i])
        u, r_sub = torch.linalg.qr(r[:, others])
        pairs[i, others] = _xtrace_samples(u.T @ h @ u, r_sub, u.T @ w[:, others], omega_sq[others], dim,
                                           gaussian)
    return pairs


def _xtrace_stderrs(samples: Tensor, pairs: Tensor) -> tuple[float, float, float]:
    """(pairwise, paper's, jackknife) standard errors of mean_i T_i from the samples T_i and the
    ``_xtrace_pairs`` T_j^(i) (see ``xtrace``)."""
    k = samples.numel()
    off = ~torch.eye(k, dtype=torch.bool)
    paper_variance = float(samples.var(unbiased=True)) / k
    change = samples[None, :] - pairs  # [i, j]: delta_ji = T_j - T_j^(i)
    covariance = float((change * change.T)[off].mean())  # mean over i != j of delta_ij delta_ji
    left_out = pairs.sum(dim=1) / (k - 1)  # t_(i): the XTrace of the s - 1 probes other than w_i
    jackknife = float(torch.sqrt((k - 1) / k * ((left_out - left_out.mean()) ** 2).sum()))
    return (paper_variance + max(covariance, 0.0)) ** 0.5, paper_variance**0.5, jackknife


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
    ``benchmarks/trace_estimators.py`` compares the two on digits Hessians. The estimate is mean_i T_i.

    Standard error ("pairwise", s - 1 degrees of freedom): sqrt(var(T) / s + C), var(T) the sample variance
    of the T_i (ddof 1) and C = mean over i != j of delta_ij delta_ji (0 if negative), delta_ij = T_i - T_i^(j)
    with T_i^(j) the sample of w_i tested against the sketch without w_j too (``_xtrace_pairs``; from the
    products already made). Unbiased for Var(mean T) (C floored at 0 aside): the T_i are exchangeable, so
    Var(mean T) = E[(T_1 - T_2)^2] / (2s) + Cov(T_1, T_2), and Cov(T_i, T_j) = E[delta_ij delta_ji] because
    the rest of e_i e_j (e_i = T_i - tr H) has mean 0: T_i^(j) - tr H has mean 0 given every probe but w_i,
    and delta_ji mean 0 given every probe but w_j. The paper's error estimate sqrt(var(T) / s) (the
    authors' ``xtrace.m``: std(ests)/sqrt(m)) drops C, treating the T_i as independent although they share
    their probes: too small, sd(z) ~1.5 over many seeds (z = (estimate - tr H) / stderr); the delete-one
    jackknife over the probes, sqrt((s-1)/s sum_i (t_(i) - t_(.))^2) with t_(i) the whole XTrace of the s - 1
    probes other than w_i (t_(i) = mean_{j != i} T_j^(i)), is too large, sd(z) ~0.5-0.85 (by Efron and Stein
    its expectation weighs the k-th order part of the estimator's Hoeffding decomposition ~k times, and
    XTrace's error is far from additive in its probes). Both are kept, ``settings["paper_stderr"]`` and
    ``settings["jackknife_stderr"]``; ``benchmarks/stderr_calibration.py`` measures all three. Docs:
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
    generator = seeded_generator(seed)
    if distribution == "gaussian":
        omega = gaussian_vectors(op, generator, probes)
    else:
        omega = rademacher_vectors(op, generator, probes)
    report = progress_reporter(op, progress, 2 * probes)
    block = max(block, 1)
    q, r = torch.linalg.qr(_blocked_matmat(op, omega, block, report))
    w = (q.T @ omega).double().cpu()  # W = Q^T Omega
    omega_sq = (omega * omega).sum(dim=0).double().cpu()  # ||w_i||^2
    del omega
    h = (q.T @ _blocked_matmat(op, q, block, report)).double().cpu()
    h = (h + h.T) / 2  # Q^T H Q, symmetric up to rounding
    r = r.double().cpu()
    low_rank_part = float(torch.trace(h))
    settings = {"probes": distribution, "test_vectors": probes, "low_rank_part": low_rank_part,
                "block": block}
    diagonal = r.diagonal().abs()
    if float(diagonal.min()) <= probes * torch.finfo(op.dtype).eps * float(diagonal.max()):
        return TraceResult("xtrace", low_rank_part, 0.0, "exact", 0, probes, op.hvp_count - first_count, seed,
                           {**settings, "rank_deficient": True, "paper_stderr": 0.0, "jackknife_stderr": 0.0})
    gaussian = distribution == "gaussian"
    samples = _xtrace_samples(h, r, w, omega_sq, op.dim, gaussian)
    stderr, paper_stderr, jackknife_stderr = _xtrace_stderrs(
        samples, _xtrace_pairs(h, r, w, omega_sq, op.dim, gaussian))
    return TraceResult("xtrace", float(samples.mean()), stderr, "pairwise", probes - 1, probes,
                       op.hvp_count - first_count, seed,
                       {**settings, "rank_deficient": False, "paper_stderr": paper_stderr,
                        "jackknife_stderr": jackknife_stderr})


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

