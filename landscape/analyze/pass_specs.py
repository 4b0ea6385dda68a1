"""Every analysis pass declared (its ``PassSpec`` in ``registry.PASSES``): the options, cost models and
summary quantities of the passes whose functions are in ``passes.py``, and, by importing
``surface_options``, the surface pass's. Importing this module completes the registry's metadata without
loading any pass function or computation (torch-heavy analysis code), so figures, reports and claims read
the passes' options, needs and quantities from here; ``catalog.load_passes`` attaches the functions.

An options dataclass is a schema of the one loader (``landscape.config.schema``): each option's kind, range
(``rule``) and choices (``Literal``) are its annotation, checked when the options are made
(``PassSpec.make_options``: analysis recipes, ``--set PASS.KEY=VALUE``, figure recipes, recorded results).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

import numpy as np

from landscape.analyze import surface_options  # noqa: F401 - imported to declare the surface pass
from landscape.analyze.registry import CLIENTS, KEPT_CLIENTS, PASSES, Cost, Quantity, StoredResult
from landscape.config.schema import rule

ALL = "0: all clients"  # the hint of a client count: all clients (0) or a seeded sample of that many


@dataclass(frozen=True)
class LossOptions:
    clients: Annotated[int, rule(ALL, ge=0)] = 0  # per-client F_i for all (0) or a seeded sample


def _accuracy_percent(result: StoredResult) -> tuple[Any, Any]:
    return 100 * float(result.value("accuracy")), None


PASSES.declare("loss", options=LossOptions, summary="F(x), accuracy and ||grad F(x)|| on the analysis data; F_i",
               cost=lambda o: Cost(gradients=2.0),
               quantities=(Quantity("F(x)", "F(x) (analysis data)", "loss"),
                           Quantity("accuracy (analysis data, %)", "accuracy (analysis data, %)", "accuracy",
                                    read_result=_accuracy_percent)))


@dataclass(frozen=True)
class SharpnessOptions:
    # radii of global S_rho
    rhos: Annotated[tuple[Annotated[float, rule(gt=0)], ...], rule(min_length=1)] = (0.01, 0.05, 0.1)
    # the most trial points of each Armijo projected ascent (steps = starts = 1: SAM)
    steps: Annotated[int, rule(gt=0)] = 50
    # stop when the estimated remaining gain is below tol * S_rho (0: run all steps)
    tol: Annotated[float, rule("0: run all steps", ge=0)] = 1e-3
    # ascents from the centre and starts - 1 seeded random points on the sphere; the best
    starts: Annotated[int, rule(gt=0)] = 8
    adaptive: bool = True  # also the ASAM-ball profile (|x| + eta, weights only, as FedASAM trains)
    eta: Annotated[float, rule(gt=0)] = 0.01
    local_rho: Annotated[float, rule(gt=0)] = 0.05  # radius of the per-client S_rho on F_i
    clients: Annotated[int, rule(ALL, ge=0)] = 0  # all clients (0) or a seeded sample


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


PASSES.declare("sharpness", options=SharpnessOptions,
               summary="rho-ball sharpness S_rho (and adaptive) of F; per-client S_rho of F_i and the gap",
               cost=_sharpness_cost,
               quantities=(_sharpness_at,
                           Quantity("local-global S_rho", "local &minus; global S<sub>&rho;</sub>", "local.gap")))

PASSES.declare("flatness", summary="flatness distance Delta_D around the mean of the round's kept clients",
               needs=(KEPT_CLIENTS,), quantities=(Quantity("Delta_D", "&Delta;<sub>D</sub> (pass)", "distance"),))

TRAINING_BATCH = "0: the run's training batch size"


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
                                    "minibatch.mean_cosine_se")))


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
    from landscape.analyze.functions import PROBE_HVPS  # the computation's own count (costs are for plans)

    lanczos = PROBE_HVPS + 2 * o.top_k + 20
    clients = CLIENT_LAMBDA_MAX_HVPS if o.clients >= 0 else 0
    return Cost(hvps=lanczos + 2 * o.trace_hvps + o.density_runs * o.density_steps + clients)


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
               quantities=(Quantity("lambda_max", "&lambda;<sub>max</sub>", "top.values",
                                    read_result=_first_eigenvalue),
                           Quantity("lambda_1/lambda_k", "&lambda;<sub>1</sub>/&lambda;<sub>k</sub>", "lambda_ratio"),
                           Quantity("trace", "trace", "trace.estimate", "trace.stderr", read_result=_trace),
                           Quantity("client lambda_max", "mean client &lambda;<sub>max</sub>",
                                    "clients.mean_lambda_max")))
