"""What several analysis passes share: the hints of their client-count and batch-size options, and the
clients' objectives a pass reads (refused in one line on a plain state_dict, which has no clients)."""

from __future__ import annotations

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
