"""Dynamic-radius SAM ("dynsam"): per-client adaptive SAM radius and proximal weight. A HEURISTIC.

From the sheet's "Dynamic-radius SAM" section (a secondary description of dynamic regularised SAM; no paper's
exact algorithm). Each client adapts its radius rho_k and proximal weight lambda_k from three local statistics
of its PREVIOUS participation (no extra communication):
  gamma_k: cosine between its final local minibatch gradient and its gradient at the global model it received;
  sigma_k: its mean local sharpness max(0, f_i(y + e) - f_i(y)) over the SAM steps (a by-product);
  tau_k:   std of the angle between the final local gradients of its last (up to ``history``) participations.
  lambda_k = clip(a * (1 - gamma_k) + b * sigma_k + c * tau_k, lambda_min, lambda_max);
  rho_k = max(rho_min, rho_max * exp(-lambda_k));
  the first ``warmup`` participations use lambda_k = 0, rho_k = rho_max.
client, each step (both gradients on the same batch):
  e = rho_k * g(y_k) / ||g(y_k)||;  d = g(y_k) + g(y_k + e) + 2 * lambda_k * (y_k - x^t)
  (the gradient of f_i(y) + lambda_k ||y - x^t||^2 + f_i(y + e));  y_{k+1} = y_k - eta * (d + wd * y_k).
server: FedAvg.

What exactly is computed (choices where the sheet is open):
- "final local minibatch gradient" = g(y_{K-1}; B_{K-1}), the plain gradient at the last step's descent point
  (already computed by that SAM step; no weight decay, no perturbation).
- "gradient at the global model it received" = g(x^t; B_0) on the client's first batch of the round, which is
  the first SAM step's own g(y_0; B_0) (y_0 = x^t), so it costs nothing extra.
- sigma_k = mean over the K steps of max(0, f_i(y_k + e; B_k) - f_i(y_k; B_k)), e of the round's radius rho_k.
- tau_k: the client keeps its last final gradient and the angles arccos(cos) (radians) between the final
  gradients of consecutive participations, the newest ``history - 1`` of them (so they span its last
  ``history`` participations); tau_k is their population standard deviation (0 with fewer than two angles).
- Cosines use one global L2 norm; a zero vector gives cosine 0.
Client state (``DynSAMClient``, none until the first participation ends): ``count`` (participations so
far), ``gamma``, ``sigma``, ``angles`` (history - 1, oldest first; the newest min(count - 1, history - 1) are
valid), ``final_grad``.
train_loss is the mean minibatch loss f_i(y_k; B_k) at the descent points.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from landscape.core import perturb
from landscape.train.algorithms import (
    ALGORITHMS,
    Algorithm,
    Batch,
    ClientResult,
    LocalModel,
    LocalProblem,
    Tensors,
    local_sgd,
)


def cosine(u: Tensor, v: Tensor) -> Tensor:
    """cos(u, v) with global L2 norms; 0 when either vector is zero."""
    return (perturb.normalized(u) * perturb.normalized(v)).sum()


def angle_std(angles: Tensor, valid: Tensor) -> Tensor:
    """Population standard deviation of angles[i] over the entries with valid[i] (0 when there are none)."""
    n = valid.sum().clamp(min=1)
    mean = torch.where(valid, angles, 0).sum() / n
    return (torch.where(valid, (angles - mean) ** 2, 0).sum() / n).sqrt()


@dataclass(frozen=True)
class DynSAMClient(Tensors):
    """A client's statistics of its participations so far (absent before the first)."""

    count: Tensor  # participations so far (long)
    gamma: Tensor  # gamma_k of the last participation
    sigma: Tensor  # sigma_k of the last participation
    angles: Tensor  # the last history - 1 angles between final gradients, oldest first
    final_grad: Tensor  # the last participation's final local gradient


@ALGORITHMS.implement("dynsam")
class DynSAM(Algorithm):
    ClientState = DynSAMClient

    def client_update(
        self, message: dict[str, Tensor], client_state: DynSAMClient | None, problem: LocalProblem
    ) -> ClientResult:
        o = self.options
        x = message["x"]
        slots = o.history - 1
        if client_state is None:  # the first participation: no statistics yet
            count = torch.zeros((), dtype=torch.long, device=x.device)
            gamma = torch.zeros((), dtype=x.dtype, device=x.device)
            sigma = torch.zeros((), dtype=x.dtype, device=x.device)
            angles = torch.zeros(slots, dtype=x.dtype, device=x.device)
        else:
            count, gamma, sigma = client_state.count, client_state.gamma, client_state.sigma
            angles = client_state.angles
        # The newest min(count - 1, history - 1) angles are valid (they sit at the end of the buffer).
        valid = torch.arange(slots, device=x.device) >= slots - (count - 1).clamp(min=0)

        # From the previous participation's statistics:
        # lambda_k = clip(a (1 - gamma_k) + b sigma_k + c tau_k); rho_k = max(rho_min, rho_max e^-lambda_k);
        # warm-up: lambda_k = 0, rho_k = rho_max.
        tau = angle_std(angles, valid)
        lam = (o.a * (1 - gamma) + o.b * sigma + o.c * tau).clamp(o.lambda_min, o.lambda_max)
        rho = (o.rho_max * torch.exp(-lam)).clamp(min=o.rho_min)
        warm = count < o.warmup
        lam = torch.where(warm, torch.zeros_like(lam), lam)
        rho = torch.where(warm, torch.full_like(rho, o.rho_max), rho)

        seen: dict[str, Tensor] = {"sharpness": torch.zeros((), dtype=x.dtype, device=x.device)}

        def direction(y: Tensor, batch: Batch) -> tuple[Tensor, Tensor]:
            loss, g = problem.loss_and_grad(y, batch)
            e = rho * perturb.normalized(g)  # e = rho_k g / ||g||
            loss_e, g_e = problem.loss_and_grad(y + e, batch, update_stats=False)  # same batch
            seen["sharpness"] = seen["sharpness"] + (loss_e - loss).clamp(min=0)  # max(0, f(y + e) - f(y))
            seen.setdefault("first_grad", g)  # g(x^t; B_0): the first step's descent point is y_0 = x^t
            seen["final_grad"] = g  # g(y_{K-1}; B_{K-1}) once the loop ends
            return loss, g + g_e + 2 * lam * (y - x)  # d = g(y) + g(y + e) + 2 lambda_k (y - x^t)

        y, loss = local_sgd(problem, x, direction)  # y_{k+1} = y_k - eta * (d + wd * y_k)

        # This participation's statistics, used at the client's next participation.
        final = seen["final_grad"]
        if client_state is not None:  # angle between this and the previous participation's final gradient
            new_angle = torch.arccos(cosine(final, client_state.final_grad).clamp(-1.0, 1.0))
            angles = torch.cat([angles[1:], new_angle.reshape(1)])
        state = DynSAMClient(
            count=count + 1,
            gamma=cosine(final, seen["first_grad"]),  # gamma_k
            sigma=seen["sharpness"] / problem.num_steps,  # sigma_k: mean local sharpness
            angles=angles,
            final_grad=final,
        )
        return ClientResult(problem.client, y, upload=LocalModel(y), state=state, train_loss=loss)

    def perturbation_direction(self, message: dict[str, Tensor], client_state: DynSAMClient | None,
                               g: Tensor) -> Tensor:
        return g  # e = rho_k g / ||g||: along the local gradient, at the client's own radius rho_k
