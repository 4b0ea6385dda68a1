"""What several analysis passes share: the hints of their client-count and batch-size options, the
clients' objectives a pass reads (refused in one line on a plain state_dict, which has no clients), and the
spelling of the keys a pass declares for the results table (``measured``, ``keys``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from landscape.core.errors import LandscapeError

if TYPE_CHECKING:
    from landscape.analyze.context import CheckpointContext

ALL = "0: all clients"  # the hint of a client count: all clients (0) or a seeded sample of that many
TRAINING_BATCH = "0: the run's training batch size"


def client_objectives(ctx: CheckpointContext, count: int, what: str) -> dict[int, Any]:
    """F_i of every client (``count`` = 0) or of a seeded sample of ``count`` clients."""
    if ctx.num_clients == 0:
        raise LandscapeError(f"{what} needs the clients of a training run; {ctx.source.name} is a plain state_dict "
                             "(run the loss, hessian, sharpness or surface pass on it)")
    return {i: ctx.client_objective(i) for i in ctx.sample_clients(count)}


def training_batch_size(ctx: CheckpointContext, value: int) -> int:
    """0 means the run's own local batch size (docs/metrics.md: the training batch size)."""
    return value if value > 0 else ctx.source.train_batch_size


def measured(keys: str, names: Mapping[str, str] | None = None) -> dict[str, str]:
    """A pass's ``measures`` (``PassSpec``): each of the whitespace-separated result keys ``keys`` under its own
    name, and the keys of ``names`` under the name given, the concept's one name where the result (or its
    summary) records it under another (the flatness result's ``distance`` is ``Delta_D``)."""
    return {**{key: key for key in keys.split()}, **(names or {})}


def keys(text: str) -> frozenset[str]:
    """A pass's ``bookkeeping`` (``PassSpec``): the whitespace-separated result keys of ``text``."""
    return frozenset(text.split())
