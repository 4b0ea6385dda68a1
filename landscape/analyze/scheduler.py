"""Runs analysis passes over checkpoints: ``plan`` (every run, round and pass, checked before work starts),
``run_analysis`` (skips results already computed with the same settings on the same checkpoint, and for a
plain state_dict with the same model and data; under torchrun splits the checkpoints, or the work inside a
pass, across the ranks: ``split_work``), ``format_summary``.
"""

from __future__ import annotations

import contextlib
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from landscape.analyze.catalog import load_passes
from landscape.analyze.context import (
    CheckpointContext,
    ForeignModel,
    Source,
    StateDictSource,
    file_digest,
    find_sources,
    select_rounds,
)
from landscape.analyze.registry import Cost, PassOutput, needs_kept_clients
from landscape.analyze.results import (
    SCHEMA_VERSION,
    find_result,
    result_name,
    settings_diff,
    settings_record,
    settings_text,
    store_result,
)
from landscape.analyze.settings import AnalysisSettings
from landscape.config.setup import thread_count, using_threads
from landscape.core import parallel
from landscape.core.errors import LandscapeError
from landscape.store.checkpoints import CheckpointError, partition_problem


@dataclass(frozen=True)
class Job:
    source: Source
    round: int
    name: str
    options: Any

    @property
    def out_dir(self) -> Path:
        return self.source.result_dir(self.round)

    @property
    def output(self) -> str:
        """What the pass's options make of it: the pass name, or surface-pca, ... (the results' files are
        named by ``result_name``: this, and the settings that differ from the defaults)."""
        return getattr(self.options, "output_name", self.name)

    def result_name(self, settings: AnalysisSettings) -> str:
        """The name of this job's result files under these settings (``results.result_name``)."""
        return result_name(self.name, settings_record(settings, self.options))


def write_output(job: Job, settings: AnalysisSettings, digest: str, output: PassOutput, seconds: float) -> None:
    record = {
        "pass": job.name,
        "run": job.source.name,
        "round": job.round,
        "checkpoint": str(job.source.checkpoints[job.round]),
        "checkpoint_sha256": digest,
        **({} if job.source.inputs is None else {"inputs": job.source.inputs}),  # a state_dict's model and data
        "settings": settings_record(settings, job.options),
        "seconds": seconds,
        "threads": thread_count(settings.threads),  # the last bits depend on it: recorded, not a setting
        "summary": output.summary,
        "result": output.scalars,
    }
    store_result(job.out_dir, job.name, record, output.arrays)


@dataclass
class AnalysisReport:
    rows: list[dict] = field(default_factory=list)  # one per (run, round): summaries of every pass
    computed: int = 0
    skipped: int = 0
    settings: dict[str, str] = field(default_factory=dict)  # result name -> its settings other than the defaults
    notes: list[str] = field(default_factory=list)  # what was skipped, one line each
    warnings: list[str] = field(default_factory=list)  # inputs that look wrong: said even with --quiet
    data: str = ""  # the analysis data the values are on (``analysis_data``); "" when not known


def plan(path: Path, rounds: str, passes: list[str], options: dict[str, Any],
         foreign: ForeignModel | None = None) -> list[Job]:
    """Every (run, round, pass) to do, with all input checked before any work starts. With ``foreign``,
    ``path`` holds plain state_dicts (every file is analysed; their model and data are checked as the sources
    are found, and a pass that needs clients is refused: ``Source.check_pass``)."""
    registry = load_passes()
    for name in passes:
        registry.get(name)
    sources, single_round = find_sources(Path(path), foreign)
    jobs = []
    for source in sources:
        for name in passes:
            source.check_pass(name, options[name])
        if foreign is not None:
            rounds = "all" if rounds == "last" else rounds
        chosen = [single_round] if single_round is not None else select_rounds(source, rounds)
        for r in chosen:
            jobs += [Job(source, r, name, options[name]) for name in passes]
    return jobs


