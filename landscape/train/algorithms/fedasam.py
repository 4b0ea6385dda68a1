"""FedASAM (Caldarola et al. ECCV 2022): adaptive SAM (ASAM, Kwon et al. ICML 2021) as the client optimiser.

T = |w| + eta_a on weight tensors, T = 1 on biases (the reference rule: every tensor named ``weight``);
client: e = rho * T^2 g(y_k) / ||T g(y_k)|| (T from y_k);  d = g(y_k + e) on the same batch;
        y_{k+1} = y_k - eta * (d + wd * y_k).
server: FedAvg. Reference rho 0.7, eta_a 0.2 (CNN setting). With rho = 0 it is FedAvg.
"""

from __future__ import annotations

from torch import Tensor

from landscape.core import perturb
from landscape.train.algorithms import (
    ALGORITHMS,
    Algorithm,
    Batch,
    ClientResult,
    LocalModel,
    LocalProblem,
    local_sgd,
)


def asam_direction(problem: LocalProblem, rho: float, eta_a: float, weight_mask: Tensor):
    """d(y; B) = g(y + e; B), e = rho * T^2 g(y; B) / ||T g(y; B)||: ASAM's descent gradient (2 backwards)."""

    def direction(y: Tensor, batch: Batch) -> tuple[Tensor, Tensor]:
        loss, g = problem.loss_and_grad(y, batch)
        e = perturb.asam_perturbation(g, y, rho, eta_a, weight_mask)  # e = rho T^2 g / ||T g||, T from y_k
        _, d = problem.loss_and_grad(y + e, batch, update_stats=False)  # d = g(y_k + e), same batch
        return loss, d

    return direction


@ALGORITHMS.implement("fedasam")
class FedASAM(Algorithm):
    def client_update(
        self, message: dict[str, Tensor], client_state: None, problem: LocalProblem
    ) -> ClientResult:
        x = message["x"]
        mask = self.layout.mask(perturb.is_weight, like=x)  # 1 where T = |w| + eta_a, 0 where T = 1
        direction = asam_direction(problem, self.options.rho, self.options.eta_a, mask)
        y, loss = local_sgd(problem, x, direction)  # y_{k+1} = y_k - eta * (d + wd * y_k)
        return ClientResult(problem.client, y, upload=LocalModel(y), train_loss=loss)

    def perturbation_direction(self, message: dict[str, Tensor], client_state: None, g: Tensor) -> Tensor:
        x = message["x"]  # y_0: T = |y_0| + eta_a on weights
        mask = self.layout.mask(perturb.is_weight, like=x)
        return perturb.asam_perturbation(g, x, 1.0, self.options.eta_a, mask)  # T^2 g / ||T g||: e at rho = 1
