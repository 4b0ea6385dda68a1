"""The names of analysis results, by their settings: ``ResultNames`` spells a result's file name
(``result_name``) and tells results apart by the settings they record (``qualified_settings``,
``same_settings``, ``settings_diff``, ``variant``), given what the settings' defaults are (a
``SettingsCatalog``: the analysis settings and each declared pass's options, which the analysis provides,
``landscape.analyze.passes.RESULT_NAMES``).

Names. A result's files are named by its settings (``result_name``): the pass's output name (the pass, or
``surface-pca``, ...) for a result at the default settings, ``<output>@<key>`` otherwise, where the key lists
the settings that differ from the defaults (``sharpness@split-test``, ``surface@data-client~3_grid-9``), so
analyses of one checkpoint with different settings stand side by side. Readers never trust the name: they
index a round's results by the pass and settings each JSON records (``files.stored_results``), so files
written before this naming (the pass's name, whatever the settings) are read by what they hold.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from typing import Any, Protocol

from landscape.store.results.serial import to_plain

# Settings that change where or how fast a result is computed, not what it is: they are not part of a
# result's name, and readers do not tell results apart by them.
NOT_NAMED = frozenset({"device", "surface.save_every", "surface.cells_per_batch"})
NAME_KEY_LIMIT = 80  # characters of the settings key in a file name; a longer key is cut and ends in a hash
_PLAIN_KEY = re.compile(r"[a-z0-9_.]+")
_PLAIN_VALUE = re.compile(r"[a-z0-9.,:-]*")


def surface_output_name(directions: str) -> str:
    """The output name of a surface: ``surface`` for the random plane, ``surface-<directions>`` (pca, clients,
    interpolate) for the others, so they never overwrite one another. It is the file name (without suffix) in
    ``analysis/round-NNNN/`` at the default settings; ``ResultNames.result_name`` adds the settings off
    their defaults (``surface@grid-21``), and readers go by what each result records."""
    return "surface" if directions == "random" else f"surface-{directions}"


def settings_record(settings: Any, options: Any) -> dict:
    """What a result records of the settings that produced it: the shared analysis settings (an object with
    ``record()``, ``AnalysisSettings``) and the pass's options."""
    return {"analysis": settings.record(), "pass": to_plain(options) if options is not None else {}}


def record_pass(record: dict, stem: str) -> str:
    """The pass of a stored record (older records without one: the file name up to ``@``)."""
    name = record.get("pass")
    return name if isinstance(name, str) and name else stem.split("@")[0]


def value_text(value: Any) -> str:
    """One spelling per setting value: true / false, 41 (also for 41.0), 0.05, a list as a,b, text as it is."""
    value = to_plain(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return str(int(value)) if value.is_integer() and abs(value) < 1e15 else repr(value)
    if isinstance(value, (list, tuple)):
        return ",".join(value_text(v) for v in value)
    if value is None:
        return "none"
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True, default=str)
    return str(value)


class SettingsCatalog(Protocol):
    """What results are named against: the defaults of the analysis settings and of each pass's options."""

    def analysis_defaults(self) -> dict[str, Any]:
        """The analysis settings as a result records them, at their defaults."""

    def option_defaults(self, pass_name: str) -> dict[str, Any]:
        """The pass's options at their defaults, plain; {} for a pass not declared (a result of a pass since
        removed)."""

    def options_recorded_before(self, pass_name: str) -> dict[str, Any]:
        """{option: value} a stored result that lacks the option was computed with, where that is not its default
        (``PassSpec.recorded_before``); {} for most passes."""

    def option_names(self) -> dict[str, set[str]]:
        """Pass -> the names of its options, for every declared pass."""

    def output_name(self, pass_name: str, options: dict) -> str | None:
        """The output the pass's options make of a result (the pass's name, surface-pca, ...); None when they
        are not (or no longer) valid."""


