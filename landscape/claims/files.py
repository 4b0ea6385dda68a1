"""Claim files (``claims/*.toml``): their schema (``ClaimFile``, each ``[[compare]]`` a ``CompareTable``), read by
``landscape.core.schema.load`` and checked (``load_claim``); the format is described in
``landscape.claims.checks``. Also the rounds each comparison reads (``chosen_rounds``, ``check_rounds``), each
quantity's scale (``scale_of``) and one number per run (``run_value``)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import numpy as np

from landscape.analyze.registry import Quantity
from landscape.claims.statistics import MAX_SEEDS
from landscape.core.errors import LandscapeError
from landscape.core.rounds import Rounds, RoundsUnavailable
from landscape.core.schema import load, read_toml, rule
from landscape.figures.report.data import quantities
from landscape.figures.rundata import WAIT, RunData

DEFAULT_TAU = 0.5  # nats above the centre's loss: the level set whose area ``surface width`` measures
SURFACE_WIDTH = "surface width"
_RHO = re.compile(r"^(adaptive )?S_rho\(([^)]+)\)$")
# Quantities free of the scale of the weights and of the clients' updates ("relative" in a claim's
# operationalisation; every other one is "raw"): Delta_D over the mean squared client update or over the mean
# model's squared norm, the adaptive (ASAM) ball's S_rho, and the ratios, shares and cosines.
RELATIVE = frozenset({
    "flatness_distance_relative", "flatness_distance_normalized", "flatness_distance_to_global_normalized",
    "Delta_D_relative", "lambda_1/lambda_k", "heterogeneity share", "friendly rate", "mean grad cos",
    "minibatch cos"})
_TEXT = rule(pattern=r"\S", text="must be a non-empty string")
_RUN_ID = rule(min_length=1, text="must name a run id of the figure recipe")
_POSITIVE = rule(gt=0, text="must be a positive number")
# The rounds a comparison averages, as the file writes them: parsed by ``Rounds.parse`` (``core.rounds``: "last",
# "last N", "all", a round or a list of rounds), which names the grammar in its message.
RoundsText = Any


@dataclass(frozen=True)
class CompareTable:
    """A ``[[compare]]`` table: ``lower`` should have the lower quantity than ``higher`` (run ids of the claim's
    figure recipe); its quantity, rounds and tau default to the file's."""

    lower: Annotated[str, _RUN_ID]
    higher: Annotated[str, _RUN_ID]
    quantity: str | None = None
    rounds: RoundsText = None
    tau: Annotated[float | None, _POSITIVE] = None


@dataclass(frozen=True)
class ClaimFile:
    """A claim file: the claim in words, its source, the figure recipe whose runs it compares, the seeds, the
    level of the tests, the defaults of its comparisons (quantity, rounds, tau) and the comparisons.
    ``hypothesis = true``: no paper makes the claim (this project's hypothesis; ``source`` then says what it
    rests on), and the table shows it apart from the published ones."""

    claim: Annotated[str, _TEXT]
    figure: Annotated[str, _TEXT]
    source: str = ""
    hypothesis: bool = False
    seeds: tuple[Annotated[int, rule(ge=0)], ...] = (0,)
    quantity: str | None = None
    rounds: RoundsText = None
    level: Annotated[float, rule(gt=0, lt=0.5, text="must be a positive number below 0.5")] = 0.05
    tau: Annotated[float, _POSITIVE] = DEFAULT_TAU
    compare: tuple[CompareTable, ...] = ()


@dataclass(frozen=True)
class Comparison:
    """``lower`` should have the lower ``quantity`` than ``higher`` (run ids of the claim's figure recipe), over
    ``rounds`` (a ``Rounds``; its text, a round or a list of rounds is parsed)."""

    lower: str
    higher: str
    quantity: str
    rounds: Rounds
    tau: float = DEFAULT_TAU

    def __post_init__(self) -> None:
        object.__setattr__(self, "rounds", Rounds.parse(self.rounds))

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
    hypothesis: bool = False  # no paper makes it: this project's hypothesis

    def run_ids(self) -> list[str]:
        ids: list[str] = []
        for c in self.comparisons:
            ids += [i for i in (c.lower, c.higher) if i not in ids]
        return ids


