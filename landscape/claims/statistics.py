"""The statistics of a claim's comparison over seeds (``landscape.claims.checks``): the one-sided paired
t-test, the exact sign-flip permutation test, the detectable difference and Holm's step; docs/metrics.md,
"Claims statistics", gives the definitions.

The statistics (``compare_pair``, then ``decide`` over every comparison of one ``landscape claims`` call): the
runs of the two ids are paired by seed (the same seed draws the same partition, initialisation and client
sampling), d_s = higher_s - lower_s, and the claimed direction is mean(d) > 0. Per comparison, at n seeds:

- ``t``, ``p``, ``p_opposite``: the one-sided paired t-test (n - 1 degrees of freedom) that mean(d) > 0, and
  that mean(d) < 0;
- ``p_signflip``, ``p_signflip_opposite``: the exact sign-flip permutation test (Fisher 1935, Pitman 1937) of
  the same mean over all 2^n sign patterns (distribution-free: it assumes only that each d_s is symmetric
  about 0 under the null); its smallest p is 2^-n (1/32 = 0.031 at n = 5, 1/8 at n = 3);
- ``ci95``: the two-sided 95% t interval of the mean paired difference, mean(d) +- t_{0.975, n-1} SE;
- ``p_holm``, ``p_holm_opposite``: Holm's step-down adjustment of ``p`` (and, as a second family, of
  ``p_opposite``) over the m comparisons of the call that have a test (``family`` = m);
- ``holm_step`` k, ``holm_level``: the step of Holm's procedure at which the comparison's p is tested (its rank
  among the family's p, 1 the smallest; ``holm_steps``) and that step's level, level / (m - k + 1);
- ``detectable_difference``: the smallest true mean difference the one-sided t-test detects with power 0.8 at
  this n and the observed sd of d (noncentral t) at ``holm_level``, the level its Holm step applies (at ``level``
  itself for a comparison tested alone).

A comparison HOLDS when p_holm < ``level`` (default 0.05) and p_signflip < ``level``, is NOT HELD when
p_holm_opposite < ``level`` and p_signflip_opposite < ``level``, and is INCONCLUSIVE otherwise ("no evidence at
n=5, detectable difference X"; with fewer than two seeds or a non-finite value there is no test). The Holm step
on the t-test controls the family-wise error rate of each family at ``level``; the sign-flip condition only
removes verdicts (at n = 5 it asks every seed to agree; below n = 5 no verdict is reachable at 0.05). A claim
is HELD when every comparison holds (an intersection-union test: no further correction), NOT HELD when some
comparison is NOT HELD, and INCONCLUSIVE otherwise. Every verdict carries the per-seed values and all numbers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from landscape.core.errors import LandscapeError
from landscape.figures.seeds import mean_se

POWER = 0.8  # the power at which ``detectable_difference`` is computed
MAX_SEEDS = 40  # the exact sign-flip test enumerates all 2^n sign patterns


def one_sided_paired_t(differences: Sequence[float]) -> tuple[float, float]:
    """(t, p) of the one-sided paired t-test that the mean of ``differences`` is > 0 (n - 1 degrees of freedom).
    A zero spread gives t = +-inf and p = 0 or 1 by the sign of the mean (p = 1 for a zero mean)."""
    from scipy.stats import t as student_t

    d = np.asarray(differences, dtype=float)
    if d.size < 2:
        raise LandscapeError("a paired t-test needs at least two seeds")
    mean, se, _ = mean_se(d)
    if se == 0:
        return (math.inf, 0.0) if mean > 0 else ((-math.inf, 1.0) if mean < 0 else (0.0, 1.0))
    t = mean / se
    return float(t), float(student_t.sf(t, d.size - 1))


def _signed_sums(values: np.ndarray) -> np.ndarray:
    """sum(eps * values) for all 2^len(values) sign patterns eps (one entry per pattern)."""
    sums = np.zeros(1)
    for value in values:
        sums = np.concatenate((sums + value, sums - value))
    return sums


def sign_flip_p(differences: Sequence[float]) -> tuple[float, float]:
    """Exact one-sided p-values of the sign-flip permutation test (Fisher 1935, Pitman 1937) of the mean paired
    difference: over all 2^n sign patterns eps in {-1, +1}^n, the fraction with sum(eps * d) >= sum(d) (the
    direction mean > 0) and the fraction with sum(eps * d) <= sum(d) (mean < 0). Sums within 1e-9 sum|d| of
    the observed one count as ties (in both). The smallest p is 2^-n. The 2^n sums are enumerated exactly as
    the pairs of two halves' sums (meet in the middle), up to ``MAX_SEEDS`` differences."""
    d = np.asarray(differences, dtype=float)
    if d.ndim != 1 or not d.size or not np.all(np.isfinite(d)):
        raise LandscapeError(f"the sign-flip test needs one or more finite differences (got {d.tolist()})")
    if d.size > MAX_SEEDS:
        raise LandscapeError(f"the exact sign-flip test takes at most {MAX_SEEDS} differences (got {d.size})")
    first, second = _signed_sums(d[: d.size // 2]), np.sort(_signed_sums(d[d.size // 2:]))
    observed, tie = float(d.sum()), 1e-9 * float(np.abs(d).sum())
    at_least = first.size * second.size - int(np.searchsorted(second, observed - tie - first, side="left").sum())
    at_most = int(np.searchsorted(second, observed + tie - first, side="right").sum())
    return at_least / 2.0**d.size, at_most / 2.0**d.size


def detectable_difference(sd: float, n: int, level: float, power: float = POWER) -> float:
    """The smallest true mean difference delta that the one-sided paired t-test at ``level`` detects with
    probability ``power`` at ``n`` seeds when the differences have standard deviation ``sd``: delta =
    ncp * sd / sqrt(n), where the noncentrality ncp solves P(T'_{n-1, ncp} > t_{1-level, n-1}) = power (T'
    noncentral t, t the central t quantile; solved with Brent's method). 0 for sd = 0."""
    from scipy.optimize import brentq
    from scipy.stats import nct
    from scipy.stats import t as student_t

    if isinstance(n, bool) or not isinstance(n, int) or n < 2:
        raise LandscapeError(f"a detectable difference needs at least two seeds (got n={n!r})")
    if not math.isfinite(sd) or sd < 0:
        raise LandscapeError(f"a detectable difference needs a finite standard deviation >= 0 (got {sd!r})")
    if not 0 < level < power < 1:
        raise LandscapeError(f"a detectable difference needs 0 < level < power < 1 (got {level!r}, {power!r})")
    if sd == 0:
        return 0.0
    critical = float(student_t.isf(level, n - 1))

    def shortfall(ncp: float) -> float:
        return float(nct.sf(critical, n - 1, ncp)) - power

    high = 1.0
    while shortfall(high) <= 0:
        high *= 2.0
    return float(brentq(shortfall, 0.0, high, xtol=1e-12)) * sd / math.sqrt(n)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's (1979) step-down adjusted p-values: with p_(1) <= ... <= p_(m) the sorted p-values,
    p~_(i) = max_{j <= i} min(1, (m - j + 1) p_(j)), returned in the input's order. Rejecting every hypothesis
    with p~ < level controls the family-wise error rate at level."""
    p = np.asarray(p_values, dtype=float)
    if p.ndim != 1 or not np.all((p >= 0) & (p <= 1)):
        raise LandscapeError(f"Holm's adjustment needs p-values in [0, 1] (got {p.tolist()})")
    order = np.argsort(p, kind="stable")
    adjusted = np.empty_like(p)
    adjusted[order] = np.maximum.accumulate(np.minimum(1.0, (p.size - np.arange(p.size)) * p[order]))
    return adjusted.tolist()


def holm_steps(p_values: Sequence[float]) -> list[int]:
    """The step k (1 = the smallest p) of Holm's procedure at which each p-value is tested, against level /
    (m - k + 1), in the input's order; ties take their input order (as ``holm`` sorts them)."""
    order = np.argsort(np.asarray(p_values, dtype=float), kind="stable")
    steps = np.empty(len(order), dtype=int)
    steps[order] = np.arange(1, len(order) + 1)
    return steps.tolist()
