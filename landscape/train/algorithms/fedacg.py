"""FedACG (Kim et al., CVPR 2024): accelerated client gradient (server momentum sent as a lookahead).

server sends the lookahead x~ = x^t + lam * m (one model: no extra downlink).
client: starts at y_0 = x~ and minimises f_i(y) + beta * ||y - x~||^2; its descent gradient is
        d = g(y_k) + 2 * beta * (y_k - x~)   (2 * beta * (y - x~) = d/dy of beta * ||y - x~||^2);
        y_{k+1} = y_k - eta * (d + wd * y_k);  Delta_i = y_{i,K} - x~.
server: m = lam * m + eta_g * mean_S(y_{i,K} - x~);  x^{t+1} = x^t + m.  Reference lam 0.85, beta 1e-3.

The server lr eta_g (not in the paper, whose rule is eta_g = 1) scales the clients' fresh update inside the
momentum, so that m stays the step the server actually takes (m = x^{t+1} - x^t) and the next lookahead
x^{t+1} + lam * m is its momentum part: x^{t+1} = x~ + eta_g * Delta_bar, a FedAvg server step from the point
the clients started at. With eta_g = 1 this is the paper's rule; with lam = 0 and beta = 0 it is FedAvg for
any eta_g. m starts at zero, so round 0 is a FedProx round (mu = 2 * beta) from x^0.
Clipping, when on, acts on the whole d (the proximal term included). train_loss is f_i alone.
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
    mean_model,
)


@dataclass(frozen=True)
class FedACGServer(Tensors):
    m: Tensor  # server momentum m = x^{t+1} - x^t of the last round (zeros at the start)


@ALGORITHMS.implement("fedacg")
class FedACG(Algorithm):
    ServerState = FedACGServer

    def init_server_state(self, x: Tensor) -> FedACGServer:
        return FedACGServer(m=torch.zeros_like(x))  # m = 0 at the start

    def lookahead(self, x: Tensor, server_state: FedACGServer) -> Tensor:
        return x + self.options.lam * server_state.m  # x~ = x^t + lam * m

    def broadcast(self, x: Tensor, server_state: FedACGServer, round: int) -> dict[str, Tensor]:
        return {"x": self.lookahead(x, server_state)}  # the model the clients start from is x~

    def client_update(
        self, message: dict[str, Tensor], client_state: None, problem: LocalProblem
    ) -> ClientResult:
        x_tilde = message["x"]
        two_beta = 2 * self.options.beta  # d/dy beta * ||y - x~||^2 = 2 * beta * (y - x~)

        def direction(y: Tensor, batch: Batch) -> tuple[Tensor, Tensor]:
            loss, g = problem.loss_and_grad(y, batch)
            return loss, g + two_beta * (y - x_tilde)  # d = g(y_k) + 2 * beta * (y_k - x~)

        y, loss = local_sgd(problem, x_tilde, direction)  # y_0 = x~
        return ClientResult(problem.client, y, upload=LocalModel(y), train_loss=loss)

    def aggregate(
        self, x: Tensor, server_state: FedACGServer, uploads: Sequence[LocalModel], server_round: ServerRound
    ) -> tuple[Tensor, FedACGServer]:
        x_tilde = self.lookahead(x, server_state)  # the x~ broadcast this round
        delta_bar = mean_model(uploads) - x_tilde  # mean_S(y_{i,K} - x~)
        m = self.options.lam * server_state.m + self.server_lr * delta_bar  # m = lam * m + eta_g * Delta_bar
        return x + m, FedACGServer(m)  # x^{t+1} = x^t + m