def skip_rounds_without_clients(jobs: list[Job]) -> tuple[list[Job], list[str]]:
    """The jobs less those of passes that need kept client models at rounds that have none (round 0, rounds
    of a run trained without --keep-clients), and one note per run and pass naming the skipped rounds. A
    pass that has no round left at all is an error saying how to keep them."""
    skipped: dict[tuple[str, str], list[int]] = {}
    kept = []
    for job in jobs:
        if needs_kept_clients(job.name, job.options) and not job.source.clients_checkpoint(job.round).is_file():
            skipped.setdefault((job.source.name, job.name), []).append(job.round)
        else:
            kept.append(job)
    for name in {name for _, name in skipped}:
        if not any(job.name == name for job in kept):
            run, rounds = next((run, r) for (run, n), r in skipped.items() if n == name)
            raise LandscapeError(f"{run} has no client models for {_rounds_text(sorted(set(rounds)))}; train with "
                                 "--keep-clients to save them at checkpoints")
    notes = [f"{run}: {name} skipped at {_rounds_text(sorted(set(rounds)))}, which kept no client models"
             for (run, name), rounds in skipped.items()]
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


def _rounds_text(rounds: list[int]) -> str:
    return f"round {rounds[0]}" if len(rounds) == 1 else "rounds " + ", ".join(map(str, rounds))


def split_work(jobs: list[Job], todo: list[int], ranks: int) -> tuple[list[list[int]], list[int]]:
    """Who runs which of ``jobs[i] for i in todo`` under ``ranks`` ranks: (per-rank queues, run alone; jobs
    run by all ranks together), both in plan order.

    A checkpoint's jobs stay on one rank (its model and data are loaded once). Whole rounds of checkpoints,
    one per rank, go to the queues; the checkpoints left over (fewer than the ranks) and every job of a
    collective pass (``PassInfo.collective``: its work is split inside it) run on all ranks together, their
    HVPs and surface cells split across the ranks. One rank: every job in one queue, in plan order.
    """
    if ranks == 1:
        return [list(todo)], []
    groups: dict[tuple[int, int], list[int]] = {}
    registry = load_passes()
    together = [i for i in todo if registry.info(jobs[i].name).collective]
    for i in todo:
        if not registry.info(jobs[i].name).collective:
            groups.setdefault((id(jobs[i].source), jobs[i].round), []).append(i)
    keys = list(groups)
    whole = len(keys) - len(keys) % ranks
    queues: list[list[int]] = [[] for _ in range(ranks)]
    for n, key in enumerate(keys[:whole]):
        queues[n % ranks] += groups[key]
    together = sorted(together + [i for key in keys[whole:] for i in groups[key]])
    return queues, together


def _inputs_change(recorded: object, inputs: dict) -> str:
    """How a state_dict result's recorded model and data (``StateDictSource.inputs``) differ from ``inputs``."""
    if not isinstance(recorded, dict):
        return "records no model and data (written before results of a state_dict were keyed by them)"
    changes = []
    for spec, digest, flag, what in (("model", "model_sha256", "--model", "code"),
                                     ("dataset", "data_sha256", "--dataset", "data")):
        if recorded.get(spec) != inputs[spec]:
            changes.append(f"{flag} {recorded.get(spec)} (now {inputs[spec]})")
        elif recorded.get(digest) != inputs[digest]:
            changes.append(f"other {what} of {flag} {inputs[spec]}")
    return "was made with " + " and ".join(changes) if changes else f"records other inputs ({recorded})"


