"""The plan of an analysis: every (run, round, pass) job, with all input checked before work starts and its
result's settings record and name worked out once (``plan``), the rounds a pass cannot run on left out with a note (``skip_unavailable``), who runs
which job under torchrun (``split_work``), and what a dry run prints (``format_plan``).
"""

from __future__ import annotations

import shlex
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from landscape.analyze.catalog import check_sizes, load_passes
from landscape.analyze.context import CheckpointContext
from landscape.analyze.passes import RESULT_NAMES
from landscape.analyze.registry import Cost, needs_kept_clients
from landscape.analyze.settings import AnalysisSettings
from landscape.analyze.source import Source, find_sources, select_rounds
from landscape.analyze.state_dict_source import ForeignModel, StateDictSource, state_dict_sources
from landscape.config.setup import using_threads
from landscape.core.errors import LandscapeError
from landscape.core.rounds import Rounds
from landscape.store.checkpoints import partition_problem
from landscape.store.results.names import settings_record


@dataclass(frozen=True)
class Job:
    """One (source, round, pass) of a plan, with the pass's options, and what its result records of its
    settings (``settings``, ``job_settings``) and is named (``result_name``: computed here, once, by the plan;
    the scheduler looks the result up, writes it and reports it under this name)."""

    source: Source
    round: int
    name: str
    options: Any
    settings: dict
    result_name: str

    @property
    def out_dir(self) -> Path:
        return self.source.result_dir(self.round)

    @property
    def output(self) -> str:
        """What the pass's options make of it: the pass name, or surface-pca, ... (the results' files are
        named by ``result_name``: this, and the settings that differ from the defaults)."""
        return getattr(self.options, "output_name", self.name)

    def inputs_record(self, settings: AnalysisSettings) -> dict:
        """What a state_dict's result records of its inputs: the model and data it is keyed by (``inputs``) and
        the data measured in words (``data``); {} for a run (its checkpoints carry their recipe)."""
        if not isinstance(self.source, StateDictSource):
            return {}
        return {"inputs": self.source.inputs, "data": self.source.data_text(settings.split)}

    @property
    def where(self) -> dict:
        """What names the job's checkpoint in its result and the summary's row: ``round`` for a run; a
        state_dict's ``file`` (its name) and ``round`` only where the files' names carry rounds."""
        return self.source.where(self.round) if isinstance(self.source, StateDictSource) else {"round": self.round}

    @property
    def label(self) -> str:
        """The checkpoint in a word: its round, or a state_dict's file label."""
        return self.source.label(self.round) if isinstance(self.source, StateDictSource) else str(self.round)


def pass_settings_record(name: str, options: Any, settings: AnalysisSettings) -> dict:
    """What a result of pass ``name`` records of its settings (``store.results.names.settings_record``): the
    analysis settings as the pass reads them (``PassSpec.reads``: the others of
    ``settings.READ_BY_DECLARATION`` at their defaults, so that ``--backend pyhessian`` changes the name of the
    hessian results alone) and its options."""
    return settings_record(settings.read_by(load_passes().get(name).reads), options)


def job_settings(source: Source, name: str, options: Any, settings: AnalysisSettings) -> dict:
    """What a job's result records of its settings (``pass_settings_record``). Data from a state_dict's data
    factory is whatever the split: no split is recorded (``data`` in ``Job.inputs_record`` says what it is)."""
    record = pass_settings_record(name, options, settings)
    if isinstance(source, StateDictSource) and source.from_factory:
        del record["analysis"]["split"]
    return record


def make_job(source: Source, round: int, name: str, options: Any, settings: AnalysisSettings) -> Job:
    """The job of pass ``name`` at a checkpoint, with its result's settings record and name, the one place a
    job's result name is computed (``ResultNames.result_name``)."""
    record = job_settings(source, name, options, settings)
    return Job(source, round, name, options, record, RESULT_NAMES.result_name(name, record))