class ResultNames:
    """The naming rule of results, against the defaults of a ``SettingsCatalog``."""

    def __init__(self, catalog: SettingsCatalog) -> None:
        self.catalog = catalog

    def analysis_names(self) -> set[str]:
        """The names of the analysis settings a result records (``split``, ``bn_mode``, ...)."""
        return set(self.catalog.analysis_defaults())

    def option_names(self) -> dict[str, set[str]]:
        """Pass -> the names of its options."""
        return self.catalog.option_names()

    def qualified_settings(self, pass_name: str, settings: Any) -> dict[str, Any]:
        """A settings record (``settings_record``) as one flat dict: the analysis settings by name (``split``),
        the pass's options as ``<pass>.<option>`` (``surface.grid``), without ``NOT_NAMED``. A setting the
        record lacks (it was written before the setting existed) has its default, or the value such results were
        computed with where the pass declares one (``options_recorded_before``); no record (None): the defaults."""
        settings = settings if isinstance(settings, dict) else {}
        analysis, options = settings.get("analysis"), settings.get("pass")
        flat = {**self.catalog.analysis_defaults(), **(analysis if isinstance(analysis, dict) else {})}
        before = self.catalog.options_recorded_before(pass_name) if isinstance(options, dict) else {}
        merged = {**self.catalog.option_defaults(pass_name), **before, **(options if isinstance(options, dict) else {})}
        flat.update({f"{pass_name}.{k}": v for k, v in merged.items()})
        return {k: to_plain(v) for k, v in flat.items() if k not in NOT_NAMED}

    def same_settings(self, pass_name: str, a: Any, b: Any) -> bool:
        """Whether two settings records of ``pass_name`` describe the same result (``NOT_NAMED`` aside)."""
        qa, qb = self.qualified_settings(pass_name, a), self.qualified_settings(pass_name, b)
        return qa.keys() == qb.keys() and all(value_text(qa[k]) == value_text(qb[k]) for k in qa)

    def variant(self, pass_name: str, settings: Any) -> tuple:
        """A hashable key of a result's settings: equal for results that differ in ``NOT_NAMED`` only."""
        return (pass_name, tuple(sorted((k, value_text(v))
                                        for k, v in self.qualified_settings(pass_name, settings).items())))

    def output_name(self, pass_name: str, settings: Any) -> str | None:
        """The output a result of ``pass_name`` with these settings belongs to: the pass's name, or the name
        its options give (surface-pca, ...); None when the recorded options are not (or no longer) valid."""
        options = settings.get("pass") if isinstance(settings, dict) else None
        return self.catalog.output_name(pass_name, dict(options) if isinstance(options, dict) else {})

    def record_output(self, record: dict, stem: str) -> str:
        """The output a stored record belongs to (surface, surface-pca, ...), from the settings it records."""
        settings = record.get("settings")
        found = self.output_name(record_pass(record, stem), settings) if isinstance(settings, dict) else None
        return found or stem.split("@")[0]

    def settings_diff(self, pass_name: str, settings: Any, reference: Any = None) -> dict[str, Any]:
        """The settings of a result that differ from ``reference`` (another settings record; default: the
        defaults), by qualified name, leaving out what the output name says already (the surface's
        directions)."""
        mine, base = self.qualified_settings(pass_name, settings), self.qualified_settings(pass_name, reference)
        diff = {k: v for k, v in mine.items() if k not in base or value_text(v) != value_text(base[k])}
        output, plain = self.output_name(pass_name, settings), self.output_name(pass_name, None)

        def implied(key: str, value: Any) -> bool:
            head, _, option = key.partition(".")
            return (head == pass_name and output is not None and output != plain
                    and self.output_name(pass_name, {"pass": {option: value}}) == output)

        return {k: v for k, v in diff.items() if not implied(k, v)}

    def display_key(self, key: str) -> str:
        """A qualified setting as people write it: ``surface.grid`` -> ``grid``; an option named like an
        analysis setting keeps its pass (``incompatibility.batch_size``, beside the analysis ``batch_size``)."""
        _, dot, option = key.partition(".")
        return option if dot and option not in self.catalog.analysis_defaults() else key

    def settings_text(self, diff: dict[str, Any]) -> str:
        """'data=client:3, grid=9': settings for labels and messages ('' for none)."""
        return ", ".join(f"{k}={v}" for k, v in sorted((self.display_key(k), value_text(v))
                                                        for k, v in diff.items()))

    def settings_label(self, pass_name: str, settings: Any) -> str:
        """'split=test' (the settings off their defaults) or 'the defaults'."""
        return self.settings_text(self.settings_diff(pass_name, settings)) or "the defaults"

    def result_name(self, pass_name: str, settings: dict) -> str:
        """The file name (without suffix) of a result of ``pass_name`` with this settings record, in
        ``analysis/round-NNNN/``. The one naming rule:

        - the output name (``sharpness``, ``surface``, ``surface-pca``, ...) at the default settings;
        - else ``<output>@<key>``, the key listing each setting that differs from its default as
          ``<name>-<value>``, sorted by name and joined by ``_``: ``sharpness@split-test``,
          ``surface@data-client~3_grid-9``. Names are the option's (``grid``), an analysis setting's
          (``split``), or ``<pass>.<option>`` for an option named like an analysis setting; a value is spelt
          by ``value_text``, with ``:`` written ``~``. ``device`` and the surface's ``save_every`` and
          ``cells_per_batch`` change no number and are left out.
        - A key longer than ``NAME_KEY_LIMIT`` characters, or one holding characters other than a-z, 0-9 and
          ``.,:-`` (upper case, ``/``, spaces, ...), is cut and spelt in those characters only, and ends in
          ``+`` and 12 hex digits of the SHA-256 of the settings.

        So a name holds only a-z, 0-9 and ``@._,~+-`` (safe on Linux, macOS and Windows, in either case), is
        at most the output name + 81 characters long, and different settings never share a name: a key
        without ``+`` spells its settings out unambiguously (option names hold no ``-``, values no ``_``),
        one with ``+`` carries their hash.
        """
        output = self.output_name(pass_name, settings) or pass_name
        diff = self.settings_diff(pass_name, settings)
        if not diff:
            return output
        items = sorted((self.display_key(k), value_text(v)) for k, v in diff.items())
        plain = all(_PLAIN_KEY.fullmatch(k) and _PLAIN_VALUE.fullmatch(v) for k, v in items)
        parts = [re.sub(r"[^a-z0-9_.]+", "-", k.lower()) + "-" + re.sub(r"[^a-z0-9.,~-]+", "-",
                                                                         v.lower().replace(":", "~"))
                 for k, v in items]
        key = "_".join(parts)
        if plain and len(key) <= NAME_KEY_LIMIT:
            return f"{output}@{key}"
        digest = hashlib.sha256(json.dumps(items).encode()).hexdigest()[:12]
        room = NAME_KEY_LIMIT - len(digest) - 1
        kept = ""
        for part in parts:
            if len(kept) + len(part) + bool(kept) > room:
                break
            kept = f"{kept}_{part}" if kept else part
        return f"{output}@{kept or parts[0][:room]}+{digest}"
