"""Analysis passes: one function each, registered by name; ``run_analysis`` runs them over checkpoints.

A pass reads one checkpoint (``CheckpointContext``) and its options (a dataclass of the pass's settings),
and returns a ``PassOutput``: scalars (written to ``analysis/round-NNNN/<pass>.json`` with the schema version,
the settings that produced them, the checkpoint's SHA-256 and the seconds taken) and arrays (``<pass>.npz``).
A pass whose JSON already records the same settings and checkpoint is skipped unless ``force``. Under
torchrun ``run_analysis`` splits the checkpoints, or the work inside a pass, across the ranks (``split_work``).
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from landscape import parallel
from landscape.analyze.context import (
    AnalysisSettings,
    CheckpointContext,
    Source,
    file_digest,
    find_sources,
    select_rounds,
)
from landscape.errors import LandscapeError
from landscape.registry import Registry
from landscape.runs import atomic_write, write_text

SCHEMA_VERSION = 1


@dataclass
class PassOutput:
    scalars: dict[str, Any]
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    summary: dict[str, float] = field(default_factory=dict)  # the few numbers shown in the final table


PassFn = Callable[[CheckpointContext, Any], PassOutput]
PASSES: Registry[PassFn] = Registry("analysis pass")


def to_plain(value: Any) -> Any:
    """JSON-ready: dataclasses -> dicts, tensors/arrays of one value -> numbers, NaN/inf kept as floats."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): to_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_plain(v) for v in value]
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    if isinstance(value, np.ndarray):
        return value.item() if value.ndim == 0 else value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


def split_result(result: Any, prefix: str = "") -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """A result dataclass -> (scalars for JSON, arrays with more than a few values for NPZ)."""
    scalars: dict[str, Any] = {}
    arrays: dict[str, np.ndarray] = {}
    items = (
        {f.name: getattr(result, f.name) for f in dataclasses.fields(result)}
        if dataclasses.is_dataclass(result)
        else dict(result)
    )
    for key, value in items.items():
        name = f"{prefix}{key}"
        if isinstance(value, torch.Tensor):
            value = value.detach().cpu().numpy()
        if isinstance(value, np.ndarray) and value.size > 16:
            arrays[name] = value
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            sub_scalars, sub_arrays = split_result(value, f"{name}.")
            scalars[key] = {k[len(name) + 1 :]: v for k, v in sub_scalars.items()}
            arrays.update(sub_arrays)
        else:
            scalars[key] = to_plain(value)
    return scalars, arrays


