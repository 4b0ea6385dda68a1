"""What the figures draw of the runs' pass results, shared by the matplotlib (``curves``) and plotly
(``report``) renderers: S_rho(x^t) and lambda_1(x^t) over the analysed rounds, the Hessian summaries, the
parts of Delta_FI and the client x client gradient cosines.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from landscape.core.errors import LandscapeError
from landscape.figures.rundata import RunData, RunsLike, as_runs, require_passes

# -- global sharpness and lambda_1 over rounds ---------------------------------------------------------------


def sharpness_rhos(runs: Sequence[RunData]) -> list[float]:
    """The radii every analysed round of every run has S_rho for."""
    common: set[float] | None = None
    for run in runs:
        for rec in run.pass_records("sharpness"):
            rhos = {round(float(r), 12) for r in np.atleast_1d(rec.array("global.rhos"))}
            common = rhos if common is None else common & rhos
    return sorted(common or ())


def choose_rho(runs: Sequence[RunData], rho: float | None) -> float:
    """``rho`` when given (checked), else 0.05 when every run has it, else the middle common radius."""
    common = sharpness_rhos(runs)
    if rho is not None:
        if not any(math.isclose(rho, r, rel_tol=1e-9) for r in common):
            raise LandscapeError(f"S_rho was not computed at rho={rho:g} for every analysed round (radii "
                                 f"everywhere: {', '.join(f'{r:g}' for r in common) or 'none'}); rerun "
                                 f"`landscape analyze RUN --passes sharpness --set sharpness.rhos=[{rho:g}]`")
        return rho
    if not common:
        raise LandscapeError("the runs' sharpness analyses share no radius rho; rerun them with the same "
                             "--set sharpness.rhos=[...]")
    return 0.05 if any(math.isclose(0.05, r) for r in common) else common[len(common) // 2]


def global_sharpness_series(run: RunData, rho: float) -> tuple[np.ndarray, np.ndarray]:
    """(rounds, S_rho(x^t)) over the rounds analysed by the sharpness pass."""
    rounds, values = [], []
    for rec in run.pass_records("sharpness"):
        rhos = np.atleast_1d(rec.array("global.rhos"))
        hit = np.flatnonzero(np.isclose(rhos, rho, rtol=1e-9, atol=0))
        rounds.append(rec.round)
        values.append(float(np.atleast_1d(rec.array("global.sharpness"))[hit[0]]))
    return np.asarray(rounds, dtype=int), np.asarray(values)


def lambda_max_series(run: RunData) -> tuple[np.ndarray, np.ndarray]:
    """(rounds, lambda_1(x^t)) over the rounds analysed by the hessian pass."""
    recs = run.pass_records("hessian")
    return (np.asarray([rec.round for rec in recs], dtype=int),
            np.asarray([float(np.atleast_1d(rec.array("top.values"))[0]) for rec in recs]))


# -- the Hessian summary -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HessianSummary:
    run: RunData
    round: int
    values: np.ndarray  # Lanczos top-k eigenvalues, descending
    ratio: float  # lambda_1 / lambda_k
    trace: float  # Hutch++
    client_lambda_max: np.ndarray  # empty when the pass skipped the clients
    grid: np.ndarray
    density: np.ndarray


def hessian_summaries(runs: RunsLike, round: int | None = None) -> list[HessianSummary]:
    runs = as_runs(runs)
    require_passes(runs, ["hessian"])
    out = []
    for run in runs:
        rec = run.pass_record("hessian", round)
        out.append(HessianSummary(
            run, rec.round, np.atleast_1d(rec.array("top.values")), float(rec.value("lambda_ratio")),
            float(rec.value("trace.estimate", rec.value("trace_hutchpp.estimate", math.nan))),
            np.atleast_1d(np.asarray(rec.value("clients.lambda_max", []), dtype=float)),
            np.atleast_1d(rec.array("density_grid")), np.atleast_1d(rec.array("density"))))
    return out


# -- flatness incompatibility -------------------------------------------------------------------------------

# (result key, its standard-error key or None, scale): the parts of Delta_FI, in the order they are drawn
INCOMPATIBILITY_PARTS = [
    ("incompatibility", "incompatibility_se", 1.0),
    ("heterogeneity", None, 1.0),
    ("batch_part", "batch_part_se", 1.0),
    ("cross", "cross_se", 2.0),
]


def incompatibility_series(run: RunData) -> dict[str, np.ndarray]:
    """rounds, rho and each part of Delta_FI (and its standard error) over the analysed rounds."""
    recs = run.pass_records("incompatibility")
    out = {"rounds": np.asarray([r.round for r in recs], dtype=int),
           "rho": np.asarray([float(r.value("rho")) for r in recs])}
    for key, se_key, scale in INCOMPATIBILITY_PARTS:
        out[key] = scale * np.asarray([float(r.value(key)) for r in recs])
        if se_key:
            out[se_key] = scale * np.asarray([float(r.value(se_key)) for r in recs])
    return out


# -- gradient alignment -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CosineMatrix:
    run: RunData
    round: int
    clients: list[int]
    matrix: np.ndarray  # [N, N] cos(grad F_i, grad F_j)
    mean_off_diagonal: float


def alignment_matrices(runs: RunsLike, round: int | None = None) -> list[CosineMatrix]:
    runs = as_runs(runs)
    require_passes(runs, ["alignment"])
    out = []
    for run in runs:
        rec = run.pass_record("alignment", round)
        matrix = np.atleast_2d(rec.array("gradients.cosine_matrix"))
        clients = [int(c) for c in rec.value("gradients.clients", list(range(len(matrix))))]
        out.append(CosineMatrix(run, rec.round, clients, matrix,
                                float(rec.value("gradients.mean_off_diagonal", math.nan))))
    return out