def load_claim(path: str | Path, seeds: Sequence[int] | None = None) -> Claim:
    """Read and check a claim file; ``seeds`` replaces the file's."""
    path = Path(path)
    try:
        file = load(ClaimFile, read_toml(path, "claim"), noun="claim key")
    except LandscapeError as e:
        raise LandscapeError(f"{path}: {e}") from None
    figure = (path.parent / file.figure).resolve()
    if not figure.is_file():
        raise LandscapeError(f"{path}: figure recipe {file.figure} not found (looked for {figure})")
    chosen = _seeds(list(seeds) if seeds is not None else list(file.seeds), path)
    if not file.compare:
        raise LandscapeError(f"{path}: a claim needs at least one [[compare]] table")
    comparisons = tuple(_comparison(entry, i, file, path) for i, entry in enumerate(file.compare, 1))
    return Claim(path, path.stem, file.claim.strip(), file.source.strip(), figure, tuple(chosen), comparisons,
                 file.level, file.hypothesis)


def _seeds(chosen: list[Any], path: Path) -> list[int]:
    """The seeds of a claim (the file's or those given): distinct non-negative integers, at most ``MAX_SEEDS``."""
    if (not chosen or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in chosen)
            or len(set(chosen)) != len(chosen)):
        raise LandscapeError(f"{path}: seeds must be a list of distinct non-negative integers (got {chosen!r})")
    if len(chosen) > MAX_SEEDS:
        raise LandscapeError(f"{path}: at most {MAX_SEEDS} seeds (the exact sign-flip test enumerates 2^n sign "
                             f"patterns; got {len(chosen)})")
    return chosen


def _comparison(entry: CompareTable, i: int, file: ClaimFile, path: Path) -> Comparison:
    """One [[compare]] table with the file's defaults filled in; its rounds and quantity checked."""
    where = f"{path}: [[compare]] {i}"
    if entry.lower == entry.higher:
        raise LandscapeError(f"{where}: lower and higher name the same run id {entry.lower!r}")
    quantity = (entry.quantity if entry.quantity is not None else file.quantity or "").strip()
    if not quantity:
        raise LandscapeError(f"{where}: no quantity (set `quantity` in the comparison or at the top)")
    rounds = entry.rounds if entry.rounds is not None else file.rounds
    if rounds is None:
        raise LandscapeError(f"{where}: no rounds (set `rounds` in the comparison or at the top)")
    comparison = Comparison(entry.lower, entry.higher, quantity, Rounds.parse(rounds, f"{where}: rounds"),
                            file.tau if entry.tau is None else entry.tau)
    _check_quantity(quantity, where)
    return comparison


def _check_quantity(quantity: str, where: str) -> None:
    """A quantity is a metrics.jsonl key, an analysis quantity or the surface width: one line naming them
    otherwise."""
    from landscape.figures.plot_kinds import METRIC_KEYS
    try:
        known = quantity in METRIC_KEYS or analysis_output(quantity) is not None
    except LandscapeError as e:  # S_rho(x) with a radius that is not a number
        raise LandscapeError(f"{where}: {e}") from None
    if not known:
        names = [q.text for q in quantities([]) if not q.text.startswith("S_rho")]
        raise LandscapeError(f"{where}: quantity {quantity!r} is neither a metrics.jsonl key "
                             f"({', '.join(METRIC_KEYS)}) nor an analysis quantity ({', '.join(names)}, "
                             f"S_rho(<rho>), adaptive S_rho(<rho>), {SURFACE_WIDTH})")


