"""Claims: a published comparison stated in a TOML file and checked on runs of several seeds.

A claim file (``claims/*.toml``) names the figure recipe whose runs it reads (they are trained and analysed
as ``landscape figures`` does, one run per seed), the seeds, and one or more comparisons, each saying which
run id should have the LOWER value of a quantity than another::

    claim = "FedNSAM brings the clients' minima closer than FedSAM at Dir(0.1)"
    source = "FedNSAM (Liu et al. 2026), Fig. 2"
    figure = "../figures/fednsam-fig2-flatness.toml"   # relative to this file
    seeds = [0, 1, 2]
    quantity = "flatness_distance"                    # the default of every comparison below
    rounds = "last 5"

    [[compare]]
    lower = "fednsam-alpha0.1"                        # run ids of the figure recipe
    higher = "fedsam-alpha0.1"

    [[compare]]                                       # a comparison may name its own quantity and rounds
    lower = "fednsam-alpha0.1"
    higher = "fedsam-alpha0.1"
    quantity = "S_rho(0.05)"
    rounds = "last"

Quantities (one number per run): a ``metrics.jsonl`` key (``flatness_distance``, ``test_acc``, ``train_loss``,
... over the rounds that logged it), an analysis quantity by the name the comparison tables give it
(``lambda_max``, ``lambda_1/lambda_k``, ``trace``, ``S_rho(0.05)``, ``Delta_D``, ``Delta_FI``, ``heterogeneity
share``, ``mean grad cos``, ... over the analysed rounds), or ``surface width``: the fraction of the 2D surface's
plane (the ``surface`` output, filter-normalised random directions) whose loss lies within ``tau`` (a claim or
comparison key, default 0.5 nats) of the loss at the centre x. ``rounds``: ``"last"``, ``"last N"`` (the mean of
the last N), ``"all"``, a round number or a list of rounds; a run lacking one of them is an error that names it.

The statistics (``compare_pair``, then ``decide`` over every comparison of one ``landscape claims`` call): the
runs of the two ids are paired by seed (the same seed draws the same partition, initialisation and client
sampling), d_s = higher_s - lower_s, and the claimed direction is mean(d) > 0. Per comparison, at n seeds:

- ``t``, ``p``, ``p_opposite``: the one-sided paired t-test (n - 1 degrees of freedom) that mean(d) > 0, and
  that mean(d) < 0;
- ``p_signflip``, ``p_signflip_opposite``: the exact sign-flip permutation test (Fisher 1935, Pitman 1937) of
  the same mean over all 2^n sign patterns (distribution-free: it assumes only that each d_s is symmetric
  about 0 under the null); its smallest p is 2^-n (1/32 = 0.031 at n = 5, 1/8 at n = 3);
- ``ci95``: the two-sided 95% t interval of the mean paired difference, mean(d) +- t_{0.975, n-1} SE;
- ``detectable_difference``: the smallest true mean difference the one-sided t-test at ``level`` detects with
  power 0.8 at this n and the observed sd of d (noncentral t; before the Holm step, so a lower bound);
- ``p_holm``, ``p_holm_opposite``: Holm's step-down adjustment of ``p`` (and, as a second family, of
  ``p_opposite``) over the m comparisons of the call that have a test (``family`` = m).

A comparison HOLDS when p_holm < ``level`` (default 0.05) and p_signflip < ``level``, is NOT HELD when
p_holm_opposite < ``level`` and p_signflip_opposite < ``level``, and is INCONCLUSIVE otherwise ("no evidence at
n=5, detectable difference X"; with fewer than two seeds or a non-finite value there is no test). The Holm step
on the t-test controls the family-wise error rate of each family at ``level``; the sign-flip condition only
removes verdicts (at n = 5 it asks every seed to agree; below n = 5 no verdict is reachable at 0.05). A claim
is HELD when every comparison holds (an intersection-union test: no further correction), NOT HELD when some
comparison is NOT HELD, and INCONCLUSIVE otherwise. Every verdict carries the per-seed values and all numbers.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from landscape.errors import LandscapeError
from landscape.figures.curves import RunData
from landscape.figures.report import quantities
from landscape.figures.seeds import mean_se
from landscape.recipe import read_toml
from landscape.runs import write_text

HELD, NOT_HELD, INCONCLUSIVE = "HELD", "NOT HELD", "INCONCLUSIVE"
SURFACE_WIDTH = "surface width"
DEFAULT_TAU = 0.5  # nats above the centre's loss: the level set whose area ``surface width`` measures
CONFIDENCE = 0.95  # the two-sided t interval of the mean paired difference
POWER = 0.8  # the power at which ``detectable_difference`` is computed
MAX_SEEDS = 40  # the exact sign-flip test enumerates all 2^n sign patterns
_TOP_KEYS = {"claim", "source", "figure", "seeds", "quantity", "rounds", "level", "tau", "compare"}
_COMPARE_KEYS = {"lower", "higher", "quantity", "rounds", "tau"}
_LAST_N = re.compile(r"^last\s+(\d+)$")
_RHO = re.compile(r"^S_rho\(([^)]+)\)$")


@dataclass(frozen=True)
class Comparison:
    """``lower`` should have the lower ``quantity`` than ``higher`` (run ids of the claim's figure recipe)."""

    lower: str
    higher: str
    quantity: str
    rounds: str | int | tuple[int, ...]
    tau: float = DEFAULT_TAU

    @property
    def text(self) -> str:
        return f"{self.quantity}: {self.lower} < {self.higher}"


@dataclass(frozen=True)
class Claim:
    path: Path
    name: str  # the file's stem
    text: str
    source: str
    figure: Path
    seeds: tuple[int, ...]
    comparisons: tuple[Comparison, ...]
    level: float = 0.05

    def run_ids(self) -> list[str]:
        ids: list[str] = []
        for c in self.comparisons:
            ids += [i for i in (c.lower, c.higher) if i not in ids]
        return ids


def _rounds(value: Any, where: str) -> str | int | tuple[int, ...]:
    if isinstance(value, bool):
        raise LandscapeError(f"{where}: rounds must be \"last\", \"last N\", \"all\", a round or a list of rounds")
    if isinstance(value, int) and value >= 0:
        return value
    if isinstance(value, list) and value and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                                                 for v in value):
        return tuple(value)
    if isinstance(value, str):
        text = " ".join(value.split())
        match = _LAST_N.match(text)
        if text in ("last", "all") or (match and int(match.group(1)) >= 1):
            return text
    raise LandscapeError(f"{where}: rounds must be \"last\", \"last N\", \"all\", a round or a list of rounds "
                         f"(got {value!r})")


