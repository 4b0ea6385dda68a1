"""Alignment of client gradients and client updates (docs/metrics.md "Alignment").

- ``gradient_alignment``: C_ij = cos(gradF_i, gradF_j) over the given clients (the caller picks a seeded
  sample where there are many: the N full gradients are held at once, N x dim values) and
  c_i = cos(gradF_i, gradF).
- ``minibatch_alignment``: within one client, the mean cosine between the gradients of distinct minibatch
  draws (the friendly-adversary view), per client and overall, with Monte-Carlo standard errors. The draws
  and the standard errors are those of ``flatness_incompatibility`` (same seed, same minibatches).
- ``update_alignment``: from the saved client models y_i of round t, Delta_i = y_i - s^t, where s^t is the
  model the clients STARTED their local steps from: the algorithm's broadcast of x^{t-1} and its server state
  (checkpoint ``round-(t-1).pt``, not ``round-t.pt``, which holds x^t, after aggregation). s^t = x^{t-1} for
  FedAvg and every rule that sends the global model; the look-ahead x^{t-1} + lam m for fedacg and
  fednsam-code, whose server forms exactly this Delta_i from the uploaded y_i. cos(Delta_i, Delta_j), cos(Delta_i, Delta_bar)
  with Delta_bar = mean_i Delta_i, and, when x^t is given, cos(Delta_i, x^t - x^{t-1}): the client's own
  update against the server's actual step from the old global model (equal to Delta_bar's direction for
  FedAvg; under FedACG's momentum the step is m^t = lam m^{t-1} + eta_g Delta_bar, so it is the cosine with
  the momentum step, and cos(Delta_bar, x^t - x^{t-1}) says how far that step is the fresh mean update).

Cosines are computed in float64; cos(v, .) of a zero vector v is 0 (its diagonal entry too).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from landscape.core.errors import LandscapeError
from landscape.measure.flatness import (
    check_client_vectors,
    check_minibatch_settings,
    client_minibatch_gradients,
    pair_mean_se,
)
from landscape.measure.gradient_cache import GradientCache, full_gradient


def _unit_rows(vectors: Tensor) -> tuple[Tensor, Tensor]:
    """Rows scaled to unit norm (zero rows stay zero), and the norms; float64."""
    v = vectors.double()
    norms = v.norm(dim=1)
    return v / torch.where(norms > 0, norms, torch.ones_like(norms))[:, None], norms


def cosine_matrix(vectors: Tensor) -> np.ndarray:
    """[N, N] cosines between the rows of ``vectors`` [N, dim]: symmetric, in [-1, 1], diagonal 1 (0 for a
    zero row)."""
    units, norms = _unit_rows(vectors)
    c = units @ units.T
    c = ((c + c.T) / 2).clamp(-1.0, 1.0)
    c.diagonal().copy_((norms > 0).double())
    return c.cpu().numpy()


def cosines_to(vectors: Tensor, target: Tensor) -> np.ndarray:
    """[N] cos(row_i, target), in [-1, 1]."""
    units, _ = _unit_rows(vectors)
    t, _ = _unit_rows(target.reshape(1, -1))
    return (units @ t[0]).clamp(-1.0, 1.0).cpu().numpy()


def _mean_off_diagonal(c: np.ndarray) -> float:
    n = c.shape[0]
    return float(c[~np.eye(n, dtype=bool)].mean()) if n > 1 else float("nan")


@dataclass(frozen=True)
class GradientAlignmentResult:
    clients: list[int]  # ascending; arrays are indexed like this list
    cosine_matrix: np.ndarray  # [N, N] C_ij = cos(gradF_i, gradF_j)
    global_cosine: np.ndarray  # [N] c_i = cos(gradF_i, gradF)
    mean_off_diagonal: float  # mean_{i != j} C_ij (NaN for one client)
    mean_global_cosine: float  # mean_i c_i
    client_gradient_norm: np.ndarray  # ||gradF_i||
    global_gradient_norm: float  # ||gradF||


def gradient_alignment(
    global_objective: Any, client_objectives: Mapping[int, Any], w: Tensor, *,
    gradients: GradientCache | None = None,
) -> GradientAlignmentResult:
    """C_ij = cos(gradF_i, gradF_j) and c_i = cos(gradF_i, gradF) at w (full-batch gradients; from
    ``gradients`` when given, ``gradient_cache``)."""
    if not client_objectives:
        raise LandscapeError("gradient alignment needs at least one client objective")
    w = w.detach()
    clients = sorted(client_objectives)
    _, grad = full_gradient(global_objective, w, gradients)
    grads = torch.stack([full_gradient(client_objectives[c], w, gradients)[1] for c in clients])
    c = cosine_matrix(grads)
    to_global = cosines_to(grads, grad)
    return GradientAlignmentResult(
        clients=[int(k) for k in clients],
        cosine_matrix=c,
        global_cosine=to_global,
        mean_off_diagonal=_mean_off_diagonal(c),
        mean_global_cosine=float(to_global.mean()),
        client_gradient_norm=grads.double().norm(dim=1).cpu().numpy(),
        global_gradient_norm=float(grad.double().norm()),
    )


@dataclass(frozen=True)
class MinibatchAlignmentResult:
    batch_size: int
    batches: int
    seed: int
    clients: list[int]
    mean_cosine: float  # mean over clients of the mean cosine over pairs of distinct draws
    mean_cosine_se: float  # Monte-Carlo SE (flatness.py docstring: first-order U-statistic, clients fixed)
    client_mean_cosine: np.ndarray  # [N]
    client_mean_cosine_se: np.ndarray  # [N]
    cosine_matrices: np.ndarray  # [N, M, M] cos(g_i^B, g_i^B') over the draws


def minibatch_alignment(
    client_objectives: Mapping[int, Any], w: Tensor, *, batch_size: int, batches: int, seed: int = 0,
    gradients: GradientCache | None = None,
) -> MinibatchAlignmentResult:
    """Within-client minibatch gradient cosine: mean over pairs of distinct draws B != B' of cos(g_i^B, g_i^B')
    (the draws' gradients from ``gradients`` when given: the incompatibility pass's, ``gradient_cache``)."""
    check_minibatch_settings(batch_size, batches)
    if not client_objectives:
        raise LandscapeError("minibatch alignment needs at least one client objective")
    w = w.detach()
    clients = sorted(client_objectives)
    matrices = []
    for c in clients:
        _, draws = client_minibatch_gradients(client_objectives[c], w, batch_size, batches, seed, c, gradients)
        grads = torch.stack(draws)
        matrices.append(cosine_matrix(grads))
    stacked = np.stack(matrices)
    means, ses, mean, se = pair_mean_se(stacked)
    return MinibatchAlignmentResult(
        batch_size=int(batch_size),
        batches=int(batches),
        seed=int(seed),
        clients=[int(k) for k in clients],
        mean_cosine=mean,
        mean_cosine_se=se,
        client_mean_cosine=means,
        client_mean_cosine_se=ses,
        cosine_matrices=stacked,
    )


@dataclass(frozen=True)
class UpdateAlignmentResult:
    clients: list[int]
    cosine_matrix: np.ndarray  # [N, N] cos(Delta_i, Delta_j), Delta_i = y_i - s^t (the clients' start point)
    mean_cosine: np.ndarray  # [N] cos(Delta_i, Delta_bar), Delta_bar = mean_i Delta_i
    mean_off_diagonal: float  # mean_{i != j} cos(Delta_i, Delta_j) (NaN for one client)
    mean_cosine_to_mean: float  # mean_i cos(Delta_i, Delta_bar)
    update_norm: np.ndarray  # [N] ||Delta_i||
    mean_update_norm: float  # ||Delta_bar||
    start_offset_norm: float  # ||s^t - x^{t-1}|| (0 where the clients start from the global model)
    server_cosine: np.ndarray  # [N] cos(Delta_i, x^t - x^{t-1}); NaN when x^t is not given
    server_mean_cosine: float  # cos(Delta_bar, x^t - x^{t-1}); NaN when x^t is not given
    server_update_norm: float  # ||x^t - x^{t-1}||; NaN when x^t is not given


def _check_same_size(w: Tensor, start_w: Tensor, what: str) -> None:
    if w.shape != start_w.shape:
        raise LandscapeError(f"the {what} has {w.numel()} parameters, the start model {start_w.numel()}")


def update_alignment(
    start_w: Tensor,
    client_ws: Mapping[int, Tensor],
    new_global_w: Tensor | None = None,
    previous_global_w: Tensor | None = None,
) -> UpdateAlignmentResult:
    """Alignment of the client updates Delta_i = y_i - ``start_w`` of one round t.

    ``start_w`` must be s^t, the model the round's clients started from (``CheckpointContext.broadcast_start``:
    the algorithm's broadcast of checkpoint round t-1), and ``client_ws`` their final models y_i
    (``round-t.clients.pt``); ``new_global_w`` optionally x^t; ``previous_global_w`` x^{t-1}, the global model
    the server stepped from (None: the clients started from it, x^{t-1} = ``start_w``).
    """
    clients = check_client_vectors(start_w, client_ws, "update alignment")
    s = start_w.detach().double()
    deltas = torch.stack([client_ws[c].detach().to(s.device).double() - s for c in clients])
    delta_bar = deltas.mean(dim=0)
    c = cosine_matrix(deltas)
    to_mean = cosines_to(deltas, delta_bar)
    n = len(clients)
    if previous_global_w is None:
        x_prev = s
    else:
        _check_same_size(previous_global_w, start_w, "previous global model")
        x_prev = previous_global_w.detach().to(s.device).double()
    if new_global_w is None:
        server, server_mean, server_norm = np.full(n, np.nan), float("nan"), float("nan")
    else:
        _check_same_size(new_global_w, start_w, "new global model")
        step = new_global_w.detach().to(s.device).double() - x_prev  # x^t - x^{t-1}
        server, server_norm = cosines_to(deltas, step), float(step.norm())
        server_mean = float(cosines_to(delta_bar.reshape(1, -1), step)[0])
    return UpdateAlignmentResult(
        clients=[int(k) for k in clients],
        cosine_matrix=c,
        mean_cosine=to_mean,
        mean_off_diagonal=_mean_off_diagonal(c),
        mean_cosine_to_mean=float(to_mean.mean()),
        update_norm=deltas.norm(dim=1).cpu().numpy(),
        mean_update_norm=float(delta_bar.norm()),
        start_offset_norm=float((s - x_prev).norm()),
        server_cosine=server,
        server_mean_cosine=server_mean,
        server_update_norm=server_norm,
    )
