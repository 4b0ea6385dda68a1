"""Model zoo: name -> builder(input_shape, num_classes, opts) -> nn.Module returning logits [B, num_classes].

Input shapes are images (C, H, W), signals (C, L) (MNIST-1D; `mlp` and `cnn` take them), features (D,) or
sequences of token indices (L,) (Shakespeare; `stacked-lstm` takes them).

All models are deterministic (no dropout), use standard layers only and keep PyTorch's default initialisation,
so the caller's torch.manual_seed fully determines the parameters.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from numbers import Integral
from typing import Any

from torch import nn

from landscape.core.errors import LandscapeError, shown
from landscape.core.imports import check_factory_spec
from landscape.core.machine import require_memory
from landscape.core.registry import Registry
from landscape.models.lstm import StackedLSTM
from landscape.models.resnet import ResNet18, norm_factory

ModelBuilder = Callable[[tuple[int, ...], int, Any], nn.Module]

MODELS = Registry("model")  # each factory a ModelBuilder

__all__ = ["MODELS", "ModelBuilder", "build_model", "check_model", "model_parameters"]


def build_model(
    name: str, input_shape: Sequence[int], num_classes: int, options: dict[str, Any] | None = None
) -> nn.Module:
    """Build model `name` for inputs of shape (C, H, W), (C, L) or (D,) with `num_classes` logits. A model
    whose training cannot fit in this machine's memory is refused first (``check_model``)."""
    entry, shape, opts = _checked(name, input_shape, num_classes, options)
    return entry.factory(shape, num_classes, opts)


def check_model(name: str, input_shape: Sequence[int], num_classes: int, options: dict[str, Any] | None = None) -> None:
    """What ``build_model`` checks, nothing built (a dry run): the options, the fit to the input and to this
    machine's memory (a built-in model's size from the meta device)."""
    _checked(name, input_shape, num_classes, options)


def _checked(name: str, input_shape: Sequence[int], num_classes: int,
             options: dict[str, Any] | None) -> tuple[Any, tuple[int, ...], Any]:
    entry = MODELS.get(name)
    if not input_shape or not all(
        isinstance(d, Integral) and not isinstance(d, bool) and d > 0 for d in input_shape
    ):
        raise LandscapeError(f"{name}: input shape must be positive integers, got {tuple(input_shape)}")
    shape = tuple(int(d) for d in input_shape)  # accepts torch.Size and numpy integers
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
        raise LandscapeError(f"{name}: num_classes must be a positive integer, got {num_classes!r}")
    opts = entry.make_options(dict(options or {}), "model")
    # the built-in models only: a model of the user's own (a registration, a factory) is built once, as they wrote
    # it (it may compute on its tensors while it is built, which the meta device cannot)
    module = getattr(entry.factory, "__module__", "")
    if name != "factory" and (module == __name__ or module.startswith(__name__ + ".")):
        check_model_memory(name, entry.factory, shape, num_classes, opts)
    return entry, shape, opts


# Copies of the parameters that training holds at once: the global model, a client's model, its gradient and
# the optimizer's or algorithm's state (momentum, control variates); each float32 (4 bytes) at the least.
MODEL_COPIES = 4


def model_parameters(name: str, factory: ModelBuilder, shape: tuple[int, ...], num_classes: int, opts: Any) -> int:
    """The model's parameter count, from a build on the meta device (no memory allocated, no random numbers
    drawn); a size torch cannot even represent is refused in one line."""
    import torch

    try:
        with torch.device("meta"):
            module = factory(shape, num_classes, opts)
    except (RuntimeError, TypeError, ValueError, OverflowError) as error:
        if isinstance(error, LandscapeError):
            raise
        text = str(error).splitlines()[0] if str(error) else type(error).__name__
        reason = "a layer's size overflows torch's 64-bit sizes" if "overflow" in text.lower() else shown(text, 120)
        raise LandscapeError(f"{name} with {_options_text(opts)} cannot be built ({reason}): choose smaller "
                             "model options") from None
    return sum(p.numel() for p in module.parameters())


def check_model_memory(name: str, factory: ModelBuilder, shape: tuple[int, ...], num_classes: int,
                       opts: Any) -> None:
    """Refuse in one line, before anything is allocated, a model whose training cannot fit in this machine's
    memory (``MODEL_COPIES`` float32 copies of its parameters)."""
    count = model_parameters(name, factory, shape, num_classes, opts)
    require_memory(MODEL_COPIES * 4 * count, f"{name} with {_options_text(opts)} ({count:,} parameters, "
                   f"{MODEL_COPIES} float32 copies in training)", "choose smaller model options")