def _positive(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise LandscapeError(f"{what} must be a positive number (got {value!r})")
    return float(value)


def load_claim(path: str | Path, seeds: Sequence[int] | None = None) -> Claim:
    """Read and check a claim file; ``seeds`` replaces the file's."""
    path = Path(path)
    raw = read_toml(path)
    unknown = sorted(set(raw) - _TOP_KEYS)
    if unknown:
        raise LandscapeError(f"{path}: unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(_TOP_KEYS))})")
    for key in ("claim", "figure"):
        if not isinstance(raw.get(key), str) or not raw[key].strip():
            raise LandscapeError(f"{path}: `{key}` must be a non-empty string")
    figure = (path.parent / raw["figure"]).resolve()
    if not figure.is_file():
        raise LandscapeError(f"{path}: figure recipe {raw['figure']} not found (looked for {figure})")
    chosen = list(seeds) if seeds is not None else raw.get("seeds", [0])
    if (not isinstance(chosen, list) or not chosen
            or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in chosen)
            or len(set(chosen)) != len(chosen)):
        raise LandscapeError(f"{path}: seeds must be a list of distinct non-negative integers (got {chosen!r})")
    if len(chosen) > MAX_SEEDS:
        raise LandscapeError(f"{path}: at most {MAX_SEEDS} seeds (the exact sign-flip test enumerates 2^n sign "
                             f"patterns; got {len(chosen)})")
    level = _positive(raw.get("level", 0.05), f"{path}: level")
    if level >= 0.5:
        raise LandscapeError(f"{path}: level must be below 0.5 (got {level})")
    tau = _positive(raw.get("tau", DEFAULT_TAU), f"{path}: tau")
    entries = raw.get("compare")
    if not isinstance(entries, list) or not entries or not all(isinstance(e, dict) for e in entries):
        raise LandscapeError(f"{path}: a claim needs at least one [[compare]] table")
    comparisons = []
    for i, entry in enumerate(entries, 1):
        where = f"{path}: [[compare]] {i}"
        unknown = sorted(set(entry) - _COMPARE_KEYS)
        if unknown:
            raise LandscapeError(f"{where}: unknown key(s) {', '.join(unknown)} "
                                 f"(known: {', '.join(sorted(_COMPARE_KEYS))})")
        for key in ("lower", "higher"):
            if not isinstance(entry.get(key), str) or not entry[key]:
                raise LandscapeError(f"{where}: `{key}` must name a run id of the figure recipe")
        if entry["lower"] == entry["higher"]:
            raise LandscapeError(f"{where}: lower and higher name the same run id {entry['lower']!r}")
        quantity = entry.get("quantity", raw.get("quantity"))
        if not isinstance(quantity, str) or not quantity.strip():
            raise LandscapeError(f"{where}: no quantity (set `quantity` in the comparison or at the top)")
        if "rounds" not in entry and "rounds" not in raw:
            raise LandscapeError(f"{where}: no rounds (set `rounds` in the comparison or at the top)")
        comparisons.append(Comparison(entry["lower"], entry["higher"], quantity.strip(),
                                      _rounds(entry.get("rounds", raw.get("rounds")), where),
                                      _positive(entry.get("tau", tau), f"{where}: tau")))
    return Claim(path, path.stem, raw["claim"].strip(), str(raw.get("source", "")).strip(), figure,
                 tuple(chosen), tuple(comparisons), level)


