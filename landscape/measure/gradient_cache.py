"""What several analysis passes of one checkpoint compute at the same point x, computed once (issue 23).

The passes of a checkpoint share one ``CheckpointContext`` (the scheduler keeps it until the next checkpoint),
and with it one ``GradientCache`` at its w. In it:

- full gradients (F(x), grad F(x)) of an objective: the global F and each client's F_i. The alignment,
  incompatibility and sharpness passes all need grad F and every grad F_i at x (the sharpness profiles
  start their ascents there, twice: plain and adaptive);
- the minibatch gradients g_i^B at x of one client's seeded draws, keyed by what determines them (the
  client's objective, the client id, the batch size, the number of draws, the seed): the alignment pass's
  within-client cosines and the incompatibility pass's e_i^B use the same draws (``flatness.client_minibatches``);
- results of deterministic computations named by a key (``remember``): the sharpness ascent of one radius,
  which the global profile and the local-sharpness comparison both run at ``local_rho``, and the seeded start
  directions of the ascents, the same for every radius, profile and client (8 Gaussian vectors of the
  model's size, drawn once per checkpoint rather than once per client).

A cached value is the value the same call computes without the cache (it is that call, made once), so the
numbers of every pass are bitwise those of the uncached path; the functions take the cache as an optional
``gradients`` argument and compute directly without it (the notebook API). Objectives are keys by identity
(the context builds each client's objective once), and every lookup checks that it is made at the cache's w.

Memory: a value is kept only while all kept values together stay within ``budget`` bytes (default
``CACHE_FRACTION`` of the memory free on w's device when the cache is made, CPU: MemAvailable); past it a
value is computed again on each request (the same numbers; only the sharing is lost). 100 clients x 8 draws of
a 53k-parameter CNN in float32 hold 170 MB; a ResNet-18 at that count would not fit, and is recomputed.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, TypeVar

import torch
from torch import Tensor

from landscape.core.errors import LandscapeError

# Kept values may take at most this fraction of the memory free on the device when the cache is made.
CACHE_FRACTION = 0.25

T = TypeVar("T")


def _tensor_bytes(value: Any) -> int:
    """Bytes of the tensors in ``value`` (a tensor, or tuples, lists and dicts of them; others count 0)."""
    if isinstance(value, Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (tuple, list)):
        return sum(_tensor_bytes(v) for v in value)
    if isinstance(value, dict):
        return sum(_tensor_bytes(v) for v in value.values())
    return 0


class GradientCache:
    """Values at one point ``w`` shared by the passes of a checkpoint (module docstring).

    ``hits`` / ``misses`` count the lookups answered from the cache and computed; ``kept_bytes`` what is held.
    """

    def __init__(self, w: Tensor, budget: int | None = None) -> None:
        if budget is not None and budget < 0:
            raise LandscapeError(f"the gradient cache budget must be >= 0 bytes, got {budget}")
        self.w = w.detach()
        if budget is None:
            from landscape.measure.operator import free_memory

            free = free_memory(self.w.device)
            budget = 0 if free is None else int(CACHE_FRACTION * free)
        self.budget = budget
        self.kept_bytes = 0
        self.hits = 0
        self.misses = 0
        self._values: dict[tuple, Any] = {}
        self._held: dict[int, Any] = {}  # the objects named by identity in keys, kept alive (ids stay unique)

    def _check_point(self, w: Tensor) -> None:
        """The lookup is made at the cache's w (the same storage, or equal values)."""
        same = (w.data_ptr() == self.w.data_ptr() and w.shape == self.w.shape and w.dtype == self.w.dtype
                and w.device == self.w.device)
        if not same and not (w.shape == self.w.shape and torch.equal(w.detach().to(self.w), self.w)):
            raise LandscapeError("the precomputed gradients are at another point than the one asked about: "
                                 "give the cache made at this w (or none)")

    def _key(self, parts: tuple) -> tuple:
        """``parts`` with every object that is not a plain hashable value replaced by its identity."""
        key = []
        for part in parts:
            if part is None or isinstance(part, (bool, int, float, str)):
                key.append(part)
            else:
                self._held[id(part)] = part
                key.append(("id", id(part)))
        return tuple(key)

    def remember(self, parts: tuple[Hashable | object, ...], w: Tensor, compute: Callable[[], T]) -> T:
        """The value of ``compute()`` at ``w`` for the key ``parts`` (objects such as objectives by identity):
        computed on the first request and kept while the budget allows."""
        self._check_point(w)
        key = self._key(parts)
        if key in self._values:
            self.hits += 1
            return self._values[key]
        self.misses += 1
        value = compute()
        size = _tensor_bytes(value)
        if self.kept_bytes + size <= self.budget:
            self._values[key] = value
            self.kept_bytes += size
        return value


def full_gradient(objective: Any, w: Tensor, gradients: GradientCache | None = None) -> tuple[Tensor, Tensor]:
    """(F(w), grad F(w)) of ``objective`` over its whole data (``objective.loss_and_grad``), from ``gradients``
    when given (computed there once per objective)."""
    if gradients is None:
        return objective.loss_and_grad(w)
    return gradients.remember(("full gradient", objective), w, lambda: objective.loss_and_grad(w))