def analysis_output(quantity: str) -> str | None:
    """The pass output an analysis quantity reads, None for a metrics.jsonl key."""
    if quantity == SURFACE_WIDTH:
        return "surface"
    match = _RHO.match(quantity)
    if match:
        try:
            rho = float(match.group(2))
        except ValueError:
            raise LandscapeError(f"bad radius in {quantity!r}: write e.g. S_rho(0.05)") from None
        for q in [*quantities([rho]), _adaptive_sharpness(rho)]:
            _QUANTITIES.setdefault(q.text, q)
    return _QUANTITIES[quantity].pass_name if quantity in _QUANTITIES else None


def _adaptive_sharpness(rho: float) -> Quantity:
    """S_rho at ``rho`` over the adaptive (ASAM) ball: the sharpness pass's ``adaptive.sharpness`` (computed with
    its option ``adaptive = true``; None in a result without it)."""
    def read(result: Any) -> tuple[Any, Any]:
        if result.value("adaptive.rhos", None) is None:
            return None, None
        rhos = np.atleast_1d(result.array("adaptive.rhos"))
        hit = np.flatnonzero(np.isclose(rhos, rho, rtol=1e-9, atol=0))
        return (float(np.atleast_1d(result.array("adaptive.sharpness"))[hit[0]]) if hit.size else None), None

    return Quantity(f"adaptive S_rho({rho:g})", f"adaptive S<sub>&rho;</sub> (&rho;={rho:g})", "adaptive.sharpness",
                    read_result=read, pass_name="sharpness")


def scale_of(quantity: str) -> str:
    """"relative" for a quantity free of the weights' and the updates' scale (``RELATIVE``, adaptive S_rho),
    "raw" for every other one."""
    return "relative" if quantity in RELATIVE or quantity.startswith("adaptive S_rho(") else "raw"


_QUANTITIES = {q.text: q for q in quantities([])}


def chosen_rounds(rounds: Rounds | str | int | tuple[int, ...], have: Sequence[int]) -> list[int] | None:
    """The rounds a comparison averages of those a run has (``have``), None when it lacks some."""
    rounds = Rounds.parse(rounds)
    return rounds.select(have) if rounds.covered_by(have) else None


def compared_rounds(comparison: Comparison, train: Any, pass_rounds: Mapping[str, Rounds]
                    ) -> tuple[list[int], str]:
    """The rounds at which a run with the training settings ``train`` has the comparison's quantity (a
    metrics.jsonl key at the rounds that log it, an analysis quantity at the rounds the figure analyses its
    pass at: ``figure_rounds``), and why these."""
    from landscape.analyze.passes import PASSES
    from landscape.analyze.registry import KEPT_CLIENTS
    from landscape.figures.recipe.rounds import analysed_rounds, logged_rounds

    output = analysis_output(comparison.quantity)
    if output is None:
        have = logged_rounds(comparison.quantity, train)
        why = f"train.rounds = {train.rounds}"
        if comparison.quantity == "swa_models" and not have:
            why += "; swa_models is logged with train.swa = true"
        return have, why
    have = analysed_rounds(output, pass_rounds[output], train)
    why = f"the figure analyses {output} at rounds {pass_rounds[output]}"
    if KEPT_CLIENTS in PASSES.get(output).needs and not have:
        why += f"; the {output} pass needs train.keep_clients = true"
    return have, why


def check_rounds(claim: Claim, trained: Mapping[str, Sequence[tuple[int | None, Any]]],
                 pass_rounds: Mapping[str, Rounds]) -> None:
    """Every comparison's rounds exist in every run it compares, before anything is trained: a metrics.jsonl
    key at the rounds that log it (``figure_rounds.logged_rounds``), an analysis quantity at the rounds the
    figure analyses its pass at (``pass_rounds``, ``figure_rounds.analysed_rounds``). ``trained``: run id ->
    (seed, training settings) of each of its runs. One line naming the file, the comparison, its rounds and the
    run's rounds otherwise."""
    from landscape.figures.recipe.rounds import round_list

    for i, comparison in enumerate(claim.comparisons, 1):
        for run_id in (comparison.lower, comparison.higher):
            for seed, train in trained[run_id]:
                have, why = compared_rounds(comparison, train, pass_rounds)
                if chosen_rounds(comparison.rounds, have) is None:
                    which = run_id if seed is None else f"{run_id} seed {seed}"
                    raise LandscapeError(f"{claim.path}: [[compare]] {i}: rounds "
                                         f"{comparison.rounds.written}: run {which} has "
                                         f"{comparison.quantity} at {round_list(have)} ({why})")