def check_run_ids(claim: Claim, known: Sequence[str]) -> None:
    """One line naming the ids a claim compares that its figure recipe does not define."""
    missing = [i for i in claim.run_ids() if i not in known]
    if missing:
        raise LandscapeError(f"{claim.path}: run id(s) {', '.join(missing)} are not in {claim.figure.name} "
                             f"(its runs: {', '.join(known)})")


# -- one number per run -----------------------------------------------------------------------------------------


def _pick(rounds_have: Sequence[int], spec: str | int | tuple[int, ...], run: RunData, what: str) -> list[int]:
    have = sorted(rounds_have)
    if not have:
        raise LandscapeError(f"run {run.path} has no {what}")
    if spec == "all":
        return have
    if spec == "last":
        return have[-1:]
    if isinstance(spec, str):
        n = int(_LAST_N.match(spec).group(1))  # checked by _rounds
        if len(have) < n:
            raise LandscapeError(f"run {run.path} has {what} at {len(have)} round(s), the claim asks for the last {n}")
        return have[-n:]
    wanted = [spec] if isinstance(spec, int) else list(spec)
    lacking = [r for r in wanted if r not in have]
    if lacking:
        raise LandscapeError(f"run {run.path} has no {what} at round(s) {', '.join(map(str, lacking))} "
                             f"(it has {', '.join(map(str, have))})")
    return wanted


def surface_width(loss: np.ndarray, x: np.ndarray, y: np.ndarray, tau: float) -> float:
    """The fraction of a 2D grid whose loss is at most tau above the loss at the grid point nearest (0, 0)."""
    if loss.ndim != 2 or not loss.size:
        raise LandscapeError("surface width needs a 2D surface")
    centre = loss[int(np.argmin(np.abs(x))), int(np.argmin(np.abs(y)))]
    finite = np.isfinite(loss)
    return float(np.count_nonzero(finite & (loss <= centre + tau)) / loss.size)


