"""Name -> constructor registries (datasets, partitions, models, algorithms).

Each entry may declare an *options* dataclass: its fields are the recipe keys the entry accepts, with the
reference defaults. The recipe layer uses it to validate keys and to write every default out.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from landscape.core.errors import LandscapeError

T = TypeVar("T")


@dataclass(frozen=True)
class Entry(Generic[T]):
    name: str
    factory: T
    options: type | None
    summary: str

    def option_defaults(self) -> dict[str, Any]:
        """Every option with its default, in declaration order."""
        if self.options is None:
            return {}
        out = {}
        for f in dataclasses.fields(self.options):
            if f.default is not dataclasses.MISSING:
                out[f.name] = f.default
            elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
                out[f.name] = f.default_factory()  # type: ignore[misc]
        return out

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

    def make_checked_options(self, values: dict[str, Any]) -> Any:
        """``make_options`` with every value checked against the kind of its default (``check_kind``) after
        the options' own checks, and a number where a tuple goes read as a one-element tuple (analysis pass
        options: ``--set sharpness.rhos=0.05``)."""
        defaults = self.option_defaults()
        values = {k: (v,) if isinstance(defaults.get(k), tuple) and not isinstance(v, (list, tuple)) else v
                  for k, v in values.items()}
        options = self.make_options(values)
        bounds = {f.name: f.metadata.get("bound") for f in dataclasses.fields(self.options)} if values else {}
        for key in values:
            check_kind(f"{self.name}.{key}", getattr(options, key), defaults.get(key))
            if bounds.get(key) is not None:
                check_bound(f"{self.name}.{key}", getattr(options, key), bounds[key])
        return options


def check_kind(where: str, value: Any, default: Any) -> None:
    """An option value against the kind of its default, after the options dataclass's own checks (every
    analysis pass option gets it): true or false for a bool, a whole number for an int, a finite
    number for a float, items of the kind of the default's first item for a list or tuple. A default of None
    or a string takes what the dataclass took."""
    if isinstance(default, (list, tuple)):
        for item in value if isinstance(value, (list, tuple)) else [value]:
            check_kind(where, item, default[0] if default else None)
        return
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if isinstance(default, bool) and not isinstance(value, bool):
        raise LandscapeError(f"{where} must be true or false (got {value!r})")
    if isinstance(default, int) and not isinstance(default, bool) and not (number and isinstance(value, int)):
        raise LandscapeError(f"{where} must be a whole number (got {value!r})")
    if isinstance(default, float) and not (number and math.isfinite(value)):
        raise LandscapeError(f"{where} must be a finite number (got {value!r})")


# The bounds an options dataclass may give a number in its field's metadata (``field(default=0.05,
# metadata=POSITIVE)``), checked by ``make_checked_options`` (``check_bound``; every item of a list or tuple).
POSITIVE = {"bound": "positive"}  # finite and > 0 (a radius, a count of steps)
NON_NEGATIVE = {"bound": "non-negative"}  # finite and >= 0 (0 often meaning "all" or "off")
_BOUNDS = {"positive": (lambda v: v > 0, "> 0"), "non-negative": (lambda v: v >= 0, ">= 0")}


def check_bound(where: str, value: Any, bound: str) -> None:
    """A number (each item of a list or tuple) against its field's bound: finite and > 0 for ``positive``,
    finite and >= 0 for ``non-negative``; one line naming the option otherwise."""
    test, rule = _BOUNDS[bound]
    for item in value if isinstance(value, (list, tuple)) else [value]:
        number = isinstance(item, (int, float)) and not isinstance(item, bool)
        if not (number and math.isfinite(item) and test(item)):
            got = list(value) if isinstance(value, tuple) else value
            raise LandscapeError(f"{where} must be a finite number {rule} (got {got!r})")


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
