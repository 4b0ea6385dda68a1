"""The passes as ``landscape analyze`` runs them: the registry of every pass (``landscape.analyze.passes``), the
passes run when none are named, and a pass's options made for work (checked against this machine too)."""

from __future__ import annotations

from typing import Any

from landscape.analyze.passes import PASSES
from landscape.analyze.registry import PassRegistry


def load_passes() -> PassRegistry:
    """The registry with every built-in pass declared and its function attached."""
    return PASSES


def default_passes() -> list[str]:
    """The passes `landscape analyze` runs when none are named: every pass but the opt-in ones."""
    registry = load_passes()
    return [name for name in registry.names() if not registry.get(name).opt_in]


def pass_options(name: str, values: dict[str, Any]) -> Any:
    """The pass's options for work, from recipe or ``--set`` values: each checked by the one schema loader
    (``PassSpec.make_options``), then against this machine (``PassSpec.machine_check``: a surface's grid
    must fit in memory)."""
    spec = load_passes().get(name)
    options = spec.make_options(values)
    if spec.machine_check is not None:
        spec.machine_check(options)
    return options


def check_sizes(name: str, options: Any, dim: int, itemsize: int, device: Any) -> None:
    """The pass's options against a model of ``dim`` trainable parameters of ``itemsize`` bytes on ``device``
    (``PassSpec.size_check``: a Hessian's top_k at most the dimension, its vectors within the device's free
    memory): one line, before the pass's work (and in ``--dry-run``'s plan, which never plans what the run
    refuses)."""
    spec = load_passes().get(name)
    if spec.size_check is not None:
        from landscape.measure.products import free_memory

        spec.size_check(options, dim, itemsize, free_memory(device))
