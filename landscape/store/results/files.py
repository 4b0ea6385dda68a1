"""Analysis results on disk: ``analysis/round-NNNN/<name>.json`` (scalars, the schema version, the settings
that produced them, the checkpoint's SHA-256, the seconds taken: ``result_record``) and ``<name>.npz``
(arrays), under the name ``names.ResultNames.result_name`` gives (the plan computes it once per job).

The JSON is written last: its presence marks a result as complete. A result whose JSON records the same
settings and checkpoint, and whose arrays are whole, is not computed again (``find_result``).

Every reader goes through ``read_record`` (a result's JSON) and ``read_arrays`` (its NPZ): a damaged, special
or hostile file (not JSON, nested too deep, a directory or FIFO in its place, a record whose ``summary`` or
``result`` is no table, an NPZ cut short or whose arrays declare more values than it holds) is one line naming
it. The analysis takes such a result for not done and computes it again.
"""

from __future__ import annotations

import io
import json
import math
import os
import zipfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from landscape.core.errors import LandscapeError
from landscape.core.reading import first_line, open_regular, read_json, special_kind
from landscape.store.fileio import atomic_write, write_text
from landscape.store.results.names import ResultNames, record_pass
from landscape.store.results.serial import json_ready

SCHEMA_VERSION = 2  # 2: Delta_D around the clients' mean, trainable parameters only, calibrated SEs


def result_record(pass_name: str, *, run: str, where: dict, checkpoint: str, digest: str, inputs: dict,
                  settings: dict, seconds: float, threads: int, memory_format: dict[str, str] | None,
                  summary: dict, result: dict, files: dict[str, str] | None = None) -> dict:
    """The record of one result, in the order its JSON lists it: the pass and run, where its checkpoint is
    (``round``; a state_dict's ``file``), the checkpoint and its SHA-256, the other files it was computed from
    and theirs where it read any (``files``, {``validity.files_label``: SHA-256}), a state_dict's model and data
    (``inputs``), the settings record, the seconds, how it was computed (threads and, where it evaluated
    anything, the memory format: the last bits depend on these, recorded beside the settings), the summary
    and the result's scalars."""
    return {
        "pass": pass_name,
        "run": run,
        **where,
        "checkpoint": checkpoint,
        "checkpoint_sha256": digest,
        **({"files_sha256": files} if files else {}),
        **inputs,
        "settings": settings,
        "seconds": seconds,
        "threads": threads,
        **({} if memory_format is None else {"memory_format": memory_format}),
        "summary": summary,
        "result": result,
    }


_TABLES = ("settings", "summary", "result")
REDO = "`landscape analyze` with the same settings computes it again (or remove it)"


def read_record(path: Path) -> dict:
    """The record of a result's JSON (``read_json``), checked to be one: a table whose ``settings``,
    ``summary`` and ``result`` are tables, whose ``arrays`` is a list of names, ``round`` a whole number and
    ``pass`` a name (where it has them); one LandscapeError naming the file otherwise."""
    record = read_json(path, "an analysis result")
    why = None
    if not isinstance(record, dict):
        why = f"it holds a JSON {type(record).__name__}, not a table"
    else:
        bad = [key for key in _TABLES if key in record and not isinstance(record[key], dict)]
        arrays = record.get("arrays", [])
        if bad:
            why = f"its {bad[0]!r} is a {type(record[bad[0]]).__name__}, not a table"
        elif not (isinstance(arrays, list) and all(isinstance(a, str) for a in arrays)):
            why = "its 'arrays' is not a list of names"
        elif "round" in record and (type(record["round"]) is not int or record["round"] < 0):
            why = "its 'round' is not a whole number >= 0"
        elif not isinstance(record.get("pass", ""), str):
            why = "its 'pass' is not a name"
    if why is not None:
        raise LandscapeError(f"{path} is not an analysis result: {why}; {REDO}")
    return record


def read_result(out_dir: Path, name: str) -> dict | None:
    path = Path(out_dir) / f"{name}.json"
    return read_record(path) if path.exists() else None


