"""FedVSSAM (2026, "variance-suppressed" SAM: mitigates the flatness incompatibility of local and global SAM).

state: the global adjusted direction h (server, zeros at t = 0), broadcast with x^t; uplink y_{i,K} only.
client, each step (gamma_l in (0, 1]):
    h_i = (1 - gamma_l) * h + gamma_l * g(y_k);  y~ = y_k + rho * h_i / ||h_i||        (LF, local flatness)
    u   = (1 - gamma_l) * h + gamma_l * g(y~);   y_{k+1} = y_k - eta * (u + wd * y_k)  (LU, local update)
    (both gradients on the same batch; wd enters the descent as in every rule here, never the perturbation)
server (gamma_g in (0, 1]):
    g^{t+1} = (x^t - mean_S y_{i,K}) / (eta * K);   h = (1 - gamma_g) * h + gamma_g * g^{t+1};
    x^{t+1} = x^t - eta_g * h                                                             (GU, global update)
Defaults (gamma_l, gamma_g) = (0.4, 0.6) for moderate heterogeneity; the paper uses (0.1, 0.6) under high
heterogeneity. rho 0.05. Ablations are settings: gamma_l = 1 disables LF + LU, gamma_g = 1 disables GU; both 1
is "FedVSSAM-base". With h = 0 at t = 0 the first round is FedSAM-like (its steps scaled by gamma_l).
Step sizes in the analysis: eta_l <= 1/(sqrt(2) gamma_l K L), eta_g <= min(1/(24 L), gamma_l gamma_g / (6 L)).

eta_g is train.server_lr, a step size on the pseudo-gradient h (not a multiplier of Delta_bar as in FedAvg):
eta_g = eta * K moves the model as far as FedAvg would, and with gamma_l = gamma_g = 1 and eta_g = eta * K the
rule is FedSAM (tests/train/test_algorithms_global.py). The recipe default 1.0 is one unit step along h per round.
K per client: where clients take different numbers of steps (epoch mode), each client's average
pseudo-gradient (x^t - y_{i,K}) / (eta * K_i) is formed and these are averaged:
g^{t+1} = mean_S (x^t - y_{i,K}) / (eta * K_i), which is the sheet's formula when all K_i are equal.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from landscape.core.perturb import sam_perturbation
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


def steered(carried: Tensor, g: Tensor, gamma_l: float) -> Tensor:
    """LF: h_i = (1 - gamma_l) h + gamma_l g(y_k), from carried = (1 - gamma_l) h."""
    return carried + gamma_l * g


@dataclass(frozen=True)
class FedVSSAMServer(Tensors):
    h: Tensor  # the global adjusted direction (zeros at t = 0)


@ALGORITHMS.implement("fedvssam")
class FedVSSAM(Algorithm):
    ServerState = FedVSSAMServer

    def init_server_state(self, x: Tensor) -> FedVSSAMServer:
        return FedVSSAMServer(h=torch.zeros_like(x))  # h = 0 at t = 0

    def broadcast(self, x: Tensor, server_state: FedVSSAMServer, round: int) -> dict[str, Tensor]:
        return {"x": x, "h": server_state.h}

    def client_update(
        self, message: dict[str, Tensor], client_state: None, problem: LocalProblem
    ) -> ClientResult:
        x, h = message["x"], message["h"]
        gamma_l, rho = self.options.gamma_l, self.options.rho
        carried = (1 - gamma_l) * h  # (1 - gamma_l) h, the same in every step of the round

        def direction(y: Tensor, batch: Batch) -> tuple[Tensor, Tensor]:
            loss, g = problem.loss_and_grad(y, batch)
            h_i = steered(carried, g, gamma_l)  # LF: h_i = (1 - gamma_l) h + gamma_l g(y_k)
            e = sam_perturbation(h_i, rho)  # LF: y~ = y_k + rho h_i / ||h_i||
            _, g_tilde = problem.loss_and_grad(y + e, batch, update_stats=False)  # g(y~), same batch
            return loss, carried + gamma_l * g_tilde  # LU: u = (1 - gamma_l) h + gamma_l g(y~)

        y, loss = local_sgd(problem, x, direction)  # LU: y_{k+1} = y_k - eta (u + wd y_k)
        return ClientResult(problem.client, y, upload=LocalModel(y), train_loss=loss)

    def perturbation_direction(self, message: dict[str, Tensor], client_state: None, g: Tensor) -> Tensor:
        gamma_l = self.options.gamma_l
        return steered((1 - gamma_l) * message["h"], g, gamma_l)  # LF: e = rho h_i / ||h_i||

    def aggregate(
        self, x: Tensor, server_state: FedVSSAMServer, uploads: Sequence[LocalModel],
        server_round: ServerRound,
    ) -> tuple[Tensor, FedVSSAMServer]:
        gamma_g, lr = self.options.gamma_g, server_round.lr
        # g^{t+1} = mean_S (x^t - y_{i,K}) / (eta K_i)
        steps = server_round.num_steps
        g_new = torch.stack([(x - u.model) / (lr * k) for u, k in zip(uploads, steps)]).mean(dim=0)
        h = (1 - gamma_g) * server_state.h + gamma_g * g_new  # GU: h = (1 - gamma_g) h + gamma_g g^{t+1}
        return x - self.server_lr * h, FedVSSAMServer(h)  # GU: x^{t+1} = x^t - eta_g h
