"""The ``incompatibility`` analysis pass: flatness incompatibility Delta_FI, its heterogeneity / minibatch split and the
friendly rate (docs/metrics.md "Flatness incompatibility"), with plain SAM's perturbations and with the one the run's
algorithm applies (the applied_* figures)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Literal

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
class IncompatibilityOptions:
    rho: Annotated[float, rule(gt=0)] = 0.05  # perturbation radius
    batches: Annotated[int, rule(gt=0)] = 8  # Monte-Carlo minibatches per client (--set incompatibility.batches=N)
    batch_size: Annotated[int, rule(TRAINING_BATCH, ge=0)] = 0  # 0: the run's training batch size
    clients: Annotated[int, rule(ALL, ge=0)] = 0  # all clients (0) or a seeded sample
    loss_level: bool = True  # also the loss-level gap (K + N + 1 extra passes over F)
    # K: the (client, draw) pairs whose F(x + e_i^B) the loss level evaluates, a seeded sample where N * M > K
    # (0: every pair, N * M)
    loss_level_pairs: Annotated[int, rule("0: every pair", ge=0)] = 64
    # F: the clients' plain average (the paper's) or size-weighted (over the analysis data)
    global_objective: Literal["client-mean", "size-weighted"] = "client-mean"


# Work besides the gradients, in full-data gradient equivalents: an evaluation of F is one forward pass over the
# data, about 0.4 of a gradient (the surface's cell).
FORWARD_COST = 0.4


def _incompatibility_cost(o: IncompatibilityOptions) -> Cost:
    """The gradients (grad F, every grad F_i, the minibatch gradients and the friendly rate's minibatch losses:
    4 full-data gradients), and with the loss level its K + 1 evaluations of F (F(x + e*) and the K pairs; the N
    full-local ones and K = 0, every pair, depend on the run's clients and are not counted)."""
    return Cost(gradients=4.0 + (FORWARD_COST * (o.loss_level_pairs + 1) if o.loss_level else 0.0))


PASSES.declare("incompatibility", options=IncompatibilityOptions,
               summary="flatness incompatibility Delta_FI (plain SAM's and the algorithm's own perturbation), its "
                       "heterogeneity / minibatch split, friendly rate",
               needs=(CLIENTS,), cost=_incompatibility_cost,
               quantities=(Quantity("Delta_FI", "&Delta;<sub>FI</sub>", "incompatibility", "incompatibility_se"),
                           Quantity("Delta_FI applied", "&Delta;<sub>FI</sub> applied", "applied_incompatibility",
                                    "applied_incompatibility_se"),
                           Quantity("heterogeneity share", "hetero&shy;geneity share", "heterogeneity_share"),
                           Quantity("perturbation heterogeneity share", "perturbation hetero&shy;geneity share",
                                    "perturbation_heterogeneity_share"),
                           Quantity("applied perturbation heterogeneity share",
                                    "applied perturbation hetero&shy;geneity share",
                                    "applied_perturbation_heterogeneity_share"),
                           Quantity("friendly rate", "friendly rate", "friendly_rate", "friendly_rate_se")),
               measures=measured(
                   "heterogeneity batch_part batch_part_se cross cross_se perturbation_heterogeneity_share "
                   "applied_heterogeneity applied_batch_part applied_batch_part_se applied_cross applied_cross_se "
                   "applied_perturbation_heterogeneity_share global_gradient_norm gradient_total gradient_total_se "
                   "gradient_heterogeneity gradient_noise gradient_noise_se gradient_cross gradient_cross_se "
                   "heterogeneity_share noise_share perturbed_global_loss local_perturbed_loss "
                   "local_perturbed_loss_se loss_gap full_local_perturbed_loss full_local_loss_gap friendly_rate "
                   "friendly_rate_se",
                   {"incompatibility": "Delta_FI", "incompatibility_se": "Delta_FI_se",
                    "applied_incompatibility": "Delta_FI_applied",
                    "applied_incompatibility_se": "Delta_FI_applied_se"}),
               # F of its global objective is the loss pass's client_loss_mean (client-mean; size-weighted: its
               # loss); loss_gap's standard error is local_perturbed_loss_se (F(w + e*) is exact)
               bookkeeping=keys("rho batch_size batches seed friendly_pairs global_loss loss_gap_se loss_level_pairs"),
               recorded_before={"loss_level_pairs": 0})  # results before the option evaluated every pair


@PASSES.implement("incompatibility")
def incompatibility_pass(ctx: CheckpointContext, opts: IncompatibilityOptions) -> PassOutput:
    from landscape.measure.flatness import flatness_incompatibility
    from landscape.measure.incompatibility import ClientMean

    clients = client_objectives(ctx, opts.clients, "the incompatibility pass")
    # F = (1/N) sum_i F_i over every client of the run (the paper's), or the analysis data's (size-weighted)
    glob = ClientMean({i: ctx.client_objective(i) for i in range(ctx.num_clients)}, ctx.gradients) \
        if opts.global_objective == "client-mean" else ctx.objective
    result = flatness_incompatibility(
        glob, clients, ctx.w, opts.rho, batch_size=training_batch_size(ctx, opts.batch_size), batches=opts.batches,
        seed=ctx.settings.seed, loss_level=opts.loss_level, loss_level_pairs=opts.loss_level_pairs,
        gradients=ctx.gradients,  # shared with alignment, sharpness
        applied=ctx.applied_perturbation(),
    )
    scalars, arrays = split_result(result)
    summary = {"Delta_FI": float(result.incompatibility), "heterogeneity_share": float(result.heterogeneity_share),
               "perturbation_heterogeneity_share": float(result.perturbation_heterogeneity_share)}
    if not result.applied_note:  # the algorithm applies a perturbation (applied_note says why not, else)
        summary["Delta_FI_applied"] = float(result.applied_incompatibility)
    return PassOutput(scalars, arrays, summary)
