"""The ``sharpness`` analysis pass: rho-ball sharpness S_rho of F (and its adaptive profile), each client's S_rho of F_i
and the gap (docs/metrics.md "Sharpness"); the ascent is imported when the pass runs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

import numpy as np

from landscape.analyze.passes._common import ALL, client_objectives, keys, measured
from landscape.analyze.registry import PASSES, Cost, PassOutput, Quantity, StoredResult
from landscape.core.machine import require_memory
from landscape.core.progress import Budget
from landscape.core.schema import rule
from landscape.store.results.records import Indexed
from landscape.store.results.serial import split_result

if TYPE_CHECKING:
    from landscape.analyze.context import CheckpointContext


@dataclass(frozen=True)
class SharpnessOptions:
    # radii of global S_rho
    rhos: Annotated[tuple[Annotated[float, rule(gt=0)], ...], rule(min_length=1)] = (0.01, 0.05, 0.1)
    # the most trial points of each Armijo projected ascent (steps = starts = 1: SAM)
    steps: Annotated[int, rule(gt=0)] = 50
    # stop when the estimated remaining gain is below tol * S_rho (0: run all steps)
    tol: Annotated[float, rule("0: run all steps", ge=0)] = 1e-3
    # ascents from the centre and starts - 1 seeded random points on the sphere; the best (below 2, or where
    # the starts disagree, S_rho is printed as a lower bound, >=)
    starts: Annotated[int, rule(gt=0)] = 8
    adaptive: bool = True  # also the ASAM-ball profile (|x| + eta, weights only, as FedASAM trains)
    eta: Annotated[float, rule(gt=0)] = 0.01
    local_rho: Annotated[float, rule(gt=0)] = 0.05  # radius of the per-client S_rho on F_i
    clients: Annotated[int, rule(ALL, ge=0)] = 0  # all clients (0) or a seeded sample


def _sharpness_cost(o: SharpnessOptions) -> Cost:
    """Every radius's ascent (twice with the adaptive profile) and the per-client ascents (N x 1/N of the
    data), each from ``starts`` starts."""
    return Cost(gradients=1 + (len(o.rhos) * o.steps * (2 if o.adaptive else 1) + o.steps) * o.starts)


def _check_sizes(o: SharpnessOptions, dim: int, itemsize: int, free: int | None) -> None:
    """The starts' directions, held at once (``measure.ascent.unit_directions``: one unit vector of the
    dimension per start), within free memory: refused in one line before any ascent."""
    require_memory(o.starts * dim * itemsize, f"sharpness.starts = {o.starts:,} ({o.starts:,} directions of the "
                   f"dimension {dim:,}, {itemsize} bytes each entry)", "choose fewer sharpness.starts", free)


def _sharpness_at(rho: float) -> Quantity:
    def read(result: StoredResult) -> tuple[Any, Any]:
        rhos = np.atleast_1d(result.array("global.rhos"))
        hit = np.flatnonzero(np.isclose(rhos, rho, rtol=1e-9, atol=0))
        return (float(np.atleast_1d(result.array("global.sharpness"))[hit[0]]) if hit.size else None), None

    return Quantity(f"S_rho({rho:g})", f"S<sub>&rho;</sub> (&rho;={rho:g})", "global.sharpness",
                    read_result=read)


def _trials(o: SharpnessOptions, clients: int | None) -> int:
    """The trial points of the pass's ascents, each at most ``steps`` from each of ``starts`` starts: every
    radius (twice with the adaptive profile) and, on a run (``clients``: the clients compared; None on a plain
    state_dict), the global ascent at ``local_rho`` and each client's."""
    ascents = len(o.rhos) * (2 if o.adaptive else 1) + (0 if clients is None else 1 + clients)
    return ascents * o.starts * o.steps


