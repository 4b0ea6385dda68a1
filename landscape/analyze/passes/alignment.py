"""The ``alignment`` analysis pass: cosines of client gradients (client x client, x global), within-client minibatch
cosines and the cosines of the clients' updates (docs/metrics.md "Alignment")."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

from landscape.analyze.passes._common import (
    ALL,
    TRAINING_BATCH,
    client_objectives,
    keys,
    measured,
    training_batch_size,
)
from landscape.analyze.registry import CLIENTS, PASSES, Cost, PassOutput, Quantity
from landscape.core.schema import rule
from landscape.store.results.serial import split_result

if TYPE_CHECKING:
    from landscape.analyze.context import CheckpointContext


@dataclass(frozen=True)
class AlignmentOptions:
    clients: Annotated[int, rule(ALL, ge=0)] = 0  # all clients (0) or a seeded sample
    batches: Annotated[int, rule(gt=0)] = 8  # minibatches per client for the within-client cosine
    batch_size: Annotated[int, rule(TRAINING_BATCH, ge=0)] = 0  # 0: the run's training batch size


PASSES.declare("alignment", options=AlignmentOptions,
               summary="cosines of client gradients (client x client, x global), minibatch and update cosines",
               needs=(CLIENTS,), cost=lambda o: Cost(gradients=3.0),
               quantities=(Quantity("mean grad cos", "mean gradient cos", "gradients.mean_off_diagonal"),
                           Quantity("minibatch cos", "minibatch cos", "minibatch.mean_cosine",
                                    "minibatch.mean_cosine_se")),
               measures=measured("gradients.mean_global_cosine updates.mean_off_diagonal updates.mean_cosine_to_mean "
                                 "updates.mean_update_norm updates.start_offset_norm updates.server_mean_cosine "
                                 "updates.server_update_norm",
                                 {"gradients.mean_off_diagonal": "mean_grad_cos",
                                  "minibatch.mean_cosine": "mean_minibatch_cos",
                                  "minibatch.mean_cosine_se": "mean_minibatch_cos_se"}),
               # ||grad F|| is the loss pass's grad_norm
               bookkeeping=keys("gradients.global_gradient_norm minibatch.batch_size minibatch.batches "
                                "minibatch.seed"))


@PASSES.implement("alignment")
def alignment_pass(ctx: CheckpointContext, opts: AlignmentOptions) -> PassOutput:
    from landscape.measure.alignment import gradient_alignment, minibatch_alignment, update_alignment

    objectives = client_objectives(ctx, opts.clients, "the alignment pass")
    # grad F, the grad F_i and the minibatch gradients are the checkpoint's, shared with incompatibility
    gradients = gradient_alignment(ctx.objective, objectives, ctx.w, gradients=ctx.gradients)
    minibatch = minibatch_alignment(objectives, ctx.w, batch_size=training_batch_size(ctx, opts.batch_size),
                                    batches=opts.batches, seed=ctx.settings.seed, gradients=ctx.gradients)
    out: dict[str, Any] = {}
    out["gradients"], arrays = split_result(gradients, "gradients.")
    out["minibatch"], more = split_result(minibatch, "minibatch.")
    arrays.update(more)
    # Update cosines need this round's kept client models and the model they started from, recorded beside them
    # (run format 2; a run written before: the algorithm's broadcast of checkpoint round t - 1). The server's
    # step is measured from x^{t-1} to the training model x^t: without checkpoint round t - 1 it is not known,
    # and neither it nor the start's offset from x^{t-1} is reported (NaN), never taken from the start.
    kept = ctx.kept_clients() if ctx.source.clients_checkpoint(ctx.round).is_file() else None
    start = ctx.broadcast_start() if kept is not None else None  # read with them (no second load of the file)
    if start is not None:
        previous = ctx.previous_global()
        result = update_alignment(start, kept, ctx.global_w if previous is not None else None, previous)
        if previous is None:
            result = dataclasses.replace(result, start_offset_norm=float("nan"))
        out["updates"], more = split_result(result, "updates.")
        arrays.update(more)
        if previous is None:
            out["updates"]["server_step"] = f"not known: round {ctx.round - 1} has no checkpoint"
    else:
        out["updates"] = {"available": False, "reason": "needs --keep-clients and a checkpoint of round "
                          f"{ctx.round - 1} (train with --checkpoint-every 1 around this round)"}
    summary = {"mean_grad_cos": float(gradients.mean_off_diagonal),
               "mean_minibatch_cos": float(minibatch.mean_cosine)}
    return PassOutput(out, arrays, summary)
