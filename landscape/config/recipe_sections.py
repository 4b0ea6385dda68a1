"""The tables of a recipe as frozen settings dataclasses (``[dataset]``, ``[partition]``, ``[model]``,
``[algorithm]``, ``[train]``), with each common setting's default and rule, and the top-level keys; read,
resolved and written by ``landscape.config.recipe``."""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from landscape.core.errors import LandscapeError, shown


def _check(predicate: Callable[[Any], bool], rule: str) -> dict:
    return {"check": predicate, "rule": rule}


def _positive(v: Any) -> bool:
    return v > 0


def _non_negative(v: Any) -> bool:
    return v >= 0


def _no_options() -> Mapping[str, Any]:
    return MappingProxyType({})


def _rebuild(cls: type, values: dict) -> Any:
    if "options" in values:
        values = {**values, "options": MappingProxyType(values["options"])}
    return cls(**values)


class _Picklable:
    """Settings travel between processes (torchrun broadcasts a recipe): a read-only options mapping does not
    pickle, so they are rebuilt from their plain values."""

    def __reduce__(self) -> tuple:
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        if "options" in values:
            values["options"] = dict(values["options"])
        return _rebuild, (type(self), values)


# The four tables that name a registry entry: a few common settings, then the entry's own options (read-only).
@dataclass(frozen=True)
class DatasetSettings(_Picklable):
    name: str = "digits"
    root: str = "data"
    download: bool = False
    augment: bool = False
    options: Mapping[str, Any] = field(default_factory=_no_options)


@dataclass(frozen=True)
class PartitionSettings(_Picklable):
    name: str = "dirichlet"
    clients: int = field(default=20, metadata=_check(_positive, "must be >= 1"))
    options: Mapping[str, Any] = field(default_factory=_no_options)


@dataclass(frozen=True)
class ModelSettings(_Picklable):
    name: str = "cnn"
    options: Mapping[str, Any] = field(default_factory=_no_options)


@dataclass(frozen=True)
class AlgorithmSettings(_Picklable):
    name: str = "fedavg"
    options: Mapping[str, Any] = field(default_factory=_no_options)


LR_SCHEDULES = ("constant", "exponential", "cosine")
DTYPES = ("float32", "float64")
PRECISIONS = ("float32", "bf16")  # bf16: autocast of the local forward/backward passes (training only)


@dataclass(frozen=True)
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
    compile: bool = False  # torch.compile the training model's forward pass (analysis never compiles)
    precision: str = field(
        default="float32", metadata=_check(lambda v: v in PRECISIONS, f"must be one of {', '.join(PRECISIONS)}")
    )
    # CPU threads of torch while training (0: every core this process may use). The numbers of a round differ
    # in the last bits with the count; 1 is fastest for small federated clients and the same on every machine.
    threads: int = field(default=1, metadata=_check(lambda v: 0 <= v <= 4096,
                                                    "must be in 0..4096 (0: every core)"))


# imports: modules of the user's own that register models, data sets, partitions or algorithms when imported
# (``imports = ["mylab.models"]``). Importing runs their code: a recipe the user names is imported before it is
# checked; a recorded one (a run's recipe.toml) only when trusted (``resolve(recorded=True)``, landscape.config.imports).
TOP_LEVEL = {"name": "", "seed": 0, "imports": []}
SECTIONS: dict[str, type] = {
    "dataset": DatasetSettings,
    "partition": PartitionSettings,
    "model": ModelSettings,
    "algorithm": AlgorithmSettings,
    "train": TrainSettings,
}


# Values of recipe keys checked against their defaults' kinds (used by landscape.config.recipe's resolve).

def type_ok(default: Any, value: Any) -> bool:
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


def type_name(default: Any) -> str:
    for t, name in ((bool, "true or false"), (int, "an integer"), (float, "a number"), (str, "a string")):
        if isinstance(default, t):
            return name
    return "a list" if isinstance(default, (list, tuple)) else type(default).__name__


def coerce_value(where: str, default: Any, value: Any) -> Any:
    if not type_ok(default, value):
        raise LandscapeError(f"{shown(where)} must be {type_name(default)} (got {shown(repr(value))})")
    if isinstance(default, float) and not isinstance(value, bool):
        value = float(value)
        if not math.isfinite(value):
            raise LandscapeError(f"{where} must be finite (got {value})")
    if isinstance(default, tuple):
        value = list(value)
    return value


def unknown_key_message(dotted: str, allowed: list[str], where: str) -> str:
    """The message for an unknown recipe key: the keys allowed ``where`` ('in [train]', 'top-level'), then the
    closest of them (difflib) when one is close."""
    prefix, _, key = dotted.rpartition(".")
    close = difflib.get_close_matches(key, allowed, n=1)
    hint = f"; did you mean '{prefix + '.' if prefix else ''}{close[0]}'?" if close else ""
    return f"unknown recipe key '{shown(dotted)}'; allowed {where}: {', '.join(allowed)}{hint}"