def _analysis_value(run: RunData, quantity: str, round: int, tau: float) -> float:
    if quantity == SURFACE_WIDTH:
        from landscape.figures.surfaces import load_surface, normalization_of

        surface = load_surface(run.analyses[round]["surface"].path)
        if normalization_of(surface.meta) == "filter":  # each model's plane scaled by its own weights
            raise LandscapeError(
                f"run {run.path}: surface width on a per-model filter-normalised plane also compares weight norms; "
                'analyse with surface.normalization = "filter-reference" and reference = "round:0" (or '
                '"euclidean"), as figures/fednsam-fig1-surfaces.toml does')
        if not surface.is_2d:
            raise LandscapeError(f"run {run.path}: surface width needs a 2D surface (round {round} has a 1D one)")
        return surface_width(surface.loss, surface.x_coords, surface.y_coords, tau)
    value = _QUANTITIES[quantity].read(run.analyses[round][_QUANTITIES[quantity].pass_name])[0]
    if value is None:
        raise LandscapeError(f"run {run.path}: the {quantity} result of round {round} has no value")
    return float(value)


def analysis_output(quantity: str) -> str | None:
    """The pass output an analysis quantity reads, None for a metrics.jsonl key."""
    if quantity == SURFACE_WIDTH:
        return "surface"
    match = _RHO.match(quantity)
    if match:
        try:
            rho = float(match.group(1))
        except ValueError:
            raise LandscapeError(f"bad radius in {quantity!r}: write e.g. S_rho(0.05)") from None
        for q in quantities([rho]):
            _QUANTITIES.setdefault(q.text, q)
    return _QUANTITIES[quantity].pass_name if quantity in _QUANTITIES else None


_QUANTITIES = {q.text: q for q in quantities([])}


def run_value(run: RunData, quantity: str, rounds: str | int | tuple[int, ...], tau: float = DEFAULT_TAU
              ) -> tuple[float, list[int]]:
    """The run's number for ``quantity``: its mean over the chosen rounds, and those rounds."""
    output = analysis_output(quantity)
    if output is None:
        if not run.has_metric(quantity):
            known = ", ".join(sorted(_QUANTITIES) + [SURFACE_WIDTH])
            raise LandscapeError(f"run {run.path}: {quantity!r} is neither a metrics.jsonl key it logged nor an "
                                 f"analysis quantity ({known})")
        logged, values = run.series(quantity)
        by_round = dict(zip((int(r) for r in logged), (float(v) for v in values)))
        chosen = _pick(list(by_round), rounds, run, f"{quantity} in metrics.jsonl")
        return float(np.mean([by_round[r] for r in chosen])), chosen
    chosen = _pick(run.analysed_rounds(output), rounds, run, f"{output} analysis")
    return float(np.mean([_analysis_value(run, quantity, r, tau) for r in chosen])), chosen


# -- the test ---------------------------------------------------------------------------------------------------


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


@dataclass(frozen=True)
class ComparisonResult:
    """Every number of one comparison; d_s = higher_s - lower_s over the seeds both ids have. The statistics are
    None without a test (fewer than two seeds, or a non-finite value); ``reason`` says why the verdict is what
    it is."""

    comparison: Comparison
    seeds: tuple[int, ...]
    lower: tuple[float, ...]  # per seed
    higher: tuple[float, ...]
    rounds: tuple[int, ...]  # the rounds averaged (of the first run; every run must have them)
    level: float
    t: float | None = None  # one-sided paired t-test
    p: float | None = None  # its p, higher > lower (the claimed direction)
    p_opposite: float | None = None  # its p, higher < lower
    p_signflip: float | None = None  # exact sign-flip permutation test, higher > lower
    p_signflip_opposite: float | None = None
    mean_difference: float | None = None  # mean of d
    ci95: tuple[float, float] | None = None  # two-sided 95% t interval of the mean of d
    detectable_difference: float | None = None  # one-sided t-test at level, power POWER, observed sd of d
    p_holm: float | None = None  # p after Holm's step over the family's comparisons
    p_holm_opposite: float | None = None  # p_opposite after Holm's step (the refutation family)
    family: int = 0  # m, the number of tested comparisons Holm's step ran over
    verdict: str = INCONCLUSIVE
    reason: str = ""

    def summary(self) -> str:
        lo, lo_se, n = mean_se(self.lower)
        hi, hi_se, _ = mean_se(self.higher)
        return f"{self.comparison.lower} {_num(lo, lo_se)} vs {self.comparison.higher} {_num(hi, hi_se)}; n={n}"

    def statistics(self) -> str:
        """d's mean and interval, t and the three p-values of the claimed direction, then the reason."""
        if self.t is None:
            return self.reason
        low, high = self.ci95
        return (f"higher - lower {self.mean_difference:.4g} (95% CI {low:.3g} to {high:.3g}); t={self.t:.2f}, "
                f"p_t={_p(self.p)}, p_sign-flip={_p(self.p_signflip)}, p_Holm={_p(self.p_holm)} "
                f"(of {self.family}): {self.reason}")


