"""The analysis passes (the surface pass is in ``surface.py``): one function each, registered by name in
``registry.PASSES`` with its metadata: the dataclass of its options, what it needs of a run, its cost model
and the summary quantities the comparison tables read of its results.

A pass reads one checkpoint (``CheckpointContext``) and its options, and returns a ``PassOutput``: scalars
(for ``analysis/round-NNNN/<pass>.json``), arrays (``<pass>.npz``) and the few numbers of the summary table.
``scheduler.run_analysis`` runs them; ``results.py`` writes what they return.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from landscape.analyze import functions
from landscape.analyze.registry import CLIENTS, KEPT_CLIENTS, PASSES, Cost, PassOutput, Quantity, StoredResult
from landscape.analyze.serial import split_result
from landscape.analyze.trace import DEFAULT_TRACE_METHOD, TRACE_METHODS
from landscape.core.errors import LandscapeError
from landscape.core.registry import NON_NEGATIVE, POSITIVE

if TYPE_CHECKING:
    from landscape.analyze.context import CheckpointContext


@dataclass(frozen=True)
class LossOptions:
    clients: int = field(default=0, metadata=NON_NEGATIVE)  # per-client F_i for all (0) or a seeded sample


def _accuracy_percent(result: StoredResult) -> tuple[Any, Any]:
    return 100 * float(result.value("accuracy")), None


LOSS_QUANTITIES = (
    Quantity("F(x)", "F(x) (analysis data)", "loss"),
    Quantity("accuracy (analysis data, %)", "accuracy (analysis data, %)", "accuracy",
             read_result=_accuracy_percent),
)


@PASSES.register("loss", options=LossOptions,
                 summary="F(x), accuracy and ||grad F(x)|| on the analysis data; F_i",
                 cost=lambda o: Cost(gradients=2.0), quantities=LOSS_QUANTITIES)
def loss_pass(ctx: CheckpointContext, opts: LossOptions) -> PassOutput:
    loss, grad = ctx.objective.loss_and_grad(ctx.w)
    accuracy = ctx.objective.accuracy(ctx.w)
    clients = ctx.sample_clients(opts.clients) if ctx.num_clients else []  # a state_dict has no clients
    client_losses = np.array([ctx.client_objective(i).loss(ctx.w).item() for i in clients])
    scalars = {
        "loss": loss.item(),
        "accuracy": accuracy,
        "grad_norm": grad.norm().item(),
        "samples": len(ctx.global_data),
        "clients": clients,
        "client_loss": client_losses.tolist(),
        "client_loss_mean": float(client_losses.mean()) if clients else None,
    }
    return PassOutput(scalars, summary={"loss": scalars["loss"], "acc": accuracy})


def _client_objectives(ctx: CheckpointContext, count: int, what: str) -> dict[int, Any]:
    if ctx.num_clients == 0:
        raise LandscapeError(f"{what} needs the clients of a training run; {ctx.source.name} is a plain state_dict "
                             "(run the loss, hessian, sharpness or surface pass on it)")
    return {i: ctx.client_objective(i) for i in ctx.sample_clients(count)}


def _training_batch_size(ctx: CheckpointContext, value: int) -> int:
    """0 means the run's own local batch size (docs/metrics.md: the training batch size)."""
    return value if value > 0 else ctx.source.train_batch_size


@dataclass(frozen=True)
class SharpnessOptions:
    rhos: tuple[float, ...] = field(default=(0.01, 0.05, 0.1), metadata=POSITIVE)  # radii of global S_rho
    # the most trial points of each Armijo projected ascent (steps = starts = 1: SAM)
    steps: int = field(default=50, metadata=POSITIVE)
    # stop when the estimated remaining gain is below tol * S_rho (0: run all steps)
    tol: float = field(default=1e-3, metadata=NON_NEGATIVE)
    # ascents from the centre and starts - 1 seeded random points on the sphere; the best
    starts: int = field(default=8, metadata=POSITIVE)
    adaptive: bool = True  # also the ASAM-ball profile (|x| + eta, weights only, as FedASAM trains)
    eta: float = field(default=0.01, metadata=POSITIVE)
    local_rho: float = field(default=0.05, metadata=POSITIVE)  # radius of the per-client S_rho on F_i
    clients: int = field(default=0, metadata=NON_NEGATIVE)  # all clients (0) or a seeded sample


