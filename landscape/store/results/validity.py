"""Whether a stored result is current: a result is valid only while what made it is unchanged (issue 46, W6 and
W7). Every reader of a run's results (``Run.records()`` and ``Run.results()``, ``landscape report``, ``landscape
compare``, ``landscape figures``, claims) reads only the current ones; the others are left out, and one line per
run says how many, of which rounds, why, and the way out.

A result in ``analysis/round-NNNN/`` is current when

- the round its record names is the folder's (``cp -r analysis/round-0003 analysis/round-0099`` copies results
  that say round 3: they are no results of round 99),
- the run has that round's checkpoint (``checkpoints/round-NNNN.pt``: also a run recorded with
  ``landscape.RunWriter`` or made by ``landscape import``, which write the same files), and
- the checkpoint file's SHA-256 is the one its record holds (``checkpoint_sha256``: the checkpoint was not
  changed, or replaced by another run's through ``train --overwrite``, since it was analysed), and
- so is each other file it was computed from (``files_sha256``, where the pass read any: the round's kept client
  models ``round-NNNN.clients.pt`` of the flatness and alignment passes and of the client-plane surface, the
  previous round's checkpoint of the update cosines, another checkpoint of a surface): none removed or changed.

A record without ``checkpoint_sha256`` (written by an older version) is current while its round and checkpoint
are there: nothing tells whether that checkpoint changed. Each checkpoint file is hashed at most once per
``CheckpointHashes`` (a ``Run`` holds one; keyed by path, inode, size and modification time), reading its bytes
(never loading it with torch). A loose array (an NPZ without a record) is current while its round has a
checkpoint.

Results of plain state_dict files (``analysis/<stem>/`` beside them) are read back only by ``landscape
analyze``, which takes one as done only when its file's SHA-256 (and its model and data) match.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shlex
import sys
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from landscape.core.errors import LandscapeError, StaleResultWarning
from landscape.core.reading import open_regular
from landscape.store.directory import RunDir

if TYPE_CHECKING:
    from landscape.store.results.records import PassRecord


class Stale(NamedTuple):
    """A stored result that is not current: its file (the JSON; a loose array's NPZ), why (``'checkpoint changed
    since analysed'``, ``'no checkpoint for round 99'``, ``'its record says round 3'``, ...), the round of its
    folder and its pass ('' for a loose array)."""

    path: Path
    reason: str
    round: int
    pass_name: str


def file_sha256(path: Path) -> str:
    """The SHA-256 of a file's bytes, read through ``open_regular`` (a FIFO or folder in its place: one line,
    never a hang)."""
    h = hashlib.sha256()
    with open_regular(path, "a checkpoint") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class CheckpointHashes:
    """SHA-256 of checkpoint files, each file hashed once while its path, inode, size and modification time stay
    the same (``hashed`` counts the files read)."""

    def __init__(self) -> None:
        self._known: dict[tuple[str, int, int, int], str] = {}
        self.hashed = 0

    def sha256(self, path: Path) -> str:
        try:
            info = os.stat(path)
        except OSError:
            return file_sha256(path)  # gone, or not to be looked at: its own one line (``open_regular``)
        key = (str(path), info.st_ino, info.st_size, info.st_mtime_ns)
        if key not in self._known:
            try:
                self._known[key] = file_sha256(path)
            except OSError as e:
                raise LandscapeError(f"cannot read {path} (a checkpoint): {e.strerror or type(e).__name__}") from None
            self.hashed += 1
        return self._known[key]


# One process's hashes of the files ``landscape analyze`` checks (``analyze.source.file_digest``: the lookup of
# results done, the checkpoint analysed, the stale results it leaves): each file hashed once while unchanged.
PROCESS_HASHES = CheckpointHashes()

UNREADABLE = "its checkpoint cannot be read"


def stale_reason(folder_round: int, record: Mapping, checkpoints: Mapping[int, Path],
                 hashes: CheckpointHashes) -> str | None:
    """Why the result ``record``, stored in the folder of ``folder_round``, is not current (None: it is), given
    the run's checkpoints (round -> file)."""
    said = record.get("round")
    checkpoint = checkpoints.get(folder_round)
    if said is not None and said != folder_round:
        return f"its record says round {said}" + ("" if checkpoint is not None else
                                                  f" and there is no checkpoint for round {folder_round}")
    if checkpoint is None:
        return f"no checkpoint for round {folder_round}"
    recorded = record.get("checkpoint_sha256")
    if recorded is None:
        return None  # written before results recorded their checkpoint's hash: current while it is there
    try:
        now = hashes.sha256(checkpoint)
    except LandscapeError as e:
        return f"{UNREADABLE} ({e})"
    return "checkpoint changed since analysed" if now != recorded else files_changed(record, checkpoint, hashes)


def files_label(path: Path, checkpoint: Path) -> str:
    """How a result names a file it was computed from besides its checkpoint (``files_sha256``): by its name
    where it lies beside the checkpoint (``round-0006.clients.pt``, ``round-0005.pt``: a run moved or copied
    keeps its results current), else by its whole absolute path."""
    path = Path(path)
    return path.name if path.parent == Path(checkpoint).parent else str(path.resolve())


def files_changed(record: Mapping, checkpoint: Path, hashes: CheckpointHashes) -> str | None:
    """Why a result is not current for the files besides its checkpoint that it was computed from (its record's
    ``files_sha256``, {``files_label``: SHA-256}: a round's kept client models, the previous round's checkpoint,
    another checkpoint of a surface): the first one removed or changed since; None while they are unchanged
    (and for a record that names none)."""
    files = record.get("files_sha256")
    for label, recorded in (files.items() if isinstance(files, Mapping) else ()):
        path = Path(label) if os.path.isabs(label) else Path(checkpoint).parent / label
        if not path.is_file():
            return f"{label} removed since analysed"
        try:
            if hashes.sha256(path) != recorded:
                return f"{label} changed since analysed"
        except LandscapeError as e:
            return f"{label} cannot be read ({e})"
    return None