def _json_ready(value: Any) -> Any:
    """JSON has no NaN/inf: write them as strings so the files stay standard JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _json_ready(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_ready(v) for v in value]
    return value


@dataclass(frozen=True)
class Job:
    source: Source
    round: int
    name: str
    options: Any

    @property
    def out_dir(self) -> Path:
        return self.source.analysis_dir / f"round-{self.round:04d}"

    @property
    def output(self) -> str:
        """The result files' name: the pass name, or what its options name (surface-pca, ...), so that
        results of one pass with different kinds of options stand side by side."""
        return getattr(self.options, "output_name", self.name)


def pass_options(name: str, values: dict[str, Any]) -> Any:
    return PASSES.get(name).make_options(values)


def _settings_record(settings: AnalysisSettings, options: Any) -> dict:
    return {"analysis": settings.record(), "pass": to_plain(options) if options is not None else {}}


def already_done(job: Job, settings: AnalysisSettings, digest: str) -> bool:
    path = job.out_dir / f"{job.output}.json"
    if not path.is_file():
        return False
    try:
        recorded = json.loads(path.read_text())
    except json.JSONDecodeError:
        return False
    return (
        recorded.get("schema_version") == SCHEMA_VERSION
        and recorded.get("settings") == _settings_record(settings, job.options)
        and recorded.get("checkpoint_sha256") == digest
    )


def write_output(job: Job, settings: AnalysisSettings, digest: str, output: PassOutput, seconds: float) -> None:
    record = {
        "schema_version": SCHEMA_VERSION,
        "pass": job.name,
        "run": job.source.name,
        "round": job.round,
        "checkpoint": str(job.source.checkpoints[job.round]),
        "checkpoint_sha256": digest,
        "settings": _settings_record(settings, job.options),
        "seconds": seconds,
        "summary": output.summary,
        "result": output.scalars,
        "arrays": sorted(output.arrays),
    }
    if output.arrays:
        buffer = io.BytesIO()
        np.savez_compressed(buffer, **output.arrays)
        atomic_write(job.out_dir / f"{job.output}.npz", lambda f: f.write(buffer.getvalue()))
    # The JSON is written last: its presence marks the pass as complete.
    write_text(job.out_dir / f"{job.output}.json", json.dumps(_json_ready(record), indent=1) + "\n")


def read_output(out_dir: Path, name: str) -> dict | None:
    path = out_dir / f"{name}.json"
    return json.loads(path.read_text()) if path.is_file() else None


@dataclass
class AnalysisReport:
    rows: list[dict] = field(default_factory=list)  # one per (run, round): summaries of every pass
    computed: int = 0
    skipped: int = 0


def plan(path: Path, rounds: str, passes: list[str], options: dict[str, Any]) -> list[Job]:
    """Every (run, round, pass) to do, with all input checked before any work starts."""
    for name in passes:
        PASSES.get(name)
    sources, single_round = find_sources(Path(path))
    jobs = []
    for source in sources:
        chosen = [single_round] if single_round is not None else select_rounds(source, rounds)
        for r in chosen:
            jobs += [Job(source, r, name, options[name]) for name in passes]
    return jobs


# Passes whose work is split inside the pass (surface: grid cells across ranks, partial grids saved by rank 0):
# under torchrun all ranks run them together, never one rank alone.
COLLECTIVE_PASSES = frozenset({"surface"})


def split_work(jobs: list[Job], todo: list[int], ranks: int) -> tuple[list[list[int]], list[int]]:
    """Who runs which of ``jobs[i] for i in todo`` under ``ranks`` ranks: (per-rank queues, run alone; jobs
    run by all ranks together), both in plan order.

    A checkpoint's jobs stay on one rank (its model and data are loaded once). Whole rounds of checkpoints,
    one per rank, go to the queues; the checkpoints left over (fewer than the ranks) and every job of a
    COLLECTIVE pass run on all ranks together, their HVPs and surface cells split across the ranks. One
    rank: every job in one queue, in plan order.
    """
    if ranks == 1:
        return [list(todo)], []
    groups: dict[tuple[int, int], list[int]] = {}
    together = [i for i in todo if jobs[i].name in COLLECTIVE_PASSES]
    for i in todo:
        if jobs[i].name not in COLLECTIVE_PASSES:
            groups.setdefault((id(jobs[i].source), jobs[i].round), []).append(i)
    keys = list(groups)
    whole = len(keys) - len(keys) % ranks
    queues: list[list[int]] = [[] for _ in range(ranks)]
    for n, key in enumerate(keys[:whole]):
        queues[n % ranks] += groups[key]
    together = sorted(together + [i for key in keys[whole:] for i in groups[key]])
    return queues, together


def _recorded_summaries(jobs: list[Job], settings: AnalysisSettings, force: bool) -> list[dict | None]:
    """The summary of each job already computed with the same settings on the same checkpoint; None for the
    jobs to run (all of them with ``force``). A checkpoint is hashed only when a result of it exists."""
    digests: dict[Path, str] = {}
    out: list[dict | None] = []
    for job in jobs:
        summary = None
        if not force and (job.out_dir / f"{job.output}.json").is_file():
            path = job.source.checkpoints[job.round]
            if path not in digests:
                digests[path] = file_digest(path)
            if already_done(job, settings, digests[path]):
                summary = read_output(job.out_dir, job.output).get("summary", {})
        out.append(summary)
    return out


class _Contexts:
    """One checkpoint's context at a time (its tensors are freed when the next checkpoint comes)."""

    def __init__(self, settings: AnalysisSettings) -> None:
        self.settings = settings
        self.key: tuple[int, int] | None = None
        self.ctx: CheckpointContext | None = None

    def get(self, job: Job) -> CheckpointContext:
        key = (id(job.source), job.round)
        if key != self.key:
            self.ctx = None  # free the previous checkpoint's tensors before loading the next
            self.ctx, self.key = CheckpointContext(job.source, job.round, self.settings), key
        return self.ctx


