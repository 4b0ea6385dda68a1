"""Claims: a published comparison stated in a TOML file and checked on runs of several seeds.

A claim file (``claims/*.toml``) names the figure recipe whose runs it reads (they are trained and analysed
as ``landscape figures`` does, one run per seed), the seeds, and one or more comparisons, each saying which
run id should have the LOWER value of a quantity than another::

    claim = "FedNSAM brings the clients' minima closer than FedSAM at Dir(0.1)"
    source = "FedNSAM (Liu et al. 2026), Fig. 2"       # hypothesis = true: a claim no paper makes
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

Quantities (one number per run): a ``metrics.jsonl`` key (``flatness_distance``, ``flatness_distance_relative``,
``test_acc``, ``train_loss``, ... over the rounds that logged it), an analysis quantity by the name the comparison
tables give it (``lambda_max``, ``lambda_1/lambda_k``, ``trace``, ``S_rho(0.05)``, ``Delta_D``, ``Delta_FI``,
``heterogeneity share``, ``mean grad cos``, ... over the analysed rounds), ``adaptive S_rho(0.05)`` (the
sharpness pass's adaptive-ball S_rho, with its option ``adaptive = true``), or ``surface width``: the fraction of the 2D surface's
plane (the ``surface`` output, filter-normalised random directions) whose loss lies within ``tau`` (a claim or
comparison key, default 0.5 nats) of the loss at the centre x. ``rounds``: ``"last"``, ``"last N"`` (the mean of
the last N), ``"all"``, a round number or a list of rounds; a run lacking one of them is an error that names it.

The statistics of each comparison and the verdict rule: ``landscape.claims.statistics``; the table, each
claim's operationalisation and the FRAGILE mark: ``landscape.claims.table``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from landscape.claims.files import (
    DEFAULT_TAU,
    SURFACE_WIDTH,
    Claim,
    Comparison,
    analysis_output,
    check_run_ids,
    load_claim,
    run_value,
    scale_of,
    surface_width,
)
from landscape.claims.statistics import (
    MAX_SEEDS,
    POWER,
    detectable_difference,
    holm,
    holm_steps,
    one_sided_paired_t,
    sign_flip_p,
)
from landscape.core.errors import LandscapeError
from landscape.core.rounds import ALL, LAST, Rounds
from landscape.figures.rundata import RunData
from landscape.figures.seeds import mean_se

__all__ = [  # the claims API, with what it takes from files and statistics
    "DEFAULT_TAU", "HELD", "INCONCLUSIVE", "MAX_SEEDS", "NOT_HELD", "SURFACE_WIDTH", "Claim", "ClaimResult",
    "Comparison", "ComparisonResult", "analysis_output", "check_run_ids", "compare_pair", "decide",
    "detectable_difference", "evaluate", "holm", "holm_steps", "load_claim", "one_sided_paired_t", "run_value",
    "scale_of", "sign_flip_p", "surface_width",
]

HELD, NOT_HELD, INCONCLUSIVE = "HELD", "NOT HELD", "INCONCLUSIVE"
CONFIDENCE = 0.95  # the two-sided t interval of the mean paired difference


# -- the test ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ComparisonResult:
    """Every number of one comparison; d_s = higher_s - lower_s over the seeds both ids have. The statistics are
    None without a test (fewer than two seeds, or a non-finite value); ``reason`` says why the verdict is what
    it is. ``other_verdict``: its verdict in other results of the same comparison (``claims_table.compare_with``:
    another memory layout); FRAGILE when it differs."""

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
    sd: float | None = None  # standard deviation of d (n - 1)
    ci95: tuple[float, float] | None = None  # two-sided 95% t interval of the mean of d
    detectable_difference: float | None = None  # one-sided t-test at holm_level, power POWER, sd
    p_holm: float | None = None  # p after Holm's step over the family's comparisons
    p_holm_opposite: float | None = None  # p_opposite after Holm's step (the refutation family)
    family: int = 0  # m, the number of tested comparisons Holm's step ran over
    holm_step: int = 0  # k: p is tested at Holm's k-th step (its rank in the family, 1 the smallest)
    holm_level: float | None = None  # level / (m - k + 1), the level of that step
    verdict: str = INCONCLUSIVE
    reason: str = ""
    other_verdict: str | None = None

    @property
    def fragile(self) -> bool:
        return self.other_verdict is not None and self.other_verdict != self.verdict

    def summary(self) -> str:
        lo, lo_se, n = mean_se(self.lower)
        hi, hi_se, _ = mean_se(self.higher)
        return f"{self.comparison.lower} {_num(lo, lo_se)} vs {self.comparison.higher} {_num(hi, hi_se)}; n={n}"

    def statistics(self) -> str:
        """d's mean and interval, t and the p-values of both directions, then the reason."""
        if self.t is None:
            return self.reason
        low, high = self.ci95
        return (f"higher - lower {self.mean_difference:.4g} (95% CI {low:.3g} to {high:.3g}); t={self.t:.2f}, "
                f"p_t={_p(self.p)}, p_sign-flip={_p(self.p_signflip)}, p_Holm={_p(self.p_holm)} "
                f"(of {self.family}); opposite p_t={_p(self.p_opposite)}, "
                f"p_sign-flip={_p(self.p_signflip_opposite)}, p_Holm={_p(self.p_holm_opposite)}: {self.reason}")


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
                     p_signflip_opposite=p_signflip_opposite, mean_difference=mean, sd=float(np.std(d, ddof=1)),
                     ci95=(mean - half, mean + half))
    return _decided(tested, p, p_opposite, 1, 1)


