"""The registry of analysis passes: a pass is one function ``(CheckpointContext, options) -> PassOutput``,
registered by name with the dataclass of its options. Pass functions live in ``passes.py`` and
``surface.py`` (``catalog.py`` imports them all); ``scheduler.py`` runs them over checkpoints; ``results.py``
writes what they return.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from landscape.registry import Registry


@dataclass
class PassOutput:
    scalars: dict[str, Any]
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    summary: dict[str, float] = field(default_factory=dict)  # the few numbers shown in the final table


PassFn = Callable[[Any, Any], PassOutput]  # (CheckpointContext, the pass's options) -> PassOutput
PASSES: Registry[PassFn] = Registry("analysis pass")

# Passes that run only when asked for by name (expensive): not part of the default `landscape analyze`.
OPT_IN = {"surface"}

# Passes that read the round's kept client models (train.keep_clients); a pass whose options say so has a
# true ``needs_kept_clients`` (the client-plane surface). Rounds without them are skipped, with a note.
KEPT_CLIENTS = {"flatness"}


def needs_kept_clients(name: str, options: Any) -> bool:
    return name in KEPT_CLIENTS or bool(getattr(options, "needs_kept_clients", False))
