"""Which analysis results a figure, a comparison or a report reads.

A round's results are indexed by what each JSON records, its pass and its settings, never by its file name
(``names.ResultNames.result_name``), so results written before they were named by their settings
are read by what they hold. Of the results of one output of a run (``sharpness``, ``surface``,
``surface-pca``, ...) ONE set of settings is read, at every round: a curve over rounds never mixes settings.

Which one (``choose``):

- a figure recipe asks for exactly the settings it analysed with (``Selection(exact=...)``);
- otherwise the results must fit the filters (``--settings KEY=VALUE``), and what F is stays at its default
  unless a filter says otherwise (``PINNED``: the training split, BN mode eval, the surface's global data);
  of the settings that fit, the defaults are read when they were computed, else those with the most
  analysed rounds (then the fewest settings off their defaults).

Rounds analysed only with other settings are left out of the run's curves and named in ``Chosen.left_out``;
``Chosen.shown`` says which settings are read where they are not the ones asked for (the defaults, or the
recipe's), for the labels.

What the settings are and their defaults come from the ``ResultNames`` a ``Selection`` is made with (the
analysis's is ``landscape.analyze.passes.RESULT_NAMES``: the declared passes' options, which load no
computation, and the analysis settings).
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from landscape.core.errors import LandscapeError
from landscape.store.results.names import NOT_NAMED, ResultNames, record_pass, value_text
from landscape.store.results.records import PassRecord

# What F is: read at its default unless a filter names it.
PINNED = ("split", "bn_mode", "surface.data")
# `landscape analyze` flags of the analysis settings (the others are --set PASS.OPTION=VALUE).
_ANALYZE_FLAGS = {"split": "--split", "analysis_samples": "--analysis-samples", "bn_mode": "--bn-mode",
                  "backend": "--backend", "hvp": "--hvp", "dtype": "--dtype", "seed": "--seed"}


class Result:
    """What selection reads of a stored result (a ``records.PassRecord``, ``rec``): its pass, output and
    settings as its JSON records them (files written before results were named by their settings carry the
    pass's name whatever their settings), each worked out on first use by ``names``."""

    def __init__(self, rec: PassRecord, names: ResultNames) -> None:
        self.rec = rec
        self.names = names
        self.settings = rec.settings

    @cached_property
    def pass_name(self) -> str:
        return record_pass(self.rec.record, self.rec.path.stem)

    @cached_property
    def output(self) -> str:
        """sharpness, surface, surface-pca, ...: what the result is of (``ResultNames.output_name``)."""
        return self.names.record_output(self.rec.record, self.rec.path.stem)

    @cached_property
    def qualified(self) -> dict[str, Any]:
        return self.names.qualified_settings(self.pass_name, self.settings)

    @cached_property
    def variant(self) -> tuple:
        return self.names.variant(self.pass_name, self.settings)

    @cached_property
    def canonical(self) -> bool:
        """Whether the file has the name its settings give (not a file written before that naming)."""
        return self.rec.path.stem == self.names.result_name(self.pass_name, self.settings)


def as_results(records: Mapping[int, Sequence[PassRecord]], names: ResultNames) -> dict[int, list[Result]]:
    """Round -> what selection reads of each stored result there (``choose`` takes them)."""
    return {r: [Result(rec, names) for rec in recs] for r, recs in records.items()}


@dataclass(frozen=True)
class Selection:
    """Which settings to read, of the settings ``names`` knows: ``filters`` ((KEY, VALUE): KEY an analysis
    setting such as ``split``, ``PASS.OPTION`` such as ``surface.grid``, or an option name such as ``grid``
    for every pass that has it), or ``exact`` (pass -> the settings record a figure recipe analysed with)."""

    names: ResultNames
    filters: tuple[tuple[str, Any], ...] = ()
    exact: Mapping[str, dict] = field(default_factory=dict)

    @classmethod
    def parse(cls, names: ResultNames, texts: Iterable[str], flag: str = "--settings") -> Selection:
        """From ``KEY=VALUE`` texts (values in TOML, as ``--set`` takes them); unknown keys are refused."""
        from landscape.config.overrides import parse_value

        filters = []
        for text in texts:
            if any(ord(c) < 32 or ord(c) == 127 for c in text):
                raise LandscapeError(f"{flag} must not hold control characters (got {text!r})")
            key, sep, value = text.partition("=")
            key = key.strip()
            if not sep or not key:
                raise LandscapeError(f"{flag} takes KEY=VALUE, e.g. {flag} split=test (got {text!r})")
            _check_key(names, key, flag)
            filters.append((key, parse_value(value.strip())))
        return cls(names, tuple(filters))

    def describe(self) -> str:
        """'split=test, surface.grid=9'; '' for no filters."""
        return ", ".join(f"{k}={value_text(v)}" for k, v in self.filters)

    def _keys(self, key: str, pass_name: str, qualified: Mapping[str, Any]) -> list[str]:
        """The qualified settings of a ``pass_name`` result that the filter KEY names."""
        if "." in key:
            return [key] if key.split(".", 1)[0] == pass_name else []
        if key in self.names.analysis_names():
            return [key]
        name = f"{pass_name}.{key}"
        return [name] if name in qualified else []

    def wants(self, rec: Result) -> bool:
        """Whether this result has the settings asked for."""
        if self.exact:
            wanted = self.exact.get(rec.pass_name)
            return wanted is not None and rec.variant == self.names.variant(rec.pass_name, wanted)
        q = rec.qualified
        named: set[str] = set()
        for key, value in self.filters:
            for name in self._keys(key, rec.pass_name, q):
                named.add(name)
                if name not in q or value_text(q[name]) != value_text(value):
                    return False
        defaults = self.names.qualified_settings(rec.pass_name, None)
        return all(value_text(q[pin]) == value_text(defaults[pin])
                   for pin in PINNED if pin in q and pin in defaults and pin not in named)

    def reference(self, pass_name: str) -> dict | None:
        """The settings record labels are told against: the recipe's (exact), else None (the defaults)."""
        return self.exact.get(pass_name) if self.exact else None

    def analyze_flags(self, pass_name: str) -> str:
        """``landscape analyze`` flags computing the results this selection asks for of ``pass_name``."""
        if self.exact:
            wanted = self.exact.get(pass_name)
            defaults = self.names.qualified_settings(pass_name, None)
            given = {k: v for k, v in self.names.qualified_settings(pass_name, wanted).items()
                     if k not in defaults or value_text(v) != value_text(defaults[k])}
        else:
            options = self.names.option_names().get(pass_name, set())
            given = {}
            for key, value in self.filters:
                if "." in key:
                    if key.split(".", 1)[0] == pass_name:
                        given[key] = value
                elif key in self.names.analysis_names():
                    given[key] = value
                elif key in options:
                    given[f"{pass_name}.{key}"] = value
        flags = []
        for key, value in sorted(given.items()):
            if key in _ANALYZE_FLAGS:
                flags.append(f"{_ANALYZE_FLAGS[key]} {shlex.quote(value_text(value))}")
            elif "." in key:
                text = f"[{value_text(value)}]" if isinstance(value, (list, tuple)) else value_text(value)
                flags.append(f"--set {shlex.quote(f'{key}={text}')}")
        return " ".join(flags)


def _check_key(names: ResultNames, key: str, flag: str) -> None:
    analysis = names.analysis_names()
    options = names.option_names()
    where = (f"{flag} keys are the analysis settings ({', '.join(sorted(analysis - NOT_NAMED))}), "
             "PASS.OPTION (e.g. surface.grid) or an option name (e.g. grid)")
    if key in NOT_NAMED or any(f"{p}.{key}" in NOT_NAMED for p in options):
        raise LandscapeError(f"{flag} {key}: results are not told apart by {key} (it changes no number)")
    if "." in key:
        pass_name, _, option = key.partition(".")
        if pass_name not in options:
            raise LandscapeError(f"{flag} {key}: no analysis pass '{pass_name}'; passes: {', '.join(sorted(options))}")
        if option not in options[pass_name]:
            allowed = ", ".join(sorted(options[pass_name])) or "(none)"
            raise LandscapeError(f"{flag} {key}: {pass_name} has no option '{option}'; its options: {allowed}")
    elif key not in analysis and not any(key in opts for opts in options.values()):
        raise LandscapeError(f"{flag} {key}: unknown setting; {where}")


@dataclass
class Chosen:
    """The results of one output of a run read at every round, all of one set of settings."""

    output: str
    pass_name: str
    records: dict[int, PassRecord]  # round -> the result
    settings: dict  # the settings record read
    shown: str  # the settings read, where they are not the ones asked for ('' when they are)
    left_out: dict[int, list[str]] = field(default_factory=dict)  # round -> settings there (not read)


def choose(results: Mapping[int, Sequence[Result]], selection: Selection
           ) -> tuple[dict[int, dict[str, PassRecord]], dict[str, Chosen], dict[str, list[str]]]:
    """(round -> output -> result read, output -> Chosen, output -> settings of the results there that the
    selection does not want, for outputs of which it wants none), of ``results`` (``as_results``)."""
    variants: dict[str, dict[tuple, dict[int, Result]]] = {}
    everything: dict[str, dict[int, set[str]]] = {}
    for r in sorted(results):
        for rec in results[r]:
            everything.setdefault(rec.output, {}).setdefault(r, set()).add(
                selection.names.settings_label(rec.pass_name, rec.settings))
            if not selection.wants(rec):
                continue
            slot = variants.setdefault(rec.output, {}).setdefault(rec.variant, {})
            if r not in slot or (rec.canonical and not slot[r].canonical):  # one result per round and settings
                slot[r] = rec

    def rank(item: tuple[tuple, dict[int, Result]]) -> tuple:
        rec = next(iter(item[1].values()))
        diff = selection.names.settings_diff(rec.pass_name, rec.settings)
        return bool(diff), -len(item[1]), len(diff), selection.names.settings_text(diff)

    chosen: dict[str, Chosen] = {}
    for output, found in variants.items():
        _, records = min(found.items(), key=rank)
        first = next(iter(records.values()))
        shown = selection.names.settings_text(
            selection.names.settings_diff(first.pass_name, first.settings, selection.reference(first.pass_name)))
        left = {r: sorted(labels) for r, labels in everything[output].items() if r not in records}
        chosen[output] = Chosen(output, first.pass_name, {r: records[r].rec for r in sorted(records)},
                                first.settings, shown, left)
    view: dict[int, dict[str, PassRecord]] = {}
    for output, c in chosen.items():
        for r, rec in c.records.items():
            view.setdefault(r, {})[output] = rec
    others = {output: sorted(set().union(*rounds.values())) for output, rounds in everything.items()
              if output not in chosen}
    return dict(sorted(view.items())), chosen, others


def caption(texts: Sequence[tuple[str, str]], asked: str = "defaults") -> str:
    """The settings a figure shows, from (run label, ``Chosen.shown``) pairs: '' when every run shows what
    was asked (``asked``: how to call that); the settings when the runs share them; else run by run."""
    if not any(text for _, text in texts):
        return ""
    if len({text for _, text in texts}) == 1:
        return texts[0][1]
    return "; ".join(f"{label}: {text or asked}" for label, text in texts)
