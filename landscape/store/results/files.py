"""Analysis results on disk: ``analysis/round-NNNN/<name>.json`` (scalars, the schema version, the settings
that produced them, the checkpoint's SHA-256, the seconds taken: ``result_record``) and ``<name>.npz``
(arrays), under the name ``names.ResultNames.result_name`` gives (the plan computes it once per job).

The JSON is written last: its presence marks a result as complete. A result whose JSON records the same
settings and checkpoint is not computed again (``find_result``).
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from landscape.core.errors import LandscapeError
from landscape.store.fileio import atomic_write, write_text
from landscape.store.results.names import ResultNames, record_pass
from landscape.store.results.serial import json_ready

SCHEMA_VERSION = 2  # 2: Delta_D around the clients' mean, trainable parameters only, calibrated SEs


def result_record(pass_name: str, *, run: str, where: dict, checkpoint: str, digest: str, inputs: dict,
                  settings: dict, seconds: float, threads: int, memory_format: dict[str, str] | None,
                  summary: dict, result: dict) -> dict:
    """The record of one result, in the order its JSON lists it: the pass and run, where its checkpoint is
    (``round``; a state_dict's ``file``), the checkpoint and its SHA-256, a state_dict's model and data
    (``inputs``), the settings record, the seconds, how it was computed (threads and, where it evaluated
    anything, the memory format: the last bits depend on these, recorded beside the settings), the summary
    and the result's scalars."""
    return {
        "pass": pass_name,
        "run": run,
        **where,
        "checkpoint": checkpoint,
        "checkpoint_sha256": digest,
        **inputs,
        "settings": settings,
        "seconds": seconds,
        "threads": threads,
        **({} if memory_format is None else {"memory_format": memory_format}),
        "summary": summary,
        "result": result,
    }


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


def _read_json(path: Path) -> dict | None:
    try:
        record = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    return record if isinstance(record, dict) else None


def find_result(out_dir: Path, name: str, pass_name: str, settings: dict,
                names: ResultNames) -> tuple[str, dict] | None:
    """(name, record) of the result of ``pass_name`` with these settings in ``out_dir`` (``NOT_NAMED``
    aside): the file ``name`` (the result's own name, ``ResultNames.result_name``), else any other that
    records them (written before results were named by their settings); None when there is none."""
    first = Path(out_dir) / f"{name}.json"
    others = sorted(p for p in Path(out_dir).glob("*.json") if p != first) if Path(out_dir).is_dir() else []
    for path in [first, *others]:
        record = _read_json(path) if path.is_file() else None
        if (record is not None and record_pass(record, path.stem) == pass_name
                and names.same_settings(pass_name, record.get("settings"), settings)):
            return path.stem, record
    return None


def store_result(out_dir: Path, name: str, record: dict, arrays: dict[str, np.ndarray],
                 names: ResultNames) -> None:
    """Write a result (``record``, its ``pass`` and ``settings`` among it) under its name, ``name``
    (``ResultNames.result_name``). A file of other settings already there (one written before results were
    named by their settings) is first moved to its own name, so that no analysis of other settings is lost;
    it is replaced only when its own name is taken already."""
    out_dir = Path(out_dir)
    pass_name = record["pass"]
    there = out_dir / f"{name}.json"
    old = _read_json(there) if there.is_file() else None
    if old is not None and isinstance(old.get("settings"), dict):
        old_pass = record_pass(old, name)
        if not (old_pass == pass_name and names.same_settings(pass_name, old["settings"], record["settings"])):
            target = names.result_name(old_pass, old["settings"])
            if target != name and not (out_dir / f"{target}.json").exists():
                try:
                    if old.get("arrays") and (out_dir / f"{name}.npz").is_file():
                        os.replace(out_dir / f"{name}.npz", out_dir / f"{target}.npz")
                    os.replace(there, out_dir / f"{target}.json")
                except OSError as e:
                    raise LandscapeError(f"cannot move {there} (other settings) to {target}.json: {e}") from None
    write_result(out_dir, name, record, arrays)


def stored_results(out_dir: Path) -> list[tuple[Path, dict[str, Any]]]:
    """Every result in a round folder (``analysis/round-NNNN``): (its JSON, the record), whatever the file is
    called; unreadable files are left out. Tell them apart by ``record["pass"]`` and ``record["settings"]``."""
    folder = Path(out_dir)
    found = [(path, _read_json(path)) for path in sorted(folder.glob("*.json"))] if folder.is_dir() else []
    return [(path, record) for path, record in found if record is not None]