def plan(path: Path, rounds: Rounds | str, passes: list[str], options: dict[str, Any], settings: AnalysisSettings,
         foreign: ForeignModel | None = None) -> list[Job]:
    """Every (run, round, pass) to do under ``settings``, with all input checked before any work starts, and
    each job's result settings and name (``make_job``). ``rounds``: the checkpoints (a ``Rounds``, or its
    text). With ``foreign``, ``path`` holds plain state_dicts: ``rounds`` picks files (``StateDictSource.select``:
    a ``Rounds``, or a comma list of their names and the rounds their names carry); their model and data are
    checked as the sources are found, and a pass that needs clients is refused (``Source.check_pass``)."""
    if foreign is None:
        rounds = Rounds.parse(rounds, "--checkpoints")
    registry = load_passes()
    for name in passes:
        registry.get(name)
    if foreign is None:
        sources, single_round = find_sources(Path(path))
    else:
        sources, single_round = state_dict_sources(Path(path), foreign), None
    jobs = []
    for source in sources:
        for name in passes:
            source.check_pass(name, options[name])
        if isinstance(source, StateDictSource):
            chosen = source.select(rounds)
        else:
            chosen = [single_round] if single_round is not None else select_rounds(source, rounds)
        for r in chosen:
            jobs += [make_job(source, r, name, options[name], settings) for name in passes]
    return jobs


def _unavailable(job: Job) -> str | None:
    """Why ``job`` cannot run at its round, or None: a pass that needs kept client models at a round that kept
    none (round 0, the rounds of a run trained without --keep-clients), or what its options say of the round
    (``options.unavailable(source, round)``: a PCA plane without 3 checkpoints of the trajectory, a client
    that was not sampled in the round)."""
    if needs_kept_clients(job.name, job.options) and not job.source.clients_checkpoint(job.round).is_file():
        if job.round == 0:
            return "the initial model has no client models"
        return "no client models were kept (train with --keep-clients to save them at checkpoints)"
    check = getattr(job.options, "unavailable", None)
    return check(job.source, job.round) if check is not None else None


def skip_unavailable(jobs: list[Job]) -> tuple[list[Job], list[str]]:
    """The jobs less those that cannot run at their round (``_unavailable``), and one note per run, pass and
    reason naming the rounds skipped; the other jobs run. When no job is left at all, one line saying why
    each was skipped."""
    skipped: dict[tuple[str, str, str], list[Job]] = {}
    kept = []
    for job in jobs:
        why = _unavailable(job)
        if why is None:
            kept.append(job)
        else:
            what = getattr(job.options, "described", job.name)
            skipped.setdefault((job.source.name, what, why), []).append(job)
    notes = [f"{run}: {what} skipped at {_rounds_text(skipped_jobs)}: {why}"
             for (run, what, why), skipped_jobs in skipped.items()]
    if jobs and not kept:
        raise LandscapeError("nothing to analyse: " + "; ".join(notes))
    return kept, notes


def partition_warnings(jobs: list[Job]) -> list[str]:
    """A warning for each run whose partition.json is not the partition its recipe makes (the analysis uses the
    recipe's, as training did)."""
    notes, seen = [], set()
    for job in jobs:
        source = job.source
        run_dir = getattr(source, "run_dir", None)
        if id(source) in seen or run_dir is None or not run_dir.partition.is_file():
            continue
        seen.add(id(source))
        setup = source.setup
        problem = partition_problem(run_dir.partition, setup.client_indices, len(setup.bundle.train))
        if problem is not None:
            notes.append(f"{run_dir.partition} {problem}; the analysis uses the partition the recipe makes "
                         f"(`landscape train --resume {shlex.quote(str(run_dir.path))}` writes "
                         "partition.json again)")
    return notes


def _rounds_text(jobs: list[Job]) -> str:
    """The jobs' checkpoints in words: "round 3", "rounds 1, 2"; a state_dict's files by their labels."""
    files = isinstance(jobs[0].source, StateDictSource)
    labels = dict.fromkeys(job.label for job in (jobs if files else sorted(jobs, key=lambda j: j.round)))
    noun = "file" if files else "round"
    return f"{noun} {next(iter(labels))}" if len(labels) == 1 else f"{noun}s " + ", ".join(labels)


