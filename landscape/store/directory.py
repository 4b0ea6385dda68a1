"""The layout of a run directory (``RunDir``): its paths, metrics.jsonl and the partition record.

A run as every reader sees it (recipe, metrics, rounds, results, read once) is ``landscape.store.run.Run``.

```
runs/<name>/
  recipe.toml                      fully resolved recipe
  partition.json                   client -> sample indices, class histogram
  metrics.jsonl                    one JSON line per round
  checkpoints/round-0050.pt        global model, server and client state, round, RNG scheme
  checkpoints/round-0050.clients.pt  that round's clients' final local models (--keep-clients)
```
Every file is written atomically (``landscape.store.fileio``), and checkpoints load safely
(``landscape.store.checkpoints``: they hold only tensors and plain containers).

Besides one row per round, metrics.jsonl may hold event rows (``{"round": t, "event": "diverged", ...}``):
``read_metrics`` returns the round rows only, ``read_events`` the event rows. A process that trains into a
run directory holds an exclusive lock on it (``fileio.RunLock``: flock on ``<run>/.lock``).
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from landscape.core.errors import LandscapeError, shown
from landscape.core.reading import open_regular
from landscape.store.fileio import LOCK_NAME, RUN_MARKER, open_no_follow, os_reason, refuse_links, write_text

_CKPT = re.compile(r"^round-(\d{4,})\.pt$")
# Temporary files of atomic_write ('.<name>.<random>.tmp') of a run's own files, left by a killed process.
_TEMP = re.compile(r"^\.(recipe\.toml|partition\.json|metrics\.jsonl(\.damaged)?|\.landscape-run"
                   r"|round-\d{4,}(\.clients)?\.pt)\.[a-z0-9_]{8}\.tmp$")
# RUN_MARKER (``.landscape-run``, in fileio): the file that marks a folder as a run directory this tool made:
# only such a folder may be replaced (--overwrite). Written before recipe.toml, kept when the run is replaced.
# What a run directory holds (its files, folders and leftovers): a folder made before the marker existed may be
# replaced when it holds nothing else.
_RUN_FILES = {"recipe.toml", "partition.json", "metrics.jsonl", LOCK_NAME, RUN_MARKER}
_RUN_FOLDERS = {"checkpoints", "analysis", "figures"}
_SET_ASIDE = re.compile(r"^(metrics\.jsonl|partition\.json|round-\d{4,}(\.clients)?\.pt)\.damaged(\.\d+)?$")
_CHECKPOINT_FILE = re.compile(r"^round-\d{4,}(\.clients)?\.pt$")


# The values the training loop logs in every round row, numbers all (NaN and inf written as NaN / Infinity).
NUMERIC_METRICS = ("lr", "train_loss", "test_loss", "test_acc", "seconds", "update_norm", "uplink_floats",
                   "client_update_sq", "flatness_distance", "flatness_distance_normalized",
                   "flatness_distance_relative", "flatness_distance_to_global",
                   "flatness_distance_to_global_normalized")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _current_row(row: dict) -> dict:
    """A metrics row under today's names (``RunDir.read_metrics``)."""
    if "flatness_distance" not in row or "flatness_distance_to_global" in row:
        return row
    row = dict(row)
    row["flatness_distance_to_global"] = row.pop("flatness_distance")
    if "flatness_distance_normalized" in row:
        row["flatness_distance_to_global_normalized"] = row.pop("flatness_distance_normalized")
    return row