def _decided(r: ComparisonResult, p_holm: float, p_holm_opposite: float, family: int, step: int
             ) -> ComparisonResult:
    """The verdict from the Holm-adjusted t p-values and the sign-flip p-values (see the module docstring), and
    the detectable difference at the level of the comparison's Holm ``step``."""
    level, n = r.level, len(r.seeds)
    holm_level = level / (family - step + 1)
    detectable = detectable_difference(r.sd, n, holm_level)
    if p_holm < level and r.p_signflip < level:
        verdict = HELD
        reason = f"p_Holm {_p(p_holm)} and p_sign-flip {_p(r.p_signflip)} < {level:g}"
    elif p_holm_opposite < level and r.p_signflip_opposite < level:
        verdict = NOT_HELD
        reason = (f"refuted: opposite direction p_Holm {_p(p_holm_opposite)} and p_sign-flip "
                  f"{_p(r.p_signflip_opposite)} < {level:g}")
    else:
        verdict = INCONCLUSIVE
        reason = f"no evidence at n={n}, detectable difference {detectable:.2g}"
        if 2.0**-n >= level:
            reason += (f" (the sign-flip test cannot reach p < {level:g} with {n} seeds: its smallest p is "
                       f"2^-{n} = {2.0**-n:.3g})")
        elif min(p_holm, p_holm_opposite) < level:
            reason += " (the t-test alone would decide; the sign-flip test does not agree)"
        if r.p_opposite < level:  # counter-evidence that Holm's step over the family does not confirm
            reason += (f"; the opposite direction has p_t {_p(r.p_opposite)}, p_sign-flip "
                       f"{_p(r.p_signflip_opposite)}, p_Holm {_p(p_holm_opposite)}")
    return replace(r, p_holm=p_holm, p_holm_opposite=p_holm_opposite, family=family, holm_step=step,
                   holm_level=holm_level, detectable_difference=detectable, verdict=verdict, reason=reason)