def split_work(jobs: list[Job], todo: list[int], ranks: int) -> tuple[list[list[int]], list[int]]:
    """Who runs which of ``jobs[i] for i in todo`` under ``ranks`` ranks: (per-rank queues, run alone; jobs
    run by all ranks together), both in plan order.

    A checkpoint's jobs stay on one rank (its model and data are loaded once). Whole rounds of checkpoints,
    one per rank, go to the queues; the checkpoints left over (fewer than the ranks) and every job of a
    collective pass (``PassSpec.collective``: its work is split inside it) run on all ranks together, their
    HVPs and surface cells split across the ranks. One rank: every job in one queue, in plan order.
    """
    if ranks == 1:
        return [list(todo)], []
    groups: dict[tuple[int, int], list[int]] = {}
    registry = load_passes()
    together = [i for i in todo if registry.get(jobs[i].name).collective]
    for i in todo:
        if not registry.get(jobs[i].name).collective:
            groups.setdefault((id(jobs[i].source), jobs[i].round), []).append(i)
    keys = list(groups)
    whole = len(keys) - len(keys) % ranks
    queues: list[list[int]] = [[] for _ in range(ranks)]
    for n, key in enumerate(keys[:whole]):
        queues[n % ranks] += groups[key]
    together = sorted(together + [i for key in keys[whole:] for i in groups[key]])
    return queues, together


def planned_work(job: Job) -> Cost:
    """What a job will cost, estimated from its options by its pass's cost model (``PassSpec.cost``: products
    are timed on their own, the other work in full-data gradients)."""
    return load_passes().get(job.name).cost(job.options)


def time_products(ctx: CheckpointContext) -> tuple[float, float]:
    """Seconds of one full-data gradient and of one Hessian-vector product at a checkpoint, each timed once after
    a warm-up (first-call allocations; the product's gradient graphs built and, where they fit, kept): the rates
    the dry-runs' estimates are priced with. Call it under the analysis's thread count."""
    import torch

    from landscape.measure.operator import HessianOperator

    ctx.objective.loss_and_grad(ctx.w)
    started = time.perf_counter()
    ctx.objective.loss_and_grad(ctx.w)
    gradient = time.perf_counter() - started
    op = HessianOperator(ctx.objective, ctx.w, backend=ctx.settings.hvp)
    v = torch.randn(ctx.flat.dim, generator=torch.Generator().manual_seed(0)).to(ctx.w)
    op.matvec(v)
    started = time.perf_counter()
    op.matvec(v)
    return gradient, time.perf_counter() - started


def format_plan(jobs: list[Job], settings: AnalysisSettings, done: list[bool] | None = None) -> str:
    """What ``landscape analyze --dry-run`` prints: every job with its estimated products and seconds, timed by
    one full-data gradient at the first checkpoint to compute (the estimate is rough: a factor of 2 either way).
    ``done[i]``: job i's result is already computed with the same settings (it is listed as done, costs nothing
    and counts in no total)."""
    done = done if done is not None else [False] * len(jobs)
    todo = [job for job, finished in zip(jobs, done) if not finished]
    if not jobs:
        return "nothing to analyse"
    if not todo:
        return (f"nothing to compute: all {len(jobs)} jobs are already done with these settings (--force computes "
                "them again)")
    with using_threads(settings.threads):
        ctx = CheckpointContext(todo[0].source, todo[0].round, settings)
        for job in todo:  # what the run would refuse is refused here too (a Hessian's top_k above the dimension)
            check_sizes(job.name, job.options, ctx.flat.dim, ctx.w.element_size(), ctx.device)
        gradient, product = time_products(ctx)
    finished = len(jobs) - len(todo)
    head = (f"{len(todo)} jobs to compute" + (f" ({finished} already done with these settings)" if finished else "")
            + f"; at the first of them ({ctx.flat.dim:,} parameters, {len(ctx.global_data)} samples, "
            f"{ctx.device}, {ctx.dtype}) one gradient took {gradient:.3g} s, one Hessian-vector product "
            f"{product:.3g} s")
    rows = [("run", "file" if "file" in jobs[0].where else "round", "pass", "HVPs", "est. seconds")]
    total_hvps, total_seconds = 0, 0.0
    for job, finished_job in zip(jobs, done):
        if finished_job:
            rows.append((job.source.name, job.label, job.name, "done", "-"))
            continue
        cost = planned_work(job)
        hvps, seconds = cost.hvps, cost.hvps * product + cost.gradients * gradient
        total_hvps, total_seconds = total_hvps + hvps, total_seconds + seconds
        rows.append((job.source.name, job.label, job.name, str(hvps), f"{seconds:.1f}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [head] + ["  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in rows]
    lines.append(f"total: about {total_hvps} Hessian-vector products and {total_seconds:.0f} s for the "
                 f"{len(todo)} jobs to compute")
    return "\n".join(lines)