def _sharpness_cost(o: SharpnessOptions) -> Cost:
    """Every radius's ascent (twice with the adaptive profile) and the per-client ascents (N x 1/N of the
    data)."""
    return Cost(gradients=1 + len(o.rhos) * o.steps * (2 if o.adaptive else 1) + o.steps)


def _sharpness_at(rho: float) -> Quantity:
    def read(result: StoredResult) -> tuple[Any, Any]:
        rhos = np.atleast_1d(result.array("global.rhos"))
        hit = np.flatnonzero(np.isclose(rhos, rho, rtol=1e-9, atol=0))
        return (float(np.atleast_1d(result.array("global.sharpness"))[hit[0]]) if hit.size else None), None

    return Quantity(f"S_rho({rho:g})", f"S<sub>&rho;</sub> (&rho;={rho:g})", "global.sharpness",
                    read_result=read)


@PASSES.register("sharpness", options=SharpnessOptions,
                 summary="rho-ball sharpness S_rho (and adaptive) of F; per-client S_rho of F_i and the gap",
                 cost=_sharpness_cost,
                 quantities=(_sharpness_at, Quantity("local-global S_rho",
                                                     "local &minus; global S<sub>&rho;</sub>", "local.gap")))
def sharpness_pass(ctx: CheckpointContext, opts: SharpnessOptions) -> PassOutput:
    from landscape.analyze.sharpness import DEFAULT_ETA, local_sharpness

    seed = ctx.settings.seed
    ascent = {"steps": opts.steps, "tol": opts.tol, "starts": opts.starts, "seed": seed}
    # eta is the ASAM ball's: the global profile records the default, which it does not use
    profile = functions.sharpness(ctx.problem, opts.rhos, adaptive=False, eta=DEFAULT_ETA, **ascent)
    scalars, arrays = split_result(profile, "global.")
    out = {"global": scalars}
    if opts.adaptive:
        adaptive = functions.sharpness(ctx.problem, opts.rhos, adaptive=True, eta=opts.eta, **ascent)
        out["adaptive"], more = split_result(adaptive, "adaptive.")
        arrays.update(more)
    summary = {f"S_rho({rho:g})": float(s) for rho, s in zip(profile.rhos, profile.sharpness)}
    if ctx.num_clients == 0:  # a plain state_dict: the global profiles only
        return PassOutput(out, arrays, summary)
    local = local_sharpness(_client_objectives(ctx, opts.clients, "local sharpness"), ctx.objective, ctx.w,
                            opts.local_rho, **ascent)
    out["local"], more = split_result(local, "local.")
    arrays.update(more)
    summary["local_gap"] = float(local.gap)
    return PassOutput(out, arrays, summary)


@PASSES.register("flatness", summary="flatness distance Delta_D around the mean of the round's kept clients",
                 needs=(KEPT_CLIENTS,),
                 quantities=(Quantity("Delta_D", "&Delta;<sub>D</sub> (pass)", "distance"),))
def flatness_pass(ctx: CheckpointContext, opts: None) -> PassOutput:
    # Delta_D^t = mean_i ||y_{i,K}^t - ybar^t||^2 around the clients' mean (the FedNSAM paper's); the distance to
    # the training global model x^{t+1} (not the SWA average) under its own name.
    result = functions.flatness_distance(ctx.global_w, ctx.kept_clients())
    scalars, arrays = split_result(result)
    return PassOutput(scalars, arrays, {"Delta_D": float(result.distance),
                                        "Delta_D_to_global": float(result.distance_to_global)})


@dataclass(frozen=True)
class IncompatibilityOptions:
    rho: float = field(default=0.05, metadata=POSITIVE)  # perturbation radius
    batches: int = field(default=8, metadata=POSITIVE)  # Monte-Carlo minibatches per client (--batches)
    batch_size: int = field(default=0, metadata=NON_NEGATIVE)  # 0: the run's training batch size
    clients: int = field(default=0, metadata=NON_NEGATIVE)  # all clients (0) or a seeded sample
    loss_level: bool = True  # also the loss-level gap (N * (M + 1) extra passes over F)


