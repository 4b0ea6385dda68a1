"""Runs analysis passes over checkpoints: ``run_analysis`` runs the jobs of a ``plan`` (``analyze.plan``),
skipping results already computed with the same settings on the same checkpoint (and for a plain state_dict
with the same model and data), and under torchrun splits the checkpoints, or the work inside a pass, across
the ranks (``plan.split_work``); what it returns is an ``AnalysisReport`` (``analyze.summary``).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from landscape.analyze.catalog import check_sizes, load_passes
from landscape.analyze.context import CheckpointContext
from landscape.analyze.passes import RESULT_NAMES
from landscape.analyze.plan import Job, partition_warnings, plan, planned_work, skip_unavailable, split_work
from landscape.analyze.registry import PassOutput
from landscape.analyze.settings import AnalysisSettings
from landscape.analyze.source import file_digest
from landscape.analyze.state_dict_source import ForeignModel, StateDictSource
from landscape.analyze.summary import AnalysisReport, analysis_data
from landscape.config.setup import thread_count, using_threads
from landscape.core import parallel
from landscape.core.errors import LandscapeError
from landscape.core.rounds import Rounds
from landscape.store import tracking
from landscape.store.checkpoints import CheckpointError
from landscape.store.fileio import refuse_links
from landscape.store.results.files import SCHEMA_VERSION, find_result, result_record, store_result
from landscape.store.results.validity import PROCESS_HASHES, files_changed, files_label, stale_in, stale_note


@dataclass(frozen=True)
class Computed:
    """How one job's result was computed, beside its settings: the checkpoint's digest, the seconds, and the
    layout of its evaluations (``CheckpointContext.memory_format``'s record; None where it evaluated none)."""

    digest: str
    seconds: float
    memory_format: dict[str, str] | None
    files: dict[str, str] | None = None  # the other files it read, by ``validity.files_label``: their SHA-256


def write_output(job: Job, settings: AnalysisSettings, output: PassOutput, computed: Computed) -> None:
    """The job's result, written under the name its plan gave it (``Job.result_name``)."""
    record = result_record(
        job.name, run=job.source.name,
        where=job.where,  # the round; a state_dict's file (and round only where its name carries one)
        checkpoint=str(job.source.checkpoints[job.round]), digest=computed.digest,
        inputs=job.inputs_record(settings),  # a state_dict's model and data, and the data measured in words
        settings=job.settings, seconds=computed.seconds,
        threads=thread_count(settings.threads), memory_format=computed.memory_format,
        summary=output.summary, result=output.scalars, files=computed.files)
    store_result(job.out_dir, job.result_name, record, output.arrays, RESULT_NAMES)


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


def recorded_summaries(jobs: list[Job], settings: AnalysisSettings,
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
        wanted = job.settings
        found = None if force else find_result(job.out_dir, job.result_name, job.name, wanted, RESULT_NAMES)
        if found is not None:
            _, recorded = found
            path = job.source.checkpoints[job.round]
            if path not in digests:
                digests[path] = file_digest(path)
            # the same settings, NOT_NAMED aside (find_result): computed on another device is the same result
            if (recorded.get("schema_version") == SCHEMA_VERSION
                    and recorded.get("checkpoint_sha256") == digests[path]
                    and files_changed(recorded, Path(path), PROCESS_HASHES) is None):  # its other files as well
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
    """A second progress bar for the work inside one pass: Hessian-vector products, ascent trials or surface cells,
    with the rate and, where the total is known, the time left. Solvers report ``(done, total or None)`` from their
    own counters; a counter that starts again (the next solver of the pass) adds to what was done. A pass whose cost
    model expects no steps gets its bar when it first reports (one that never does shows none, not "0step")."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.bar = None
        self.base = self.last = 0
        self.what = ""

    def start(self, what: str, expected: int | None = None) -> WorkBar | None:
        """A bar for pass ``what``; ``expected``: its steps as its cost model estimates them (the total shown
        until its solvers report their own, and grown where the work runs past it; none: the bar is drawn when the
        pass first reports)."""
        if not self.enabled:
            return None
        self.close()
        self.base = self.last = 0
        self.what = what
        if expected:
            self._open(expected)
        return self

    def _open(self, total: int | None) -> None:
        from landscape.core.progress import progress_bar

        self.bar = progress_bar(total=total or None, desc=f"  {self.what}", unit="step", leave=False, position=1,
                                dynamic_ncols=True)

    def __call__(self, done: int, total: int | None) -> None:
        if not self.enabled:
            return
        if self.bar is None:
            self._open(total)
        if done < self.last:
            self.base += self.last
        self.last = done
        if total is not None:
            self.bar.total = self.base + total
        elif self.bar.total is not None and self.base + done > self.bar.total:
            self.bar.total = self.base + done  # past the estimate: the bar stays honest, not over 100%
        self.bar.n = self.base + done
        self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def _run_job(job: Job, contexts: _Contexts, work: WorkBar | None = None) -> tuple[PassOutput, Computed]:
    ctx = contexts.get(job)
    check_sizes(job.name, job.options, ctx.flat.dim, ctx.w.element_size(), ctx.device)
    ctx.progress = work.start(job.name, planned_work(job).hvps) if work is not None else None
    ctx.result_name = job.result_name
    ctx.files_read = {}
    started = time.perf_counter()
    try:
        output = load_passes().get(job.name).factory(ctx, job.options)
    finally:
        ctx.progress = ctx.result_name = None
        if work is not None:
            work.close()
    seconds = time.perf_counter() - started
    layout = None if ctx.memory_format is None else ctx.memory_format.record()
    checkpoint = Path(job.source.checkpoints[job.round])
    files = {files_label(path, checkpoint): PROCESS_HASHES.sha256(path) for path in ctx.files_read
             if Path(path) != checkpoint}  # each file hashed once per process while unchanged
    return output, Computed(ctx.digest, seconds, layout, files)


class _Runner:
    """The jobs of one ``run_analysis``, run in turn: every result written (by rank 0) as soon as it is computed
    and counted in the report; the plain state_dict files that fail are kept in ``failed`` (file -> why) and
    the other jobs go on."""

    def __init__(self, jobs: list[Job], settings: AnalysisSettings, report: AnalysisReport,
                 summaries: dict[int, dict], shown: bool) -> None:
        from landscape.core.progress import progress_bar

        self.jobs, self.settings, self.report, self.summaries = jobs, settings, report, summaries
        self.main = parallel.is_main()
        self.contexts = _Contexts(settings)
        self.tracked = tracking.ResultLog(job.source for job in jobs)  # train.log: checked before any work
        self.work = WorkBar(shown)
        self.bar = progress_bar(total=len(jobs), initial=report.skipped, desc="analyze", unit="pass",
                                disable=not shown, dynamic_ncols=True)
        self.failed: dict[Path, str] = {}  # state_dict files that did not load or match the model: why

    def finish(self, i: int, output: PassOutput, computed: Computed) -> None:
        if self.main:
            write_output(self.jobs[i], self.settings, output, computed)
            job = self.jobs[i]  # the summary goes to the run's train.log trackers too
            self.tracked.log(job.source, job.round, job.result_name, output.summary)
        self.summaries[i] = output.summary
        self.report.computed += 1
        self.bar.update(1)

    def _show(self, i: int) -> None:
        job = self.jobs[i]
        self.bar.set_postfix_str(f"{job.source.name} {'' if 'file' in job.where else 'r'}{job.label} {job.name}")

    def _alone(self, i: int) -> tuple:
        """Job i run by this rank alone: (i, output, ``Computed``, error or None, whether it is a state_dict
        file that failed). One rank: a LandscapeError other than a failed file stops here."""
        self._show(i)
        try:
            if parallel.world_size() == 1:
                return (i, *_run_job(self.jobs[i], self.contexts, self.work), None, False)
            with parallel.solo():
                return (i, *_run_job(self.jobs[i], self.contexts), None, False)
        except _FileFailed as e:  # the other files go on; the analysis fails at the end
            return (i, None, None, str(e), True)
        except LandscapeError as e:  # every rank stops with it, after the step's other results
            if parallel.world_size() == 1:
                raise
            return (i, None, None, str(e), False)

    def run_alone(self, queues: list[list[int]]) -> None:
        """Every rank its own queue (``split_work``), one job a step; each step's outcomes go to every rank."""
        own = queues[parallel.rank()]
        for step in range(max(len(q) for q in queues)):
            outcome = self._alone(own[step]) if step < len(own) else None
            self._gathered([o for o in parallel.all_gather_objects(outcome) if o is not None])

    def _gathered(self, outcomes: list[tuple]) -> None:
        """One step's outcomes of all ranks: results finished, failed files noted; any other error stops every
        rank (the first one's)."""
        for i, output, computed, error, file_failed in outcomes:
            if error is None:
                self.finish(i, output, computed)
            elif file_failed:
                self.failed.setdefault(self.jobs[i].source.checkpoints[self.jobs[i].round], error)
        errors = [error for *_, error, file_failed in outcomes if error is not None and not file_failed]
        if errors:
            raise LandscapeError(errors[0])

    def run_together(self, together: list[int]) -> None:
        """The jobs all ranks run together (their products and surface cells split across the ranks)."""
        for i in together:
            self._show(i)
            try:
                self.finish(i, *_run_job(self.jobs[i], self.contexts, self.work))
            except _FileFailed as e:  # on every rank alike: the file is the same
                self.failed.setdefault(e.path, str(e))


def run_analysis(
    path: Path,
    *,
    rounds: Rounds | str = "last",
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
    jobs, notes = skip_unavailable(plan(path, rounds, passes, options, settings, foreign))
    main = parallel.is_main()
    recorded, redone = parallel.on_main(lambda: recorded_summaries(jobs, settings, force))
    report = AnalysisReport(notes=notes + redone, data=analysis_data(settings))
    report.warnings += partition_warnings([job for job, done in zip(jobs, recorded) if done is None])
    summaries = {i: summary for i, summary in enumerate(recorded) if summary is not None}
    report.skipped = len(summaries)
    # a link planted in a run is refused before any work, not when the first result is filed
    parallel.on_main(lambda: _refuse_links([job for job, done in zip(jobs, recorded) if done is None]))
    queues, together = split_work(jobs, [i for i, s in enumerate(recorded) if s is None], parallel.world_size())
    runner = _Runner(jobs, settings, report, summaries, progress and main)
    threads = contextlib.ExitStack()
    try:
        threads.enter_context(using_threads(settings.threads))  # the settings', never the machine's
        runner.run_alone(queues)
        runner.run_together(together)
    finally:
        threads.close()
        runner.bar.close()
        runner.tracked.close()
    if runner.failed:
        raise _failed_files_error(jobs, runner.failed)
    _fill_report(report, jobs, summaries)
    report.data = _data_text(jobs, settings)
    report.notes += parallel.on_main(lambda: _stale_left(jobs))
    return report


def _refuse_links(jobs: list[Job]) -> None:
    """One line naming a symbolic link planted on the way to a result folder the jobs write into."""
    for folder in dict.fromkeys(job.out_dir for job in jobs):
        refuse_links(folder, itself=True, what="write results into")


def _stale_left(jobs: list[Job]) -> list[str]:
    """One note per run whose stored results are not current after the analysis (``store.results.validity``: of
    passes or rounds it was not asked for; it recomputes only what it is asked for), naming them and the way out."""
    runs = list(dict.fromkeys(job.source.run.path for job in jobs if job.source.run is not None))
    return [stale_note(path, stale, "left as they are") for path in runs if (stale := stale_in(path))]


def _data_text(jobs: list[Job], settings: AnalysisSettings) -> str:
    """The analysis data in words (``summary.analysis_data``), with a subset of N of a split of at most N
    samples said to be all of it: "the test set, all 360 samples (fewer than 1000)"."""
    n = settings.analysis_samples
    described = jobs[0].inputs_record(settings).get("data") if jobs else None  # a state_dict's data, in words
    if not n or not jobs:
        return analysis_data(settings, described)
    sources = list({id(job.source): job.source for job in jobs}.values())
    sizes = {len(source.analysis_set(settings.split)[1]) for source in sources}
    if max(sizes) > n:
        whole = " (all of it where the split has fewer)" if min(sizes) <= n else ""
        return analysis_data(settings, described) + whole
    whole = f"all {sizes.pop()} samples" if len(sizes) == 1 else "all of its samples"
    return f"{analysis_data(replace(settings, analysis_samples=0), described)}, {whole} (fewer than {n})"


def _fill_report(report: AnalysisReport, jobs: list[Job], summaries: dict[int, dict]) -> None:
    """The report's rows (one per run and round, with the summaries of its jobs, in plan order) and the
    settings of every result name."""
    rows: dict[tuple[str, int], dict] = {}
    for i, job in enumerate(jobs):
        row = rows.setdefault((job.source.name, job.round), {"run": job.source.name, **job.where})
        row.update(summaries.get(i, {}))
    report.rows = list(rows.values())
    for job in jobs:
        report.settings[job.result_name] = RESULT_NAMES.settings_text(RESULT_NAMES.settings_diff(job.name, job.settings))
