"""The claims workflow: claim recipes (claims/*.toml) checked against their figures' runs before anything is
trained, those runs trained and analysed where missing (shared with the figure workflow), each comparison
tested over seeds and Holm's step taken over every comparison of the call."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from landscape.core import parallel
from landscape.core.errors import LandscapeError
from landscape.workflows.ensure import Notify, ignore
from landscape.workflows.figure import figure_folder, figure_selection, figure_training, prepare_figure_runs

if TYPE_CHECKING:
    from landscape.claims.checks import ClaimResult
    from landscape.claims.claim_files import Claim
    from landscape.figures.figure_recipe import FigureRecipe


class ClaimWork(NamedTuple):
    """One claim to check: the claim, its figure recipe cut to the runs and passes the claim reads, and the
    figure's folder (where ``landscape figures`` puts the same runs)."""

    claim: Claim
    fig: FigureRecipe
    out: Path


class Verdicts(NamedTuple):
    """The decided claims (Holm's step over every comparison) and the files they were written to."""

    results: list[ClaimResult]
    written: list[Path]


def plan_claims(claim_files: Sequence[Path], *, figures_out: Path, seeds: list[int] | None = None,
                scale: str | None = None, assignments: Sequence[str] = (),
                device: str = "auto") -> list[ClaimWork]:
    """Every claim file read and checked before anything is trained: its figure recipe (at ``scale``, with
    the ``KEY=VALUE`` ``assignments``, read as ``landscape figures --set`` reads them, and ``seeds``, default
    the file's), its run ids, that the figure runs the passes it reads, and that its rounds exist in the runs
    it compares."""
    from landscape.analyze.catalog import load_passes
    from landscape.claims import checks as claims
    from landscape.claims.claim_files import check_rounds
    from landscape.config import recipe_overrides
    from landscape.figures import figure_recipe, figure_rounds

    work = []
    for path in claim_files:
        claim = claims.load_claim(path, seeds)
        fig = figure_recipe.load_figure_recipe(claim.figure, scale)
        for text in assignments:
            key, value = recipe_overrides.parse_assignment(text)
            fig.assign(key, value, recipe_overrides.classify_assignment(key, load_passes().names, "claims"))
        fig.set_seeds(list(claim.seeds))
        claims.check_run_ids(claim, [spec.id for spec in fig.runs])
        fig.runs = [spec for spec in fig.runs if spec.id in claim.run_ids()]  # only the runs it compares
        needed = set()
        for comparison in claim.comparisons:
            output = claims.analysis_output(comparison.quantity)
            if output is not None and output not in fig.pass_rounds:
                raise LandscapeError(f"{path}: {comparison.quantity} needs the {output} pass, which "
                                     f"{claim.figure.name} does not run")
            needed |= {output} - {None}
        # only the passes it reads (with the figure's options and rounds, so `landscape figures` reuses them)
        fig.pass_rounds = {name: rounds for name, rounds in fig.pass_rounds.items() if name in needed}
        fig.pass_options = {name: opts for name, opts in fig.pass_options.items() if name in needed}
        fig_out = figure_folder(fig, figures_out)
        trained = figure_training(fig, fig_out, device)  # its rounds exist in the runs it will train
        figure_rounds.check_pass_rounds(fig, trained)
        check_rounds(claim, trained, fig.pass_rounds)
        work.append(ClaimWork(claim, fig, fig_out))
    return work


def check_claims(work: Sequence[ClaimWork], out: Path, *, device: str = "auto", progress: bool = False,
                 notify: Notify = ignore) -> Verdicts:
    """Train and analyse each claim's runs where missing, test its comparisons over seeds, take Holm's step
    over every comparison of ``work`` and write claims.md and claims.json into ``out``."""
    from landscape.claims import checks as claims
    from landscape.figures.rundata import load_runs

    results = []
    for claim, fig, fig_out in work:
        notify(f"claim {claim.name}: runs of {claim.figure.name} in {fig_out}")
        by_id = prepare_figure_runs(fig, fig_out, device=device, progress=progress, notify=notify)
        selection = figure_selection(fig, device)
        wanted = {run_id: by_id[run_id] for run_id in claim.run_ids()}
        loaded = iter(load_runs([p for paths in wanted.values() for p in paths], selection))
        runs: dict[str, Any] = {run_id: [next(loaded) for _ in paths] for run_id, paths in wanted.items()}
        results.append(claims.evaluate(claim, runs))
    decided = claims.decide(results)  # Holm's step over every comparison of every claim given
    return Verdicts(decided, parallel.on_main(lambda: claims.write_results(decided, out)))