PASSES.declare("sharpness", options=SharpnessOptions,
               summary="rho-ball sharpness S_rho (and adaptive) of F; per-client S_rho of F_i and the gap",
               cost=_sharpness_cost,
               size_check=_check_sizes,
               quantities=(_sharpness_at,
                           Quantity("local-global S_rho", "local &minus; global S<sub>&rho;</sub>", "local.gap")),
               # S_rho per radius is the summary's (the arrays global.sharpness at global.rhos)
               measures=measured("local.mean_local_sharpness local.mean_local_sharpness_se",
                                 {"local.gap": "local_gap"}),
               # the adaptive (ASAM-ball) S_rho at each radius, beside S_rho's (the summary's): claims' name for it
               indexed=(Indexed("adaptive.sharpness", "adaptive.rhos", "adaptive S_rho({:g})"),),
               # what each ascent was asked and did; F(w) and ||grad F|| (the loss pass's loss and grad_norm); the
               # local comparison's global S_rho at local_rho (S_rho(local_rho) where the radii include it)
               bookkeeping=keys(" ".join(f"{part}.{key}" for part in ("global", "adaptive", "local")
                                         for key in ("steps", "tol", "starts", "eta", "seed", "gradient_evaluations"))
                                + " global.scaled_parameters global.loss global.gradient_norm global.loss_evaluations"
                                  " adaptive.scaled_parameters adaptive.loss adaptive.gradient_norm"
                                  " adaptive.loss_evaluations local.rho local.global_loss local.global_sharpness"
                                  " local.global_perturbation_norm"))


@PASSES.implement("sharpness")
def sharpness_pass(ctx: CheckpointContext, opts: SharpnessOptions) -> PassOutput:
    from landscape.analyze.summary import LOWER_BOUNDS
    from landscape.measure import functions
    from landscape.measure.sharpness import DEFAULT_ETA, local_sharpness

    seed = ctx.settings.seed
    # grad F, the grad F_i and each radius's ascent are kept in the checkpoint's cache: the local comparison's
    # global S_rho at local_rho is the plain profile's ascent at that radius when it has one
    ascent = {"steps": opts.steps, "tol": opts.tol, "starts": opts.starts, "seed": seed, "gradients": ctx.gradients}
    if ctx.progress is not None:  # the bar counts trial points: steps x starts per radius and profile, per client
        ascent["advance"] = Budget(ctx.progress, _trials(opts, len(ctx.sample_clients(opts.clients))
                                                         if ctx.num_clients else None)).advance
    # eta is the ASAM ball's: the global profile records the default, which it does not use
    profile = functions.sharpness(ctx.problem, opts.rhos, adaptive=False, eta=DEFAULT_ETA, **ascent)
    scalars, arrays = split_result(profile, "global.")
    out = {"global": scalars}
    if opts.adaptive:
        adaptive = functions.sharpness(ctx.problem, opts.rhos, adaptive=True, eta=opts.eta, **ascent)
        out["adaptive"], more = split_result(adaptive, "adaptive.")
        arrays.update(more)
    summary: dict[str, Any] = {f"S_rho({rho:g})": float(s) for rho, s in zip(profile.rhos, profile.sharpness)}
    # S_rho that the search does not confirm as the maximum (the best start's ascent short of its tolerance,
    # or no second start reaching its value) is printed as a lower bound, ">=S"
    bounds = [key for key, agreed, converged in zip(summary, profile.maximum_agreed, profile.ascent_converged)
              if not (agreed and converged)]
    if bounds:
        summary[LOWER_BOUNDS] = bounds
    if ctx.num_clients == 0:  # a plain state_dict: the global profiles only
        return PassOutput(out, arrays, summary)
    local = local_sharpness(client_objectives(ctx, opts.clients, "local sharpness"), ctx.objective, ctx.w,
                            opts.local_rho, **ascent)
    out["local"], more = split_result(local, "local.")
    arrays.update(more)
    summary["local_gap"] = float(local.gap)
    return PassOutput(out, arrays, summary)
