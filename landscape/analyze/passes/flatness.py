"""The ``flatness`` analysis pass: the flatness distance Delta_D of the round's kept clients around their mean, and the
distance to the new global model under its own name (docs/metrics.md "Flatness distance")."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from landscape.analyze.passes._common import measured
from landscape.analyze.registry import KEPT_CLIENTS, PASSES, PassOutput, Quantity
from landscape.core.errors import LandscapeError
from landscape.store.results.serial import split_result

if TYPE_CHECKING:
    from landscape.analyze.context import CheckpointContext


PASSES.declare("flatness", summary="flatness distance Delta_D around the mean of the round's kept clients",
               needs=(KEPT_CLIENTS,), quantities=(Quantity("Delta_D", "&Delta;<sub>D</sub> (pass)", "distance"),
                                                  Quantity("Delta_D relative", "&Delta;<sub>D</sub> / U (pass)",
                                                           "distance_relative")),
               # Delta_D, its normalised form and its companions under the paper's name (docs/metrics.md 5)
               measures=measured("mean_norm_sq global_norm_sq global_offset_sq update_sq",
                                 {"distance": "Delta_D", "distance_normalized": "Delta_D_normalized",
                                  "distance_to_global": "Delta_D_to_global",
                                  "distance_to_global_normalized": "Delta_D_to_global_normalized",
                                  "distance_relative": "Delta_D_relative"}))


@PASSES.implement("flatness")
def flatness_pass(ctx: CheckpointContext, opts: None) -> PassOutput:
    from landscape.measure import functions

    # Delta_D^t = mean_i ||y_{i,K}^t - ybar^t||^2 around the clients' mean (the FedNSAM paper's), and over the
    # clients' mean squared update from the point s^t they started from (its scale-free companion); the distance
    # to the training global model x^{t+1} (not the SWA average) under its own name.
    clients = ctx.kept_clients()
    try:
        start = ctx.broadcast_start()
    except LandscapeError:  # a plain state_dict, a version-1 run without the server state: no companion
        start = None
    result = functions.flatness_distance(ctx.global_w, clients, start)
    scalars, arrays = split_result(result)
    summary = {"Delta_D": float(result.distance), "Delta_D_to_global": float(result.distance_to_global)}
    if math.isfinite(result.distance_relative):
        summary["Delta_D_relative"] = result.distance_relative
    return PassOutput(scalars, arrays, summary)