def _recorded_summaries(jobs: list[Job], settings: AnalysisSettings,
                        force: bool) -> tuple[list[dict | None], list[str]]:
    """The summary of each job already computed with the same settings on the same checkpoint (for a plain
    state_dict also with the same model and data: ``Source.inputs``); None for the jobs to run (all of them
    with ``force``). The result is looked up by its settings (``find_result``: its own name, or a file
    written before results were named by their settings); a checkpoint is hashed only when a result with
    these settings exists. Also one note per source whose results of another model or data (or of none
    recorded) are computed again, replacing them."""
    digests: dict[Path, str] = {}
    out: list[dict | None] = []
    redone: dict[str, list[str]] = {}
    for job in jobs:
        summary = None
        wanted = settings_record(settings, job.options)
        found = None if force else find_result(job.out_dir, job.name, wanted)
        if found is not None:
            _, recorded = found
            path = job.source.checkpoints[job.round]
            if path not in digests:
                digests[path] = file_digest(path)
            if (recorded.get("schema_version") == SCHEMA_VERSION and recorded.get("settings") == wanted
                    and recorded.get("checkpoint_sha256") == digests[path]):
                inputs = job.source.inputs
                if inputs is None or recorded.get("inputs") == inputs:
                    summary = recorded.get("summary", {})
                else:
                    redone.setdefault(job.source.name, []).append(
                        f"{job.name} of {path.name} {_inputs_change(recorded.get('inputs'), inputs)}")
        out.append(summary)
    notes = [f"{name}: {len(changes)} result{'s' if len(changes) > 1 else ''} of another model or data, "
             f"computed again and replaced ({changes[0]}{', ...' if len(changes) > 1 else ''})"
             for name, changes in redone.items()]
    return out, notes


class _FileFailed(LandscapeError):
    """A file of a folder of plain state_dicts that cannot be analysed (it does not load, or does not match
    the model): the other files are analysed, and the analysis fails at the end naming it."""

    def __init__(self, message: str, path: Path) -> None:
        super().__init__(message)
        self.path = path


def _failed_files_error(jobs: list[Job], failed: dict[Path, str]) -> LandscapeError:
    """One line: the first file that failed and why, how many others were analysed, and the rest that failed."""
    files = list(dict.fromkeys(job.source.checkpoints[job.round] for job in jobs))
    first, *rest = failed.values()
    if len(files) == 1:
        return LandscapeError(first)
    good = len(files) - len(failed)
    folders = sorted({str(job.source.analysis_dir) for job in jobs
                      if job.source.checkpoints[job.round] not in failed})
    text = f"{first}; the other {good} file{'s were' if good != 1 else ' was'} analysed"
    if good:
        text += f" (results in {', '.join(folders)})"
    if rest:
        text += f"; {len(rest)} more failed: {', '.join(path.name for path in list(failed)[1:])}"
    return LandscapeError(text + "; move the failed files away or replace them, and analyse again")


class _Contexts:
    """One checkpoint's context at a time (its tensors are freed when the next checkpoint comes)."""

    def __init__(self, settings: AnalysisSettings) -> None:
        self.settings = settings
        self.key: tuple[int, int] | None = None
        self.ctx: CheckpointContext | None = None
        self.failed: dict[tuple[int, int], str] = {}  # state_dict files that could not be loaded or checked

    def get(self, job: Job) -> CheckpointContext:
        """The job's checkpoint context. A plain state_dict file that does not load or match the model raises
        ``_FileFailed`` (now and for its further jobs, without loading it again); other errors stop."""
        key = (id(job.source), job.round)
        path = job.source.checkpoints[job.round]
        if key in self.failed:
            raise _FileFailed(self.failed[key], path)
        if key != self.key:
            self.ctx = self.key = None  # free the previous checkpoint's tensors before loading the next
            try:
                self.ctx = CheckpointContext(job.source, job.round, self.settings)
            except LandscapeError as e:
                about_file = (isinstance(e, CheckpointError) and e.path == Path(path)) or str(path) in str(e)
                if not (isinstance(job.source, StateDictSource) and about_file):
                    raise
                self.failed[key] = str(e)
                raise _FileFailed(str(e), path) from None
            self.key = key
        return self.ctx


