"""SCAFFOLD (Karimireddy et al., ICML 2020), option II control variates.

client: d = g(y_k) - c_i + c;  y_{k+1} = y_k - eta * (d + wd * y_k);
        after K steps: c_i+ = c_i - c + (x^t - y_{i,K}) / (K * eta).
server: x^{t+1} = x^t + eta_g * Delta_bar;  c += (1/N) * sum_{i in S} (c_i+ - c_i)  (N: all clients).
Upload: y_{i,K} (for Delta_i) and c_i+ - c_i (2x uplink). Broadcast: x^t and c.

State: the server's c (zeros at round 0); each client's c_i (zeros before its first participation), kept
between its participations. K and eta are this client's local steps and this round's client lr. Clipping,
when on, acts on the whole corrected d. The control-variate client and server rules are the helpers below,
reused by FedGAMMA (SAM + SCAFFOLD), whose only change is the uncorrected local direction.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from landscape.train.algorithms import (
    ALGORITHMS,
    Algorithm,
    Batch,
    ClientResult,
    LocalProblem,
    ServerRound,
    Tensors,
    local_sgd,
)

Direction = Callable[[Tensor, Batch], tuple[Tensor, Tensor]]


@dataclass(frozen=True)
class ScaffoldServer(Tensors):
    c: Tensor  # the server control variate (zeros at round 0)


@dataclass(frozen=True)
class ScaffoldClient(Tensors):
    c_i: Tensor  # the client's control variate (zeros before its first participation)


@dataclass(frozen=True)
class ScaffoldUpload(Tensors):
    model: Tensor  # y_{i,K} (the server forms Delta_i = y_{i,K} - x^t from it)
    dc: Tensor  # c_i+ - c_i


def control_variate_update(c_i: Tensor, c: Tensor, x: Tensor, y: Tensor, num_steps: int, lr: float) -> Tensor:
    """Option II: c_i+ = c_i - c + (x^t - y_{i,K}) / (K * eta)."""
    return c_i - c + (x - y) / (num_steps * lr)


def corrected_client_update(
    message: dict[str, Tensor], client_state: ScaffoldClient | None, problem: LocalProblem,
    direction: Direction,
) -> ClientResult:
    """K local steps with d = direction(y_k) - c_i + c, then the new c_i; uploads y_{i,K} and c_i+ - c_i."""
    x, c = message["x"], message["c"]
    # a client's first participation: c_i = 0
    c_i = client_state.c_i if client_state is not None else torch.zeros_like(x)
    correction = c - c_i  # the drift correction -c_i + c, the same at every local step

    def corrected(y: Tensor, batch: Batch) -> tuple[Tensor, Tensor]:
        loss, g = direction(y, batch)
        return loss, g + correction  # d = g - c_i + c

    y, loss = local_sgd(problem, x, corrected)
    c_i_new = control_variate_update(c_i, c, x, y, problem.num_steps, problem.lr)  # c_i+
    return ClientResult(problem.client, y, upload=ScaffoldUpload(y, c_i_new - c_i),
                        state=ScaffoldClient(c_i_new), train_loss=loss)


def server_control_variate(c: Tensor, uploads: Sequence[ScaffoldUpload], num_clients: int) -> Tensor:
    """c + (1/N) * sum_{i in S} (c_i+ - c_i), N = all clients."""
    return c + torch.stack([u.dc for u in uploads]).sum(dim=0) / num_clients


@ALGORITHMS.implement("scaffold")
class Scaffold(Algorithm):
    ServerState = ScaffoldServer
    ClientState = ScaffoldClient
    Upload = ScaffoldUpload

    def init_server_state(self, x: Tensor) -> ScaffoldServer:
        return ScaffoldServer(c=torch.zeros_like(x))  # c = 0 at the start

    def broadcast(self, x: Tensor, server_state: ScaffoldServer, round: int) -> dict[str, Tensor]:
        return {"x": x, "c": server_state.c}

    def local_direction(self, problem: LocalProblem) -> Direction:
        """The uncorrected local direction: the minibatch gradient g(y_k) (FedGAMMA: the SAM gradient)."""
        return problem.loss_and_grad

    def client_update(
        self, message: dict[str, Tensor], client_state: ScaffoldClient | None, problem: LocalProblem
    ) -> ClientResult:
        return corrected_client_update(message, client_state, problem, self.local_direction(problem))

    def aggregate(
        self, x: Tensor, server_state: ScaffoldServer, uploads: Sequence[ScaffoldUpload],
        server_round: ServerRound,
    ) -> tuple[Tensor, ScaffoldServer]:
        x_new, _ = super().aggregate(x, server_state, uploads, server_round)  # x^t + eta_g * Delta_bar
        return x_new, ScaffoldServer(server_control_variate(server_state.c, uploads, self.num_clients))
