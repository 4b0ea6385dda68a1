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

The statistics of each comparison and the verdict rule: ``landscape.claims.claim_statistics``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from landscape.claims.claim_files import (
    _QUANTITIES,
    DEFAULT_TAU,
    LAST_N,
    SURFACE_WIDTH,
    Claim,
    Comparison,
    analysis_output,
    check_run_ids,
    load_claim,
)
from landscape.claims.claim_statistics import (
    MAX_SEEDS,
    POWER,
    detectable_difference,
    holm,
    one_sided_paired_t,
    sign_flip_p,
)
from landscape.core.errors import LandscapeError
from landscape.figures.rundata import RunData
from landscape.figures.seeds import mean_se
from landscape.store.fileio import write_text

__all__ = [  # the claims API, with what it takes from claim_files and claim_statistics
    "DEFAULT_TAU", "HELD", "INCONCLUSIVE", "MAX_SEEDS", "NOT_HELD", "SURFACE_WIDTH", "Claim", "ClaimResult",
    "Comparison", "ComparisonResult", "analysis_output", "check_run_ids", "compare_pair", "decide",
    "detectable_difference", "evaluate", "holm", "load_claim", "markdown_table", "one_sided_paired_t", "run_value",
    "sign_flip_p", "surface_width", "write_results",
]

HELD, NOT_HELD, INCONCLUSIVE = "HELD", "NOT HELD", "INCONCLUSIVE"
CONFIDENCE = 0.95  # the two-sided t interval of the mean paired difference


def _pick(rounds_have: Sequence[int], spec: str | int | tuple[int, ...], run: RunData, what: str) -> list[int]:
    have = sorted(rounds_have)
    if not have:
        raise LandscapeError(f"run {run.path} has no {what}")
    if spec == "all":
        return have
    if spec == "last":
        return have[-1:]
    if isinstance(spec, str):
        n = int(LAST_N.match(spec).group(1))  # checked by _rounds
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
        from landscape.figures.surface_data import load_surface, normalization_of

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
