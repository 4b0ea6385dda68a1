"""The ``flatness`` analysis pass: the flatness distance Delta_D of the round's kept clients around their mean, and the
distance to the new global model under its own name (docs/metrics.md "Flatness distance")."""

from __future__ import annotations

from typing import TYPE_CHECKING

from landscape.analyze.registry import KEPT_CLIENTS, PASSES, PassOutput, Quantity
from landscape.analyze.serial import split_result

if TYPE_CHECKING:
    from landscape.analyze.context import CheckpointContext


PASSES.declare("flatness", summary="flatness distance Delta_D around the mean of the round's kept clients",
               needs=(KEPT_CLIENTS,), quantities=(Quantity("Delta_D", "&Delta;<sub>D</sub> (pass)", "distance"),))


@PASSES.implement("flatness")
def flatness_pass(ctx: CheckpointContext, opts: None) -> PassOutput:
    from landscape.analyze import functions

    # Delta_D^t = mean_i ||y_{i,K}^t - ybar^t||^2 around the clients' mean (the FedNSAM paper's); the distance to
    # the training global model x^{t+1} (not the SWA average) under its own name.
    result = functions.flatness_distance(ctx.global_w, ctx.kept_clients())
    scalars, arrays = split_result(result)
    return PassOutput(scalars, arrays, {"Delta_D": float(result.distance),
                                        "Delta_D_to_global": float(result.distance_to_global)})
