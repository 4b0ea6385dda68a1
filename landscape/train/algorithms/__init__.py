"""Federated algorithms, one module each, implementing the algorithms declared in ``landscape.config.algorithms``.

An algorithm is a client rule, a server rule and their state (the optax / Flower split):

- ``init_server_state(x)``: the server's state (momentum, control variates, ...), an instance of the class's
  ``ServerState``.
- ``broadcast(x, server_state, round)``: what the server sends down (always ``"x"``: the global model, or e.g.
  FedACG's lookahead x^t + lam*m).
- ``start_point(message)``: the model the clients start their local steps from, given the broadcast:
  ``message["x"]``, unless the client rule starts elsewhere (fednsam-code: x^t + lam*m from ``"x"`` and
  ``"m"``).
  The alignment pass measures the client updates Delta_i = y_i - start_point from it.
- ``client_update(message, client_state, problem)``: the local rule, from the client's ``ClientState`` (None
  before its first participation, and for a rule that keeps none); returns the client's final model, what it
  sends up (an ``Upload``, counted as uplink floats) and its new persistent state.
- ``perturbation_direction(message, client_state, g)``: the direction of the perturbation a SAM-type rule
  applies at a round's first local step, from its minibatch gradient g (None: it applies none); the
  incompatibility pass measures it.
- ``aggregate(x, server_state, uploads, server_round)``: the server rule, from the round's uploads alone (a
  rule that needs the clients' models uploads them); returns the new global model and server state.

Server state, client state and upload are frozen dataclasses of named tensors (``Tensors``); checkpoints hold
them as tables by field name. State tensors live on the training device while in use; the loop keeps client
states on the CPU between rounds and saves both in checkpoints. Hyper-parameters come from the algorithm's
options dataclass (the recipe's ``[algorithm]`` keys, reference defaults); none is hard-coded in a rule.

Every module in this package is imported on first use. A built-in algorithm is declared (label, summary,
options) in ``landscape.config.algorithms``, which recipes and figures read without importing torch, and its class
here attaches with ``@ALGORITHMS.implement(name)``; an algorithm of a user's module declares and implements itself
at once with ``@ALGORITHMS.register(name, label=..., options=...)``.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import pkgutil
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from landscape.config.algorithms import ALGORITHMS

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


@dataclass(frozen=True)
class Tensors:
    """Base of an algorithm's server state, client state and upload: a frozen dataclass of named tensors,
    saved in checkpoints (and sent between ranks) as a table by field name."""

    @classmethod
    def names(cls) -> list[str]:
        """The field names, in declaration order."""
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def from_named(cls, tensors: Mapping[str, Tensor]) -> Tensors:
        """This class from a table of named tensors, a checkpoint's: its keys are the field names. A missing
        field is a KeyError naming it, a key that is no field a ValueError."""
        unknown = sorted(set(tensors) - set(cls.names()))
        if unknown:
            raise ValueError(f"'{unknown[0]}' is not one of the tensors of {cls.__name__} "
                             f"({', '.join(cls.names()) or 'none'})")
        return cls(**{name: tensors[name] for name in cls.names()})

    def named(self) -> dict[str, Tensor]:
        """The tensors by field name, in declaration order (the table a checkpoint holds)."""
        return {name: getattr(self, name) for name in self.names()}

    def to(self, device: torch.device | str) -> Tensors:
        """The same tensors (of the same class) on ``device``."""
        return type(self).from_named({k: v.to(device) for k, v in self.named().items()})

    @property
    def floats(self) -> int:
        """How many numbers the tensors hold (of an upload: its uplink cost)."""
        return sum(t.numel() for t in self.named().values())


@dataclass(frozen=True)
class NoState(Tensors):
    """No tensors: the server or client state of a rule that keeps none."""


@dataclass(frozen=True)
class LocalModel(Tensors):
    """The upload of a rule whose server reads only the client's final model (as many floats as Delta_i)."""

    model: Tensor  # y_{i,K}


