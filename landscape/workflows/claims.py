"""The claims workflow: claim recipes (claims/*.toml) checked against their figures' runs before anything is
trained (an SWA run compared must average at least ``MIN_SWA_SNAPSHOTS`` snapshots), those runs trained and
analysed where missing (shared with the figure workflow), each comparison tested over seeds and Holm's step
taken over every comparison of the call; with other results' verdicts, the ones that differ marked FRAGILE."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from landscape.core import parallel
from landscape.core.errors import LandscapeError
from landscape.core.rounds import Rounds
from landscape.workflows.ensure import Notify, ensure_analysis, ignore
from landscape.workflows.figure import (
    figure_analysis,
    figure_folder,
    figure_training,
    prepare_figure_runs,
)

if TYPE_CHECKING:
    from landscape.claims.checks import ClaimResult
    from landscape.claims.files import Claim
    from landscape.figures.recipe.figure import FigureRecipe

# The fewest server-SWA snapshots an SWA run compared must average at the rounds a comparison reads: two
# snapshots cannot test the paper's SWA (Caldarola et al. 2022 average 250: 10,000 rounds, cycle 10 from 75%).
MIN_SWA_SNAPSHOTS = 5


def swa_snapshots(train: Any, round: int) -> list[int]:
    """The rounds whose global model x^t server SWA has averaged into x_swa after ``round`` rounds of training
    with the settings ``train`` (the training loop's rule: ``landscape.train.schedule.swa_cycle_ends``)."""
    from landscape.train.schedule import swa_cycle_ends

    return [t + 1 for t in range(round) if swa_cycle_ends(train, t)]


def check_swa_snapshots(claim: Claim, trained: Mapping[str, Sequence[tuple[int | None, Any]]],
                        pass_rounds: Mapping[str, Rounds]) -> None:
    """One line naming the first comparison that reads an SWA run (``train.swa``) at a round where it averages
    fewer than ``MIN_SWA_SNAPSHOTS`` snapshots."""
    from landscape.claims.files import chosen_rounds, compared_rounds

    for i, comparison in enumerate(claim.comparisons, 1):
        for run_id in (comparison.lower, comparison.higher):
            for seed, train in trained[run_id]:
                if not train.swa:
                    continue
                for round in chosen_rounds(comparison.rounds, compared_rounds(comparison, train, pass_rounds)[0]):
                    taken = swa_snapshots(train, round)
                    if len(taken) < MIN_SWA_SNAPSHOTS:
                        which = run_id if seed is None else f"{run_id} seed {seed}"
                        raise LandscapeError(
                            f"{claim.path}: [[compare]] {i}: run {which} averages {len(taken)} SWA snapshot(s) at "
                            f"round {round} (rounds {', '.join(map(str, taken)) or 'none'}: train.rounds = "
                            f"{train.rounds}, swa_start = {train.swa_start:g}, swa_cycle = {train.swa_cycle}); an "
                            f"SWA comparison needs at least {MIN_SWA_SNAPSHOTS}: raise train.rounds or lower "
                            "train.swa_cycle")


def _check_adaptive(claim: Claim, fig: FigureRecipe) -> None:
    """An adaptive S_rho needs the figure's sharpness pass to compute it (its option ``adaptive``)."""
    if (any(c.quantity.startswith("adaptive S_rho(") for c in claim.comparisons)
            and not (fig.pass_options.get("sharpness") or {}).get("adaptive", True)):
        raise LandscapeError(f"{claim.path}: adaptive S_rho needs the sharpness pass's adaptive = true, which "
                             f"{claim.figure.name} sets to false")


class ClaimWork(NamedTuple):
    """One claim to check: the claim, its figure recipe cut to the runs and passes the claim reads (and to the
    runs it trains), the figure's folder (where ``landscape figures`` puts the same runs), and the runs given
    for some of its run ids (run id -> one run directory per seed of the claim, in its seeds' order)."""

    claim: Claim
    fig: FigureRecipe
    out: Path
    given: dict[str, list[Path]]


def given_runs(claim: Claim, runs: Mapping[str, Path]) -> dict[str, list[tuple[int, Any, Path]]]:
    """Run id -> (seed, training settings, run directory) for each seed of ``claim``, of the runs given for
    the ids it compares (``runs``: run id -> a run directory or a folder of runs, each run's seed its recipe's:
    runs trained elsewhere, recorded with ``landscape.RunWriter`` or ``landscape import``)."""
    from landscape.store.run import Run, run_dirs

    out = {}
    for run_id, folder in runs.items():
        if run_id not in claim.run_ids():
            continue
        by_seed: dict[int, Run] = {}
        for path in run_dirs(folder, "claims --runs"):
            run = Run(path)
            if run.recipe.seed in by_seed:
                raise LandscapeError(f"--runs {run_id}: {by_seed[run.recipe.seed].path} and {path} are both of seed "
                                     f"{run.recipe.seed}")
            by_seed[run.recipe.seed] = run
        missing = [s for s in claim.seeds if s not in by_seed]
        if missing:
            raise LandscapeError(f"--runs {run_id}: {folder} has no run of seed(s) {', '.join(map(str, missing))} "
                                 f"(its runs' seeds: {', '.join(map(str, sorted(by_seed))) or 'none'}); {claim.name} "
                                 f"compares seeds {', '.join(map(str, claim.seeds))}")
        out[run_id] = [(s, by_seed[s].recipe.train, by_seed[s].path) for s in claim.seeds]
    return out


class Verdicts(NamedTuple):
    """The decided claims (Holm's step over every comparison) and the files they were written to."""

    results: list[ClaimResult]
    written: list[Path]


def plan_claims(claim_files: Sequence[Path], *, figures_out: Path, seeds: list[int] | None = None,
                scale: str | None = None, assignments: Sequence[str] = (),
                device: str = "auto", runs: Mapping[str, Path] | None = None) -> list[ClaimWork]:
    """Every claim file read and checked before anything is trained: its figure recipe (at ``scale``, with
    the ``KEY=VALUE`` ``assignments``, read as ``landscape figures --set`` reads them, and ``seeds``, default
    the file's), its run ids, that the figure runs the passes it reads, and that its rounds exist in the runs
    it compares. ``runs``: run id -> the runs to use for it (``given_runs``) instead of training the figure's."""
    runs = dict(runs or {})
    unknown = set(runs)
    from landscape.claims import checks as claims
    from landscape.claims.files import check_rounds
    from landscape.figures.recipe import figure as figure_recipe
    from landscape.figures.recipe import rounds as figure_rounds

    work = []
    for path in claim_files:
        claim = claims.load_claim(path, seeds)
        fig = figure_recipe.load_figure_recipe(claim.figure, scale).with_sets(assignments, "claims")
        fig = fig.with_seeds(list(claim.seeds))
        claims.check_run_ids(claim, [spec.id for spec in fig.runs])
        needed = set()
        for comparison in claim.comparisons:
            output = claims.analysis_output(comparison.quantity)
            if output is not None and output not in fig.pass_rounds:
                raise LandscapeError(f"{path}: {comparison.quantity} needs the {output} pass, which "
                                     f"{claim.figure.name} does not run")
            needed |= {output} - {None}
        # only the runs it compares and the passes it reads (with the figure's options and rounds, so
        # `landscape figures` reuses them)
        fig = fig.only(runs=claim.run_ids(), passes=sorted(needed))
        fig_out = figure_folder(fig, figures_out)
        given = given_runs(claim, runs)
        unknown -= set(given)
        fig = fig.only(runs=[spec.id for spec in fig.runs if spec.id not in given])  # the others it trains
        trained = figure_training(fig, fig_out, device)  # its rounds exist in the runs it will train or has
        trained.update({run_id: [(seed, train) for seed, train, _ in entries] for run_id, entries in given.items()})
        figure_rounds.check_pass_rounds(fig, trained)
        check_rounds(claim, trained, fig.pass_rounds)
        check_swa_snapshots(claim, trained, fig.pass_rounds)
        _check_adaptive(claim, fig)
        work.append(ClaimWork(claim, fig, fig_out, {i: [path for *_, path in e] for i, e in given.items()}))
    if unknown:
        raise LandscapeError(f"--runs {', '.join(sorted(unknown))}: no claim given compares such a run (their run "
                             f"ids: {', '.join(sorted({i for w in work for i in w.claim.run_ids()}))})")
    return work


def check_claims(work: Sequence[ClaimWork], out: Path, *, device: str = "auto", progress: bool = False,
                 notify: Notify = ignore, other: Mapping[tuple[str, ...], str] | None = None,
                 compared_with: str = "") -> Verdicts:
    """Train and analyse each claim's runs where missing, test its comparisons over seeds, take Holm's step
    over every comparison of ``work`` and write claims.md and claims.json into ``out``. ``other``: the
    verdicts of other results (``claims_table.read_verdicts`` of the folder ``compared_with``): a verdict
    that differs there is FRAGILE."""
    from landscape.claims import checks as claims
    from landscape.claims import table as claims_table
    from landscape.figures.rundata import load_runs

    results = []
    for claim, fig, fig_out, given in work:
        notify(f"claim {claim.name}: runs of {claim.figure.name} in {fig_out}")
        analysis = figure_analysis(fig, device)
        by_id = prepare_figure_runs(fig, fig_out, device=device, analysis=analysis, progress=progress,
                                    notify=notify) if fig.runs else {}
        if given:  # the runs given for some of its ids: analysed where they lack the figure's results
            ensure_analysis([path for paths in given.values() for path in paths], fig.pass_rounds, analysis.settings,
                            analysis.options, progress=progress)
            by_id.update(given)
        selection = analysis.selection
        wanted = {run_id: by_id[run_id] for run_id in claim.run_ids()}
        loaded = iter(load_runs([p for paths in wanted.values() for p in paths], selection))
        runs: dict[str, Any] = {run_id: [next(loaded) for _ in paths] for run_id, paths in wanted.items()}
        results.append(claims.evaluate(claim, runs))
    decided = claims.decide(results)  # Holm's step over every comparison of every claim given
    if other is not None:
        decided = claims_table.compare_with(decided, other)
    return Verdicts(decided, parallel.on_main(lambda: claims_table.write_results(decided, out, compared_with)))
