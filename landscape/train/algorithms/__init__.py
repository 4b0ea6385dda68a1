"""Federated algorithms, one module each, registered by name.

An algorithm is a client rule, a server rule and their state (the optax / Flower split):

- ``init_server_state(x)``: the server's state tensors (momentum, control variates, ...).
- ``broadcast(x, server_state, round)``: what the server sends down (always ``"x"``: the global model, or e.g.
  FedACG's lookahead x^t + lam*m).
- ``start_point(message)``: the model the clients start their local steps from, given the broadcast:
  ``message["x"]``, unless the client rule starts elsewhere (fednsam-code: x^t + lam*m from ``"x"`` and ``"m"``).
  The alignment pass measures the client updates Delta_i = y_i - start_point from it.
- ``client_update(message, client_state, problem)``: the local rule; returns the client's final model, what it
  sends up (``upload``, counted as uplink floats) and its new persistent state.
- ``aggregate(x, server_state, results, round, lr)``: the server rule; returns the new global model and state.

State tensors live on the training device while in use; the loop keeps client states on the CPU between
rounds and saves both in checkpoints. Hyper-parameters come from the algorithm's options dataclass (the
recipe's ``[algorithm]`` keys, reference defaults); none is hard-coded in a rule.

Every module in this package is imported on first use, so adding an algorithm is adding one file.
"""

from __future__ import annotations

import importlib
import math
import pkgutil
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from landscape.registry import Registry

Batch = tuple[Tensor, Tensor]


@dataclass(frozen=True)
class ParamLayout:
    """Names and shapes of the tensors packed into the flat parameter vector, in order."""

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]

    @property
    def numels(self) -> list[int]:
        return [math.prod(s) for s in self.shapes]

    def mask(self, select: Callable[[str, tuple[int, ...]], bool], like: Tensor) -> Tensor:
        """A 0/1 vector shaped like the flat parameters: 1 on the tensors ``select(name, shape)`` picks."""
        parts = [torch.full((n,), float(select(name, shape)), dtype=like.dtype, device=like.device)
                 for name, shape, n in zip(self.names, self.shapes, self.numels)]
        return torch.cat(parts)


@dataclass
class LocalProblem:
    """What one client has in one round: its minibatches, step settings and loss oracle."""

    client: int
    round: int
    lr: float
    weight_decay: float
    clip_norm: float
    num_steps: int
    batch_stream: Callable[[], Iterator[Batch]]
    oracle: Callable[[Tensor, Batch, bool], tuple[Tensor, Tensor]]

    def batches(self) -> Iterator[Batch]:
        """The client's ``num_steps`` minibatches of this round, in order (seeded by seed, round, client)."""
        return self.batch_stream()

    def loss_and_grad(self, w: Tensor, batch: Batch, update_stats: bool = True) -> tuple[Tensor, Tensor]:
        """Minibatch cross-entropy f_i(w; B) and its gradient g(w; B) (no weight decay).

        ``update_stats=False`` for evaluations at perturbed points (y + e): BatchNorm running statistics
        are then left as they were (they move only with the descent point's batches).
        """
        return self.oracle(w, batch, update_stats)

    def descent(self, d: Tensor, y: Tensor) -> Tensor:
        """The descent gradient actually applied: clip(d) + wd * y (wd never enters a perturbation)."""
        if self.clip_norm > 0:
            d = d * torch.clamp(self.clip_norm / (d.norm() + 1e-12), max=1.0)
        if self.weight_decay > 0:
            d = d + self.weight_decay * y
        return d


@dataclass
class ClientResult:
    client: int
    model: Tensor  # y_{i,K}: the client's final local model
    upload: dict[str, Tensor]  # what crosses the wire up (its size is the uplink cost)
    state: dict[str, Tensor] = field(default_factory=dict)  # the client's persistent state after the round
    train_loss: Tensor | float = float("nan")  # mean minibatch loss over the local steps
    num_steps: int = 0  # K of this client this round (filled in by the loop)

    @property
    def uplink_floats(self) -> int:
        return sum(t.numel() for t in self.upload.values())


class Algorithm(ABC):
    """Base class: FedAvg's server rule and a plain broadcast; subclasses give their own rules."""

    def __init__(self, options, *, num_clients: int, server_lr: float, layout: ParamLayout) -> None:
        self.options = options
        self.num_clients = num_clients
        self.server_lr = server_lr
        self.layout = layout

    def init_server_state(self, x: Tensor) -> dict[str, Tensor]:
        return {}

    def broadcast(self, x: Tensor, server_state: dict[str, Tensor], round: int) -> dict[str, Tensor]:
        return {"x": x}

    def start_point(self, message: dict[str, Tensor]) -> Tensor:
        """The model the clients start their local steps from, given the server's ``broadcast``."""
        return message["x"]

    @abstractmethod
    def client_update(
        self, message: dict[str, Tensor], client_state: dict[str, Tensor], problem: LocalProblem
    ) -> ClientResult:
        """The client rule: K local steps from what the server sent."""

    def aggregate(
        self, x: Tensor, server_state: dict[str, Tensor], results: list[ClientResult], round: int, lr: float
    ) -> tuple[Tensor, dict[str, Tensor]]:
        # FedAvg server: x^{t+1} = x^t + eta_g * mean_S(Delta_i), Delta_i = y_{i,K} - x^t.
        delta_bar = torch.stack([r.model for r in results]).mean(dim=0) - x
        return x + self.server_lr * delta_bar, server_state


def local_sgd(
    problem: LocalProblem, start: Tensor, direction: Callable[[Tensor, Batch], tuple[Tensor, Tensor]]
) -> tuple[Tensor, Tensor]:
    """K local steps y_{k+1} = y_k - eta * (clip(d_k) + wd * y_k), d_k = direction(y_k, B_k).

    ``direction`` returns (minibatch loss at y_k, d_k). Returns (y_K, mean loss over the K steps).
    """
    y = start.clone()
    total = torch.zeros((), dtype=torch.float64, device=start.device)
    steps = 0
    for batch in problem.batches():
        loss, d = direction(y, batch)
        y = y - problem.lr * problem.descent(d, y)
        total += loss.double()
        steps += 1
    return y, total / max(steps, 1)


ALGORITHMS: Registry[type[Algorithm]] = Registry("algorithm")


def build_algorithm(recipe: Any, layout: ParamLayout) -> Algorithm:
    """The algorithm of ``recipe`` (a resolved ``landscape.recipe.Recipe``; not imported here: the recipe module
    imports this registry) with its options: the trainer's, and the alignment pass's to rebuild a broadcast."""
    entry = ALGORITHMS.get(recipe.algorithm.name)
    options = entry.make_options(dict(recipe.algorithm.options))
    return entry.factory(options, num_clients=recipe.partition.clients, server_lr=recipe.train.server_lr,
                         layout=layout)


def _import_all() -> None:
    for module in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{module.name}")


_import_all()