def check_run_ids(claim: Claim, known: Sequence[str]) -> None:
    """One line naming the ids a claim compares that its figure recipe does not define."""
    missing = [i for i in claim.run_ids() if i not in known]
    if missing:
        raise LandscapeError(f"{claim.path}: run id(s) {', '.join(missing)} are not in {claim.figure.name} "
                             f"(its runs: {', '.join(known)})")


# -- one number per run -----------------------------------------------------------------------------------------

def _in_use(run: RunData, what: str) -> None:
    """Refused in one line when another process trains into the run now (``RunData.lacks_while_in_use``)."""
    busy = run.lacks_while_in_use(what)
    if busy:
        raise LandscapeError(f"{busy}: {WAIT}")


def _pick(rounds_have: Sequence[int], spec: Rounds, run: RunData, what: str) -> list[int]:
    have = sorted(rounds_have)
    if not have:
        _in_use(run, what)
        raise LandscapeError(f"run {run.path} has no {what}")
    try:
        return spec.select(have)
    except RoundsUnavailable as e:
        if e.lacking:
            raise LandscapeError(f"run {run.path} has no {what} at round(s) {', '.join(map(str, e.lacking))} "
                                 f"(it has {', '.join(map(str, have))})") from None
        raise LandscapeError(f"run {run.path} has {what} at {len(have)} round(s), the claim asks for the last "
                             f"{e.asked}") from None


def surface_width(loss: np.ndarray, x: np.ndarray, y: np.ndarray, tau: float) -> float:
    """The fraction of a 2D grid whose loss is at most tau above the loss at the grid point nearest (0, 0)."""
    if loss.ndim != 2 or not loss.size:
        raise LandscapeError("surface width needs a 2D surface")
    centre = loss[int(np.argmin(np.abs(x))), int(np.argmin(np.abs(y)))]
    finite = np.isfinite(loss)
    return float(np.count_nonzero(finite & (loss <= centre + tau)) / loss.size)


def _analysis_value(run: RunData, quantity: str, round: int, tau: float) -> float:
    if quantity == SURFACE_WIDTH:
        from landscape.figures.surface.data import load_surface, normalization_of

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


def run_value(run: RunData, quantity: str, rounds: Rounds | str | int | tuple[int, ...], tau: float = DEFAULT_TAU
              ) -> tuple[float, list[int]]:
    """The run's number for ``quantity``: its mean over the chosen rounds (a ``Rounds``, or what it parses), and
    those rounds."""
    rounds = Rounds.parse(rounds)
    output = analysis_output(quantity)
    if output is None:
        if not run.has_metric(quantity):
            _in_use(run, f"{quantity!r} in metrics.jsonl")
            known = ", ".join(sorted(_QUANTITIES) + [SURFACE_WIDTH])
            raise LandscapeError(f"run {run.path}: {quantity!r} is neither a metrics.jsonl key it logged nor an "
                                 f"analysis quantity ({known})")
        logged, values = run.series(quantity)
        by_round = dict(zip((int(r) for r in logged), (float(v) for v in values)))
        chosen = _pick(list(by_round), rounds, run, f"{quantity} in metrics.jsonl")
        return float(np.mean([by_round[r] for r in chosen])), chosen
    chosen = _pick(run.analysed_rounds(output), rounds, run, f"{output} analysis")
    return float(np.mean([_analysis_value(run, quantity, r, tau) for r in chosen])), chosen
