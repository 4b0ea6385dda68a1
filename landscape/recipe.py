"""TOML recipes: load, override (flags and ``--set key=value``), validate, resolve, write.

A recipe has two top-level keys (``name``, ``seed``) and five tables. Four of them name a registry entry
(``[dataset]``, ``[partition]``, ``[model]``, ``[algorithm]``): their keys are a few common settings plus
the options that entry declares. ``[train]`` holds the round loop's settings. The resolved recipe written
into a run directory holds every key with its value, defaults included.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from landscape.errors import LandscapeError
from landscape.registry import Registry

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


def _check(predicate: Callable[[Any], bool], rule: str) -> dict:
    return {"check": predicate, "rule": rule}


def _positive(v: Any) -> bool:
    return v > 0


def _non_negative(v: Any) -> bool:
    return v >= 0


@dataclass
class DatasetSettings:
    name: str = "digits"
    root: str = "data"
    download: bool = False
    augment: bool = False


@dataclass
class PartitionSettings:
    name: str = "dirichlet"
    clients: int = field(default=20, metadata=_check(_positive, "must be >= 1"))


@dataclass
class ModelSettings:
    name: str = "cnn"


@dataclass
class AlgorithmSettings:
    name: str = "fedavg"


LR_SCHEDULES = ("constant", "exponential", "cosine")
DTYPES = ("float32", "float64")


@dataclass
class TrainSettings:
    rounds: int = field(default=30, metadata=_check(_positive, "must be >= 1"))
    participation: float = field(default=0.25, metadata=_check(lambda v: 0 < v <= 1, "must be in (0, 1]"))
    local_epochs: int = field(default=5, metadata=_check(_non_negative, "must be >= 0"))
    local_steps: int = field(default=0, metadata=_check(_non_negative, "must be >= 0 (0: use local_epochs)"))
    batch_size: int = field(default=32, metadata=_check(_positive, "must be >= 1"))
    lr: float = field(default=0.1, metadata=_check(_positive, "must be > 0"))
    lr_schedule: str = field(
        default="constant", metadata=_check(lambda v: v in LR_SCHEDULES, f"must be one of {', '.join(LR_SCHEDULES)}")
    )
    lr_decay: float = field(default=0.998, metadata=_check(_positive, "must be > 0"))
    lr_min: float = field(default=0.0, metadata=_check(_non_negative, "must be >= 0"))
    server_lr: float = field(default=1.0, metadata=_check(_positive, "must be > 0"))
    weight_decay: float = field(default=0.0, metadata=_check(_non_negative, "must be >= 0"))
    clip_norm: float = field(default=0.0, metadata=_check(_non_negative, "must be >= 0 (0: no clipping)"))
    eval_every: int = field(default=1, metadata=_check(_positive, "must be >= 1"))
    checkpoint_every: int = field(default=10, metadata=_check(_positive, "must be >= 1"))
    keep_clients: bool = False
    swa: bool = False
    swa_start: float = field(default=0.75, metadata=_check(lambda v: 0 <= v < 1, "must be in [0, 1) (a fraction of rounds)"))
    swa_cycle: int = field(default=5, metadata=_check(_positive, "must be >= 1"))
    swa_lr: float = field(default=0.001, metadata=_check(_positive, "must be > 0"))
    device: str = "auto"
    dtype: str = field(default="float32", metadata=_check(lambda v: v in DTYPES, f"must be one of {', '.join(DTYPES)}"))


TOP_LEVEL = {"name": "", "seed": 0}
SECTIONS: dict[str, type] = {
    "dataset": DatasetSettings,
    "partition": PartitionSettings,
    "model": ModelSettings,
    "algorithm": AlgorithmSettings,
    "train": TrainSettings,
}


def registries() -> dict[str, Registry]:
    # Imported here so that the recipe module stays importable without pulling in torch models at import.
    from landscape.data.datasets import DATASETS
    from landscape.data.partitions import PARTITIONS
    from landscape.models import MODELS
    from landscape.train.algorithms import ALGORITHMS

    return {"dataset": DATASETS, "partition": PARTITIONS, "model": MODELS, "algorithm": ALGORITHMS}


# ----------------------------------------------------------------------------------------------------------
# reading and overriding


def read_toml(path: str | Path) -> dict:
    p = Path(path)
    if not p.is_file():
        raise LandscapeError(f"recipe file not found: {p}")
    try:
        return tomllib.loads(p.read_text())
    except tomllib.TOMLDecodeError as e:
        raise LandscapeError(f"{p}: not valid TOML ({e})") from None
    except UnicodeDecodeError:
        raise LandscapeError(f"{p}: not a text (TOML) file") from None


def parse_value(text: str) -> Any:
    """A ``--set`` value: TOML syntax when it parses (0.1, true, [1, 2], "x"), else the plain string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def set_key(raw: dict, dotted: str, value: Any) -> None:
    """Set ``section.key`` (or a top-level key) in a raw recipe dict."""
    parts = dotted.split(".")
    if len(parts) > 2 or not all(parts):
        raise LandscapeError(f"recipe key '{dotted}' must be 'key' or 'section.key'")
    if len(parts) == 1:
        if parts[0] in SECTIONS:
            raise LandscapeError(f"recipe key '{dotted}' is a table; set one of its keys, e.g. {dotted}.name")
        raw[parts[0]] = value
        return
    table = raw.setdefault(parts[0], {})
    if not isinstance(table, dict):
        raise LandscapeError(f"recipe key '{parts[0]}' must be a table")
    table[parts[1]] = value