def _run_job(job: Job, contexts: _Contexts) -> tuple[PassOutput, str, float]:
    ctx = contexts.get(job)
    started = time.perf_counter()
    output = PASSES.get(job.name).factory(ctx, job.options)
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
) -> AnalysisReport:
    """Run ``passes`` on the chosen checkpoints of the runs under ``path``; each result is written as soon as
    it is computed, and results already computed with the same settings are skipped (unless ``force``).

    Under torchrun (every rank calls this with the same arguments) rank 0 decides what is done and writes
    every file; the work is split as ``split_work`` says: first each rank analyses its own checkpoints
    alone (``parallel.solo``: no collectives, so ranks working on different checkpoints never wait on each
    other), the results going to rank 0 after each step; then the rest runs on all ranks together, with
    Hessian-vector products and surface cells split across them. Splitting checkpoints and, at the same
    time, the work inside a pass would deadlock: a rank would wait in an all-reduce for ranks busy with
    other checkpoints. Every rank returns the same report.
    """
    from tqdm.auto import tqdm

    jobs = plan(path, rounds, passes, options)
    main = parallel.is_main()
    recorded = parallel.on_main(lambda: _recorded_summaries(jobs, settings, force))
    report = AnalysisReport()
    summaries = {i: summary for i, summary in enumerate(recorded) if summary is not None}
    report.skipped = len(summaries)
    queues, together = split_work(jobs, [i for i, s in enumerate(recorded) if s is None], parallel.world_size())
    contexts = _Contexts(settings)
    bar = tqdm(total=len(jobs), initial=report.skipped, desc="analyze", unit="pass",
               disable=not (progress and main), dynamic_ncols=True)

    def finish(i: int, output: PassOutput, digest: str, seconds: float) -> None:
        if main:
            write_output(jobs[i], settings, digest, output, seconds)
        summaries[i] = output.summary
        report.computed += 1
        bar.update(1)

    try:
        own = queues[parallel.rank()]
        for step in range(max(len(q) for q in queues)):
            outcome = None
            if step < len(own):
                i = own[step]
                bar.set_postfix_str(f"{jobs[i].source.name} r{jobs[i].round} {jobs[i].name}")
                if parallel.world_size() == 1:
                    outcome = (i, *_run_job(jobs[i], contexts), None)
                else:
                    try:
                        with parallel.solo():
                            outcome = (i, *_run_job(jobs[i], contexts), None)
                    except LandscapeError as e:  # every rank stops with it, after the step's other results
                        outcome = (i, None, "", 0.0, str(e))
            outcomes = [o for o in parallel.all_gather_objects(outcome) if o is not None]
            for i, output, digest, seconds, error in outcomes:
                if error is None:
                    finish(i, output, digest, seconds)
            errors = [error for *_, error in outcomes if error is not None]
            if errors:
                raise LandscapeError(errors[0])
        for i in together:
            bar.set_postfix_str(f"{jobs[i].source.name} r{jobs[i].round} {jobs[i].name}")
            finish(i, *_run_job(jobs[i], contexts))
    finally:
        bar.close()
    rows: dict[tuple[str, int], dict] = {}
    for i, job in enumerate(jobs):
        row = rows.setdefault((job.source.name, job.round), {"run": job.source.name, "round": job.round})
        row.update(summaries.get(i, {}))
    report.rows = list(rows.values())
    return report


def format_summary(report: AnalysisReport) -> str:
    """A plain-text table: one line per (run, round), one column per summary value."""
    if not report.rows:
        return "nothing analysed"
    columns = ["run", "round"] + sorted({k for row in report.rows for k in row} - {"run", "round"})

    def cell(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:.4g}"
        return "-" if value is None else str(value)

    table = [columns] + [[cell(row.get(c)) for c in columns] for row in report.rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(columns))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------------------