@PASSES.register("incompatibility", options=IncompatibilityOptions,
                 summary="flatness incompatibility Delta_FI, its heterogeneity / minibatch split, "
                         "friendly rate",
                 needs=(CLIENTS,), cost=lambda o: Cost(gradients=4.0),
                 quantities=(
                     Quantity("Delta_FI", "&Delta;<sub>FI</sub>", "incompatibility", "incompatibility_se"),
                     Quantity("heterogeneity share", "hetero&shy;geneity share", "heterogeneity_share"),
                     Quantity("friendly rate", "friendly rate", "friendly_rate", "friendly_rate_se")))
def incompatibility_pass(ctx: CheckpointContext, opts: IncompatibilityOptions) -> PassOutput:
    from landscape.analyze.flatness import flatness_incompatibility

    result = flatness_incompatibility(
        ctx.objective, _client_objectives(ctx, opts.clients, "the incompatibility pass"), ctx.w, opts.rho,
        batch_size=_training_batch_size(ctx, opts.batch_size), batches=opts.batches, seed=ctx.settings.seed,
        loss_level=opts.loss_level,
    )
    scalars, arrays = split_result(result)
    summary = {"Delta_FI": float(result.incompatibility), "heterogeneity_share": float(result.heterogeneity_share)}
    return PassOutput(scalars, arrays, summary)


@dataclass(frozen=True)
class AlignmentOptions:
    clients: int = field(default=0, metadata=NON_NEGATIVE)  # all clients (0) or a seeded sample
    batches: int = field(default=8, metadata=POSITIVE)  # minibatches per client for the within-client cosine
    batch_size: int = field(default=0, metadata=NON_NEGATIVE)  # 0: the run's training batch size


@PASSES.register("alignment", options=AlignmentOptions,
                 summary="cosines of client gradients (client x client, x global), minibatch and update "
                         "cosines",
                 needs=(CLIENTS,), cost=lambda o: Cost(gradients=3.0),
                 quantities=(Quantity("mean grad cos", "mean gradient cos", "gradients.mean_off_diagonal"),
                             Quantity("minibatch cos", "minibatch cos", "minibatch.mean_cosine",
                                      "minibatch.mean_cosine_se")))
def alignment_pass(ctx: CheckpointContext, opts: AlignmentOptions) -> PassOutput:
    from landscape.analyze.alignment import gradient_alignment, minibatch_alignment, update_alignment

    objectives = _client_objectives(ctx, opts.clients, "the alignment pass")
    gradients = gradient_alignment(ctx.objective, objectives, ctx.w)
    minibatch = minibatch_alignment(objectives, ctx.w, batch_size=_training_batch_size(ctx, opts.batch_size),
                                    batches=opts.batches, seed=ctx.settings.seed)
    out: dict[str, Any] = {}
    out["gradients"], arrays = split_result(gradients, "gradients.")
    out["minibatch"], more = split_result(minibatch, "minibatch.")
    arrays.update(more)
    # Update cosines need this round's kept client models and the model they started from: the algorithm's
    # broadcast of checkpoint round t - 1 (x^{t-1}, or a look-ahead x^{t-1} + lam m); the server's step is
    # measured from x^{t-1} to the training model x^t.
    kept = ctx.source.clients_checkpoint(ctx.round).is_file()
    start = ctx.broadcast_start() if kept else None
    if start is not None:
        result = update_alignment(start, ctx.kept_clients(), ctx.global_w, ctx.previous_global())
        out["updates"], more = split_result(result, "updates.")
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
    trace_hvps: int = 60  # budget of the trace estimator; Hutchinson (the baseline) runs on as many probes
    trace_method: str = DEFAULT_TRACE_METHOD  # xtrace, hutch++ or hutchinson (benchmarks/trace_estimators.py)
    density_runs: int = 4  # SLQ: n_v runs x m steps; its trace_stderr has n_v - 1 degrees of freedom
    density_steps: int = 40
    clients: int = 0  # per-client lambda_max(grad^2 F_i) for all clients (0), a seeded sample, or none (-1)

    def __post_init__(self) -> None:
        # a value of another kind than a number is named by ``make_checked_options`` (``check_kind``)
        numbers = all(isinstance(v, (int, float)) for v in (self.top_k, self.tol, self.trace_hvps,
                                                            self.density_runs, self.density_steps))
        if numbers and (self.top_k < 1 or self.tol <= 0 or self.trace_hvps < 6 or self.density_runs < 1
                        or self.density_steps < 2):
            raise LandscapeError("hessian options: top_k >= 1, tol > 0, trace_hvps >= 6 (Hutch++), density_runs >= 1, "
                                 "density_steps >= 2")
        if self.trace_method not in TRACE_METHODS:
            raise LandscapeError(f"hessian.trace_method must be one of {', '.join(TRACE_METHODS)} "
                                 f"(got {self.trace_method!r})")


