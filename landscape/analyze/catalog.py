"""Every built-in analysis pass, registered: importing this module imports the modules of the passes (which
register them in ``registry.PASSES``), so the registry is complete wherever passes are looked up."""

from __future__ import annotations

from typing import Any

from landscape.analyze import passes, surface  # noqa: F401 - imported to register their passes
from landscape.analyze.registry import PASSES, PassRegistry


def load_passes() -> PassRegistry:
    """The registry with every built-in pass registered."""
    return PASSES


def default_passes() -> list[str]:
    """The passes `landscape analyze` runs when none are named: every pass but the opt-in ones."""
    registry = load_passes()
    return [name for name in registry.names() if not registry.info(name).opt_in]


def pass_options(name: str, values: dict[str, Any]) -> Any:
    """The pass's options dataclass from recipe values, each checked (``Entry.make_checked_options``)."""
    return load_passes().get(name).make_checked_options(values)