# the passes


@dataclass(frozen=True)
class LossOptions:
    clients: int = 0  # per-client F_i for all clients (0) or a seeded sample of this many


@PASSES.register("loss", options=LossOptions, summary="F(x), accuracy and ||grad F(x)|| on the analysis data; F_i")
def loss_pass(ctx: CheckpointContext, opts: LossOptions) -> PassOutput:
    loss, grad = ctx.objective.loss_and_grad(ctx.w)
    accuracy = ctx.objective.accuracy(ctx.w)
    clients = ctx.sample_clients(opts.clients)
    client_losses = np.array([ctx.client_objective(i).loss(ctx.w).item() for i in clients])
    scalars = {
        "loss": loss.item(),
        "accuracy": accuracy,
        "grad_norm": grad.norm().item(),
        "samples": len(ctx.global_data),
        "clients": clients,
        "client_loss": client_losses.tolist(),
        "client_loss_mean": float(client_losses.mean()),
    }
    return PassOutput(scalars, summary={"loss": scalars["loss"], "acc": accuracy})


def _client_objectives(ctx: CheckpointContext, count: int) -> dict[int, Any]:
    return {i: ctx.client_objective(i) for i in ctx.sample_clients(count)}


def _training_batch_size(ctx: CheckpointContext, value: int) -> int:
    """0 means the run's own local batch size (METRICS.md: the training batch size)."""
    return value if value > 0 else int(ctx.source.recipe["train"]["batch_size"])


@dataclass(frozen=True)
class SharpnessOptions:
    rhos: tuple[float, ...] = (0.01, 0.05, 0.1)  # radii of the global S_rho profile
    steps: int = 5  # projected normalised ascent steps (1 = the SAM estimate)
    adaptive: bool = True  # also the ASAM-ball profile (|x| + eta, weights only, as FedASAM trains)
    eta: float = 0.01
    local_rho: float = 0.05  # radius of the per-client S_rho on F_i
    clients: int = 0  # all clients (0) or a seeded sample


@PASSES.register("sharpness", options=SharpnessOptions,
                 summary="rho-ball sharpness S_rho (and adaptive) of F; per-client S_rho of F_i and the gap")
def sharpness_pass(ctx: CheckpointContext, opts: SharpnessOptions) -> PassOutput:
    from landscape.analyze.sharpness import asam_weight_mask, local_sharpness, sharpness_profile

    seed = ctx.settings.seed
    profile = sharpness_profile(ctx.objective, ctx.w, list(opts.rhos), steps=opts.steps, seed=seed)
    scalars, arrays = split_result(profile, "global.")
    out = {"global": scalars}
    if opts.adaptive:
        adaptive = sharpness_profile(ctx.objective, ctx.w, list(opts.rhos), steps=opts.steps, adaptive=True,
                                     eta=opts.eta, weight_mask=asam_weight_mask(ctx.flat), seed=seed)
        out["adaptive"], more = split_result(adaptive, "adaptive.")
        arrays.update(more)
    local = local_sharpness(_client_objectives(ctx, opts.clients), ctx.objective, ctx.w, opts.local_rho,
                            steps=opts.steps, seed=seed)
    out["local"], more = split_result(local, "local.")
    arrays.update(more)
    summary = {f"S_rho({rho:g})": float(s) for rho, s in zip(profile.rhos, profile.sharpness)}
    summary["local_gap"] = float(local.gap)
    return PassOutput(out, arrays, summary)


@PASSES.register("flatness", summary="flatness distance Delta_D from the round's kept client models")
def flatness_pass(ctx: CheckpointContext, opts: None) -> PassOutput:
    from landscape.analyze.flatness import flatness_distance

    # Delta_D^t = mean_i ||y_{i,K}^t - x^t||^2 against the training global model (not the SWA average).
    result = flatness_distance(ctx.global_w, ctx.kept_clients())
    scalars, arrays = split_result(result)
    return PassOutput(scalars, arrays, {"Delta_D": float(result.distance)})


