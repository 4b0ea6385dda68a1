"""Every built-in analysis pass, registered: importing this module imports the modules of the passes (which
register them in ``registry.PASSES``), so the registry is complete wherever passes are looked up."""

from __future__ import annotations

from typing import Any

from landscape.analyze import passes, surface  # noqa: F401 - imported to register their passes
from landscape.analyze.registry import OPT_IN, PASSES, PassFn
from landscape.registry import Registry


def load_passes() -> Registry[PassFn]:
    """The registry with every built-in pass registered."""
    return PASSES


def default_passes() -> list[str]:
    return [name for name in load_passes().names() if name not in OPT_IN]


def pass_options(name: str, values: dict[str, Any]) -> Any:
    return load_passes().get(name).make_checked_options(values)
