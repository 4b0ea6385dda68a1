"""The ``loss`` analysis pass: F(x), the accuracy and ||grad F(x)|| on the analysis data, and each client's F_i."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

import numpy as np

from landscape.analyze.passes._common import ALL, keys, measured
from landscape.analyze.registry import PASSES, Cost, PassOutput, Quantity, StoredResult
from landscape.core.schema import rule

if TYPE_CHECKING:
    from landscape.analyze.context import CheckpointContext


@dataclass(frozen=True)
class LossOptions:
    clients: Annotated[int, rule(ALL, ge=0)] = 0  # per-client F_i for all (0) or a seeded sample


def _accuracy_percent(result: StoredResult) -> tuple[Any, Any]:
    return 100 * float(result.value("accuracy")), None


PASSES.declare("loss", options=LossOptions, summary="F(x), accuracy and ||grad F(x)|| on the analysis data; F_i",
               cost=lambda o: Cost(gradients=2.0),
               quantities=(Quantity("F(x)", "F(x) (analysis data)", "loss"),
                           Quantity("accuracy (analysis data, %)", "accuracy (analysis data, %)", "accuracy",
                                    read_result=_accuracy_percent)),
               measures=measured("loss accuracy grad_norm client_loss_mean", {"acc": "accuracy"}),
               bookkeeping=keys("samples"))


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
