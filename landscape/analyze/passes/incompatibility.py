"""The ``incompatibility`` analysis pass: flatness incompatibility Delta_FI, its heterogeneity / minibatch split and the
friendly rate (docs/metrics.md "Flatness incompatibility")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated

from landscape.analyze.passes._common import ALL, TRAINING_BATCH, client_objectives, training_batch_size
from landscape.analyze.registry import CLIENTS, PASSES, Cost, PassOutput, Quantity
from landscape.analyze.serial import split_result
from landscape.config.schema import rule

if TYPE_CHECKING:
    from landscape.analyze.context import CheckpointContext


@dataclass(frozen=True)
class IncompatibilityOptions:
    rho: Annotated[float, rule(gt=0)] = 0.05  # perturbation radius
    batches: Annotated[int, rule(gt=0)] = 8  # Monte-Carlo minibatches per client (--batches)
    batch_size: Annotated[int, rule(TRAINING_BATCH, ge=0)] = 0  # 0: the run's training batch size
    clients: Annotated[int, rule(ALL, ge=0)] = 0  # all clients (0) or a seeded sample
    loss_level: bool = True  # also the loss-level gap (N * (M + 1) extra passes over F)


PASSES.declare("incompatibility", options=IncompatibilityOptions,
               summary="flatness incompatibility Delta_FI, its heterogeneity / minibatch split, friendly rate",
               needs=(CLIENTS,), cost=lambda o: Cost(gradients=4.0),
               quantities=(Quantity("Delta_FI", "&Delta;<sub>FI</sub>", "incompatibility", "incompatibility_se"),
                           Quantity("heterogeneity share", "hetero&shy;geneity share", "heterogeneity_share"),
                           Quantity("friendly rate", "friendly rate", "friendly_rate", "friendly_rate_se")))


@PASSES.implement("incompatibility")
def incompatibility_pass(ctx: CheckpointContext, opts: IncompatibilityOptions) -> PassOutput:
    from landscape.analyze.flatness import flatness_incompatibility

    result = flatness_incompatibility(
        ctx.objective, client_objectives(ctx, opts.clients, "the incompatibility pass"), ctx.w, opts.rho,
        batch_size=training_batch_size(ctx, opts.batch_size), batches=opts.batches, seed=ctx.settings.seed,
        loss_level=opts.loss_level, gradients=ctx.gradients,  # shared with alignment and sharpness
    )
    scalars, arrays = split_result(result)
    summary = {"Delta_FI": float(result.incompatibility), "heterogeneity_share": float(result.heterogeneity_share)}
    return PassOutput(scalars, arrays, summary)