@dataclass(frozen=True)
class ClaimResult:
    """A claim's verdict, its comparisons' results, notes, the partition each compared run id trained on
    (``partition_text``: (run id, text) pairs) and, from other results, the claim's verdict there."""

    claim: Claim
    verdict: str
    comparisons: tuple[ComparisonResult, ...]
    notes: tuple[str, ...] = field(default=())
    partitions: tuple[tuple[str, str], ...] = field(default=())
    other_verdict: str | None = None

    @property
    def fragile(self) -> bool:
        return self.other_verdict is not None and self.other_verdict != self.verdict

    def operationalisation(self) -> str:
        """One line: each quantity with its scale (raw / relative) and the rounds it is averaged over, then the
        partition (name and options) of the compared runs."""
        parts: dict[str, list[str]] = {}
        for r in self.comparisons:
            shown = f"{r.comparison.quantity} ({scale_of(r.comparison.quantity)})"
            if shown not in parts.setdefault(_span(r.rounds), []):
                parts[_span(r.rounds)].append(shown)
        texts = {text for _, text in self.partitions}
        if len(texts) == 1:
            partition = f"partition {texts.pop()}"
        else:
            partition = "partitions " + ", ".join(f"{run_id}: {text}" for run_id, text in self.partitions)
        return "; ".join([*(f"{' and '.join(q)} {span}" for span, q in parts.items()), partition])

    def lines(self) -> list[str]:
        mark = f" FRAGILE ({self.other_verdict} in the other results)" if self.fragile else ""
        out = [f"{self.verdict}{mark}: {self.claim.text} [{self.claim.name}]"
               + (" (this project's hypothesis)" if self.claim.hypothesis else ""),
               f"  tested as: {self.operationalisation()}"]
        for r in self.comparisons:
            mark = f" FRAGILE ({r.other_verdict} in the other results)" if r.fragile else ""
            out.append(f"  {r.verdict:<12} {r.comparison.text} ({_rounds_text(r.comparison.rounds)}): "
                       f"{r.summary()}{mark}")
            out.append(f"  {'':<12} {r.statistics()}")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "claim": self.claim.text, "name": self.claim.name, "file": str(self.claim.path),
            "source": self.claim.source, "hypothesis": self.claim.hypothesis, "verdict": self.verdict,
            "other_verdict": self.other_verdict, "fragile": self.fragile, "level": self.claim.level,
            "operationalisation": self.operationalisation(), "partitions": dict(self.partitions),
            "test": "d = higher - lower per seed; p: one-sided paired t-test (mean d > 0), p_signflip: exact "
                    "sign-flip permutation test of mean d over 2^n patterns, p_holm: p after Holm's step over "
                    "the `holm_family` tested comparisons of the call (p_holm_opposite: the same for "
                    "p_opposite); HELD: p_holm < level and p_signflip < level; NOT HELD: the same for the "
                    "opposite direction; claim: intersection-union; detectable_difference: at holm_level = "
                    "level / (holm_family - holm_step + 1)",
            "confidence": CONFIDENCE, "power": POWER, "notes": list(self.notes),
            "comparisons": [{
                "lower": r.comparison.lower, "higher": r.comparison.higher, "quantity": r.comparison.quantity,
                "scale": scale_of(r.comparison.quantity), "rounds": list(r.rounds), "seeds": list(r.seeds),
                "n": len(r.seeds), "lower_values": list(r.lower), "higher_values": list(r.higher),
                "mean_difference": r.mean_difference, "sd": r.sd, "ci95": None if r.ci95 is None else list(r.ci95),
                "t": _finite(r.t), "p": r.p, "p_opposite": r.p_opposite, "p_signflip": r.p_signflip,
                "p_signflip_opposite": r.p_signflip_opposite, "p_holm": r.p_holm,
                "p_holm_opposite": r.p_holm_opposite, "holm_family": r.family, "holm_step": r.holm_step,
                "holm_level": r.holm_level, "detectable_difference": r.detectable_difference,
                "verdict": r.verdict, "other_verdict": r.other_verdict, "fragile": r.fragile, "reason": r.reason}
                for r in self.comparisons],
        }


def _finite(value: float | None) -> float | str | None:
    return value if value is None or math.isfinite(value) else ("inf" if value > 0 else "-inf")


