"""Claim files (``claims/*.toml``): their schema, read and checked (``load_claim``); the format is described in
``landscape.figures.claims``."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from landscape.errors import LandscapeError
from landscape.figures.claim_statistics import MAX_SEEDS
from landscape.recipe import read_toml

DEFAULT_TAU = 0.5  # nats above the centre's loss: the level set whose area ``surface width`` measures
_TOP_KEYS = {"claim", "source", "figure", "seeds", "quantity", "rounds", "level", "tau", "compare"}
_COMPARE_KEYS = {"lower", "higher", "quantity", "rounds", "tau"}
LAST_N = re.compile(r"^last\s+(\d+)$")


@dataclass(frozen=True)
class Comparison:
    """``lower`` should have the lower ``quantity`` than ``higher`` (run ids of the claim's figure recipe)."""

    lower: str
    higher: str
    quantity: str
    rounds: str | int | tuple[int, ...]
    tau: float = DEFAULT_TAU

    @property
    def text(self) -> str:
        return f"{self.quantity}: {self.lower} < {self.higher}"


@dataclass(frozen=True)
class Claim:
    path: Path
    name: str  # the file's stem
    text: str
    source: str
    figure: Path
    seeds: tuple[int, ...]
    comparisons: tuple[Comparison, ...]
    level: float = 0.05

    def run_ids(self) -> list[str]:
        ids: list[str] = []
        for c in self.comparisons:
            ids += [i for i in (c.lower, c.higher) if i not in ids]
        return ids


def _rounds(value: Any, where: str) -> str | int | tuple[int, ...]:
    if isinstance(value, bool):
        raise LandscapeError(f"{where}: rounds must be \"last\", \"last N\", \"all\", a round or a list of rounds")
    if isinstance(value, int) and value >= 0:
        return value
    if isinstance(value, list) and value and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                                                 for v in value):
        return tuple(value)
    if isinstance(value, str):
        text = " ".join(value.split())
        match = LAST_N.match(text)
        if text in ("last", "all") or (match and int(match.group(1)) >= 1):
            return text
    raise LandscapeError(f"{where}: rounds must be \"last\", \"last N\", \"all\", a round or a list of rounds "
                         f"(got {value!r})")


def _positive(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise LandscapeError(f"{what} must be a positive number (got {value!r})")
    return float(value)


def load_claim(path: str | Path, seeds: Sequence[int] | None = None) -> Claim:
    """Read and check a claim file; ``seeds`` replaces the file's."""
    path = Path(path)
    raw = read_toml(path)
    unknown = sorted(set(raw) - _TOP_KEYS)
    if unknown:
        raise LandscapeError(f"{path}: unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(_TOP_KEYS))})")
    for key in ("claim", "figure"):
        if not isinstance(raw.get(key), str) or not raw[key].strip():
            raise LandscapeError(f"{path}: `{key}` must be a non-empty string")
    figure = (path.parent / raw["figure"]).resolve()
    if not figure.is_file():
        raise LandscapeError(f"{path}: figure recipe {raw['figure']} not found (looked for {figure})")
    chosen = list(seeds) if seeds is not None else raw.get("seeds", [0])
    if (not isinstance(chosen, list) or not chosen
            or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in chosen)
            or len(set(chosen)) != len(chosen)):
        raise LandscapeError(f"{path}: seeds must be a list of distinct non-negative integers (got {chosen!r})")
    if len(chosen) > MAX_SEEDS:
        raise LandscapeError(f"{path}: at most {MAX_SEEDS} seeds (the exact sign-flip test enumerates 2^n sign "
                             f"patterns; got {len(chosen)})")
    level = _positive(raw.get("level", 0.05), f"{path}: level")
    if level >= 0.5:
        raise LandscapeError(f"{path}: level must be below 0.5 (got {level})")
    tau = _positive(raw.get("tau", DEFAULT_TAU), f"{path}: tau")
    entries = raw.get("compare")
    if not isinstance(entries, list) or not entries or not all(isinstance(e, dict) for e in entries):
        raise LandscapeError(f"{path}: a claim needs at least one [[compare]] table")
    comparisons = []
    for i, entry in enumerate(entries, 1):
        where = f"{path}: [[compare]] {i}"
        unknown = sorted(set(entry) - _COMPARE_KEYS)
        if unknown:
            raise LandscapeError(f"{where}: unknown key(s) {', '.join(unknown)} "
                                 f"(known: {', '.join(sorted(_COMPARE_KEYS))})")
        for key in ("lower", "higher"):
            if not isinstance(entry.get(key), str) or not entry[key]:
                raise LandscapeError(f"{where}: `{key}` must name a run id of the figure recipe")
        if entry["lower"] == entry["higher"]:
            raise LandscapeError(f"{where}: lower and higher name the same run id {entry['lower']!r}")
        quantity = entry.get("quantity", raw.get("quantity"))
        if not isinstance(quantity, str) or not quantity.strip():
            raise LandscapeError(f"{where}: no quantity (set `quantity` in the comparison or at the top)")
        if "rounds" not in entry and "rounds" not in raw:
            raise LandscapeError(f"{where}: no rounds (set `rounds` in the comparison or at the top)")
        comparisons.append(Comparison(entry["lower"], entry["higher"], quantity.strip(),
                                      _rounds(entry.get("rounds", raw.get("rounds")), where),
                                      _positive(entry.get("tau", tau), f"{where}: tau")))
    return Claim(path, path.stem, raw["claim"].strip(), str(raw.get("source", "")).strip(), figure,
                 tuple(chosen), tuple(comparisons), level)


def check_run_ids(claim: Claim, known: Sequence[str]) -> None:
    """One line naming the ids a claim compares that its figure recipe does not define."""
    missing = [i for i in claim.run_ids() if i not in known]
    if missing:
        raise LandscapeError(f"{claim.path}: run id(s) {', '.join(missing)} are not in {claim.figure.name} "
                             f"(its runs: {', '.join(known)})")


# -- one number per run -----------------------------------------------------------------------------------------
