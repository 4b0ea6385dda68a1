"""FedNSAM as the public reference code runs it (Liu et al. 2026; docs/algorithms.md variant "official-code").

client: starts at the look-ahead x~ = x^t + lam * m^{t-1};  local-gradient SAM from there (y_0 = x~):
    e = rho * g(y_k) / ||g(y_k)||;  d = g(y_k + e) (same batch);  y_{k+1} = y_k - eta * (d + wd * y_k);
    Delta_i = y_{i,K} - x~  (relative to the look-ahead start, not to x^t).
server, option ``server``:
  "momentum" (default, the paper's momentum; what the reference code's momentum update computes):
      m^t = lam * m^{t-1} + Delta_bar^t;   x^{t+1} = x^t + eta_g * m^t.
      At eta_g = 1 this is x^{t+1} = x~ + Delta_bar = mean_S(y_{i,K}): the new model is the clients' average.
  "latest-revision" (a DEFECT, reproduced only for side-by-side study): the latest public revision loops over
      the keys of the averaged update and writes m[k] = lam * v + Delta_bar[k] with v = Delta_bar[k], so
      m^t = (1 + lam) * Delta_bar^t (the previous momentum is dropped) for t >= 1, while round 0 keeps the
      code's initialisation of its empty momentum, m^0 = Delta_bar^0;  x^{t+1} = x^t + eta_g * m^t as above.
      The server steps from x^t, not from x~, with an over-scaled update and no momentum memory.
eta_g (train.server_lr) scales the step x^t -> x^{t+1} (the public code has no server lr: eta_g = 1 there).
Reference: lam (``gamma`` in the code) 0.85, rho 0.05 (the code's value), weight decay 1e-3, clip at 10,
lr 0.1 cosine, K = 50, batch 50. Downlink (x^t, m^{t-1}), uplink y_{i,K} only (as many floats as Delta_i).
With lam = 0 either server is FedSAM, bit for bit (tests/train/test_algorithms_global.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor

from landscape.train.algorithms import (
    ALGORITHMS,
    ClientResult,
    LocalModel,
    LocalProblem,
    ServerRound,
    local_sgd,
    mean_model,
)
from landscape.train.algorithms.fednsam import FedNSAM, FedNSAMServer
from landscape.train.algorithms.fedsam import sam_direction


@ALGORITHMS.implement("fednsam-code")
class FedNSAMCode(FedNSAM):
    """FedNSAM's server state and broadcast (m, sent with x); the public code's client and server rules."""

    def start_point(self, message: dict[str, Tensor]) -> Tensor:
        return message["x"] + self.options.lam * message["m"]  # x~ = x^t + lam m^{t-1}

    def client_update(
        self, message: dict[str, Tensor], client_state: None, problem: LocalProblem
    ) -> ClientResult:
        start = self.start_point(message)  # x~ = x^t + lam m^{t-1}
        y, loss = local_sgd(problem, start, sam_direction(problem, self.options.rho))  # local SAM from x~
        # the server forms Delta_i = y_{i,K} - x~
        return ClientResult(problem.client, y, upload=LocalModel(y), train_loss=loss)

    def perturbation_direction(self, message: dict[str, Tensor], client_state: None, g: Tensor) -> Tensor:
        return g  # e = rho g / ||g||, local SAM (from the look-ahead x~: g is the gradient there)

    def aggregate(
        self, x: Tensor, server_state: FedNSAMServer, uploads: Sequence[LocalModel], server_round: ServerRound
    ) -> tuple[Tensor, FedNSAMServer]:
        lam = self.options.lam
        start = x + lam * server_state.m  # x~, the point every client started from this round
        delta_bar = mean_model(uploads) - start  # mean_S(y_{i,K}) - x~
        if self.options.server == "momentum":
            m = lam * server_state.m + delta_bar  # m^t = lam m^{t-1} + Delta_bar^t
        elif server_round.round == 0:
            m = delta_bar  # latest revision, first round: its empty momentum becomes Delta_bar^0
        else:
            m = (1 + lam) * delta_bar  # latest revision (defect): m^t = (1 + lam) Delta_bar^t, no m^{t-1}
        return x + self.server_lr * m, FedNSAMServer(m)  # x^{t+1} = x^t + eta_g m^t