def _num(value: float, se: float | None) -> str:
    return f"{value:.4g}" + (f" +- {se:.2g}" if se is not None else "")


def _p(p: float | None) -> str:
    return "-" if p is None else (f"{p:.3f}" if p >= 0.001 else f"{p:.1e}")


def compare_pair(comparison: Comparison, lower: Mapping[int, RunData], higher: Mapping[int, RunData],
                 level: float) -> ComparisonResult:
    """Pair the two ids' runs by seed and compute every statistic of ``higher > lower`` (and the opposite);
    the verdict is that of a family of one comparison (``decide`` redoes it over every comparison of a call)."""
    from scipy.stats import t as student_t

    seeds = tuple(sorted(set(lower) & set(higher)))
    if not seeds:
        raise LandscapeError(f"{comparison.lower} and {comparison.higher} have no seed in common")
    low, high, rounds = [], [], ()
    for seed in seeds:
        a, a_rounds = run_value(lower[seed], comparison.quantity, comparison.rounds, comparison.tau)
        b, b_rounds = run_value(higher[seed], comparison.quantity, comparison.rounds, comparison.tau)
        if a_rounds != b_rounds:
            raise LandscapeError(f"{comparison.text}, seed {seed}: the runs have {comparison.quantity} at different "
                                 f"rounds ({a_rounds} against {b_rounds}); analyse both at the same rounds")
        low.append(a)
        high.append(b)
        rounds = rounds or tuple(a_rounds)
    base = ComparisonResult(comparison, seeds, tuple(low), tuple(high), rounds, level)
    bad = [f"seed {s} of {run_id} is {v}" for s, a, b in zip(seeds, low, high)
           for run_id, v in ((comparison.lower, a), (comparison.higher, b)) if not math.isfinite(v)]
    if bad:
        return replace(base, reason="no test: " + ", ".join(bad))
    if len(seeds) < 2:
        return replace(base, reason=f"no test at n={len(seeds)}: a paired test needs at least two seeds")
    d = np.asarray(high) - np.asarray(low)
    mean, se, n = mean_se(d)
    t, p = one_sided_paired_t(d)
    _, p_opposite = one_sided_paired_t(-d)
    p_signflip, p_signflip_opposite = sign_flip_p(d)
    half = float(student_t.ppf(0.5 + CONFIDENCE / 2, n - 1)) * se
    tested = replace(base, t=t, p=p, p_opposite=p_opposite, p_signflip=p_signflip,
                     p_signflip_opposite=p_signflip_opposite, mean_difference=mean, ci95=(mean - half, mean + half),
                     detectable_difference=detectable_difference(float(np.std(d, ddof=1)), n, level))
    return _decided(tested, p, p_opposite, 1)


