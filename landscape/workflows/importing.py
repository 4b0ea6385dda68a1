"""``landscape import``: a folder of existing state_dict files (the global model and each client's per round,
named by patterns such as ``global/round-{round}.pt`` and ``clients/round-{round}/client-{client}.pt``) made a run
directory of the run format, without training again (``import_run``). Rounds and clients come from the file
names, never from sorted position; the run is written by ``landscape.RunWriter``, so it is exactly the run that
writer would have recorded from the same models, and an interrupted import continues where it stopped.
"""

from __future__ import annotations

import glob
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from landscape.core.errors import LandscapeError
from landscape.core.reading import read_json
from landscape.store.checkpoints import load_state_dict_file
from landscape.store.writer import RunWriter

PREVIOUS = "previous"  # --start previous: the clients started from the previous round's global model


@dataclass(frozen=True)
class Pattern:
    """A file name pattern with ``{round}`` (and ``{client}``) fields, each matching a whole number."""

    text: str
    fields: tuple[str, ...]

    @classmethod
    def parse(cls, text: str, what: str, fields: tuple[str, ...]) -> Pattern:
        found = re.findall(r"\{(\w*)\}", text)
        unknown = [f for f in found if f not in fields]
        if unknown or sorted(found) != sorted(fields) or len(set(found)) != len(found):
            need = " and ".join("{" + f + "}" for f in fields)
            example = "clients/round-{round}/client-{client}.pt" if "client" in fields else "global/round-{round}.pt"
            raise LandscapeError(f"{what} '{text}' must name {need} once each (e.g. {example})")
        return cls(text, fields)

    def regex(self, **known: int) -> re.Pattern:
        parts = re.split(r"(\{\w+\})", self.text)
        out = []
        for part in parts:
            name = part[1:-1] if part.startswith("{") and part.endswith("}") else None
            if name is None:
                out.append(re.escape(part))
            elif name in known:
                out.append(rf"0*{known[name]}")
            else:
                out.append(rf"(?P<{name}>\d+)")
        return re.compile("".join(out) + r"\Z")

    def matches(self, **known: int) -> dict[tuple[int, ...], Path]:
        """(values of the free fields) -> file, for every file the pattern names."""
        regex = self.regex(**known)
        found: dict[tuple[int, ...], Path] = {}
        for name in sorted(glob.glob(re.sub(r"\{\w+\}", "*", glob.escape(self.text)))):
            hit = regex.match(name)
            if hit and Path(name).is_file():
                key = tuple(int(v) for v in hit.groups())
                if key in found:
                    raise LandscapeError(f"{found[key]} and {name} name the same {self._what(hit)}")
                found[key] = Path(name)
        return found

    @staticmethod
    def _what(hit: re.Match) -> str:
        return ", ".join(f"{k} {int(v)}" for k, v in hit.groupdict().items())


def read_partition_file(path: Path) -> dict[int, list[int]]:
    """{client: indices} of a JSON file: landscape's partition.json, {"0": [...], ...} or [[...], ...]."""
    record = read_json(path, "a partition: JSON")  # a FIFO, a folder, a damaged or deep file: one line
    if isinstance(record, dict) and isinstance(record.get("clients"), list):
        record = [c.get("indices") if isinstance(c, dict) else None for c in record["clients"]]
    if isinstance(record, list):
        record = dict(enumerate(record))
    if not isinstance(record, dict) or not all(isinstance(k, (str, int)) and str(k).isdigit() for k in record):
        raise LandscapeError(f"the partition {path} must map clients 0..N-1 to lists of sample indices (a "
                             "partition.json, {\"0\": [...], ...} or [[...], ...])")
    out = {int(k): v for k, v in record.items()}
    if not all(isinstance(v, list) and all(type(i) is int for i in v) for v in out.values()):
        raise LandscapeError(f"the partition {path}: each client's samples must be a list of whole numbers")
    return out


