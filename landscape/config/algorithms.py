"""The algorithms a recipe may name, declared: each with its display label (FedSAM, FedNSAM, ...), a one-line
summary and its options dataclass (the recipe's ``[algorithm]`` keys with the reference defaults: the SAM radius
rho, the momentum lam, ...).

These are the entries of the one registry (``landscape.core.registry``) whose code, the algorithm class, is
attached by ``@ALGORITHMS.implement(name)`` in its module of ``landscape.train.algorithms``. Declared here,
apart from that code, a recipe checks its ``[algorithm]`` table and figures read an algorithm's label without
importing torch or training. An algorithm of a user's module declares and implements itself at once
(``@ALGORITHMS.register(name, label=..., options=...)``); one without a label is labelled by its name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from landscape.core.errors import LandscapeError
from landscape.core.registry import Entry, Registry
from landscape.core.schema import rule


@dataclass(frozen=True, kw_only=True)
class AlgorithmEntry(Entry):
    """A declared algorithm: its label in legends and tables ('' for its name) besides ``Entry``'s name,
    summary, options and code (``factory``: the ``Algorithm`` class)."""

    label: str = ""

    @property
    def display(self) -> str:
        """Its label, or its name where it has none (a user's algorithm)."""
        return self.label or self.name


class AlgorithmRegistry(Registry[AlgorithmEntry]):
    """The algorithms by name; implementing one also gives its class its ``name`` and display ``label``."""

    def __init__(self) -> None:
        super().__init__("algorithm", AlgorithmEntry)

    def _attached(self, entry: AlgorithmEntry) -> None:
        entry.factory.name, entry.factory.label = entry.name, entry.display


ALGORITHMS = AlgorithmRegistry()


def algorithm_label(name: str) -> str:
    """The display label of algorithm ``name``; the name itself for one not declared (a user's own, not
    imported) or declared without a label."""
    return ALGORITHMS.get(name).display if name in ALGORITHMS else name


# The kind of a server (or global) momentum coefficient lam of an options dataclass: 0 <= lam < 1.
Momentum = Annotated[float, rule(ge=0, lt=1, text="must be in [0, 1)")]
# The kind of a SAM radius.
Radius = Annotated[float, rule(ge=0)]
# The kind of a mixing weight in (0, 1].
Weight = Annotated[float, rule(gt=0, le=1, text="must be in (0, 1]")]


ALGORITHMS.declare("fedavg", label="FedAvg",
                   summary="FedAvg (McMahan et al. 2017): local SGD, average of client updates")


@dataclass(frozen=True)
class FedProxOptions:
    mu: Annotated[float, rule(ge=0)] = 0.01  # proximal weight


ALGORITHMS.declare("fedprox", label="FedProx", options=FedProxOptions,
                   summary="FedProx (Li et al. 2020): local SGD with a proximal term mu/2 ||y - x||^2")

ALGORITHMS.declare("scaffold", label="SCAFFOLD",
                   summary="SCAFFOLD (Karimireddy et al. 2020): control variates c, c_i correct the client drift")


@dataclass(frozen=True)
class FedSAMOptions:
    rho: Radius = 0.1  # SAM radius


ALGORITHMS.declare("fedsam", label="FedSAM", options=FedSAMOptions,
                   summary="FedSAM (Caldarola et al. 2022): SAM local steps")


@dataclass(frozen=True)
class FedASAMOptions:
    rho: Radius = 0.7  # ASAM radius (in the T-rescaled geometry)
    eta_a: Annotated[float, rule(ge=0)] = 0.2  # ASAM's offset in T = |w| + eta_a


ALGORITHMS.declare("fedasam", label="FedASAM", options=FedASAMOptions,
                   summary="FedASAM (Caldarola et al. 2022): adaptive-SAM (ASAM) local steps")


@dataclass(frozen=True)
class MoFedSAMOptions:
    # weight of the local SAM gradient (1 - alpha on the server momentum)
    alpha: Weight = 0.1
    rho: Radius = 0.1  # SAM radius


ALGORITHMS.declare("mofedsam", label="MoFedSAM", options=MoFedSAMOptions,
                   summary="MoFedSAM (Qu et al. 2022): SAM local steps mixed with the last round's average "
                           "pseudo-gradient")


@dataclass(frozen=True)
class FedGammaOptions:
    rho: Radius = 0.01  # SAM radius


ALGORITHMS.declare("fedgamma", label="FedGAMMA", options=FedGammaOptions,
                   summary="FedGAMMA (Dai et al. 2023): SAM local steps + SCAFFOLD control variates")


@dataclass(frozen=True)
class FedSMOOOptions:
    rho: Radius = 0.1  # SAM radius (and of the global correction s)
    lam: Annotated[float, rule(ge=0)] = 0.1  # weight of the dynamic regulariser lam * (y - x^t + h_i)


ALGORITHMS.declare("fedsmoo", label="FedSMOO", options=FedSMOOOptions,
                   summary="FedSMOO (Sun et al. 2023): SAM with dual-corrected perturbation and a dynamic "
                           "regulariser")


@dataclass(frozen=True)
class FedLESAMOptions:
    # perturbation radius along the estimated global ascent direction
    rho: Radius = 0.05


ALGORITHMS.declare("fedlesam", label="FedLESAM", options=FedLESAMOptions,
                   summary="FedLESAM (Fan et al. 2024): SAM along a locally estimated global perturbation, "
                           "1 backward/step")


@dataclass(frozen=True)
class FedNSAMOptions:
    # global (Nesterov) momentum coefficient
    lam: Momentum = 0.85
    rho: Radius = 0.1  # SAM radius


ALGORITHMS.declare("fednsam", label="FedNSAM", options=FedNSAMOptions,
                   summary="FedNSAM (Liu et al. 2026): SAM perturbed along the global Nesterov momentum, server "
                           "momentum")


@dataclass(frozen=True)
class FedNSAMCodeOptions:
    # global momentum coefficient (the code's gamma)
    lam: Momentum = 0.85
    rho: Radius = 0.05  # SAM radius (the code's value)
    # "momentum" (paper) or "latest-revision" (defect: m = (1 + lam) Delta_bar)
    server: Literal["momentum", "latest-revision"] = "momentum"


ALGORITHMS.declare("fednsam-code", label="FedNSAM (code)", options=FedNSAMCodeOptions,
                   summary="FedNSAM as the public code runs it: local SAM from the look-ahead x + lam m, server "
                           "momentum")


@dataclass(frozen=True)
class FedVSSAMOptions:
    # local mixing weight of the fresh gradient against h (LF, LU)
    gamma_l: Weight = 0.4
    # global mixing weight of the round's pseudo-gradient against h (GU)
    gamma_g: Weight = 0.6
    rho: Radius = 0.05  # SAM radius


ALGORITHMS.declare("fedvssam", label="FedVSSAM", options=FedVSSAMOptions,
                   summary="FedVSSAM (2026): SAM on a gradient mixed with the global direction, server momentum "
                           "on it")


@dataclass(frozen=True)
class FedACGOptions:
    # server momentum coefficient (lookahead)
    lam: Momentum = 0.85
    beta: Annotated[float, rule(ge=0)] = 1e-3  # weight of the proximal term beta * ||y - x~||^2


ALGORITHMS.declare("fedacg", label="FedACG", options=FedACGOptions,
                   summary="FedACG (Kim et al. 2024): server momentum broadcast as a lookahead, proximal local "
                           "steps")


@dataclass(frozen=True)
class DynSAMOptions:
    a: Annotated[float, rule(ge=0)] = 0.4  # weight of the gradient misalignment 1 - gamma_k in lambda_k
    b: Annotated[float, rule(ge=0)] = 0.5  # weight of the local sharpness sigma_k
    c: Annotated[float, rule(ge=0)] = 0.1  # weight of the gradient-angle instability tau_k
    lambda_min: Annotated[float, rule(ge=0)] = 0.01  # lambda_k is clipped to [lambda_min, lambda_max]
    lambda_max: float = 0.3
    rho_min: Annotated[float, rule(ge=0)] = 0.001  # rho_k = max(rho_min, rho_max * exp(-lambda_k))
    rho_max: float = 0.05
    # participations with lambda_k = 0, rho_k = rho_max
    warmup: Annotated[int, rule("stats need an earlier participation", ge=1)] = 3
    # participations whose final gradients define tau_k
    history: Annotated[int, rule("an angle needs two participations", ge=2)] = 5

    def __post_init__(self) -> None:
        if self.lambda_max < self.lambda_min:
            raise LandscapeError(
                f"algorithm.lambda_max must be >= lambda_min ({self.lambda_min}) (got {self.lambda_max})"
            )
        if self.rho_max < self.rho_min:
            raise LandscapeError(
                f"algorithm.rho_max must be >= rho_min ({self.rho_min}) (got {self.rho_max})"
            )


ALGORITHMS.declare("dynsam", label="DynSAM", options=DynSAMOptions,
                   summary="Dynamic-radius SAM (heuristic): per-client radius and proximal weight from local "
                           "statistics")
