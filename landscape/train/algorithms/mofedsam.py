"""MoFedSAM (Qu et al. ICML 2022): SAM local steps with FedCM-style client momentum.

server sends m = -Delta_bar^{t-1} / (K * eta), the average pseudo-gradient per local step of the last round
(m = 0 at round 0);
client: e = rho * g(y_k) / ||g(y_k)||;  d = alpha * g(y_k + e) + (1 - alpha) * m (both g on the same batch);
        y_{k+1} = y_k - eta * (d + wd * y_k).
server: x^{t+1} = x^t + eta_g * Delta_bar (FedAvg). Reference alpha 0.1 (0.05 also used), rho 0.1.
With alpha = 1 it is FedSAM.

Interpretation: K may differ between clients (epoch mode: K_i = number of minibatches), so the server computes
m = -mean_{i in S_t}(Delta_i / (K_i * eta)) with the eta the clients used in that round; with equal K this is
exactly -Delta_bar / (K * eta). Delta_i is relative to x^t and m leaves out eta_g, as in the sheet.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

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
)
from landscape.train.algorithms.fedsam import sam_direction


@dataclass(frozen=True)
class MoFedSAMServer(Tensors):
    m: Tensor  # -Delta_bar^{t-1} / (K * eta): the last round's average pseudo-gradient per local step


@ALGORITHMS.implement("mofedsam")
class MoFedSAM(Algorithm):
    ServerState = MoFedSAMServer

    def init_server_state(self, x: Tensor) -> MoFedSAMServer:
        return MoFedSAMServer(m=torch.zeros_like(x))  # m = 0 at round 0

    def broadcast(self, x: Tensor, server_state: MoFedSAMServer, round: int) -> dict[str, Tensor]:
        return {"x": x, "m": server_state.m}

    def client_update(
        self, message: dict[str, Tensor], client_state: None, problem: LocalProblem
    ) -> ClientResult:
        x, m = message["x"], message["m"]
        alpha = self.options.alpha
        sam = sam_direction(problem, self.options.rho)  # g(y_k + e), e = rho g / ||g||, same batch

        def direction(y: Tensor, batch: Batch) -> tuple[Tensor, Tensor]:
            loss, d_sam = sam(y, batch)
            return loss, alpha * d_sam + (1 - alpha) * m  # d = alpha g(y_k + e) + (1 - alpha) m

        y, loss = local_sgd(problem, x, direction)  # y_{k+1} = y_k - eta * (d + wd * y_k)
        return ClientResult(problem.client, y, upload=LocalModel(y), train_loss=loss)

    def perturbation_direction(self, message: dict[str, Tensor], client_state: None, g: Tensor) -> Tensor:
        return g  # e = rho g / ||g||: the local gradient's; m enters the descent only

    def aggregate(
        self, x: Tensor, server_state: MoFedSAMServer, uploads: Sequence[LocalModel],
        server_round: ServerRound,
    ) -> tuple[Tensor, MoFedSAMServer]:
        x_new, _ = super().aggregate(x, server_state, uploads, server_round)  # x^t + eta_g Delta_bar
        # m = -mean_S(Delta_i / (K_i * eta)): the average pseudo-gradient per local step, sent next round.
        lr, steps = server_round.lr, server_round.num_steps
        m = -torch.stack([(u.model - x) / (k * lr) for u, k in zip(uploads, steps)]).mean(dim=0)
        return x_new, MoFedSAMServer(m)
