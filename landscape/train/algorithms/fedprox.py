"""FedProx (Li et al., MLSys 2020): local SGD on a proximal objective f_i(y) + (mu/2) * ||y - x^t||^2.

client descent gradient: d = g(y_k) + mu * (y_k - x^t);  y_{k+1} = y_k - eta * (d + wd * y_k).
server: FedAvg, x^{t+1} = x^t + eta_g * Delta_bar.

mu = 0.01 by default: a value of the paper's grid {0.001, 0.01, 0.1, 1} (its best on Sent140) and the
common default of FedProx baselines (e.g. NIID-Bench). Clipping, when on, acts on the whole d (the
proximal term included), as in code that clips the gradient of the full local loss. train_loss is the
minibatch cross-entropy f_i(y_k; B) alone (the proximal term is not added), so it compares with FedAvg's.
"""

from __future__ import annotations

from torch import Tensor

from landscape.train.algorithms import (
    ALGORITHMS,
    Algorithm,
    Batch,
    ClientResult,
    LocalModel,
    LocalProblem,
    local_sgd,
)


@ALGORITHMS.implement("fedprox")
class FedProx(Algorithm):
    def client_update(
        self, message: dict[str, Tensor], client_state: None, problem: LocalProblem
    ) -> ClientResult:
        x = message["x"]
        mu = self.options.mu

        def direction(y: Tensor, batch: Batch) -> tuple[Tensor, Tensor]:
            loss, g = problem.loss_and_grad(y, batch)
            return loss, g + mu * (y - x)  # d = g(y_k) + mu * (y_k - x^t)

        y, loss = local_sgd(problem, x, direction)
        return ClientResult(problem.client, y, upload=LocalModel(y), train_loss=loss)  # server: FedAvg
