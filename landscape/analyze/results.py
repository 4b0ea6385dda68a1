"""Analysis results on disk: ``analysis/round-NNNN/<name>.json`` (scalars, the schema version, the settings
that produced them, the checkpoint's SHA-256, the seconds taken) and ``<name>.npz`` (arrays).

The JSON is written last: its presence marks a result as complete. A result whose JSON records the same
settings and checkpoint is not computed again.

Names. A result's files are named by its settings (``result_name``): the pass's output name (the pass, or
``surface-pca``, ...) for a result at the default settings, ``<output>@<key>`` otherwise, where the key lists
the settings that differ from the defaults (``sharpness@split-test``, ``surface@data-client~3_grid-9``), so
analyses of one checkpoint with different settings stand side by side. Readers never trust the name: they
index a round's results by the pass and settings each JSON records (``stored_results``), so files written
before this naming (the pass's name, whatever the settings) are read by what they hold.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from landscape.analyze.passes import PASSES  # every pass declared (no pass function loaded)
from landscape.analyze.serial import json_ready, to_plain
from landscape.core.errors import LandscapeError
from landscape.store.fileio import atomic_write, write_text

SCHEMA_VERSION = 2  # 2: Delta_D around the clients' mean, trainable parameters only, calibrated SEs


def settings_record(settings: Any, options: Any) -> dict:
    """What a result records of the settings that produced it: the shared analysis settings and the pass's."""
    return {"analysis": settings.record(), "pass": to_plain(options) if options is not None else {}}


def read_result(out_dir: Path, name: str) -> dict | None:
    path = out_dir / f"{name}.json"
    return json.loads(path.read_text()) if path.is_file() else None


def write_result(out_dir: Path, name: str, record: dict, arrays: dict[str, np.ndarray]) -> None:
    """``<name>.npz`` (when there are arrays), then ``<name>.json`` (the record, with the schema version)."""
    record = {"schema_version": SCHEMA_VERSION, **record, "arrays": sorted(arrays)}
    if arrays:
        buffer = io.BytesIO()
        np.savez_compressed(buffer, **arrays)
        atomic_write(out_dir / f"{name}.npz", lambda f: f.write(buffer.getvalue()))
    # The JSON is written last: its presence marks the result as complete.
    write_text(out_dir / f"{name}.json", json.dumps(json_ready(record), indent=1) + "\n")


# -- results named by their settings -----------------------------------------------------------------------

# Settings that change where or how fast a result is computed, not what it is: they are not part of a
# result's name, and readers do not tell results apart by them.
NOT_NAMED = frozenset({"device", "surface.save_every", "surface.cells_per_batch"})
NAME_KEY_LIMIT = 80  # characters of the settings key in a file name; a longer key is cut and ends in a hash
_PLAIN_KEY = re.compile(r"[a-z0-9_.]+")
_PLAIN_VALUE = re.compile(r"[a-z0-9.,:-]*")


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


def _analysis_defaults() -> dict[str, Any]:
    from landscape.analyze.settings import AnalysisSettings

    return AnalysisSettings().record()


def _option_defaults(pass_name: str) -> dict[str, Any]:
    # A pass not declared (a result of a pass since removed) has no options to name.
    return to_plain(PASSES.get(pass_name).option_defaults()) if pass_name in PASSES else {}


def qualified_settings(pass_name: str, settings: Any) -> dict[str, Any]:
    """A settings record (``settings_record``) as one flat dict: the analysis settings by name (``split``),
    the pass's options as ``<pass>.<option>`` (``surface.grid``), without ``NOT_NAMED``. A setting the record
    lacks (it was written before the setting existed) has its default."""
    settings = settings if isinstance(settings, dict) else {}
    analysis, options = settings.get("analysis"), settings.get("pass")
    flat = {**_analysis_defaults(), **(analysis if isinstance(analysis, dict) else {})}
    merged = {**_option_defaults(pass_name), **(options if isinstance(options, dict) else {})}
    flat.update({f"{pass_name}.{k}": v for k, v in merged.items()})
    return {k: to_plain(v) for k, v in flat.items() if k not in NOT_NAMED}


def same_settings(pass_name: str, a: Any, b: Any) -> bool:
    """Whether two settings records of ``pass_name`` describe the same result (``NOT_NAMED`` aside)."""
    qa, qb = qualified_settings(pass_name, a), qualified_settings(pass_name, b)
    return qa.keys() == qb.keys() and all(value_text(qa[k]) == value_text(qb[k]) for k in qa)


def output_name(pass_name: str, settings: Any) -> str | None:
    """The output a result of ``pass_name`` with these settings belongs to: the pass's name, or the name its
    options give (surface-pca, ...); None when the recorded options are not (or no longer) valid."""
    options = settings.get("pass") if isinstance(settings, dict) else None
    try:
        made = PASSES.get(pass_name).make_options(dict(options) if isinstance(options, dict) else {})
    except (LandscapeError, TypeError, ValueError, AttributeError):  # options of another type than their own
        return None
    return getattr(made, "output_name", pass_name)


def settings_diff(pass_name: str, settings: Any, reference: Any = None) -> dict[str, Any]:
    """The settings of a result that differ from ``reference`` (another settings record; default: the
    defaults), by qualified name, leaving out what the output name says already (the surface's directions)."""
    mine, base = qualified_settings(pass_name, settings), qualified_settings(pass_name, reference)
    diff = {k: v for k, v in mine.items() if k not in base or value_text(v) != value_text(base[k])}
    output, plain = output_name(pass_name, settings), output_name(pass_name, None)

    def implied(key: str, value: Any) -> bool:
        head, _, option = key.partition(".")
        return (head == pass_name and output is not None and output != plain
                and output_name(pass_name, {"pass": {option: value}}) == output)

    return {k: v for k, v in diff.items() if not implied(k, v)}