def _decided(r: ComparisonResult, p_holm: float, p_holm_opposite: float, family: int) -> ComparisonResult:
    """The verdict from the Holm-adjusted t p-values and the sign-flip p-values (see the module docstring)."""
    level, n = r.level, len(r.seeds)
    if p_holm < level and r.p_signflip < level:
        verdict = HELD
        reason = f"p_Holm {_p(p_holm)} and p_sign-flip {_p(r.p_signflip)} < {level:g}"
    elif p_holm_opposite < level and r.p_signflip_opposite < level:
        verdict = NOT_HELD
        reason = (f"refuted: opposite direction p_Holm {_p(p_holm_opposite)} and p_sign-flip "
                  f"{_p(r.p_signflip_opposite)} < {level:g}")
    else:
        verdict = INCONCLUSIVE
        reason = f"no evidence at n={n}, detectable difference {r.detectable_difference:.2g}"
        if 2.0**-n >= level:
            reason += (f" (the sign-flip test cannot reach p < {level:g} with {n} seeds: its smallest p is "
                       f"2^-{n} = {2.0**-n:.3g})")
        elif min(p_holm, p_holm_opposite) < level:
            reason += " (the t-test alone would decide; the sign-flip test does not agree)"
    return replace(r, p_holm=p_holm, p_holm_opposite=p_holm_opposite, family=family, verdict=verdict, reason=reason)


@dataclass(frozen=True)
class ClaimResult:
    claim: Claim
    verdict: str
    comparisons: tuple[ComparisonResult, ...]
    notes: tuple[str, ...] = field(default=())

    def lines(self) -> list[str]:
        out = [f"{self.verdict}: {self.claim.text} [{self.claim.name}]"]
        for r in self.comparisons:
            out.append(f"  {r.verdict:<12} {r.comparison.text} ({_rounds_text(r.comparison.rounds)}): "
                       f"{r.summary()}")
            out.append(f"  {'':<12} {r.statistics()}")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "claim": self.claim.text, "file": str(self.claim.path), "source": self.claim.source,
            "verdict": self.verdict, "level": self.claim.level,
            "test": "d = higher - lower per seed; p: one-sided paired t-test (mean d > 0), p_signflip: exact "
                    "sign-flip permutation test of mean d over 2^n patterns, p_holm: p after Holm's step over "
                    "the `holm_family` tested comparisons of the call (p_holm_opposite: the same for "
                    "p_opposite); HELD: p_holm < level and p_signflip < level; NOT HELD: the same for the "
                    "opposite direction; claim: intersection-union",
            "confidence": CONFIDENCE, "power": POWER, "notes": list(self.notes),
            "comparisons": [{
                "lower": r.comparison.lower, "higher": r.comparison.higher, "quantity": r.comparison.quantity,
                "rounds": list(r.rounds), "seeds": list(r.seeds), "n": len(r.seeds), "lower_values": list(r.lower),
                "higher_values": list(r.higher), "mean_difference": r.mean_difference,
                "ci95": None if r.ci95 is None else list(r.ci95), "t": _finite(r.t), "p": r.p,
                "p_opposite": r.p_opposite, "p_signflip": r.p_signflip,
                "p_signflip_opposite": r.p_signflip_opposite, "p_holm": r.p_holm,
                "p_holm_opposite": r.p_holm_opposite, "holm_family": r.family,
                "detectable_difference": r.detectable_difference, "verdict": r.verdict, "reason": r.reason}
                for r in self.comparisons],
        }


def _finite(value: float | None) -> float | str | None:
    return value if value is None or math.isfinite(value) else ("inf" if value > 0 else "-inf")


def _rounds_text(rounds: str | int | tuple[int, ...]) -> str:
    if isinstance(rounds, str):
        return f"{rounds} rounds" if rounds.startswith("last ") else f"{rounds} round" + ("s" if rounds == "all" else "")
    if isinstance(rounds, int):
        return f"round {rounds}"
    return "rounds " + ",".join(map(str, rounds))


def _claim_result(claim: Claim, results: tuple[ComparisonResult, ...]) -> ClaimResult:
    verdicts = [r.verdict for r in results]
    verdict = HELD if all(v == HELD for v in verdicts) else (NOT_HELD if NOT_HELD in verdicts else INCONCLUSIVE)
    notes = tuple(f"{r.comparison.text}: {r.reason}" for r in results if r.t is None)
    return ClaimResult(claim, verdict, results, notes)