class WorkBar:
    """A second progress bar for the work inside one pass: Hessian-vector products or surface cells, with the
    rate and, where the total is known, the time left. Solvers report ``(done, total or None)`` from their own
    counters; a counter that starts again (the next solver of the pass) adds to what was done."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.bar = None
        self.base = self.last = 0

    def start(self, what: str) -> WorkBar | None:
        if not self.enabled:
            return None
        from tqdm.auto import tqdm

        self.close()
        self.base = self.last = 0
        self.bar = tqdm(total=None, desc=f"  {what}", unit="step", leave=False, position=1, dynamic_ncols=True)
        return self

    def __call__(self, done: int, total: int | None) -> None:
        if self.bar is None:
            return
        if done < self.last:
            self.base += self.last
        self.last = done
        if total is not None:
            self.bar.total = self.base + total
        self.bar.n = self.base + done
        self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def _run_job(job: Job, contexts: _Contexts, work: WorkBar | None = None) -> tuple[PassOutput, str, float]:
    ctx = contexts.get(job)
    ctx.progress = work.start(job.name) if work is not None else None
    started = time.perf_counter()
    try:
        output = load_passes().get(job.name).factory(ctx, job.options)
    finally:
        ctx.progress = None
        if work is not None:
            work.close()
    return output, ctx.digest, time.perf_counter() - started


def run_analysis(
    path: Path,
    *,
    rounds: str = "last",
    passes: list[str],
    settings: AnalysisSettings,
    options: dict[str, Any],
    force: bool = False,
    progress: bool = True,
    foreign: ForeignModel | None = None,
) -> AnalysisReport:
    """Run ``passes`` on the chosen checkpoints of the runs under ``path``; each result is written as soon as
    it is computed, and results already computed with the same settings are skipped (unless ``force``).

    A plain state_dict file that does not load or does not match the model stops none of the others: they
    are analysed (their results written), and then the analysis fails in one line naming it (the first such
    file and why, how many others were analysed, the names of any further failed files). A damaged
    checkpoint of a run stops the analysis there.

    Under torchrun (every rank calls this with the same arguments) rank 0 decides what is done and writes
    every file; the work is split as ``split_work`` says: first each rank analyses its own checkpoints
    alone (``parallel.solo``: no collectives, so ranks working on different checkpoints never wait on each
    other), the results going to rank 0 after each step; then the rest runs on all ranks together, with
    Hessian-vector products and surface cells split across them. Splitting checkpoints and, at the same
    time, the work inside a pass would deadlock: a rank would wait in an all-reduce for ranks busy with
    other checkpoints. Every rank returns the same report.
    """
    from tqdm.auto import tqdm

    jobs, notes = skip_rounds_without_clients(plan(path, rounds, passes, options, foreign))
    main = parallel.is_main()
    recorded, redone = parallel.on_main(lambda: _recorded_summaries(jobs, settings, force))
    report = AnalysisReport(notes=notes + redone, data=analysis_data(settings))
    report.warnings += partition_warnings([job for job, done in zip(jobs, recorded) if done is None])
    summaries = {i: summary for i, summary in enumerate(recorded) if summary is not None}
    report.skipped = len(summaries)
    queues, together = split_work(jobs, [i for i, s in enumerate(recorded) if s is None], parallel.world_size())
    contexts = _Contexts(settings)
    work = WorkBar(progress and main)
    bar = tqdm(total=len(jobs), initial=report.skipped, desc="analyze", unit="pass",
               disable=not (progress and main), dynamic_ncols=True)

    def finish(i: int, output: PassOutput, digest: str, seconds: float) -> None:
        if main:
            write_output(jobs[i], settings, digest, output, seconds)
        summaries[i] = output.summary
        report.computed += 1
        bar.update(1)

    failed: dict[Path, str] = {}  # state_dict files that did not load or match the model: why

    threads = contextlib.ExitStack()
    try:
        threads.enter_context(using_threads(settings.threads))  # the settings', never the machine's
        own = queues[parallel.rank()]
        for step in range(max(len(q) for q in queues)):
            outcome = None
            if step < len(own):
                i = own[step]
                bar.set_postfix_str(f"{jobs[i].source.name} r{jobs[i].round} {jobs[i].name}")
                try:
                    if parallel.world_size() == 1:
                        outcome = (i, *_run_job(jobs[i], contexts, work), None, False)
                    else:
                        with parallel.solo():
                            outcome = (i, *_run_job(jobs[i], contexts), None, False)
                except _FileFailed as e:  # the other files go on; the analysis fails at the end
                    outcome = (i, None, "", 0.0, str(e), True)
                except LandscapeError as e:  # every rank stops with it, after the step's other results
                    if parallel.world_size() == 1:
                        raise
                    outcome = (i, None, "", 0.0, str(e), False)
            outcomes = [o for o in parallel.all_gather_objects(outcome) if o is not None]
            for i, output, digest, seconds, error, file_failed in outcomes:
                if error is None:
                    finish(i, output, digest, seconds)
                elif file_failed:
                    failed.setdefault(jobs[i].source.checkpoints[jobs[i].round], error)
            errors = [error for *_, error, file_failed in outcomes if error is not None and not file_failed]
            if errors:
                raise LandscapeError(errors[0])
        for i in together:
            bar.set_postfix_str(f"{jobs[i].source.name} r{jobs[i].round} {jobs[i].name}")
            try:
                finish(i, *_run_job(jobs[i], contexts, work))
            except _FileFailed as e:  # on every rank alike: the file is the same
                failed.setdefault(e.path, str(e))
    finally:
        threads.close()
        bar.close()
    if failed:
        raise _failed_files_error(jobs, failed)
    rows: dict[tuple[str, int], dict] = {}
    for i, job in enumerate(jobs):
        row = rows.setdefault((job.source.name, job.round), {"run": job.source.name, "round": job.round})
        row.update(summaries.get(i, {}))
    report.rows = list(rows.values())
    for job in jobs:
        record = settings_record(settings, job.options)
        report.settings[result_name(job.name, record)] = settings_text(settings_diff(job.name, record))
    return report


def analysis_data(settings: AnalysisSettings) -> str:
    """The data the analysis values are computed on, in words (what the summary's accuracy is measured on)."""
    text = ("the test set" if settings.split == "test"
            else "the training split (the union of the clients' training data)")
    if settings.analysis_samples:
        text += f", a seeded subset of {settings.analysis_samples} samples"
    return text


SUMMARY_WIDTH = 120  # the summary table is cut into blocks of columns that fit this many characters
RUN_WIDTH = 40  # longer run names are written as [1], [2], ... in the table and in full under it


def _wrapped(text: str, indent: str = "    ") -> list[str]:
    import textwrap

    return textwrap.wrap(text, SUMMARY_WIDTH, subsequent_indent=indent, break_on_hyphens=False,
                         break_long_words=False)


def format_summary(report: AnalysisReport) -> str:
    """A plain-text table, one line per (run, round), one column per summary value (named by its key in the
    results' ``summary``), in the order the passes ran. No line is wider than ``SUMMARY_WIDTH``: columns that
    do not fit go to further blocks (each repeating run and round), run names longer than ``RUN_WIDTH`` are
    numbered and written out under the table, and the accuracy is said to be the analysis accuracy it is."""
    if not report.rows:
        return "nothing analysed"
    columns: list[str] = []
    for row in report.rows:
        columns += [k for k in row if k not in ("run", "round") and k not in columns]
    names = list(dict.fromkeys(str(row.get("run")) for row in report.rows))
    numbered = any(len(name) > RUN_WIDTH for name in names)
    run_cell = {name: f"[{k + 1}]" if numbered else name for k, name in enumerate(names)}

    def cell(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:.4g}"
        return "-" if value is None else str(value)

    keys = [["run", "round"]] + [[run_cell[str(row.get("run"))], cell(row.get("round"))] for row in report.rows]
    table = [columns] + [[cell(row.get(c)) for c in columns] for row in report.rows]
    key_widths = [max(len(r[i]) for r in keys) for i in range(2)]
    widths = [max(len(r[i]) for r in table) for i in range(len(columns))]

    def pack(limit: int) -> list[list[int]]:
        blocks: list[list[int]] = [[]]
        used = sum(key_widths) + 2
        for i, width in enumerate(widths):
            if blocks[-1] and used + 2 + width > limit:
                blocks.append([])
                used = sum(key_widths) + 2
            blocks[-1].append(i)
            used += 2 + width
        return blocks

    blocks = pack(SUMMARY_WIDTH)
    limit = SUMMARY_WIDTH  # the narrowest blocks that are no more: the columns spread evenly over them
    while limit > 1 and len(pack(limit - 1)) == len(blocks):
        limit -= 1
    blocks = pack(limit)
    lines: list[str] = []
    for b, block in enumerate(blocks):
        if b:
            lines.append("")
        all_widths = key_widths + [widths[i] for i in block]
        rows = [k + [r[i] for i in block] for k, r in zip(keys, table)]
        text = ["  ".join(v.ljust(w) for v, w in zip(r, all_widths)).rstrip() for r in rows]
        text.insert(1, "  ".join("-" * w for w in all_widths))
        lines += text
    if numbered or "acc" in columns or any(report.settings.values()):
        lines.append("")
    if numbered:
        lines += [f"{run_cell[name]} {name}" for name in names]
    if "acc" in columns:
        data = report.data or "the analysis data (--split; by default the union of the clients' training data)"
        lines += _wrapped(f"acc: accuracy of the checkpoint x on {data}, from the loss pass ('accuracy' in "
                          "its JSON); not the test accuracy training logged (metrics.jsonl 'test_acc')")
    # Which results these are, when some were asked for with settings other than the defaults.
    for name, text in sorted(report.settings.items()):
        if text:
            lines += _wrapped(f"{name}: {text}")
    return "\n".join(lines)


def planned_work(job: Job) -> Cost:
    """What a job will cost, estimated from its options by its pass's cost model (``PassInfo.cost``: products
    are timed on their own, the other work in full-data gradients)."""
    return load_passes().info(job.name).cost(job.options)


def format_plan(jobs: list[Job], settings: AnalysisSettings) -> str:
    """What ``landscape analyze --dry-run`` prints: every job with its estimated products and seconds, timed by
    one full-data gradient at the first checkpoint (the estimate is rough: a factor of 2 either way)."""
    if not jobs:
        return "nothing to analyse"
    import torch

    from landscape.analyze.operator import HessianOperator

    with using_threads(settings.threads):
        ctx = CheckpointContext(jobs[0].source, jobs[0].round, settings)
        ctx.objective.loss_and_grad(ctx.w)  # warm-up (first-call allocations)
        started = time.perf_counter()
        ctx.objective.loss_and_grad(ctx.w)
        gradient = time.perf_counter() - started
        op = HessianOperator(ctx.objective, ctx.w, backend=settings.hvp)
        v = torch.randn(ctx.flat.dim, generator=torch.Generator().manual_seed(0)).to(ctx.w)
        op.matvec(v)  # builds (and, where it fits, keeps) the gradient graphs
        started = time.perf_counter()
        op.matvec(v)
        product = time.perf_counter() - started
    head = (f"{len(jobs)} jobs; at the first checkpoint ({ctx.flat.dim:,} parameters, {len(ctx.global_data)} samples, "
            f"{ctx.device}, {ctx.dtype}) one gradient took {gradient:.3g} s, one Hessian-vector product "
            f"{product:.3g} s")
    rows = [("run", "round", "pass", "HVPs", "est. seconds")]
    total_hvps, total_seconds = 0, 0.0
    for job in jobs:
        cost = planned_work(job)
        hvps, seconds = cost.hvps, cost.hvps * product + cost.gradients * gradient
        total_hvps, total_seconds = total_hvps + hvps, total_seconds + seconds
        rows.append((job.source.name, str(job.round), job.name, str(hvps), f"{seconds:.1f}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [head] + ["  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in rows]
    lines.append(f"total: about {total_hvps} Hessian-vector products and {total_seconds:.0f} s "
                 "(results already computed are skipped, and cost nothing)")
    return "\n".join(lines)
