"""Name -> constructor registries (datasets, partitions, models, algorithms).

Each entry may declare an *options* dataclass: its fields are the recipe keys the entry accepts, with the
reference defaults. The recipe layer uses it to validate keys and to write every default out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from landscape.core.errors import LandscapeError

T = TypeVar("T")


def option_defaults(options: type | None) -> dict[str, Any]:
    """Every field of an options dataclass with its default, in declaration order ({} for no options)."""
    if options is None:
        return {}
    out = {}
    for f in dataclasses.fields(options):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            out[f.name] = f.default_factory()  # type: ignore[misc]
    return out


@dataclass(frozen=True)
class Entry(Generic[T]):
    name: str
    factory: T
    options: type | None
    summary: str

    def option_defaults(self) -> dict[str, Any]:
        """Every option with its default, in declaration order."""
        return option_defaults(self.options)

    def make_options(self, values: dict[str, Any]) -> Any:
        """Build the options dataclass from recipe values (unknown keys are a LandscapeError)."""
        if self.options is None:
            if values:
                raise LandscapeError(f"{self.name} takes no options (got {', '.join(sorted(values))})")
            return None
        allowed = [f.name for f in dataclasses.fields(self.options)]
        unknown = sorted(set(values) - set(allowed))
        if unknown:
            raise LandscapeError(
                f"unknown option '{unknown[0]}' for {self.name}; allowed: {', '.join(allowed) or '(none)'}"
            )
        return self.options(**values)


class Registry(Generic[T]):
    """A registry of named constructors of one kind ('dataset', 'model', ...)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, Entry[T]] = {}

    def register(self, name: str, *, options: type | None = None, summary: str = "") -> Callable[[T], T]:
        def decorate(factory: T) -> T:
            if name in self._entries:
                raise ValueError(f"{self.kind} '{name}' registered twice")
            doc = summary or ((getattr(factory, "__doc__", None) or "").strip().splitlines() or [""])[0]
            self._entries[name] = Entry(name=name, factory=factory, options=options, summary=doc)
            return factory

        return decorate

    def get(self, name: str) -> Entry[T]:
        try:
            return self._entries[name]
        except KeyError:
            raise LandscapeError(
                f"unknown {self.kind} '{name}'; choose from: {', '.join(self.names())}"
            ) from None

    def names(self) -> list[str]:
        return sorted(self._entries)

    def entries(self) -> list[Entry[T]]:
        return [self._entries[n] for n in self.names()]

    def __contains__(self, name: object) -> bool:
        return name in self._entries