def decide(results: Sequence[ClaimResult]) -> list[ClaimResult]:
    """Holm's step over every tested comparison of ``results`` (one ``landscape claims`` call: the family of
    claimed directions, and apart from it the family of opposite directions), and the verdicts it gives."""
    tested = [(i, j) for i, result in enumerate(results) for j, r in enumerate(result.comparisons) if r.t is not None]
    found = [list(result.comparisons) for result in results]
    adjusted = holm([found[i][j].p for i, j in tested])
    opposite = holm([found[i][j].p_opposite for i, j in tested])
    for (i, j), p_holm, p_holm_opposite in zip(tested, adjusted, opposite):
        found[i][j] = _decided(found[i][j], p_holm, p_holm_opposite, len(tested))
    return [_claim_result(result.claim, tuple(rows)) for result, rows in zip(results, found)]


def evaluate(claim: Claim, runs: Mapping[str, Sequence[RunData]]) -> ClaimResult:
    """The claim's verdict over ``runs`` (run id -> its runs, one per seed; the seed read from each recipe), with
    Holm's step over this claim's comparisons alone (``decide`` redoes it over every claim of a call)."""
    by_seed: dict[str, dict[int, RunData]] = {}
    for run_id in claim.run_ids():
        if run_id not in runs:
            raise LandscapeError(f"{claim.path}: no runs of id {run_id!r}")
        by_seed[run_id] = {int(run.recipe.get("seed", 0)): run for run in runs[run_id]}
    results = tuple(compare_pair(c, by_seed[c.lower], by_seed[c.higher], claim.level) for c in claim.comparisons)
    return decide([_claim_result(claim, results)])[0]


def markdown_table(results: Sequence[ClaimResult]) -> str:
    """One row per comparison: claim, verdict, quantity, the two means +- SE, n, the mean paired difference with
    its 95% interval, t, the three p-values of the claimed direction and the detectable difference; a legend."""
    header = ("| claim | verdict | comparison (lower < higher) | lower: mean +- SE | higher: mean +- SE | n "
              "| higher - lower (95% CI) | t | p_t | p_sign-flip | p_Holm | detectable |")
    lines = [header, "|" + "---|" * 12]
    family = max((r.family for result in results for r in result.comparisons), default=0)
    for result in results:
        for i, r in enumerate(result.comparisons):
            lo, lo_se, n = mean_se(r.lower)
            hi, hi_se, _ = mean_se(r.higher)
            head = (f"{result.claim.text} (`{result.claim.name}`)", f"**{result.verdict}**") if i == 0 else ("", "")
            diff = "-" if r.ci95 is None else f"{r.mean_difference:.3g} ({r.ci95[0]:.3g} to {r.ci95[1]:.3g})"
            lines.append(f"| {head[0]} | {head[1]} | {r.comparison.quantity} ({_rounds_text(r.comparison.rounds)}): "
                         f"{r.comparison.lower} < {r.comparison.higher}: {r.verdict} | {_num(lo, lo_se)} | "
                         f"{_num(hi, hi_se)} | {n} | {diff} | {'-' if r.t is None else f'{r.t:.2f}'} | "
                         f"{_p(r.p)} | {_p(r.p_signflip)} | {_p(r.p_holm)} | "
                         f"{'-' if r.detectable_difference is None else f'{r.detectable_difference:.2g}'} |")
    lines += ["", (f"p-values of the claimed direction (higher > lower), one-sided: p_t the paired t-test, "
              f"p_sign-flip the exact sign-flip permutation test (smallest p 2^-n), p_Holm p_t after Holm's step "
              f"over the {family} tested comparisons. HELD: p_Holm and p_sign-flip below the level (refuted: the "
              f"same for the opposite direction). detectable: the smallest mean difference the one-sided t-test "
              f"at the level detects with power {POWER:g} at this n and sd (before Holm's step).")]
    return "\n".join(lines)


def write_results(results: Sequence[ClaimResult], out: Path) -> list[Path]:
    """``claims.json`` (every number) and ``claims.md`` (the table) under ``out``."""
    written = [out / "claims.json", out / "claims.md"]
    write_text(written[0], json.dumps([r.to_dict() for r in results], indent=1) + "\n")
    write_text(written[1], markdown_table(results) + "\n")
    return written
