"""FedAvg (McMahan et al. 2017).

client: y_{k+1} = y_k - eta * (g(y_k) + wd * y_k).   server: x^{t+1} = x^t + eta_g * Delta_bar.
"""

from __future__ import annotations

from torch import Tensor

from landscape.train.algorithms import (
    ALGORITHMS,
    Algorithm,
    ClientResult,
    LocalModel,
    LocalProblem,
    local_sgd,
)


@ALGORITHMS.implement("fedavg")
class FedAvg(Algorithm):
    def client_update(
        self, message: dict[str, Tensor], client_state: None, problem: LocalProblem
    ) -> ClientResult:
        x = message["x"]
        y, loss = local_sgd(problem, x, problem.loss_and_grad)  # d = g(y_k)
        return ClientResult(problem.client, y, upload=LocalModel(y), train_loss=loss)