@dataclass(frozen=True)
class ServerRound:
    """What the server knows of round t besides the uploads: t, the clients' learning rate eta and the number
    of local steps K_i of each upload's client (in the order of the uploads)."""

    round: int
    lr: float
    num_steps: tuple[int, ...]


@dataclass
class ClientResult:
    """One client's round: its final model, its upload and its new persistent state."""

    client: int
    model: Tensor  # y_{i,K}: the client's final local model (for the loop's metrics and kept clients)
    upload: Tensors  # what crosses the wire up: all that the server rule reads (its size is the uplink cost)
    state: Tensors | None = None  # the client's persistent state after the round (None: the rule keeps none)
    train_loss: Tensor | float = float("nan")  # mean minibatch loss over the local steps
    num_steps: int = 0  # K of this client this round (filled in by the loop)

    @property
    def uplink_floats(self) -> int:
        return self.upload.floats


def mean_model(uploads: Sequence[Tensors]) -> Tensor:
    """mean_S(y_{i,K}): the average of the uploaded client models."""
    return torch.stack([u.model for u in uploads]).mean(dim=0)


class Algorithm(ABC):
    """Base class: FedAvg's server rule and a plain broadcast; subclasses give their own rules.

    A subclass names the classes of what it keeps and sends: ``ServerState``, ``ClientState`` (``NoState``:
    none) and ``Upload``; registration gives it its ``name`` and display ``label``."""

    ServerState: ClassVar[type[Tensors]] = NoState
    ClientState: ClassVar[type[Tensors]] = NoState
    Upload: ClassVar[type[Tensors]] = LocalModel
    name: ClassVar[str]
    label: ClassVar[str]

    def __init__(self, options, *, num_clients: int, server_lr: float, layout: ParamLayout) -> None:
        self.options = options
        self.num_clients = num_clients
        self.server_lr = server_lr
        self.layout = layout

    def init_server_state(self, x: Tensor) -> Tensors:
        return NoState()

    def broadcast(self, x: Tensor, server_state: Tensors, round: int) -> dict[str, Tensor]:
        return {"x": x}

    def start_point(self, message: dict[str, Tensor]) -> Tensor:
        """The model the clients start their local steps from, given the server's ``broadcast``."""
        return message["x"]

    @abstractmethod
    def client_update(
        self, message: dict[str, Tensor], client_state: Tensors | None, problem: LocalProblem
    ) -> ClientResult:
        """The client rule: K local steps from what the server sent (``client_state`` None before the client's
        first participation)."""

    def perturbation_direction(self, message: dict[str, Tensor], client_state: Tensors | None,
                               g: Tensor) -> Tensor | None:
        """The direction d of the perturbation the client rule applies at its first local step of a round, given
        its minibatch gradient g there: the perturbation is a positive multiple of d (rho d / ||d|| but for
        ASAM's); None: the rule applies none. The incompatibility pass measures it (docs/metrics.md)."""
        return None

    def aggregate(
        self, x: Tensor, server_state: Tensors, uploads: Sequence[Tensors], server_round: ServerRound
    ) -> tuple[Tensor, Tensors]:
        """The server rule, from the round's uploads: the new global model and server state."""
        # FedAvg server: x^{t+1} = x^t + eta_g * mean_S(Delta_i), Delta_i = y_{i,K} - x^t.
        delta_bar = mean_model(uploads) - x
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


def build_algorithm(recipe: Any, layout: ParamLayout) -> Algorithm:
    """The algorithm of ``recipe`` (a resolved ``landscape.config.recipe.Recipe``) with its options: the
    trainer's, and the alignment pass's to rebuild a broadcast."""
    entry = ALGORITHMS.get(recipe.algorithm.name)
    # Checked by the options' schema again: a recorded recipe read without the algorithms holds them as written.
    options = entry.make_options(dict(recipe.algorithm.options), "algorithm", noun="recipe key")
    return entry.factory(options, num_clients=recipe.partition.clients, server_lr=recipe.train.server_lr,
                         layout=layout)


def _import_all() -> None:
    for module in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{module.name}")


_import_all()
