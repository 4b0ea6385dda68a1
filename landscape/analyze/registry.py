"""The registry of analysis passes: a pass is one function ``(CheckpointContext, options) -> PassOutput``,
registered by name with the dataclass of its options. Pass functions live in ``passes.py`` and
``surface.py``; ``scheduler.py`` runs them over checkpoints; ``results.py`` writes what they return.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from landscape.registry import Registry

if TYPE_CHECKING:
    from landscape.analyze.context import CheckpointContext


@dataclass
class PassOutput:
    scalars: dict[str, Any]
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    summary: dict[str, float] = field(default_factory=dict)  # the few numbers shown in the final table


PassFn = Callable[["CheckpointContext", Any], PassOutput]
PASSES: Registry[PassFn] = Registry("analysis pass")

# Passes that run only when asked for by name (expensive): not part of the default `landscape analyze`.
OPT_IN = {"surface"}


def load_passes() -> Registry[PassFn]:
    """The registry with every built-in pass registered (importing their modules registers them)."""
    from landscape.analyze import passes, surface  # noqa: F401

    return PASSES


def default_passes() -> list[str]:
    return [name for name in load_passes().names() if name not in OPT_IN]


def pass_options(name: str, values: dict[str, Any]) -> Any:
    return load_passes().get(name).make_options(values)
