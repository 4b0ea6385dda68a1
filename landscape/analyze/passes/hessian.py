"""The ``hessian`` analysis pass: Lanczos top-k eigenvalues of grad^2 F, its trace (XTrace; Hutchinson baseline), the SLQ
density and each client's lambda_max (docs/metrics.md "Hessian"); the solvers are imported when the pass runs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal

import numpy as np

from landscape.analyze.passes._common import client_objectives, keys, measured
from landscape.analyze.registry import PASSES, Cost, PassOutput, Quantity, StoredResult
from landscape.core.errors import LandscapeError
from landscape.core.machine import require_memory
from landscape.core.schema import rule
from landscape.store.results.serial import split_result

if TYPE_CHECKING:
    from landscape.analyze.context import CheckpointContext


@dataclass(frozen=True)
class HessianOptions:
    top_k: Annotated[int, rule(ge=1)] = 5  # Lanczos top-k eigenvalues of grad^2 F (lambda_1 / lambda_k reported)
    tol: Annotated[float, rule(gt=0)] = 1e-3  # relative residual ||Hv - lambda v|| <= tol * |lambda|
    # budget of the trace estimator; Hutchinson (the baseline) runs on as many probes
    trace_hvps: Annotated[int, rule("Hutch++", ge=6)] = 60
    # trace.TRACE_METHODS (benchmarks/trace_estimators.py); the default is trace.DEFAULT_TRACE_METHOD
    trace_method: Literal["xtrace", "hutch++", "hutchinson"] = "xtrace"
    density_runs: Annotated[int, rule(ge=1)] = 4  # SLQ: n_v runs x m steps; trace_stderr has n_v - 1 d.o.f.
    density_steps: Annotated[int, rule(ge=2)] = 40
    # per-client lambda_max(grad^2 F_i) for all clients (0), a seeded sample, or none (-1)
    clients: Annotated[int, rule("-1: none, 0: all clients", ge=-1)] = 0


# Per-client lambda_max: a Lanczos run per client on its share of the data, about this many full-data
# products in all.
CLIENT_LAMBDA_MAX_HVPS = 50


def _hessian_cost(o: HessianOptions) -> Cost:
    """The probe; Lanczos (a Krylov space of top_k + 10, often up to twice that, and the verification); the
    trace and its Hutchinson baseline; SLQ; per-client lambda_max."""
    from landscape.measure.functions import PROBE_HVPS  # the computation's own count (costs are for plans)

    lanczos = PROBE_HVPS + 2 * o.top_k + 20
    clients = CLIENT_LAMBDA_MAX_HVPS if o.clients >= 0 else 0
    return Cost(hvps=lanczos + 2 * o.trace_hvps + o.density_runs * o.density_steps + clients)


def _check_sizes(o: HessianOptions, dim: int, itemsize: int, free: int | None) -> None:
    """top_k at most the dimension; the vectors the solvers hold at once within free memory: the Lanczos basis
    (a Krylov space of up to 2 (top_k + 10) vectors), the trace's trace_hvps probes, the SLQ basis of
    density_steps vectors. Refused in one line before any product."""
    if o.top_k > dim:
        raise LandscapeError(f"hessian.top_k must be at most the Hessian's dimension {dim:,} (got {o.top_k:,})")
    largest = max((2 * (o.top_k + 10), "hessian.top_k"), (o.trace_hvps, "hessian.trace_hvps"),
                  (o.density_steps, "hessian.density_steps"))
    vectors, setting = largest
    require_memory(vectors * dim * itemsize, f"{setting} = {o.top_k if setting.endswith('top_k') else vectors:,} "
                   f"({vectors:,} vectors of the dimension {dim:,}, {itemsize} bytes each entry)",
                   f"choose a smaller {setting}", free)


def _first_eigenvalue(result: StoredResult) -> tuple[Any, Any]:
    values = np.atleast_1d(result.array("top.values"))
    return (float(values[0]) if values.size else None), None


def _trace(result: StoredResult) -> tuple[Any, Any]:
    """The trace estimate and its standard error (``trace``; results written before it: Hutch++)."""
    key = "trace" if result.value("trace.estimate", None) is not None else "trace_hutchpp"
    return result.value(f"{key}.estimate", None), result.value(f"{key}.stderr", None)


PASSES.declare("hessian", options=HessianOptions,
               summary="Lanczos top-k eigenvalues, trace (XTrace; Hutchinson baseline), SLQ density, client "
                       "lambda_max",
               cost=_hessian_cost,
               size_check=_check_sizes,
               reads=frozenset({"backend", "hvp"}),  # the PyHessian cross-check; the products' backend
               quantities=(Quantity("lambda_max", "&lambda;<sub>max</sub>", "top.values",
                                    read_result=_first_eigenvalue),
                           Quantity("lambda_1/lambda_k", "&lambda;<sub>1</sub>/&lambda;<sub>k</sub>", "lambda_ratio"),
                           Quantity("trace", "trace", "trace.estimate", "trace.stderr", read_result=_trace),
                           Quantity("client lambda_max", "mean client &lambda;<sub>max</sub>",
                                    "clients.mean_lambda_max")),
               # lambda_max (top.values[0]) and the PyHessian lambda_max are the summary's
               measures=measured("lambda_ratio trace.stderr trace_hutchinson.estimate trace_hutchinson.stderr "
                                 "density.sigma density.mass density.trace density.trace_stderr "
                                 "pyhessian.trace_stderr pyhessian.rule_trace",
                                 {"trace.estimate": "trace", "trace.settings.paper_stderr": "trace.paper_stderr",
                                  "trace.settings.jackknife_stderr": "trace.jackknife_stderr",
                                  "trace.settings.low_rank_part": "trace.low_rank_part",
                                  "clients.mean_lambda_max": "client_lambda_max_mean",
                                  "pyhessian.trace": "pyhessian_trace"}),
               bookkeeping=keys(
                   "dim frozen hvp_count hvp.graph_bytes top.hvp_count top.iterations top.seed top.tol top.settings "
                   "trace.stderr_dof trace.samples trace.hvp_count trace.seed trace.settings.test_vectors "
                   "trace.settings.block trace.settings.sketch trace.settings.residual_probes "
                   "trace_hutchinson.stderr_dof trace_hutchinson.samples trace_hutchinson.hvp_count "
                   "trace_hutchinson.seed trace_hutchinson.settings density.trace_stderr_dof density.runs "
                   "density.steps density.hvp_count density.seed clients.hvp_count pyhessian.trace_samples "
                   "pyhessian.rule_samples pyhessian.eigen_hvp_count pyhessian.trace_hvp_count "
                   "pyhessian.eigen_seconds pyhessian.trace_seconds pyhessian.seed pyhessian.settings"))


# PyHessian's power iteration stops on a relative change of the Rayleigh quotient, which at 1e-3 leaves
# errors near 1% on small eigengaps; the cross-check runs it tighter so that it can check ours.
PYHESSIAN_TOL = 1e-5


@PASSES.implement("hessian")
def hessian_pass(ctx: CheckpointContext, opts: HessianOptions) -> PassOutput:
    from landscape.measure import functions
    from landscape.measure.lanczos import client_lambda_max

    seed, problem = ctx.settings.seed, ctx.problem
    # One operator for every solver of the checkpoint (progress: every product, on the bar); auto is decided
    # once, here, and recorded with the measured size of the graphs.
    op = functions.hessian_operator(problem, hvp=ctx.settings.hvp, progress=ctx.progress)
    backend, graph_bytes = op.decide_backend(), op.graph_bytes
    shared = {"seed": seed, "hvp": backend, "operator": op}
    top = functions.hessian_eigs(problem, opts.top_k, tol=float(opts.tol), **shared)  # after the probe
    trace = functions.trace(problem, hvps=opts.trace_hvps, method=opts.trace_method, **shared)
    hutchinson = functions.trace(problem, hvps=opts.trace_hvps, method="hutchinson", **shared)
    density = functions.density(problem, runs=opts.density_runs, steps=opts.density_steps, **shared)
    op.release()  # the kept graphs go before the clients' operators are built
    out: dict[str, Any] = {
        "dim": ctx.flat.dim,  # the trainable entries: the Hessian's dimension
        "frozen": ctx.flat.frozen_dim,  # requires_grad=False entries, held constant
        "top": top.summary(),
        "lambda_ratio": top.top_ratio,
        "trace": trace.summary(),
        "trace_hutchinson": hutchinson.summary(),
        "density": {k: v for k, v in density.summary().items() if k not in ("nodes", "weights", "grid", "density")},
        "hvp_count": (functions.PROBE_HVPS + top.hvp_count + trace.hvp_count + hutchinson.hvp_count
                      + density.hvp_count),
        "hvp": {"setting": ctx.settings.hvp, "backend": backend,
                "graph_bytes": graph_bytes},  # the products' backend and the measured graph size
    }
    arrays = {"density_grid": density.grid, "density": density.density, "slq_nodes": density.nodes,
              "slq_weights": density.weights}
    summary = {"lambda_max": float(top.values[0]), "lambda_ratio": float(top.top_ratio),
               "trace": float(trace.estimate)}
    if opts.clients >= 0 and ctx.num_clients:
        objectives = client_objectives(ctx, opts.clients, "per-client lambda_max")
        local = client_lambda_max(objectives, ctx.w, tol=opts.tol, seed=seed, backend=backend,
                                  products=ctx.progress)  # the bar moves with every client's products
        values = np.array([float(local[i].values[0]) for i in sorted(local)])
        out["clients"] = {"clients": sorted(local), "lambda_max": values.tolist(),
                          "hvp_count": sum(r.hvp_count for r in local.values()),
                          "mean_lambda_max": float(values.mean())}
        summary["client_lambda_max_mean"] = float(values.mean())
    if ctx.settings.backend == "pyhessian":
        # Cross-check with the PyHessian package on the same data (its defects are worked around there).
        from landscape.measure.pyhessian_backend import pyhessian_lambda_max_and_trace

        if ctx.settings.bn_mode != "eval" and ctx.objective.has_batchnorm:
            raise LandscapeError("--backend pyhessian forces eval mode; use --bn-mode eval with it")
        ref = pyhessian_lambda_max_and_trace(ctx.flat.module, ctx.global_data, ctx.w, buffers=ctx.buffers,
                                             top_n=1, trace_iters=opts.trace_hvps, tol=PYHESSIAN_TOL,
                                             device=ctx.device, seed=seed)
        out["pyhessian"], _ = split_result(ref)
        summary["pyhessian_lambda_max"] = float(ref.lambda_max)
        if ref.trace is not None:  # its Hutchinson trace beside ours (trace_hvps Rademacher probes)
            summary["pyhessian_trace"] = float(ref.trace)
    return PassOutput(out, arrays, summary)