@dataclass(frozen=True)
class IncompatibilityOptions:
    rho: float = 0.05  # perturbation radius
    batches: int = 8  # Monte-Carlo minibatches per client (--batches)
    batch_size: int = 0  # 0: the run's training batch size
    clients: int = 0  # all clients (0) or a seeded sample
    loss_level: bool = True  # also the loss-level gap (N * (M + 1) extra passes over F)


@PASSES.register("incompatibility", options=IncompatibilityOptions,
                 summary="flatness incompatibility Delta_FI, its heterogeneity / minibatch split, friendly rate")
def incompatibility_pass(ctx: CheckpointContext, opts: IncompatibilityOptions) -> PassOutput:
    from landscape.analyze.flatness import flatness_incompatibility

    result = flatness_incompatibility(
        ctx.objective, _client_objectives(ctx, opts.clients), ctx.w, opts.rho,
        batch_size=_training_batch_size(ctx, opts.batch_size), batches=opts.batches, seed=ctx.settings.seed,
        loss_level=opts.loss_level,
    )
    scalars, arrays = split_result(result)
    summary = {"Delta_FI": float(result.incompatibility), "heterogeneity_share": float(result.heterogeneity_share)}
    return PassOutput(scalars, arrays, summary)


@dataclass(frozen=True)
class AlignmentOptions:
    clients: int = 0  # all clients (0) or a seeded sample for the gradient cosines
    batches: int = 8  # minibatches per client for the within-client cosine
    batch_size: int = 0  # 0: the run's training batch size


@PASSES.register("alignment", options=AlignmentOptions,
                 summary="cosines of client gradients (client x client, x global), minibatch and update cosines")
def alignment_pass(ctx: CheckpointContext, opts: AlignmentOptions) -> PassOutput:
    from landscape.analyze.alignment import gradient_alignment, minibatch_alignment, update_alignment

    objectives = _client_objectives(ctx, opts.clients)
    gradients = gradient_alignment(ctx.objective, objectives, ctx.w)
    minibatch = minibatch_alignment(objectives, ctx.w, batch_size=_training_batch_size(ctx, opts.batch_size),
                                    batches=opts.batches, seed=ctx.settings.seed)
    out: dict[str, Any] = {}
    out["gradients"], arrays = split_result(gradients, "gradients.")
    out["minibatch"], more = split_result(minibatch, "minibatch.")
    arrays.update(more)
    # Update cosines need this round's kept client models and the model they started from (round t - 1).
    start = ctx.previous_global()
    kept = ctx.source.clients_checkpoint(ctx.round).is_file()
    if kept and start is not None:
        out["updates"], more = split_result(update_alignment(start, ctx.kept_clients(), ctx.global_w), "updates.")
        arrays.update(more)
    else:
        out["updates"] = {"available": False, "reason": "needs --keep-clients and a checkpoint of round "
                          f"{ctx.round - 1} (train with --checkpoint-every 1 around this round)"}
    summary = {"mean_grad_cos": float(gradients.mean_off_diagonal),
               "mean_minibatch_cos": float(minibatch.mean_cosine)}
    return PassOutput(out, arrays, summary)


# PyHessian's power iteration stops on a relative change of the Rayleigh quotient, which at 1e-3 leaves
# errors near 1% on small eigengaps; the cross-check runs it tighter so that it can check ours.
PYHESSIAN_TOL = 1e-5


@dataclass(frozen=True)
class HessianOptions:
    top_k: int = 5  # Lanczos top-k eigenvalues of grad^2 F (lambda_1 / lambda_k reported)
    tol: float = 1e-3  # relative residual ||Hv - lambda v|| <= tol * |lambda|
    trace_hvps: int = 60  # Hutch++ budget; Hutchinson runs on the same number of probes
    density_runs: int = 2  # SLQ: n_v runs x m steps
    density_steps: int = 40
    clients: int = 0  # per-client lambda_max(grad^2 F_i) for all clients (0), a seeded sample, or none (-1)

    def __post_init__(self) -> None:
        if self.top_k < 1 or self.tol <= 0 or self.trace_hvps < 6 or self.density_runs < 1 or self.density_steps < 2:
            raise LandscapeError("hessian options: top_k >= 1, tol > 0, trace_hvps >= 6 (Hutch++), density_runs >= 1, "
                                 "density_steps >= 2")


