"""FedLESAM (Fan et al. ICML 2024): a locally estimated global perturbation, one backward pass per step.

client: u = x^{tau_i} - x^t (the global model the client received at its previous participation minus the
        current one); where the client has no history, u = x^{t-1} - x^t; at t = 0, u = 0 (no perturbation);
        e = rho * u / ||u|| (one global L2 norm over all tensors; fixed for the round);
        d = g(y_k + e) (the only forward/backward of the step);  y_{k+1} = y_k - eta * (d + wd * y_k).
server: FedAvg.

State: each client keeps the global model it last received, x^{tau_i} (client state ``x_seen``); the server
keeps its previous global model x^{t-1} (server state ``x_prev``, broadcast for the clients without history;
at round 0 it is x^0, so u = 0 there). train_loss is the mean minibatch loss at the evaluated points y_k + e
(no extra forward pass at y_k); that single forward also moves BatchNorm statistics, as in the reference code.
Reference rho: 0.05 (the official FedLESAM run command; the code's argparse default is 0.1).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from torch import Tensor

from landscape.core import perturb
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


@dataclass(frozen=True)
class FedLESAMServer(Tensors):
    x_prev: Tensor  # x^{t-1}, the previous global model (x^0 at round 0)


@dataclass(frozen=True)
class FedLESAMClient(Tensors):
    x_seen: Tensor  # x^{tau_i}, the global model the client received at its last participation


@ALGORITHMS.implement("fedlesam")
class FedLESAM(Algorithm):
    ServerState = FedLESAMServer
    ClientState = FedLESAMClient

    def init_server_state(self, x: Tensor) -> FedLESAMServer:
        return FedLESAMServer(x_prev=x.clone())  # x^{t-1}; equal to x^0 at round 0, so u = 0 there

    def broadcast(self, x: Tensor, server_state: FedLESAMServer, round: int) -> dict[str, Tensor]:
        return {"x": x, "x_prev": server_state.x_prev}

    def client_update(
        self, message: dict[str, Tensor], client_state: FedLESAMClient | None, problem: LocalProblem
    ) -> ClientResult:
        x = message["x"]
        e = perturb.sam_perturbation(self.estimate(message, client_state), self.options.rho)  # e = rho u / ||u||

        def direction(y: Tensor, batch: Batch) -> tuple[Tensor, Tensor]:
            return problem.loss_and_grad(y + e, batch)  # d = g(y_k + e): one forward/backward per step

        y, loss = local_sgd(problem, x, direction)  # y_{k+1} = y_k - eta * (d + wd * y_k)
        return ClientResult(problem.client, y, upload=LocalModel(y), state=FedLESAMClient(x_seen=x),
                            train_loss=loss)

    def estimate(self, message: dict[str, Tensor], client_state: FedLESAMClient | None) -> Tensor:
        """u = x^{tau_i} - x^t, or x^{t-1} - x^t without history: the estimated global ascent direction."""
        seen = client_state.x_seen if client_state is not None else message["x_prev"]
        return seen - message["x"]

    def perturbation_direction(self, message: dict[str, Tensor], client_state: FedLESAMClient | None,
                               g: Tensor) -> Tensor:
        return self.estimate(message, client_state)  # e = rho u / ||u||, whatever the gradient

    def aggregate(
        self, x: Tensor, server_state: FedLESAMServer, uploads: Sequence[LocalModel],
        server_round: ServerRound,
    ) -> tuple[Tensor, FedLESAMServer]:
        x_new, _ = super().aggregate(x, server_state, uploads, server_round)  # FedAvg server
        return x_new, FedLESAMServer(x_prev=x)  # x^t becomes the next round's x^{t-1}