# Per-client lambda_max: a Lanczos run per client on its share of the data, about this many full-data
# products in all.
CLIENT_LAMBDA_MAX_HVPS = 50


def _hessian_cost(o: HessianOptions) -> Cost:
    """The probe; Lanczos (a Krylov space of top_k + 10, often up to twice that, and the verification); the
    trace and its Hutchinson baseline; SLQ; per-client lambda_max."""
    lanczos = functions.PROBE_HVPS + 2 * o.top_k + 20
    clients = CLIENT_LAMBDA_MAX_HVPS if o.clients >= 0 else 0
    return Cost(hvps=lanczos + 2 * o.trace_hvps + o.density_runs * o.density_steps + clients)


def _first_eigenvalue(result: StoredResult) -> tuple[Any, Any]:
    values = np.atleast_1d(result.array("top.values"))
    return (float(values[0]) if values.size else None), None


def _trace(result: StoredResult) -> tuple[Any, Any]:
    """The trace estimate and its standard error (``trace``; results written before it: Hutch++)."""
    key = "trace" if result.value("trace.estimate", None) is not None else "trace_hutchpp"
    return result.value(f"{key}.estimate", None), result.value(f"{key}.stderr", None)


HESSIAN_QUANTITIES = (
    Quantity("lambda_max", "&lambda;<sub>max</sub>", "top.values", read_result=_first_eigenvalue),
    Quantity("lambda_1/lambda_k", "&lambda;<sub>1</sub>/&lambda;<sub>k</sub>", "lambda_ratio"),
    Quantity("trace", "trace", "trace.estimate", "trace.stderr", read_result=_trace),
    Quantity("client lambda_max", "mean client &lambda;<sub>max</sub>", "clients.mean_lambda_max"),
)


@PASSES.register("hessian", options=HessianOptions,
                 summary="Lanczos top-k eigenvalues, trace (XTrace; Hutchinson baseline), SLQ density, "
                         "client lambda_max",
                 cost=_hessian_cost, quantities=HESSIAN_QUANTITIES)
def hessian_pass(ctx: CheckpointContext, opts: HessianOptions) -> PassOutput:
    from landscape.analyze.lanczos import client_lambda_max

    seed, backend = ctx.settings.seed, ctx.settings.hvp
    problem = ctx.problem
    shared = {"seed": seed, "hvp": backend, "progress": ctx.progress}  # progress: every product, on the bar
    top = functions.hessian_eigs(problem, opts.top_k, tol=float(opts.tol), **shared)  # after the probe
    trace = functions.trace(problem, hvps=opts.trace_hvps, method=opts.trace_method, **shared)
    hutchinson = functions.trace(problem, hvps=opts.trace_hvps, method="hutchinson", **shared)
    density = functions.density(problem, runs=opts.density_runs, steps=opts.density_steps, **shared)
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
    }
    arrays = {"density_grid": density.grid, "density": density.density, "slq_nodes": density.nodes,
              "slq_weights": density.weights}
    summary = {"lambda_max": float(top.values[0]), "lambda_ratio": float(top.top_ratio),
               "trace": float(trace.estimate)}
    if opts.clients >= 0 and ctx.num_clients:
        objectives = _client_objectives(ctx, opts.clients, "per-client lambda_max")
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