def split_current(records: Mapping[int, Sequence[PassRecord]], checkpoints: Mapping[int, Path],
                  hashes: CheckpointHashes) -> tuple[dict[int, list[PassRecord]], list[Stale]]:
    """(round -> the current results, in their order; the results that are not, a ``Stale`` each)."""
    current: dict[int, list[PassRecord]] = {}
    stale: list[Stale] = []
    for round_number, recs in records.items():
        for rec in recs:
            why = stale_reason(round_number, rec.record, checkpoints, hashes)
            if why is None:
                current.setdefault(round_number, []).append(rec)
            else:
                stale.append(Stale(rec.path, why, round_number, rec.name))
    return current, stale


def split_loose(loose: Sequence[tuple[int, Path]], checkpoints: Mapping[int, Path]
                ) -> tuple[list[tuple[int, Path]], list[Stale]]:
    """Loose arrays (round, NPZ without a record): those of a round with a checkpoint, and the others."""
    kept = [(r, path) for r, path in loose if r in checkpoints]
    return kept, [Stale(path, f"no checkpoint for round {r}", r, "") for r, path in loose if r not in checkpoints]


def run_checkpoints(run_path: Path, rounds: Sequence[int]) -> dict[int, Path]:
    """Round -> checkpoint file of a run directory's checkpointed ``rounds``."""
    return {r: RunDir(run_path).checkpoint(r) for r in rounds}


def stale_note(run_path: Path, stale: Sequence[Stale], lead: str = "left out") -> str:
    """One line saying how many of a run's results are not current, of which rounds and why, and the way out:
    ``run NAME: 2 analysis results left out, not current: round 3 (loss, hessian: checkpoint changed since
    analysed); `landscape analyze RUN --checkpoints 3 --passes loss,hessian --force` recomputes them (Run.
    stale_results() lists them)``. ``lead``: what the reader did with them."""
    run_path = Path(run_path)
    by_round: dict[int, dict[str, list[str]]] = {}
    for item in stale:
        by_round.setdefault(item.round, {}).setdefault(item.reason, []).append(item.pass_name or item.path.name)
    parts = []
    for r, reasons in sorted(by_round.items()):
        parts += [f"round {r} ({', '.join(dict.fromkeys(names))}: {why})" for why, names in reasons.items()]
    redo = sorted({item.round for item in stale if _way_out(item) == "redo"})
    passes = list(dict.fromkeys(item.pass_name for item in stale if _way_out(item) == "redo" and item.pass_name))
    remove = sorted({item.round for item in stale if _way_out(item) == "remove"})
    unreadable = sorted({item.round for item in stale if _way_out(item) == "repair"})
    ways = []
    quoted = shlex.quote(str(run_path))
    if redo:
        ways.append(f"`landscape analyze {quoted} --checkpoints {','.join(map(str, redo))}"
                    + (f" --passes {','.join(passes)}" if passes else "") + " --force` recomputes "
                    + ("them" if not (remove or unreadable) else f"those of round{'s' if len(redo) > 1 else ''} "
                       + ", ".join(map(str, redo))))
    if remove:
        folders = ", ".join(shlex.quote(str(run_path / "analysis" / f"round-{r:04d}")) for r in remove)
        ways.append(f"remove {folders} (the run has no checkpoint for {'them' if len(remove) > 1 else 'it'})")
    if unreadable:
        files = ", ".join(shlex.quote(str(RunDir(run_path).checkpoint(r))) for r in unreadable)
        ways.append(f"replace {files} by a checkpoint, or move {'them' if len(unreadable) > 1 else 'it'} away")
    n = len(stale)
    return (f"run {run_path.name}: {n} analysis result{'s' if n != 1 else ''} {lead}, not current: "
            f"{'; '.join(parts)}; {'; '.join(ways)} (Run.stale_results() lists them)")


_PACKAGE = str(Path(__file__).parents[2]) + os.sep  # the landscape package's folder


def warn_stale(run_path: Path, stale: Sequence[Stale]) -> None:
    """One ``StaleResultWarning`` (``stale_note``), attributed to the first caller outside the package (the
    notebook line that read the run)."""
    level, frame = 2, sys._getframe(1)  # level 2: the caller of this function
    while frame is not None and (frame.f_code.co_filename.startswith(_PACKAGE)
                                 or frame.f_code.co_filename == functools.__file__):
        level, frame = level + 1, frame.f_back
    warnings.warn(stale_note(run_path, stale), StaleResultWarning, stacklevel=level)


def _way_out(item: Stale) -> str:
    """How a stale result goes: 'redo' (``landscape analyze --force`` replaces it: its round has a checkpoint),
    'remove' (its round has no checkpoint: its folder goes) or 'repair' (its checkpoint cannot be read)."""
    if item.reason.startswith(UNREADABLE):
        return "repair"
    return "remove" if "no checkpoint" in item.reason else "redo"


def stale_in(run_path: Path, hashes: CheckpointHashes | None = None) -> list[Stale]:
    """The results of the run directory ``run_path`` that are not current (its records and loose arrays), read
    now, without warning (``landscape analyze`` says them in its summary)."""
    from landscape.store.results.records import loose_arrays, read_results

    checkpoints = run_checkpoints(run_path, RunDir(run_path).rounds())
    hashes = hashes if hashes is not None else PROCESS_HASHES
    _, stale = split_current(read_results(run_path), checkpoints, hashes)
    return stale + split_loose(loose_arrays(run_path), checkpoints)[1]
