"""``landscape claims``: published claims checked on runs of several seeds (the claims workflow)."""

from __future__ import annotations

from pathlib import Path

import click

from landscape.cli.common import check_printable, progress_lines, set_option, trust_imports_option
from landscape.core.errors import LandscapeError


def _print_plan(work: list, compare_with: Path | None, device: str) -> None:
    """--dry-run: each claim, its runs (with what would be done with each and its training time) and
    comparisons, the analysis jobs it would compute (never those done), the results its verdicts would be
    compared with, and the total with the rates measured here (a run or job two claims share counted once)."""
    from landscape.store import lifecycle
    from landscape.workflows.estimate import WorkEstimate, about
    from landscape.workflows.figure import figure_analysis, figure_plan

    estimate = WorkEstimate()
    for claim, fig, fig_out, kept in work:
        click.echo(f"claim {claim.name}: {claim.text}" + (" (this project's hypothesis)" if claim.hypothesis else ""))
        click.echo(f"  runs of {claim.figure.name} ({fig.scale} scale) in {fig_out}, seeds "
                   f"{','.join(map(str, claim.seeds))}: {', '.join(claim.run_ids())}")
        analysis = figure_analysis(fig, device)
        runs = [(recipe, path, lifecycle.owned_run_status(recipe, path))
                for entries in figure_plan(fig, fig_out, device).values() for _, recipe, path in entries]
        runs += [(None, path, None) for paths in kept.values() for path in paths]
        training = [estimate.training(recipe, path, status, analysis.settings)
                    for recipe, path, status in runs if status is not None]
        statuses = [status for *_, status in runs if status is not None]
        if statuses:
            counts = ", ".join(f"{statuses.count(s)} {s}" for s in dict.fromkeys(statuses))
            click.echo(f"  train: {counts}" + (f" ({about(sum(training))})" if sum(training) else ""))
        for run_id, paths in kept.items():
            click.echo(f"  {run_id}: the runs given, {', '.join(map(str, paths))}")
        for name, spec in fig.pass_rounds.items():
            click.echo("  " + estimate.pass_line(runs, name, spec, analysis.options[name], analysis.settings))
        for comparison in claim.comparisons:
            click.echo(f"  test {comparison.text} over rounds {comparison.rounds}")
    if compare_with is not None:
        click.echo(f"FRAGILE: each verdict that differs from those of {compare_with / 'claims.json'} (read when the "
                   "claims are checked)")
    for line in estimate.lines():
        click.echo(line)


@click.command("claims")
@click.argument("claim_files", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option("-o", "--out", type=click.Path(file_okay=False, path_type=Path), default=Path("runs/claims"),
              show_default=True,
              help="folder for claims.md (the verdict table) and claims.json (every number)")
@click.option("--figures-out", type=click.Path(file_okay=False, path_type=Path), default=Path("runs/figures"),
              show_default=True, help="each claim's runs live in <this>/<figure name> (where `landscape "
                                      "figures` puts them, so the two share runs)")
@click.option("--seeds", default=None, metavar="S,S,...",
              help="the seeds of every claim [default: each file's]")
@click.option("--scale", type=click.Choice(["digits", "paper"]), default=None,
              help="the figures' scale [default: each figure recipe's]")
@click.option("--device", default="auto", show_default=True,
              help="auto, cpu, cuda or cuda:N (training and analysis)")
@set_option("as landscape figures takes it, for every claim's figure: a training recipe key for every run, e.g. "
            "--set dataset.name=mnist1d (give another --figures-out), an analysis setting (--set "
            "analyze.analysis_samples=500) or a pass option (--set hessian.top_k=10)", "claims takes all three")
@click.option("--runs", "given", multiple=True, metavar="RUN_ID=PATH",
              help="use these runs for a run id the claims compare instead of training the figure's: a folder of "
                   "runs (or one run), one per seed, each run's seed its recipe's (runs recorded with "
                   "landscape.RunWriter or landscape import too); they are analysed where they lack the figure's "
                   "results. Repeatable")
@trust_imports_option("with --runs: import the modules their recipes name (`imports`, a model or data factory) to "
                      "analyse what they lack (their code runs); without, a run whose model or data only that code "
                      "provides is refused in one line")
@click.option("--compare-with", type=click.Path(file_okay=False, path_type=Path), default=None, metavar="DIR",
              help="the output folder of another `landscape claims` call on the same claims, computed another way "
                   "(e.g. --set train.memory_format=contiguous with another --figures-out): mark each claim and "
                   "comparison whose verdict differs there FRAGILE")
@click.option("--dry-run", is_flag=True, help="print the claims, their comparisons and runs, then exit")
@click.option("--quiet", is_flag=True, help="no progress bars or progress lines (verdicts and errors stay)")
def claims_command(claim_files: tuple[Path, ...], out: Path, figures_out: Path, seeds: str | None,
                   scale: str | None, device: str, assignments: tuple[str, ...], given: tuple[str, ...],
                   compare_with: Path | None, dry_run: bool, quiet: bool) -> None:
    """Check published claims (claims/*.toml) on runs of several seeds: train and analyse the runs of each
    claim's figure recipe where missing (as `landscape figures` does), then test each comparison over seeds
    (one-sided paired t-test, exact sign-flip test, Holm's step over every comparison of this call) and print
    HELD / NOT HELD / INCONCLUSIVE with the numbers (FRAGILE: another call's verdict differs, --compare-with)."""
    from landscape.claims import checks as claims
    from landscape.claims.table import read_verdicts
    from landscape.figures.recipe import figure as figure_recipe
    from landscape.workflows.claims import check_claims, plan_claims

    chosen = figure_recipe.parse_seeds(seeds, "--seeds") if seeds is not None else None
    for text in assignments:
        check_printable("--set", text)
    # every file is checked before anything is trained
    runs = {}
    for text in given:
        run_id, sep, path = text.partition("=")
        if not sep or not run_id or not path:
            raise LandscapeError(f"--runs takes RUN_ID=PATH, e.g. fedsam-alpha0.1=runs/mine/fedsam (got '{text}')")
        runs[run_id.strip()] = Path(path.strip())
    work = plan_claims(claim_files, figures_out=figures_out, seeds=chosen, scale=scale,
                       assignments=assignments, device=device, runs=runs)
    if dry_run:
        _print_plan(work, compare_with, device)
        return
    other = read_verdicts(compare_with) if compare_with is not None else None  # read before anything trains
    results, written = check_claims(work, out, device=device, progress=not quiet, notify=progress_lines(quiet),
                                    other=other, compared_with=str(compare_with or ""))
    family = max((r.family for result in results for r in result.comparisons), default=0)
    click.echo(f"claims: Holm's step over the {family} tested comparison(s) of this call; a comparison is "
               "HELD when p_Holm (of the one-sided paired t-test) and p_sign-flip (exact) are below the "
               "level")
    for result in results:
        for line in result.lines():
            click.echo(line)
    fragile = f", {sum(r.fragile for r in results)} FRAGILE (against {compare_with})" if other is not None else ""
    click.echo("claims: " + ", ".join(f"{sum(r.verdict == v for r in results)} {v}"
                                      for v in (claims.HELD, claims.NOT_HELD, claims.INCONCLUSIVE))
               + f"{fragile}; {', '.join(map(str, written))}")