def _options_text(opts: Any) -> str:
    if opts is None or not dataclasses.is_dataclass(opts):
        return "its defaults"
    return ", ".join(f"model.{f.name} = {shown(repr(getattr(opts, f.name)), 60)}" for f in dataclasses.fields(opts))


def _check_positive_int(model: str, option: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise LandscapeError(f"{model} option '{option}' must be a positive integer, got {value!r}")


def _image_shape(model: str, input_shape: tuple[int, ...]) -> tuple[int, int, int]:
    if len(input_shape) != 3:
        raise LandscapeError(f"{model} needs image input (C, H, W), got input shape {input_shape}")
    c, h, w = input_shape
    return c, h, w


def _min_size(out_size: Callable[[int], int]) -> int:
    """Smallest input side for which `out_size` (the side after the conv/pool stack) is at least 1."""
    return next(n for n in range(1, 1024) if out_size(n) >= 1)


# --- mlp ---


@dataclass(frozen=True)
class MLPOptions:
    hidden: tuple[int, ...] = (200, 200)  # the "2NN" of McMahan et al. 2017 (a TOML array: a tuple)

    def __post_init__(self) -> None:
        if not isinstance(self.hidden, (list, tuple)):
            raise LandscapeError(f"mlp option 'hidden' must be a list of widths, got {self.hidden!r}")
        for width in self.hidden:
            _check_positive_int("mlp", "hidden", width)


@MODELS.register("mlp", options=MLPOptions, summary="fully connected ReLU net on flattened input (2NN)")
def _build_mlp(input_shape: tuple[int, ...], num_classes: int, opts: MLPOptions) -> nn.Module:
    layers: OrderedDict[str, nn.Module] = OrderedDict(flatten=nn.Flatten())
    in_features = 1
    for d in input_shape:
        in_features *= d
    for i, width in enumerate(opts.hidden, start=1):
        layers[f"fc{i}"] = nn.Linear(in_features, width)
        layers[f"relu{i}"] = nn.ReLU()
        in_features = width
    layers["out"] = nn.Linear(in_features, num_classes)
    return nn.Sequential(layers)


# --- cnn ---


@dataclass(frozen=True)
class CNNOptions:
    width: int = 32  # channels of the first conv; the second has 2 * width
    hidden: int = 128

    def __post_init__(self) -> None:
        _check_positive_int("cnn", "width", self.width)
        _check_positive_int("cnn", "hidden", self.hidden)


def _cnn_side(n: int) -> int:
    return n // 2 // 2  # 3x3 pad-1 convs keep the side; each 2x2 max-pool halves it


@MODELS.register("cnn", options=CNNOptions,
                 summary="small 2-conv CNN for digits / MNIST-sized images, or 1D signals (MNIST-1D)")
def _build_cnn(input_shape: tuple[int, ...], num_classes: int, opts: CNNOptions) -> nn.Module:
    least = _min_size(_cnn_side)
    if len(input_shape) == 2:  # a signal (C, L): the same net with 1D convolutions and pools
        c, length = input_shape
        if length < least:
            raise LandscapeError(f"cnn needs a signal at least {least} long (two max-pools of 2), got {length}")
        conv, pool, flat = nn.Conv1d, nn.MaxPool1d, _cnn_side(length)
    else:
        if len(input_shape) != 3:
            raise LandscapeError(f"cnn needs image input (C, H, W), got input shape {input_shape} "
                                 "(or a signal (C, L))")
        c, h, w = input_shape
        if min(h, w) < least:
            raise LandscapeError(f"cnn needs input at least {least}x{least} (two 2x2 max-pools), got {h}x{w}")
        conv, pool, flat = nn.Conv2d, nn.MaxPool2d, _cnn_side(h) * _cnn_side(w)
    return nn.Sequential(
        OrderedDict(
            conv1=conv(c, opts.width, 3, padding=1),
            relu1=nn.ReLU(),
            pool1=pool(2),
            conv2=conv(opts.width, 2 * opts.width, 3, padding=1),
            relu2=nn.ReLU(),
            pool2=pool(2),
            flatten=nn.Flatten(),
            fc1=nn.Linear(2 * opts.width * flat, opts.hidden),
            relu3=nn.ReLU(),
            fc2=nn.Linear(opts.hidden, num_classes),
        )
    )


# --- lenet5 ---


def _lenet_side(n: int) -> int:
    # conv5x5 (no padding) -> maxpool2 -> conv5x5 -> maxpool2
    return ((n - 4) // 2 - 4) // 2


@MODELS.register("lenet5", summary="LeNet-5-style CNN of the FedSAM CIFAR experiments")
def _build_lenet5(input_shape: tuple[int, ...], num_classes: int, opts: None) -> nn.Module:
    # Layer sizes as in Hsu et al. 2020 and Caldarola et al. 2022 (FedSAM, models/cifar10/cnn.py):
    # conv5x5 64, conv5x5 64, fc 384, fc 192, each followed by ReLU (and 2x2 max-pool after the convs).
    c, h, w = _image_shape("lenet5", input_shape)
    least = _min_size(_lenet_side)
    if min(h, w) < least:
        raise LandscapeError(
            f"lenet5 needs input at least {least}x{least} (two 5x5 convs, each followed by a 2x2 max-pool), "
            f"got {h}x{w}"
        )
    return nn.Sequential(
        OrderedDict(
            conv1=nn.Conv2d(c, 64, 5),
            relu1=nn.ReLU(),
            pool1=nn.MaxPool2d(2),
            conv2=nn.Conv2d(64, 64, 5),
            relu2=nn.ReLU(),
            pool2=nn.MaxPool2d(2),
            flatten=nn.Flatten(),
            fc1=nn.Linear(64 * _lenet_side(h) * _lenet_side(w), 384),
            relu3=nn.ReLU(),
            fc2=nn.Linear(384, 192),
            relu4=nn.ReLU(),
            fc3=nn.Linear(192, num_classes),
        )
    )


# --- resnet18 ---

_NORMS = ("gn", "bn")


@dataclass(frozen=True)
class ResNetOptions:
    norm: str = "gn"  # GroupNorm, as in Hsieh et al. 2020 and FedSAM; "bn" for BatchNorm2d
    groups: int = 2  # GroupNorm groups (ignored for "bn")

    def __post_init__(self) -> None:
        if self.norm not in _NORMS:
            raise LandscapeError(f"unknown norm {self.norm!r} for resnet18; choose from: {', '.join(_NORMS)}")
        _check_positive_int("resnet18", "groups", self.groups)
        if self.norm == "gn" and ResNet18.WIDTHS[0] % self.groups:
            raise LandscapeError(
                f"resnet18 option 'groups' must divide {ResNet18.WIDTHS[0]} (the narrowest width), "
                f"got {self.groups}"
            )


@MODELS.register("resnet18", options=ResNetOptions, summary="ResNet-18, CIFAR stem, GroupNorm(2) by default")
def _build_resnet18(input_shape: tuple[int, ...], num_classes: int, opts: ResNetOptions) -> nn.Module:
    c, _, _ = _image_shape("resnet18", input_shape)
    return ResNet18(c, num_classes, norm_factory(opts.norm, opts.groups))


# --- stacked-lstm ---


@dataclass(frozen=True)
class StackedLSTMOptions:
    embedding: int = 8  # size of a character's embedding (LEAF's Shakespeare model: 8)
    hidden: int = 256  # units of each LSTM layer (LEAF: 256)
    layers: int = 2  # stacked LSTM layers (LEAF: 2)

    def __post_init__(self) -> None:
        for option in ("embedding", "hidden", "layers"):
            _check_positive_int("stacked-lstm", option, getattr(self, option))


@MODELS.register("stacked-lstm", options=StackedLSTMOptions,
                 summary="LEAF's next-character LSTM (embedding, stacked LSTM, linear) on token indices (shakespeare)")
def _build_stacked_lstm(input_shape: tuple[int, ...], num_classes: int, opts: StackedLSTMOptions) -> nn.Module:
    if len(input_shape) != 1:
        raise LandscapeError(f"stacked-lstm needs a sequence of token indices (L,), got input shape {input_shape}")
    # LEAF's vocabulary is its classes (the next character): one embedding row per class
    return StackedLSTM(num_classes, opts.embedding, opts.hidden, opts.layers, num_classes)


# -- a factory of the user's own ([model] name = "factory"): runs recorded from a training loop of their own
# (landscape.RunWriter, landscape import) name their model so; its module is imported as a recipe's imports are
# (landscape.config.recipe.resolve: a recorded recipe's only when the user trusts it).


@dataclass(frozen=True)
class FactoryModelOptions:
    factory: str = ""  # package.module:function, called with no arguments, returns the nn.Module

    def __post_init__(self) -> None:
        check_factory_spec(self.factory, "model.factory")


@MODELS.register("factory", options=FactoryModelOptions,
                 summary="the nn.Module a function of yours returns (model.factory = package.module:function)")
def _build_from_factory(input_shape: tuple[int, ...], num_classes: int, opts: FactoryModelOptions) -> nn.Module:
    from landscape.core.imports import call_factory

    module = call_factory(opts.factory, "model factory")
    if not isinstance(module, nn.Module):
        raise LandscapeError(f"model factory '{opts.factory}' returned {type(module).__name__}, not an nn.Module")
    return module