def _rounds_text(rounds: Rounds) -> str:
    """A comparison's rounds in words: "last round", "last 5 rounds", "all rounds", "round 3" (written as one
    round), "rounds 2,3"."""
    if rounds.kind == LAST:
        return "last round" if rounds.count == 1 else f"last {rounds.count} rounds"
    if rounds.kind == ALL:
        return "all rounds"
    return f"round {rounds.written}" if rounds.written.isdigit() else f"rounds {rounds}"


def _span(rounds: Sequence[int]) -> str:
    """The rounds averaged, in words: "at round 30", "mean over rounds 26-30", "mean over rounds 5, 10, 30"."""
    rounds = list(rounds)
    if len(rounds) == 1:
        return f"at round {rounds[0]}"
    if rounds == list(range(rounds[0], rounds[0] + len(rounds))):
        return f"mean over rounds {rounds[0]}-{rounds[-1]}"
    return "mean over rounds " + ", ".join(map(str, rounds))


def partition_text(run: RunData) -> str:
    """The partition a run trained on, from its recipe: its name and options ("dirichlet-client-reuse, alpha
    0.1"); "not recorded" for a run whose recipe has none."""
    table = run.recipe.get("partition")
    if not isinstance(table, dict) or "name" not in table:
        return "not recorded"
    options = [f"{key} {value:g}" if isinstance(value, float) else f"{key} {value}"
               for key, value in table.items() if key not in ("name", "clients")]
    return ", ".join([str(table["name"]), *options])


def _claim_result(claim: Claim, results: tuple[ComparisonResult, ...],
                  partitions: tuple[tuple[str, str], ...] = ()) -> ClaimResult:
    verdicts = [r.verdict for r in results]
    verdict = HELD if all(v == HELD for v in verdicts) else (NOT_HELD if NOT_HELD in verdicts else INCONCLUSIVE)
    notes = tuple(f"{r.comparison.text}: {r.reason}" for r in results if r.t is None)
    return ClaimResult(claim, verdict, results, notes, partitions)


def decide(results: Sequence[ClaimResult]) -> list[ClaimResult]:
    """Holm's step over every tested comparison of ``results`` (one ``landscape claims`` call: the family of
    claimed directions, and apart from it the family of opposite directions), and the verdicts it gives."""
    tested = [(i, j) for i, result in enumerate(results) for j, r in enumerate(result.comparisons) if r.t is not None]
    found = [list(result.comparisons) for result in results]
    claimed = [found[i][j].p for i, j in tested]
    adjusted, opposite = holm(claimed), holm([found[i][j].p_opposite for i, j in tested])
    for (i, j), p_holm, p_holm_opposite, step in zip(tested, adjusted, opposite, holm_steps(claimed)):
        found[i][j] = _decided(found[i][j], p_holm, p_holm_opposite, len(tested), step)
    return [_claim_result(result.claim, tuple(rows), result.partitions) for result, rows in zip(results, found)]


def evaluate(claim: Claim, runs: Mapping[str, Sequence[RunData]]) -> ClaimResult:
    """The claim's verdict over ``runs`` (run id -> its runs, one per seed; the seed read from each recipe), with
    Holm's step over this claim's comparisons alone (``decide`` redoes it over every claim of a call)."""
    by_seed: dict[str, dict[int, RunData]] = {}
    for run_id in claim.run_ids():
        if run_id not in runs:
            raise LandscapeError(f"{claim.path}: no runs of id {run_id!r}")
        by_seed[run_id] = {int(run.recipe.get("seed", 0)): run for run in runs[run_id]}
    results = tuple(compare_pair(c, by_seed[c.lower], by_seed[c.higher], claim.level) for c in claim.comparisons)
    partitions = tuple((run_id, " / ".join(dict.fromkeys(partition_text(run) for run in runs[run_id])))
                       for run_id in claim.run_ids())
    return decide([_claim_result(claim, results, partitions)])[0]