def _declared_bytes(member: Any) -> tuple[tuple[int, ...], int]:
    """(shape, bytes) an ``.npy`` member of an NPZ declares in its header (read without its data)."""
    version = np.lib.format.read_magic(member)
    read_header = {(1, 0): np.lib.format.read_array_header_1_0,
                   (2, 0): np.lib.format.read_array_header_2_0}.get(version)
    if read_header is None:
        raise ValueError(f"an .npy version {version} header")
    shape, _, dtype = read_header(member)
    if dtype.hasobject:
        raise ValueError("an array of Python objects")
    return shape, math.prod(shape) * dtype.itemsize


def read_arrays(npz: Path, names: Any = None) -> dict[str, np.ndarray]:
    """The arrays of a result's NPZ (read through ``open_regular``; no pickles), each array's header checked
    against the bytes the file holds for it before any memory is taken for it (an NPZ that declares 10^11
    values is refused, not allocated); ``names``, when given, must all be there. A missing, cut or damaged
    file is one LandscapeError naming it."""
    npz = Path(npz)
    if not npz.exists() and not npz.is_symlink():
        raise LandscapeError(f"{npz} is missing; {REDO}")
    try:
        with open_regular(npz, "the arrays of an analysis result") as f:
            with zipfile.ZipFile(f) as archive:
                for info in archive.infolist():
                    with archive.open(info) as member:
                        shape, size = _declared_bytes(member)
                    if size > info.file_size:
                        raise ValueError(f"{info.filename} declares {math.prod(shape):,} values (shape "
                                         f"{list(shape)}) in {info.file_size:,} bytes")
            f.seek(0)
            with np.load(f, allow_pickle=False) as loaded:
                arrays = {k: loaded[k] for k in loaded.files}
    except LandscapeError:
        raise
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile, zlib.error, MemoryError,
            RecursionError) as e:
        raise LandscapeError(f"{npz} is damaged ({first_line(e)[:200]}); {REDO}") from None
    missing = sorted(set(names or ()) - set(arrays))
    if missing:
        raise LandscapeError(f"{npz} lacks the array {missing[0]!r} its record lists; {REDO}")
    return arrays


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
    """The record of a result's JSON, None where it is not one (``read_record``)."""
    try:
        return read_record(path)
    except LandscapeError:
        return None


def arrays_whole(out_dir: Path, name: str, record: dict) -> bool:
    """Whether the arrays ``record`` lists are there, whole, in ``<name>.npz`` beside it."""
    if not record.get("arrays"):
        return True
    try:
        read_arrays(Path(out_dir) / f"{name}.npz", record["arrays"])
    except LandscapeError:
        return False
    return True


def find_result(out_dir: Path, name: str, pass_name: str, settings: dict,
                names: ResultNames) -> tuple[str, dict] | None:
    """(name, record) of the result of ``pass_name`` with these settings in ``out_dir`` (``NOT_NAMED``
    aside): the file ``name`` (the result's own name, ``ResultNames.result_name``), else any other that
    records them (written before results were named by their settings); None when there is none. A damaged
    record, or one whose arrays are missing or damaged, is none: the analysis computes it again."""
    first = Path(out_dir) / f"{name}.json"
    others = sorted(p for p in Path(out_dir).glob("*.json") if p != first) if Path(out_dir).is_dir() else []
    for path in [first, *others]:
        record = _read_json(path) if path.exists() else None
        if (record is not None and record_pass(record, path.stem) == pass_name
                and names.same_settings(pass_name, record.get("settings"), settings)):
            return (path.stem, record) if arrays_whole(out_dir, path.stem, record) else None
    return None


def store_result(out_dir: Path, name: str, record: dict, arrays: dict[str, np.ndarray],
                 names: ResultNames) -> None:
    """Write a result (``record``, its ``pass`` and ``settings`` among it) under its name, ``name``
    (``ResultNames.result_name``). A file of other settings already there (one written before results were
    named by their settings) is first moved to its own name, so that no analysis of other settings is lost;
    it is replaced only when its own name is taken already."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise LandscapeError(f"cannot write {out_dir / name}.json: {out_dir} is {special_kind(out_dir) or 'a file'}, "
                             "not a folder (the round's results are written in it); move it aside")
    pass_name = record["pass"]
    there = out_dir / f"{name}.json"
    for path in (there, there.with_suffix(".npz")):
        if path.is_dir() and not path.is_symlink():  # a FIFO or other file is replaced; a folder cannot be
            raise LandscapeError(f"cannot write {path}: it is a directory, not a result file; remove it")
    old = _read_json(there) if there.exists() else None
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
