"""FedSAM (Caldarola et al. ECCV 2022; Qu et al. ICML 2022): SAM as the client optimiser.

client: e = rho * g(y_k) / ||g(y_k)||;  d = g(y_k + e) on the same batch;
        y_{k+1} = y_k - eta * (d + wd * y_k).
server: FedAvg. Reference rho 0.1 (CNN: lr 0.01, wd 4e-4, E = 1, batch 64; or ResNet-18-GN).
"""

from __future__ import annotations

from torch import Tensor

from landscape.core.perturb import sam_perturbation
from landscape.train.algorithms import (
    ALGORITHMS,
    Algorithm,
    Batch,
    ClientResult,
    LocalModel,
    LocalProblem,
    local_sgd,
)


def sam_direction(problem: LocalProblem, rho: float):
    """d(y; B) = g(y + e; B) with e = rho * g(y; B) / ||g(y; B)||: the SAM descent gradient (two backward
    passes)."""

    def direction(y: Tensor, batch: Batch) -> tuple[Tensor, Tensor]:
        loss, g = problem.loss_and_grad(y, batch)
        e = sam_perturbation(g, rho)  # ascent step to the (first-order) worst point of the rho-ball
        _, d = problem.loss_and_grad(y + e, batch, update_stats=False)  # gradient there, same batch
        return loss, d

    return direction


@ALGORITHMS.implement("fedsam")
class FedSAM(Algorithm):
    def client_update(
        self, message: dict[str, Tensor], client_state: None, problem: LocalProblem
    ) -> ClientResult:
        x = message["x"]
        y, loss = local_sgd(problem, x, sam_direction(problem, self.options.rho))
        return ClientResult(problem.client, y, upload=LocalModel(y), train_loss=loss)

    def perturbation_direction(self, message: dict[str, Tensor], client_state: None, g: Tensor) -> Tensor:
        return g  # e = rho g / ||g|| (sam_direction)