def parse_assignment(text: str) -> tuple[str, Any]:
    if "=" not in text:
        raise LandscapeError(f"--set takes key=value (got '{text}')")
    key, value = text.split("=", 1)
    return key.strip(), parse_value(value.strip())


# ----------------------------------------------------------------------------------------------------------
# validation


def _type_ok(default: Any, value: Any) -> bool:
    if isinstance(default, bool):
        return isinstance(value, bool)
    if isinstance(default, int):
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(default, float):
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if isinstance(default, str):
        return isinstance(value, str)
    if isinstance(default, (list, tuple)):
        return isinstance(value, list)
    return True


def _type_name(default: Any) -> str:
    for t, name in ((bool, "true or false"), (int, "an integer"), (float, "a number"), (str, "a string")):
        if isinstance(default, t):
            return name
    return "a list" if isinstance(default, (list, tuple)) else type(default).__name__


def _coerce(where: str, default: Any, value: Any) -> Any:
    if not _type_ok(default, value):
        raise LandscapeError(f"{where} must be {_type_name(default)} (got {value!r})")
    if isinstance(default, float) and not isinstance(value, bool):
        value = float(value)
        if not math.isfinite(value):
            raise LandscapeError(f"{where} must be finite (got {value})")
    if isinstance(default, tuple):
        value = list(value)
    return value


def _resolve_section(section: str, given: dict, registry: Registry | None) -> dict:
    common = SECTIONS[section]
    common_fields = {f.name: f for f in dataclasses.fields(common)}
    defaults = {f.name: f.default for f in common_fields.values()}
    name = given.get("name", defaults.get("name"))
    entry = None
    if registry is not None:
        if not isinstance(name, str):
            raise LandscapeError(f"{section}.name must be a string (got {name!r})")
        entry = registry.get(name)
        option_defaults = entry.option_defaults()
    else:
        option_defaults = {}
    allowed = list(common_fields) + [k for k in option_defaults if k not in common_fields]
    out: dict[str, Any] = {}
    for key in given:
        if key not in allowed:
            owner = f"[{section}] with {section}.name = '{name}'" if entry is not None else f"[{section}]"
            raise LandscapeError(f"unknown recipe key '{section}.{key}'; allowed in {owner}: {', '.join(allowed)}")
    for key in allowed:
        default = defaults[key] if key in common_fields else option_defaults[key]
        value = _coerce(f"{section}.{key}", default, given[key]) if key in given else default
        meta = common_fields[key].metadata if key in common_fields else {}
        if "check" in meta and not meta["check"](value):
            raise LandscapeError(f"{section}.{key} {meta['rule']} (got {value!r})")
        out[key] = list(value) if isinstance(value, tuple) else value
    if entry is not None:
        # The entry's own options dataclass may check its values (e.g. alpha > 0) in __post_init__.
        try:
            entry.make_options({k: out[k] for k in option_defaults})
        except (TypeError, ValueError) as e:
            raise LandscapeError(f"{section} '{name}': {e}") from None
    return out


def resolve(raw: dict) -> dict:
    """Validate a raw recipe dict and return it with every default written out."""
    if not isinstance(raw, dict):
        raise LandscapeError("a recipe must be a TOML table")
    allowed = list(TOP_LEVEL) + list(SECTIONS)
    for key in raw:
        if key not in allowed:
            raise LandscapeError(f"unknown recipe key '{key}'; allowed top-level keys: {', '.join(allowed)}")
    regs = registries()
    out: dict[str, Any] = {}
    for key, default in TOP_LEVEL.items():
        out[key] = _coerce(key, default, raw[key]) if key in raw else default
    if out["seed"] < 0:
        raise LandscapeError(f"seed must be >= 0 (got {out['seed']})")
    for section in SECTIONS:
        given = raw.get(section, {})
        if not isinstance(given, dict):
            raise LandscapeError(f"recipe key '{section}' must be a table ([{section}])")
        out[section] = _resolve_section(section, given, regs.get(section))
    return out


def entry_options(recipe: dict, section: str) -> dict:
    """The registry-entry options of a resolved section (its keys minus the common settings)."""
    common = {f.name for f in dataclasses.fields(SECTIONS[section])}
    return {k: v for k, v in recipe[section].items() if k not in common}


def build(path: str | Path | None = None, overrides: list[tuple[str, Any]] = ()) -> dict:
    """Load a recipe file (or start empty), apply overrides in order, resolve."""
    raw = read_toml(path) if path is not None else {}
    for key, value in overrides:
        set_key(raw, key, value)
    return resolve(raw)


# ----------------------------------------------------------------------------------------------------------
# writing


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def to_toml(recipe: dict) -> str:
    lines = [f"{k} = {_toml_value(v)}" for k, v in recipe.items() if not isinstance(v, dict)]
    for k, v in recipe.items():
        if isinstance(v, dict):
            lines += ["", f"[{k}]"] + [f"{kk} = {_toml_value(vv)}" for kk, vv in v.items()]
    return "\n".join(lines) + "\n"


def run_name(recipe: dict) -> str:
    """A systematic run name: dataset-algorithm-partition-model-clients-seed."""
    part = recipe["partition"]
    pname = {"dirichlet": "dir", "pathological": "path"}.get(part["name"], part["name"])
    if "alpha" in part:
        pname += f"{part['alpha']:g}"
    if "classes_per_client" in part:
        pname += f"{part['classes_per_client']}"
    return "-".join(
        [
            recipe["dataset"]["name"],
            recipe["algorithm"]["name"],
            pname,
            recipe["model"]["name"],
            f"c{part['clients']}",
            f"s{recipe['seed']}",
        ]
    )
