"""FedSMOO (Sun et al. ICML 2023, "Dynamic Regularized Sharpness Aware Minimization in Federated Learning").

state: client dual mu_i and dynamic regulariser h_i (zeros until client i is first sampled); the global
perturbation correction s (server, zeros at t = 0). Per local step, on one batch:
    g = g(y_k);   g' = g - (mu_i + s);   e = rho * g' / ||g'||;   mu_i += e - s;
    d = g(y_k + e) + lam * (y_k - x^t + h_i) + wd * y_k;          y_{k+1} = y_k - eta * d.
server: h_i += Delta_i (sampled i);   s = rho * mean_S(mu_i) / ||mean_S(mu_i)||;
        x^{t+1} = mean_S(y_{i,K}) + mean_{all N}(h_i).
Reference rho 0.1, lam 0.1.

Where the state lives: the sheet keeps mu_i and h_i "on the server for every client"; here they are client
state (the loop stores it per client between rounds and checkpoints it): the same thing in a simulation.
- h_i += Delta_i uses only the client's own Delta_i, so the client returns its updated h_i; the server keeps
  the running sum H = sum over all N clients of h_i (H += Delta_i for each sampled i; never-sampled clients
  have h_i = 0), so mean_{all N}(h_i) = H / N without holding N vectors.
- The server needs the sampled clients' updated mu_i for s, so mu_i is uploaded with y_{i,K} (from which the
  server forms Delta_i): FedSMOO's uplink is 2x FedAvg's (what the sheet's server-side mu_i costs in a real
  deployment). s is broadcast with x^t.
eta_g (train.server_lr, absent from the sheet) scales the average step:
    x^{t+1} = x^t + eta_g * Delta_bar + H / N,   which is the sheet's rule at the default eta_g = 1.
Against FL-Simulator's fedsmoo the signs agree (its SGD weight decay wd + lam and its lam * <y, h_i - x^t>
term give the same d; it adds 1e-7 to ||.|| where the zero vector stays zero here). One difference: there,
clipping acts on g(y + e) + lam * (h_i - x^t) and lam * y is added after it; here the optional clip acts on
the whole g(y + e) + lam * (y - x^t + h_i), like every descent gradient in this package (clip default off).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from landscape.core.perturb import normalized, sam_perturbation
from landscape.train.algorithms import (
    ALGORITHMS,
    Algorithm,
    ClientResult,
    LocalProblem,
    ServerRound,
    Tensors,
    mean_model,
)


def corrected_gradient(g: Tensor, mu: Tensor, s: Tensor) -> Tensor:
    """g' = g - (mu_i + s): the gradient whose direction FedSMOO perturbs along."""
    return g - (mu + s)


@dataclass(frozen=True)
class FedSMOOServer(Tensors):
    s: Tensor  # the global perturbation correction (zeros at t = 0)
    h_sum: Tensor  # H = sum over all N clients of h_i


@dataclass(frozen=True)
class FedSMOOClient(Tensors):
    mu: Tensor  # the client's dual mu_i
    h: Tensor  # the client's dynamic regulariser h_i


@dataclass(frozen=True)
class FedSMOOUpload(Tensors):
    model: Tensor  # y_{i,K} (the server forms Delta_i = y_{i,K} - x^t from it)
    mu: Tensor  # mu_i, for s


@ALGORITHMS.implement("fedsmoo")
class FedSMOO(Algorithm):
    ServerState = FedSMOOServer
    ClientState = FedSMOOClient
    Upload = FedSMOOUpload

    def init_server_state(self, x: Tensor) -> FedSMOOServer:
        return FedSMOOServer(s=torch.zeros_like(x), h_sum=torch.zeros_like(x))

    def broadcast(self, x: Tensor, server_state: FedSMOOServer, round: int) -> dict[str, Tensor]:
        return {"x": x, "s": server_state.s}

    def client_update(
        self, message: dict[str, Tensor], client_state: FedSMOOClient | None, problem: LocalProblem
    ) -> ClientResult:
        x, s = message["x"], message["s"]
        rho, lam = self.options.rho, self.options.lam
        mu = client_state.mu if client_state is not None else torch.zeros_like(x)
        h = client_state.h if client_state is not None else torch.zeros_like(x)
        anchor = h - x  # lam (y - x^t + h_i) = lam (y + anchor): x^t and h_i are fixed during the round
        y = x.clone()
        total = torch.zeros((), dtype=torch.float64, device=x.device)
        steps = 0
        for batch in problem.batches():
            loss, g = problem.loss_and_grad(y, batch)  # g = g(y_k)
            e = sam_perturbation(corrected_gradient(g, mu, s), rho)  # g' = g - (mu_i + s);  e = rho g' / ||g'||
            mu = mu + e - s  # mu_i += e - s
            _, g_pert = problem.loss_and_grad(y + e, batch, update_stats=False)  # g(y_k + e), same batch
            d = g_pert + lam * (y + anchor)  # d = g(y_k + e) + lam (y_k - x^t + h_i)   (+ wd y_k in descent)
            y = y - problem.lr * problem.descent(d, y)  # y_{k+1} = y_k - eta (d + wd y_k)
            total += loss.double()
            steps += 1
        delta = y - x  # Delta_i
        return ClientResult(
            problem.client, y,
            upload=FedSMOOUpload(model=y, mu=mu),  # mu_i goes up for s: 2x uplink
            state=FedSMOOClient(mu=mu, h=h + delta),  # h_i += Delta_i
            train_loss=total / max(steps, 1),
        )

    def perturbation_direction(self, message: dict[str, Tensor], client_state: FedSMOOClient | None,
                               g: Tensor) -> Tensor:
        mu = client_state.mu if client_state is not None else torch.zeros_like(g)  # mu_i at the round's start
        return corrected_gradient(g, mu, message["s"])  # e = rho g' / ||g'||

    def aggregate(
        self, x: Tensor, server_state: FedSMOOServer, uploads: Sequence[FedSMOOUpload],
        server_round: ServerRound,
    ) -> tuple[Tensor, FedSMOOServer]:
        deltas = torch.stack([u.model - x for u in uploads])  # Delta_i = y_{i,K} - x^t, the client's
        h_sum = server_state.h_sum + deltas.sum(dim=0)  # h_i += Delta_i (sampled i), kept as sum_N h_i
        s = self.options.rho * normalized(torch.stack([u.mu for u in uploads]).mean(dim=0))
        # s = rho mean_S(mu_i) / ||mean_S(mu_i)||
        delta_bar = mean_model(uploads) - x  # mean_S(y_{i,K}) - x^t
        # x^{t+1} = mean_S(y_{i,K}) + mean_{all N}(h_i)  (at eta_g = 1)
        x_new = x + self.server_lr * delta_bar + h_sum / self.num_clients
        return x_new, FedSMOOServer(s=s, h_sum=h_sum)
