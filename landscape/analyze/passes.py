"""The analysis passes (the surface pass is in ``surface.py``): one function each, attached to the pass
declared by name in ``pass_specs.py`` with its metadata (the dataclass of its options, what it needs of a run,
its cost model and the summary quantities the comparison tables read of its results).

A pass reads one checkpoint (``CheckpointContext``) and its options, and returns a ``PassOutput``: scalars
(for ``analysis/round-NNNN/<pass>.json``), arrays (``<pass>.npz``) and the few numbers of the summary table.
``scheduler.run_analysis`` runs them; ``results.py`` writes what they return.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from landscape.analyze import functions
from landscape.analyze.pass_specs import (
    AlignmentOptions,
    HessianOptions,
    IncompatibilityOptions,
    LossOptions,
    SharpnessOptions,
)
from landscape.analyze.registry import PASSES, PassOutput
from landscape.analyze.serial import split_result
from landscape.core.errors import LandscapeError

if TYPE_CHECKING:
    from landscape.analyze.context import CheckpointContext


@PASSES.implement("loss")
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


@PASSES.implement("sharpness")
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


@PASSES.implement("flatness")
def flatness_pass(ctx: CheckpointContext, opts: None) -> PassOutput:
    # Delta_D^t = mean_i ||y_{i,K}^t - ybar^t||^2 around the clients' mean (the FedNSAM paper's); the distance to
    # the training global model x^{t+1} (not the SWA average) under its own name.
    result = functions.flatness_distance(ctx.global_w, ctx.kept_clients())
    scalars, arrays = split_result(result)
    return PassOutput(scalars, arrays, {"Delta_D": float(result.distance),
                                        "Delta_D_to_global": float(result.distance_to_global)})


@PASSES.implement("incompatibility")
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


@PASSES.implement("alignment")
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


@PASSES.implement("hessian")
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
