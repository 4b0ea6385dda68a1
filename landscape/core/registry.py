"""The one registry of named things: data sets, partitions, models, algorithms, analysis passes and plot kinds.

An entry is *declared* with everything there is to know about it besides its code (its summary, its options
dataclass, and what its kind adds: an algorithm's display label, a pass's cost and needs, a plot kind's passes)
and *implemented* when the module holding its code is imported (``implement`` attaches the function or class as
``factory``). Declaring apart lets a layer read the metadata without importing the code: figures read an
algorithm's label and the passes' quantities without importing torch or training. ``register`` does both at
once, for an entry whose metadata and code live together (a data set, a model, a user's algorithm).

Options are checked in one place, ``Entry.make_options``: the entry's options dataclass read by the one schema
loader (``landscape.core.schema.load``), one line naming the key for an unknown key or a bad value.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Generic, TypeVar

from landscape.core.errors import LandscapeError
from landscape.core.schema import load

F = TypeVar("F")


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


@dataclass(frozen=True, kw_only=True)
class Entry:
    """A declared entry: its name, a one-line summary (``landscape list``), its options dataclass (None: it
    takes none) and, once implemented, its code (``factory``). Kinds with more metadata subclass it."""

    name: str
    summary: str = ""
    options: type | None = None
    factory: Any = None

    def option_defaults(self) -> dict[str, Any]:
        """Every option with its default, in declaration order."""
        return option_defaults(self.options)

    def make_options(self, values: Any, where: str | None = None, *, noun: str = "option") -> Any:
        """The options dataclass from recipe, ``--set`` or recorded values, checked by the schema loader
        (unknown key, wrong kind, out of range, not a choice: one line naming the key); None for an entry
        without options, which refuses any value. ``where``: the keys' prefix in messages (default: the entry's
        name; the recipe section, ``model``, where the options are a section's)."""
        where = self.name if where is None else where
        if self.options is None:
            if not isinstance(values, Mapping) or values:
                got = ", ".join(sorted(values)) if isinstance(values, Mapping) else repr(values)
                raise LandscapeError(f"{self.name} takes no options (got {got})")
            return None
        return load(self.options, values, where, noun=noun)


E = TypeVar("E", bound=Entry)


class Registry(Generic[E]):
    """Entries of one kind ('dataset', 'analysis pass', ...) by name: each declared once, implemented once."""

    def __init__(self, kind: str, entry: type[E] = Entry) -> None:  # type: ignore[assignment]
        self.kind = kind
        self._entry_type = entry
        self._entries: dict[str, E] = {}

    def declare(self, name: str, **metadata: Any) -> E:
        """Declare the entry ``name`` with its metadata (the entry type's fields but ``factory``)."""
        if name in self._entries:
            raise ValueError(f"{self.kind} '{name}' declared twice")
        if "factory" in metadata:
            raise TypeError("an entry's factory is attached by implement(), not declared")
        entry = self._entry_type(name=name, **metadata)
        self._entries[name] = entry
        return entry

    def implement(self, name: str) -> Callable[[F], F]:
        """Decorator: the code (function or class) of the declared entry ``name``."""

        def attach(factory: F) -> F:
            entry = self.get(name)
            if entry.factory is not None:
                raise ValueError(f"{self.kind} '{name}' implemented twice")
            self._entries[name] = replace(entry, factory=factory)
            self._attached(self._entries[name])
            return factory

        return attach

    def register(self, name: str, **metadata: Any) -> Callable[[F], F]:
        """Decorator: declare ``name`` and implement it with the decorated code at once (the summary defaults
        to the first line of its docstring)."""

        def decorate(factory: F) -> F:
            given = dict(metadata)
            summary = given.pop("summary", "") or (
                (getattr(factory, "__doc__", None) or "").strip().splitlines() or [""])[0]
            self.declare(name, summary=summary, **given)
            return self.implement(name)(factory)

        return decorate

    def _attached(self, entry: E) -> None:
        """What a kind does when an entry's code is attached (nothing here)."""

    def get(self, name: str) -> E:
        try:
            return self._entries[name]
        except KeyError:
            raise LandscapeError(
                f"unknown {self.kind} '{name}'; choose from: {', '.join(self.names())}"
            ) from None

    def names(self) -> list[str]:
        return sorted(self._entries)

    def entries(self) -> list[E]:
        return [self._entries[n] for n in self.names()]

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self):
        return iter(self.names())