@PASSES.register("hessian", options=HessianOptions,
                 summary="Lanczos top-k eigenvalues, Hutchinson/Hutch++ trace, SLQ density, per-client lambda_max")
def hessian_pass(ctx: CheckpointContext, opts: HessianOptions) -> PassOutput:
    from landscape.analyze.operator import HessianOperator
    from landscape.analyze.spectrum import (
        client_lambda_max,
        hutchinson_trace,
        hutchpp_trace,
        lanczos_topk,
        slq_density,
    )

    seed, backend = ctx.settings.seed, ctx.settings.hvp
    op = HessianOperator(ctx.objective, ctx.w, backend=backend)
    op.check_determinism(seed)  # before trusting the operator: dropout / train-mode BN / augmentation
    top = lanczos_topk(op, opts.top_k, tol=opts.tol, seed=seed)
    hutchpp = hutchpp_trace(op, hvps=opts.trace_hvps, seed=seed)
    hutchinson = hutchinson_trace(op, samples=opts.trace_hvps, seed=seed)
    density = slq_density(op, runs=opts.density_runs, steps=opts.density_steps, seed=seed)
    out: dict[str, Any] = {
        "dim": op.dim,
        "top": top.summary(),
        "lambda_ratio": top.top_ratio,
        "trace_hutchpp": hutchpp.summary(),
        "trace_hutchinson": hutchinson.summary(),
        "density": {k: v for k, v in density.summary().items() if k not in ("nodes", "weights", "grid", "density")},
        "hvp_count": op.hvp_count,
    }
    arrays = {"density_grid": density.grid, "density": density.density, "slq_nodes": density.nodes,
              "slq_weights": density.weights}
    summary = {"lambda_max": float(top.values[0]), "lambda_ratio": float(top.top_ratio),
               "trace": float(hutchpp.estimate)}
    if opts.clients >= 0:
        objectives = _client_objectives(ctx, opts.clients)
        local = client_lambda_max(objectives, ctx.w, tol=opts.tol, seed=seed, backend=backend)
        values = np.array([float(local[i].values[0]) for i in sorted(local)])
        out["clients"] = {"clients": sorted(local), "lambda_max": values.tolist(),
                          "hvp_count": sum(r.hvp_count for r in local.values()),
                          "mean_lambda_max": float(values.mean())}
        summary["client_lambda_max_mean"] = float(values.mean())
    if ctx.settings.backend == "pyhessian":
        # Cross-check with the PyHessian package on the same data (its defects are worked around there).
        from landscape.analyze.pyhessian_backend import pyhessian_lambda_max_and_trace

        if ctx.settings.bn_mode != "eval" and ctx.objective.has_batchnorm:
            raise LandscapeError("--backend pyhessian forces eval mode; use --bn-mode eval with it")
        ref = pyhessian_lambda_max_and_trace(ctx.flat.module, ctx.global_data, ctx.w, buffers=ctx.buffers,
                                             top_n=1, trace_iters=opts.trace_hvps, tol=PYHESSIAN_TOL,
                                             device=ctx.device, seed=seed)
        out["pyhessian"], _ = split_result(ref)
        summary["pyhessian_lambda_max"] = float(ref.lambda_max)
    return PassOutput(out, arrays, summary)


# Passes that run only when asked for by name (expensive): not part of the default `landscape analyze`.
OPT_IN = {"surface"}


def default_passes() -> list[str]:
    return [name for name in PASSES.names() if name not in OPT_IN]


# The surface pass lives in its own module; importing it registers "surface" in PASSES.
from landscape.analyze import surface as _surface  # noqa: F401
