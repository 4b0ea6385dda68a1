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

The test (``compare_pair``): the runs of the two ids are paired by seed (the same seed draws the same
partition, initialisation and client sampling) and the one-sided paired t-test on the differences
d_s = higher_s - lower_s is run both ways. A comparison HOLDS when the test that higher > lower gives
p < ``level`` (default 0.05), is NOT HELD when the opposite test does, and is INCONCLUSIVE otherwise (or with
fewer than two seeds). A claim is HELD when every comparison holds (an intersection-union test: no correction
is needed), NOT HELD when some comparison is refuted at ``level`` / the number of comparisons (Bonferroni),
and INCONCLUSIVE otherwise. Every verdict carries the per-seed values, mean +- standard error, t and p.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
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
        from landscape.figures.surfaces import load_surface

        surface = load_surface(run.analyses[round]["surface"].path)
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


@dataclass(frozen=True)
class ComparisonResult:
    comparison: Comparison
    seeds: tuple[int, ...]
    lower: tuple[float, ...]  # per seed
    higher: tuple[float, ...]
    rounds: tuple[int, ...]  # the rounds averaged (of the first run; every run must have them)
    t: float | None
    p: float | None  # one-sided, higher > lower
    p_opposite: float | None
    verdict: str

    def summary(self) -> str:
        lo, lo_se, n = mean_se(self.lower)
        hi, hi_se, _ = mean_se(self.higher)
        parts = [f"{self.comparison.lower} {_num(lo, lo_se)} vs {self.comparison.higher} {_num(hi, hi_se)}",
                 f"n={n}"]
        if self.t is not None:
            parts.append(f"t={self.t:.2f}, p={_p(self.p)}")
        return "; ".join(parts)


def _num(value: float, se: float | None) -> str:
    return f"{value:.4g}" + (f" +- {se:.2g}" if se is not None else "")


def _p(p: float | None) -> str:
    return "-" if p is None else (f"{p:.3f}" if p >= 0.001 else f"{p:.1e}")


def compare_pair(comparison: Comparison, lower: Mapping[int, RunData], higher: Mapping[int, RunData],
                    level: float) -> ComparisonResult:
    """Pair the two ids' runs by seed and test ``higher > lower`` (and the opposite) one-sided at ``level``."""
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
    if len(seeds) < 2:
        return ComparisonResult(comparison, seeds, tuple(low), tuple(high), rounds, None, None, None, INCONCLUSIVE)
    differences = np.asarray(high) - np.asarray(low)
    t, p = one_sided_paired_t(differences)
    _, p_opposite = one_sided_paired_t(-differences)
    verdict = HELD if p < level else (NOT_HELD if p_opposite < level else INCONCLUSIVE)
    return ComparisonResult(comparison, seeds, tuple(low), tuple(high), rounds, t, p, p_opposite, verdict)


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
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "claim": self.claim.text, "file": str(self.claim.path), "source": self.claim.source,
            "verdict": self.verdict, "level": self.claim.level,
            "test": "one-sided paired t-test over seeds (higher - lower > 0); claim: intersection-union, "
                    "refutation: Bonferroni",
            "comparisons": [{
                "lower": r.comparison.lower, "higher": r.comparison.higher, "quantity": r.comparison.quantity,
                "rounds": list(r.rounds), "seeds": list(r.seeds), "lower_values": list(r.lower),
                "higher_values": list(r.higher), "t": _finite(r.t), "p": r.p, "p_opposite": r.p_opposite,
                "verdict": r.verdict} for r in self.comparisons],
        }


def _finite(value: float | None) -> float | str | None:
    return value if value is None or math.isfinite(value) else ("inf" if value > 0 else "-inf")


def _rounds_text(rounds: str | int | tuple[int, ...]) -> str:
    if isinstance(rounds, str):
        return f"{rounds} rounds" if rounds.startswith("last ") else f"{rounds} round" + ("s" if rounds == "all" else "")
    if isinstance(rounds, int):
        return f"round {rounds}"
    return "rounds " + ",".join(map(str, rounds))


def evaluate(claim: Claim, runs: Mapping[str, Sequence[RunData]]) -> ClaimResult:
    """The claim's verdict over ``runs`` (run id -> its runs, one per seed; the seed read from each recipe)."""
    by_seed: dict[str, dict[int, RunData]] = {}
    for run_id in claim.run_ids():
        if run_id not in runs:
            raise LandscapeError(f"{claim.path}: no runs of id {run_id!r}")
        by_seed[run_id] = {int(run.recipe.get("seed", 0)): run for run in runs[run_id]}
    results = tuple(compare_pair(c, by_seed[c.lower], by_seed[c.higher], claim.level) for c in claim.comparisons)
    verdicts = [r.verdict for r in results]
    refuted = [r for r in results if r.p_opposite is not None and r.p_opposite < claim.level / len(results)]
    if all(v == HELD for v in verdicts):
        verdict = HELD
    elif refuted:
        verdict = NOT_HELD
    else:
        verdict = INCONCLUSIVE
    notes = () if len(results[0].seeds) >= 2 else ("fewer than two seeds: no test, INCONCLUSIVE",)
    return ClaimResult(claim, verdict, results, notes)


def markdown_table(results: Sequence[ClaimResult]) -> str:
    """One row per comparison: claim, verdict, quantity, the two means +- SE (n), t and p."""
    header = "| claim | verdict | comparison (lower < higher) | lower: mean +- SE | higher: mean +- SE | n | t | p |"
    lines = [header, "|---|---|---|---|---|---|---|---|"]
    for result in results:
        for i, r in enumerate(result.comparisons):
            lo, lo_se, n = mean_se(r.lower)
            hi, hi_se, _ = mean_se(r.higher)
            head = (f"{result.claim.text} (`{result.claim.name}`)", f"**{result.verdict}**") if i == 0 else ("", "")
            lines.append(f"| {head[0]} | {head[1]} | {r.comparison.quantity} ({_rounds_text(r.comparison.rounds)}): "
                         f"{r.comparison.lower} < {r.comparison.higher}: {r.verdict} | {_num(lo, lo_se)} | "
                         f"{_num(hi, hi_se)} | {n} | {'-' if r.t is None else f'{r.t:.2f}'} | {_p(r.p)} |")
    return "\n".join(lines)


def write_results(results: Sequence[ClaimResult], out: Path) -> list[Path]:
    """``claims.json`` (every number) and ``claims.md`` (the table) under ``out``."""
    written = [out / "claims.json", out / "claims.md"]
    write_text(written[0], json.dumps([r.to_dict() for r in results], indent=1) + "\n")
    write_text(written[1], markdown_table(results) + "\n")
    return written