class RunDir:
    """Paths of one run directory."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    recipe = property(lambda self: self.path / "recipe.toml")
    partition = property(lambda self: self.path / "partition.json")
    metrics = property(lambda self: self.path / "metrics.jsonl")
    checkpoints = property(lambda self: self.path / "checkpoints")

    def checkpoint(self, round: int) -> Path:
        return self.checkpoints / f"round-{round:04d}.pt"

    def clients_checkpoint(self, round: int) -> Path:
        return self.checkpoints / f"round-{round:04d}.clients.pt"

    def rounds(self) -> list[int]:
        """Rounds with a checkpoint file, ascending."""
        if not self.checkpoints.is_dir():
            return []
        found = (_CKPT.match(p.name) for p in self.checkpoints.iterdir())
        return sorted(int(m.group(1)) for m in found if m)

    def is_run(self) -> bool:
        """A recipe.toml is there (of whatever kind: one that is a FIFO or a folder is named when read)."""
        return self.recipe.exists() or self.recipe.is_symlink()

    @property
    def marker(self) -> Path:
        return self.path / RUN_MARKER

    def mark(self) -> None:
        """Mark the folder as a run directory this tool made (``--overwrite`` may replace it)."""
        if not self.marker.is_file() or self.marker.is_symlink():
            write_text(self.marker, "a run directory made by `landscape train`: --overwrite may replace it\n")

    def foreign_entries(self) -> list[str]:
        """What a run directory made before the marker existed holds besides a run's files and folders (its
        own or a user's files: --overwrite leaves such a folder alone). Empty for a marked run."""
        if self.marker.is_file() and not self.marker.is_symlink():
            return []
        foreign = []
        for entry in sorted(self.path.iterdir()):
            name = entry.name
            if entry.is_symlink():
                foreign.append(name)
            elif entry.is_dir() and name in _RUN_FOLDERS:
                if name == "checkpoints":
                    foreign += [f"checkpoints/{p.name}" for p in sorted(entry.iterdir())
                                if p.is_symlink() or not p.is_file() or not (
                                    _CHECKPOINT_FILE.match(p.name) or _SET_ASIDE.match(p.name) or _TEMP.match(p.name))]
            elif not (entry.is_file() and (name in _RUN_FILES or _SET_ASIDE.match(name) or _TEMP.match(name))):
                foreign.append(name)
        return foreign

    def holds_run_files(self) -> bool:
        """A recipe.toml and something a run writes after it (partition.json, metrics, checkpoints)."""
        return self.is_run() and any(p.exists() for p in (self.partition, self.metrics, self.checkpoints))

    # -- metrics.jsonl ----------------------------------------------------------------------------------
    def scan_metrics(self) -> tuple[list[dict], list[tuple[int, str]]]:
        """The intact rows of metrics.jsonl (round rows and event rows: JSON objects with an integer
        ``round``) and its damaged lines as (line number, text). A last line without its newline is what a
        killed process leaves: it is neither (a resume drops it and recomputes its round)."""
        rows, damaged = self._scan_metrics()
        return [row for _, row in rows], damaged

    def _scan_metrics(self) -> tuple[list[tuple[int, dict]], list[tuple[int, str]]]:
        """``scan_metrics``, each intact row with its line number."""
        if not self.metrics.exists():
            return [], []
        try:  # through open_regular: a FIFO or folder in its place is one line, never a hang
            with open_regular(self.metrics, "the metrics of a run") as f:
                text = f.read().decode("utf-8", errors="replace")
        except OSError as e:
            raise LandscapeError(f"cannot read {self.metrics}: {os_reason(e)}") from None
        lines = text.split("\n")
        rows: list[tuple[int, dict]] = []
        damaged: list[tuple[int, str]] = []
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except (ValueError, RecursionError):
                row = None
            if isinstance(row, dict) and isinstance(row.get("round"), int) and not isinstance(row["round"], bool):
                rows.append((number, row))
            elif number < len(lines):  # a whole line (the last one has no newline after it)
                damaged.append((number, line + "\n"))
        return rows, damaged

    def _read_rows(self) -> list[dict]:
        """Every intact row of metrics.jsonl (round rows and event rows); damaged lines are skipped. A round
        row whose measured value is not a number (``"test_acc": "high"``, null, a list: a hand-edited or
        hostile file) is one line naming the file, the line and the key: the figures and tables read these
        values as numbers. A value counts as measured where the training loop logs it (``NUMERIC_METRICS``) or
        where another row of the file holds a number under its key."""
        rows = self._scan_metrics()[0]
        numeric = set(NUMERIC_METRICS) | {key for _, row in rows if "event" not in row for key, value in row.items()
                                          if _is_number(value)}
        for number, row in rows:
            if "event" in row:
                continue
            bad = next((key for key in row if key in numeric and not _is_number(row[key])), None)
            if bad is not None:
                raise LandscapeError(f"{self.metrics}, line {number}: {shown(bad, 40)} is "
                                     f"{shown(json.dumps(row[bad]), 40)}, not a number (a damaged metrics.jsonl: "
                                     "correct or remove that line)")
        return [row for _, row in rows]

    def read_rows(self) -> tuple[list[dict], list[dict]]:
        """(``read_metrics``, ``read_events``) from one reading of metrics.jsonl."""
        rows = self._read_rows()
        return [_current_row(r) for r in rows if "event" not in r], [r for r in rows if "event" in r]

    def read_metrics(self) -> list[dict]:
        """The per-round rows of metrics.jsonl (event rows such as a divergence are left out: see
        ``read_events``). A row written before the flatness distance was taken around the clients' mean
        (it has ``flatness_distance`` but no ``flatness_distance_to_global``) logged the distance to the new
        global model under that name: it is read under its own name, ``flatness_distance_to_global``."""
        return self.read_rows()[0]

    def read_events(self) -> list[dict]:
        """The event rows of metrics.jsonl: ``{"round": t, "event": "diverged", "algorithm": ..., ...}``."""
        return self.read_rows()[1]

    def append_metrics(self, row: dict) -> None:
        try:  # never through a symbolic link (a resume writes the file anew first: a link is replaced)
            with open(self.metrics, "a", opener=open_no_follow) as f:
                f.write(json.dumps(row, allow_nan=True) + "\n")
                f.flush()
                os.fsync(f.fileno())
        except OSError as e:
            if self.metrics.is_symlink():
                raise LandscapeError(f"cannot write {self.metrics}: it is a symbolic link; metrics.jsonl is a "
                                     "plain file this tool writes") from None
            raise LandscapeError(f"cannot write {self.metrics}: {os_reason(e)}") from None

    def append_event(self, event: str, round: int, **fields: Any) -> None:
        """An event row (NaN and inf written as strings, so that the line stays standard JSON)."""
        def plain(v: Any) -> Any:
            return str(v) if isinstance(v, float) and not math.isfinite(v) else v

        self.append_metrics({"round": round, "event": event, **{k: plain(v) for k, v in fields.items()}})

    def truncate_metrics(self, last_round: int, recomputed: list[dict] = ()) -> None:
        """Keep the rows of rounds <= ``last_round`` (rows after a resumed checkpoint are recomputed) and
        every event row (the run's history: a divergence stays on record), in their order; put the
        ``recomputed`` rows of rounds that had none in their place. Damaged lines are left out (see
        ``set_aside_lines``)."""
        rows = [r for r in self.scan_metrics()[0] if "event" in r or r["round"] <= last_round]
        for new in sorted(recomputed, key=lambda r: r["round"]):
            at = next((i for i, r in enumerate(rows) if "event" not in r and r["round"] > new["round"]), len(rows))
            rows.insert(at, new)
        write_text(self.metrics, "".join(json.dumps(r, allow_nan=True) + "\n" for r in rows))

    def set_aside_lines(self, lines: list[tuple[int, str]]) -> Path:
        """Add damaged metrics lines to ``metrics.jsonl.damaged`` (never deleted); returns that file."""
        target = self.path / "metrics.jsonl.damaged"
        try:
            before = target.read_text(errors="replace") if target.is_file() and not target.is_symlink() else ""
        except OSError as e:
            raise LandscapeError(f"cannot read {target}: {os_reason(e)}") from None
        write_text(target, before + "".join(text for _, text in lines))
        return target

    # -- leftovers of a killed process ------------------------------------------------------------------
    def stale_temp_files(self) -> list[Path]:
        """Temporary files of interrupted atomic writes in the run folder and checkpoints/ (never results)."""
        found = []
        for folder in (self.path, self.checkpoints):
            if folder.is_dir() and not (folder == self.checkpoints and folder.is_symlink()):  # never outside
                found += [p for p in folder.iterdir() if _TEMP.match(p.name) and p.is_file()]
        return sorted(found)

    def remove_stale_temp_files(self) -> list[Path]:
        """Remove them (call with the run's lock held: no other process is writing here)."""
        removed = self.stale_temp_files()
        for p in removed:
            p.unlink(missing_ok=True)
        return removed

    def set_aside(self, path: Path, suffix: str = ".damaged") -> Path:
        """Rename a file out of the way (``round-0004.pt`` -> ``round-0004.pt.damaged``), never deleting it."""
        refuse_links(path, what="move aside")
        target = path.with_name(path.name + suffix)
        n = 1
        while target.exists():
            target = path.with_name(f"{path.name}{suffix}.{n}")
            n += 1
        try:
            os.replace(path, target)
        except OSError as e:
            raise LandscapeError(f"cannot move {path} aside: {os_reason(e)}") from None
        return target

    def is_empty(self) -> bool:
        """No entries besides what a process killed before writing recipe.toml leaves (its lock file, a
        temporary file)."""
        return not self.path.is_dir() or all(p.name in (LOCK_NAME, RUN_MARKER) or _TEMP.match(p.name)
                                             for p in self.path.iterdir())


def partition_record(
    client_indices: list[np.ndarray], histogram: np.ndarray, settings: dict, heterogeneity: dict
) -> dict:
    return {
        "settings": settings,
        "num_clients": len(client_indices),
        "heterogeneity": heterogeneity,
        "clients": [
            {"client": i, "size": len(idx), "histogram": histogram[i].tolist(), "indices": idx.tolist()}
            for i, idx in enumerate(client_indices)
        ],
    }
