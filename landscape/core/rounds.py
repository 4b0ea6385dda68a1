"""Which rounds to take (``Rounds``): one grammar for every place that names rounds, parsed once where the spec
enters (a flag, a recipe, a claim file) and carried typed afterwards.

The grammar (``GRAMMAR``), the same for ``landscape analyze --checkpoints``, an analysis recipe's ``rounds``, a
figure recipe's ``analyze.<pass>.rounds`` and a claim's ``rounds``:

- ``last``: the last round available; ``last N`` (N >= 1): the last N;
- ``all``: every round available;
- a round (``10``, or the TOML integer ``10``), or a list of rounds: ``10,20`` (spaces around the commas and
  empty items ignored) or the TOML list ``[10, 20]``; a round listed twice is taken once, in the order first
  listed.

``Rounds.select`` picks them among the rounds something has (a run's checkpoints, the rounds a metric is logged
at), refusing a listed round it lacks or fewer rounds than ``last N`` asks for (``RoundsUnavailable``, whose
fields let each caller name what lacks them). A folder of plain state_dicts also takes its files' names
(``analyze.state_dict_source``): that is its own extension, not part of this grammar.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from landscape.core.errors import LandscapeError, shown

LAST, ALL, LISTED = "last", "all", "listed"
GRAMMAR = "last, all, last N (N >= 1), a round, or a list of rounds such as 10,20 or [10, 20]"
_LAST_N = re.compile(r"last ([0-9]+)")
_ROUND = re.compile(r"[0-9]+")


class RoundsUnavailable(LandscapeError):
    """``Rounds.select`` found rounds missing: ``lacking`` the listed rounds not available (in the order listed),
    or ``asked`` the N of ``last N`` (``all``, ``last``: 1) when fewer rounds are available; ``available`` the
    rounds there are, ascending."""

    def __init__(self, message: str, lacking: tuple[int, ...], asked: int, available: tuple[int, ...]) -> None:
        super().__init__(message)
        self.lacking = lacking
        self.asked = asked
        self.available = available


def _is_round(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


@dataclass(frozen=True)
class Rounds:
    """A choice of rounds: ``kind`` is ``last`` (the last ``count``), ``all``, or ``listed`` (the rounds
    ``listed``, in order, each once). ``written``: the spec as it was written (its repr: ``'last 5'``, ``[2]``,
    ``3``), for messages that quote it; it takes no part in equality."""

    kind: str = LAST
    count: int = 1
    listed: tuple[int, ...] = ()
    written: str = field(default="", compare=False, repr=False)

    def __post_init__(self) -> None:
        good = ((self.kind == LAST and _is_round(self.count) and self.count >= 1 and not self.listed)
                or (self.kind == ALL and self.count == 1 and not self.listed)
                or (self.kind == LISTED and self.count == 1 and bool(self.listed)
                    and all(map(_is_round, self.listed)) and len(set(self.listed)) == len(self.listed)))
        if not good:
            raise LandscapeError(f"not a choice of rounds: kind={self.kind!r}, count={self.count!r}, "
                                 f"listed={self.listed!r}")
        if not self.written:
            object.__setattr__(self, "written", repr(list(self.listed)) if self.kind == LISTED else repr(str(self)))

    @classmethod
    def parse(cls, value: Any, where: str = "rounds") -> Rounds:
        """``value`` (a text, an integer, a list of integers, or already a ``Rounds``) as a ``Rounds``; anything
        else is one line: ``<where> must be <GRAMMAR> (got <value>)``."""
        if isinstance(value, Rounds):
            return value
        if isinstance(value, tuple):
            value = list(value)  # as TOML gave it (a schema freezes lists)
        if _is_round(value):
            return cls(LISTED, listed=(value,), written=repr(value))
        if isinstance(value, list) and value and all(map(_is_round, value)):
            return cls(LISTED, listed=tuple(dict.fromkeys(value)), written=repr(value))
        if isinstance(value, str):
            text = " ".join(value.split())
            if text in (LAST, ALL):
                return cls(text, written=repr(text))
            match = _LAST_N.fullmatch(text)
            if match and int(match.group(1)) >= 1:
                return cls(LAST, count=int(match.group(1)), written=repr(text))
            items = [item.strip() for item in text.split(",") if item.strip()]
            if items and all(_ROUND.fullmatch(item) for item in items):
                return cls(LISTED, listed=tuple(dict.fromkeys(map(int, items))), written=repr(text))
        raise LandscapeError(f"{where} must be {GRAMMAR} (got {shown(repr(value))})")

    def __str__(self) -> str:
        """The spec in the grammar: ``last``, ``last 5``, ``all`` or ``10,20``."""
        if self.kind == LAST:
            return LAST if self.count == 1 else f"{LAST} {self.count}"
        return ALL if self.kind == ALL else ",".join(map(str, self.listed))

    def lacking(self, available: Iterable[int]) -> tuple[int, ...]:
        """The listed rounds that are not ``available`` (in the order listed); () for last and all."""
        have = set(available)
        return tuple(r for r in self.listed if r not in have)

    def covered_by(self, available: Iterable[int]) -> bool:
        """Whether ``select`` finds every round it asks for among ``available``."""
        have = sorted(set(available))
        if self.kind == LISTED:
            return not self.lacking(have)
        return len(have) >= (self.count if self.kind == LAST else 1)

    def among(self, available: Iterable[int]) -> list[int]:
        """What it picks of ``available``, leaving out what is not there: the listed rounds available (in
        the order listed), the last ``count`` (or fewer) or every one; [] where none is."""
        have = sorted(set(available))
        if self.kind == LISTED:
            return [r for r in self.listed if r in have]
        return have if self.kind == ALL else have[-self.count:] if have else []

    def select(self, available: Iterable[int]) -> list[int]:
        """The rounds it picks of ``available``: the last ``count`` or every one (ascending), or the listed ones
        (in the order listed). Never empty: a listed round not available, or fewer available rounds than it
        asks for (none at all for ``all``), is ``RoundsUnavailable`` in one line."""
        have = tuple(sorted(set(available)))
        listed = ", ".join(map(str, have)) or "none"
        lacking = self.lacking(have)
        if lacking:
            raise RoundsUnavailable(f"round {lacking[0]} is not available (rounds available: {listed})",
                                    lacking, 1, have)
        if not self.covered_by(have):
            raise RoundsUnavailable(f"'{self}' asks for {self.count} round(s), {len(have)} available (rounds "
                                    f"available: {listed})", (), self.count, have)
        return self.among(have)
