"""The tables of a recipe as frozen settings dataclasses (``[dataset]``, ``[partition]``, ``[model]``,
``[algorithm]``, ``[train]``) and its top-level keys, each setting's kind, default, range and choices declared in
its annotation (``landscape.core.schema``); read, resolved and written by ``landscape.config.recipe``."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Annotated, Any, Literal

from landscape.core import schema
from landscape.core.schema import rule


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


# The four tables that name a registry entry: a few common settings, then the entry's own options (read-only;
# checked by the entry's options dataclass, not by these).
@dataclass(frozen=True)
class DatasetSettings(_Picklable):
    name: str = "digits"
    root: str = "data"
    download: bool = False
    augment: bool = False
    options: Mapping[str, Any] = field(default_factory=_no_options)


@dataclass(frozen=True)
class PartitionSettings(_Picklable):
    name: str = "dirichlet-client-reuse"  # as the papers' reference codes draw (landscape.data.partitions)
    clients: Annotated[int, rule(ge=1)] = 20
    options: Mapping[str, Any] = field(default_factory=_no_options)


@dataclass(frozen=True)
class ModelSettings(_Picklable):
    name: str = "cnn"
    options: Mapping[str, Any] = field(default_factory=_no_options)


@dataclass(frozen=True)
class AlgorithmSettings(_Picklable):
    name: str = "fedavg"
    options: Mapping[str, Any] = field(default_factory=_no_options)


@dataclass(frozen=True)
class TrainSettings:
    rounds: Annotated[int, rule(ge=1)] = 30
    participation: Annotated[float, rule(gt=0, le=1, text="must be in (0, 1]")] = 0.25
    local_epochs: Annotated[int, rule(ge=0)] = 5
    local_steps: Annotated[int, rule("0: use local_epochs", ge=0)] = 0
    batch_size: Annotated[int, rule(ge=1)] = 32
    lr: Annotated[float, rule(gt=0)] = 0.1
    lr_schedule: Literal["constant", "exponential", "cosine"] = "constant"
    lr_decay: Annotated[float, rule(gt=0)] = 0.998
    lr_min: Annotated[float, rule(ge=0)] = 0.0
    server_lr: Annotated[float, rule(gt=0)] = 1.0
    weight_decay: Annotated[float, rule(ge=0)] = 0.0
    clip_norm: Annotated[float, rule("0: no clipping", ge=0)] = 0.0
    eval_every: Annotated[int, rule(ge=1)] = 1
    checkpoint_every: Annotated[int, rule(ge=1)] = 10
    keep_clients: bool = False
    swa: bool = False
    swa_start: Annotated[float, rule(ge=0, lt=1, text="must be in [0, 1) (a fraction of rounds)")] = 0.75
    swa_cycle: Annotated[int, rule(ge=1)] = 5
    swa_lr: Annotated[float, rule(gt=0)] = 0.001
    device: str = "auto"
    dtype: Literal["float32", "float64"] = "float32"
    compile: bool = False  # torch.compile the training model's forward pass (analysis never compiles)
    # bf16: autocast of the local forward/backward passes (training only)
    precision: Literal["float32", "bf16"] = "float32"
    # CPU threads of torch while training (0: every core this process may use). The numbers of a round differ
    # in the last bits with the count; 1 is fastest for small federated clients and the same on every machine.
    threads: Annotated[int, rule(ge=0, le=4096, text="must be in 0..4096 (0: every core)")] = 1
    # A round's clients trained together, one vmapped gradient per local step ("on"), one after another ("off"),
    # or "auto": together on a CUDA device, never on the CPU (the device decides, never a timing). The
    # numbers equal the sequential ones to float tolerance; BatchNorm or dropout models train one after another.
    vectorize: Literal["auto", "on", "off"] = "auto"
    # The layout of 4-D inputs and convolution weights in the training steps and evaluations: "channels-last",
    # "contiguous" (NCHW), or "auto": channels-last on the CPU for a model with 2-D convolutions, contiguous
    # otherwise (the model and device decide, never a timing: landscape.core.memory_format), recorded in every
    # checkpoint and kept by a resume. The numbers of the two differ in the last bits (float rounding), like train.threads.
    memory_format: Literal["auto", "channels-last", "contiguous"] = "auto"
    # Experiment trackers that also get every metrics row and analysis result (docs/tracking.md; the optional
    # extras of the same names). They change no number.
    log: tuple[Literal["tensorboard", "wandb"], ...] = ()


# The choices of the Literal settings, for click choices, `landscape list` and the analysis settings' dtype.
LR_SCHEDULES = schema.choices(TrainSettings, "lr_schedule")
DTYPES = schema.choices(TrainSettings, "dtype")
PRECISIONS = schema.choices(TrainSettings, "precision")

MAX_SEED = 2**32 - 1  # data set splits and partitions take 32-bit seeds


@dataclass(frozen=True)
class TopLevelSettings:
    """The top-level keys. ``imports``: modules of the user's own that register models, data sets, partitions or
    algorithms when imported (``imports = ["mylab.models"]``). Importing runs their code: a recipe the user
    names is imported before it is checked; a recorded one (a run's recipe.toml) only when trusted
    (``resolve(recorded=True)``, landscape.core.imports)."""

    name: str = ""
    seed: Annotated[int, rule(ge=0, le=MAX_SEED, text=f"must be in 0..{MAX_SEED}")] = 0
    imports: tuple[str, ...] = ()


TOP_LEVEL = tuple(f.name for f in dataclasses.fields(TopLevelSettings))
SECTIONS: dict[str, type] = {
    "dataset": DatasetSettings,
    "partition": PartitionSettings,
    "model": ModelSettings,
    "algorithm": AlgorithmSettings,
    "train": TrainSettings,
}
ENTRY_SECTIONS = ("dataset", "partition", "model", "algorithm")  # the tables that name a registry entry


def common_fields(section: str) -> tuple[str, ...]:
    """The settings every entry of a section has (the entry's own options excluded), in declaration order."""
    return tuple(f.name for f in dataclasses.fields(SECTIONS[section]) if f.name != "options")


def load_settings(cls: type, given: Mapping[str, Any], where: str) -> Any:
    """A settings dataclass from the keys given (checked by ``schema.load``: kind, range, choices, unknown keys),
    the others at their defaults, read from the dataclass's fields at each call (the CLI's help shows them)."""
    defaults = {f.name: f.default for f in dataclasses.fields(cls)
                if f.default is not dataclasses.MISSING and f.name not in given}
    return schema.load(cls, {**defaults, **given}, where, noun="recipe key")


def with_options(settings: Any, options: Mapping[str, Any]) -> Any:
    """The settings of an entry table with its own options (a read-only mapping)."""
    return dataclasses.replace(settings, options=MappingProxyType(dict(options)))
