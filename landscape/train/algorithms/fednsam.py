"""FedNSAM (Liu et al. 2026): SAM with the global Nesterov momentum as the estimated global ascent direction.

server:  m^t = lam * m^{t-1} + Delta_bar^t;   x^{t+1} = x^t + eta_g * m^t     (Delta_i = y_{i,K} - x^t)
client, each step (m = m^{t-1}, the momentum the server broadcast with x^t):
    y' = y_k + lam * m                       (Nesterov look-ahead)
    e  = -rho * m / ||m||                    (m points down-hill, so -m is the estimated global ascent)
    d  = g(y' + e; B)
    y_{k+1} = y_k - eta * (d + wd * y_k)
Round 0 (m = 0): the plain FedSAM step e = rho * g(y_k) / ||g(y_k)||, d = g(y_k + e) on the same batch.
Reference lam 0.85, rho 0.1 (0.05 in the public code), lr 0.1 cosine, E = 5 / K = 50, batch 50.

Choices where the sheet is silent:
- eta_g (train.server_lr) scales the momentum step: x^{t+1} = x^t + eta_g * m^t, the sheet's rule at the
  default eta_g = 1. The momentum itself accumulates the unscaled Delta_bar.
- "m = 0": the FedSAM fallback is taken whenever ||m|| = 0 (decided once per client and round, one host sync),
  i.e. in round 0 and in any later round whose momentum vanished exactly; then -m/||m|| is undefined.
- Downlink is (x^t, m^{t-1}); uplink is y_{i,K} only (as many floats as Delta_i: FedAvg-equal).
- Off round 0 a step evaluates one gradient, at y' + e; that evaluation moves BatchNorm statistics (it is the
  step's only forward pass) and its minibatch loss is the reported train loss (the loss at y_k itself would
  cost a second forward/backward pass).
With lam = 0 and rho = 0 the rule is FedAvg, bit for bit (tests/train/test_algorithms_global.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from landscape.core.perturb import normalized
from landscape.train.algorithms import (
    ALGORITHMS,
    Algorithm,
    Batch,
    ClientResult,
    LocalModel,
    LocalProblem,
    ServerRound,
    Tensors,
    local_sgd,
    mean_model,
)
from landscape.train.algorithms.fedsam import sam_direction


@dataclass(frozen=True)
class FedNSAMServer(Tensors):
    m: Tensor  # the global momentum m^{t-1} (zeros before round 0)


@ALGORITHMS.implement("fednsam")
class FedNSAM(Algorithm):
    ServerState = FedNSAMServer

    def init_server_state(self, x: Tensor) -> FedNSAMServer:
        return FedNSAMServer(m=torch.zeros_like(x))  # m^{-1} = 0

    def broadcast(self, x: Tensor, server_state: FedNSAMServer, round: int) -> dict[str, Tensor]:
        return {"x": x, "m": server_state.m}

    def client_update(
        self, message: dict[str, Tensor], client_state: None, problem: LocalProblem
    ) -> ClientResult:
        x, m = message["x"], message["m"]
        lam, rho = self.options.lam, self.options.rho
        if bool(m.norm() > 0):
            # The evaluation point y' + e = y_k + (lam m - rho m / ||m||): the offset is fixed all round.
            offset = lam * m + -rho * normalized(m)  # y' = y_k + lam m;  e = -rho m / ||m||

            def direction(y: Tensor, batch: Batch) -> tuple[Tensor, Tensor]:
                return problem.loss_and_grad(y + offset, batch)  # d = g(y' + e; B)

        else:
            direction = sam_direction(problem, rho)  # m = 0: FedSAM, e = rho g / ||g||, d = g(y + e)
        y, loss = local_sgd(problem, x, direction)  # y_{k+1} = y_k - eta (d + wd y_k)
        return ClientResult(problem.client, y, upload=LocalModel(y), train_loss=loss)

    def perturbation_direction(self, message: dict[str, Tensor], client_state: None, g: Tensor) -> Tensor:
        m = message["m"]
        return -m if bool(m.norm() > 0) else g  # e = -rho m / ||m|| (at the look-ahead y'); m = 0: FedSAM's

    def aggregate(
        self, x: Tensor, server_state: FedNSAMServer, uploads: Sequence[LocalModel], server_round: ServerRound
    ) -> tuple[Tensor, FedNSAMServer]:
        # Delta_bar^t = mean_S(Delta_i), Delta_i = y_{i,K} - x^t
        delta_bar = mean_model(uploads) - x
        m = self.options.lam * server_state.m + delta_bar  # m^t = lam m^{t-1} + Delta_bar^t
        return x + self.server_lr * m, FedNSAMServer(m)  # x^{t+1} = x^t + eta_g m^t