def display_key(key: str) -> str:
    """A qualified setting as people write it: ``surface.grid`` -> ``grid``; an option named like an analysis
    setting keeps its pass (``incompatibility.batch_size``, beside the analysis ``batch_size``)."""
    _, dot, option = key.partition(".")
    return option if dot and option not in _analysis_defaults() else key


def settings_text(diff: dict[str, Any]) -> str:
    """'data=client:3, grid=9': settings for labels and messages ('' for none)."""
    return ", ".join(f"{k}={v}" for k, v in sorted((display_key(k), value_text(v)) for k, v in diff.items()))


def result_name(pass_name: str, settings: dict) -> str:
    """The file name (without suffix) of a result of ``pass_name`` with this settings record, in
    ``analysis/round-NNNN/``. The one naming rule:

    - the output name (``sharpness``, ``surface``, ``surface-pca``, ...) at the default settings;
    - else ``<output>@<key>``, the key listing each setting that differs from its default as
      ``<name>-<value>``, sorted by name and joined by ``_``: ``sharpness@split-test``,
      ``surface@data-client~3_grid-9``. Names are the option's (``grid``), an analysis setting's (``split``),
      or ``<pass>.<option>`` for an option named like an analysis setting; a value is spelt by
      ``value_text``, with ``:`` written ``~``. ``device`` and the surface's ``save_every`` and
      ``cells_per_batch`` change no number and are left out.
    - A key longer than ``NAME_KEY_LIMIT`` characters, or one holding characters other than a-z, 0-9 and
      ``.,:-`` (upper case, ``/``, spaces, ...), is cut and spelt in those characters only, and ends in
      ``+`` and 12 hex digits of the SHA-256 of the settings.

    So a name holds only a-z, 0-9 and ``@._,~+-`` (safe on Linux, macOS and Windows, in either case), is at
    most the output name + 81 characters long, and different settings never share a name: a key without
    ``+`` spells its settings out unambiguously (option names hold no ``-``, values no ``_``), one with ``+``
    carries their hash.
    """
    output = output_name(pass_name, settings) or pass_name
    diff = settings_diff(pass_name, settings)
    if not diff:
        return output
    items = sorted((display_key(k), value_text(v)) for k, v in diff.items())
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


def _read_json(path: Path) -> dict | None:
    try:
        record = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    return record if isinstance(record, dict) else None


def record_pass(record: dict, stem: str) -> str:
    """The pass of a stored record (older records without one: the file name up to ``@``)."""
    name = record.get("pass")
    return name if isinstance(name, str) and name else stem.split("@")[0]


def record_output(record: dict, stem: str) -> str:
    """The output a stored record belongs to (surface, surface-pca, ...), from the settings it records."""
    settings = record.get("settings")
    found = output_name(record_pass(record, stem), settings) if isinstance(settings, dict) else None
    return found or stem.split("@")[0]


def find_result(out_dir: Path, pass_name: str, settings: dict) -> tuple[str, dict] | None:
    """(name, record) of the result of ``pass_name`` with these settings in ``out_dir`` (``NOT_NAMED``
    aside): the file ``result_name`` names, else any other that records them (written before results were
    named by their settings); None when there is none."""
    name = result_name(pass_name, settings)
    first = Path(out_dir) / f"{name}.json"
    others = sorted(p for p in Path(out_dir).glob("*.json") if p != first) if Path(out_dir).is_dir() else []
    for path in [first, *others]:
        record = _read_json(path) if path.is_file() else None
        if (record is not None and record_pass(record, path.stem) == pass_name
                and same_settings(pass_name, record.get("settings"), settings)):
            return path.stem, record
    return None


def store_result(out_dir: Path, pass_name: str, record: dict, arrays: dict[str, np.ndarray]) -> str:
    """Write a result under its ``result_name``; return the name. A file of other settings already there (one
    written before results were named by their settings) is first moved to its own name, so that no
    analysis of other settings is lost; it is replaced only when its own name is taken already."""
    out_dir = Path(out_dir)
    name = result_name(pass_name, record["settings"])
    there = out_dir / f"{name}.json"
    old = _read_json(there) if there.is_file() else None
    if old is not None and isinstance(old.get("settings"), dict):
        old_pass = record_pass(old, name)
        if not (old_pass == pass_name and same_settings(pass_name, old["settings"], record["settings"])):
            target = result_name(old_pass, old["settings"])
            if target != name and not (out_dir / f"{target}.json").exists():
                try:
                    if old.get("arrays") and (out_dir / f"{name}.npz").is_file():
                        os.replace(out_dir / f"{name}.npz", out_dir / f"{target}.npz")
                    os.replace(there, out_dir / f"{target}.json")
                except OSError as e:
                    raise LandscapeError(f"cannot move {there} (other settings) to {target}.json: {e}") from None
    write_result(out_dir, name, record, arrays)
    return name


def stored_results(out_dir: Path) -> list[tuple[Path, dict]]:
    """Every result in a round folder (``analysis/round-NNNN``): (its JSON, the record), whatever the file is
    called; unreadable files are left out. Tell them apart by ``record["pass"]`` and ``record["settings"]``."""
    folder = Path(out_dir)
    found = [(path, _read_json(path)) for path in sorted(folder.glob("*.json"))] if folder.is_dir() else []
    return [(path, record) for path, record in found if record is not None]