def hyperparameters(assignments: tuple[str, ...] | list[str]) -> dict:
    """``--set train.KEY=VALUE`` / ``algorithm.KEY=VALUE`` as RunWriter's hyper-parameters (recorded, never run)."""
    from landscape.config.overrides import parse_assignment
    from landscape.store.writer import TRAIN_KEYS

    out = {}
    for text in assignments:
        key, value = parse_assignment(text)
        section, _, name = key.partition(".")
        if section not in ("train", "algorithm") or not name or "." in name:
            raise LandscapeError(f"--set of landscape import records a hyper-parameter: train.KEY or algorithm.KEY "
                                 f"(got '{key}')")
        if section == "train" and name not in TRAIN_KEYS:
            raise LandscapeError(f"--set {key}: not a training key; training keys: {', '.join(sorted(TRAIN_KEYS))}")
        out[name] = value
    return out


@dataclass
class ImportReport:
    rounds: list[int] = field(default_factory=list)
    clients: dict[int, list[int]] = field(default_factory=dict)  # round -> the clients recorded


def _plan(global_files: Pattern, client_files: Pattern | None, start: str) -> dict[int, tuple[Path, dict, Path | None]]:
    """round -> (global file, {client: file}, start file or None for the previous round's global file)."""
    rounds = {key[0]: path for key, path in global_files.matches().items()}
    if not rounds:
        raise LandscapeError(f"no file matches --global '{global_files.text}'")
    start_files = None if start == PREVIOUS else Pattern.parse(start, "--start", ("round",)).matches()
    plan = {}
    for t, path in sorted(rounds.items()):
        clients = {key[0]: p for key, p in client_files.matches(round=t).items()} if client_files else {}
        begin = None
        if clients and start_files is not None:
            if (t,) not in start_files:
                raise LandscapeError(f"round {t} has client models but no start file (--start '{start}')")
            begin = start_files[(t,)]
        elif clients and t - 1 not in rounds:
            raise LandscapeError(f"round {t}'s clients started from round {t - 1}'s global model (--start previous), "
                                 f"and no file of round {t - 1} matches --global '{global_files.text}'")
        plan[t] = (path, clients, begin)
    return plan


def import_run(out: Path, *, global_files: str, client_files: str | None, start: str | None, model: str, data: str,
               partition: str, test_data: str | None = None, algorithm: str = "unknown",
               hyperparameters: dict | None = None, overwrite: bool = False,
               progress: Callable[[int, int], None] | None = None) -> ImportReport:
    """Record the state_dict files the patterns name as the run ``out`` (see the module's docstring). ``start``:
    a pattern of the files the clients started from, or ``previous`` (the previous round's global model, the
    start of FedAvg, FedSAM and every rule that sends the global model); said explicitly, never assumed.
    ``partition``: a JSON file of the clients' sample indices."""
    pattern = Pattern.parse(global_files, "--global", ("round",))
    clients_pattern = Pattern.parse(client_files, "--clients", ("round", "client")) if client_files else None
    if clients_pattern is not None and not start:
        raise LandscapeError("say what the clients of a round started from: --start previous (the previous round's "
                             "global model: FedAvg, FedSAM, ...) or --start PATTERN (e.g. sent/round-{round}.pt)")
    plan = _plan(pattern, clients_pattern, start or PREVIOUS)
    report = ImportReport()
    with RunWriter(out, model=model, data=data, test_data=test_data, partition=read_partition_file(Path(partition)),
                   algorithm=algorithm, hyperparameters=hyperparameters, overwrite=overwrite) as writer:
        for done, (t, (path, clients, begin)) in enumerate(plan.items(), 1):
            kept = {c: load_state_dict_file(p) for c, p in clients.items()} or None
            first = begin if begin is not None else (plan[t - 1][0] if kept else None)
            writer.round(t, end=load_state_dict_file(path), clients=kept,
                         start=load_state_dict_file(first) if first is not None else None)
            report.rounds.append(t)
            if kept:
                report.clients[t] = sorted(kept)
            if progress is not None:
                progress(done, len(plan))
    return report
