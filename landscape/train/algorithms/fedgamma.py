"""FedGAMMA (Dai et al., IEEE TNNLS 2023): SAM local steps with SCAFFOLD control variates.

client: e = rho * g(y_k) / ||g(y_k)|| (the local minibatch gradient, uncorrected);
        d = g(y_k + e) + c - c_i (same batch);  y_{k+1} = y_k - eta * (d + wd * y_k);
        after K steps: c_i+ = c_i - c + (x^t - y_{i,K}) / (K * eta).
server: as SCAFFOLD, x^{t+1} = x^t + eta_g * Delta_bar;  c += (1/N) * sum_{i in S} (c_i+ - c_i).
Reference rho 0.01. With rho = 0 it is SCAFFOLD exactly.

The control-variate rules are SCAFFOLD's (scaffold.py); the SAM gradient is FedSAM's (fedsam.py).
"""

from __future__ import annotations

from torch import Tensor

from landscape.train.algorithms import ALGORITHMS, LocalProblem, Tensors
from landscape.train.algorithms.fedsam import sam_direction
from landscape.train.algorithms.scaffold import Direction, Scaffold


@ALGORITHMS.implement("fedgamma")
class FedGamma(Scaffold):
    def local_direction(self, problem: LocalProblem) -> Direction:
        # e = rho * g / ||g||;  g(y_k + e) on the same batch (SCAFFOLD's rule adds the correction c - c_i)
        return sam_direction(problem, self.options.rho)

    def perturbation_direction(self, message: dict[str, Tensor], client_state: Tensors | None,
                               g: Tensor) -> Tensor:
        return g  # e = rho g / ||g||: the local gradient's, uncorrected (c - c_i enters the descent only)
