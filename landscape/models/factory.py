"""The model of a factory of the user's own (``[model] name = "factory"``): ``package.module:function``, called
with no arguments, returns the ``nn.Module``. Runs recorded from a training loop of the user's own
(``landscape.RunWriter``, ``landscape import``) name their model so.

The factory's module is imported as a recipe's ``imports`` are (``landscape.config.recipe.resolve``): a recorded
recipe's only when the user trusts it."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from landscape.config.imports import check_factory_spec
from landscape.core.errors import LandscapeError
from landscape.models import MODELS


@dataclass(frozen=True)
class FactoryModelOptions:
    factory: str = ""  # package.module:function, called with no arguments, returns the nn.Module

    def __post_init__(self) -> None:
        check_factory_spec(self.factory, "model.factory")


@MODELS.register("factory", options=FactoryModelOptions,
                 summary="the nn.Module a function of yours returns (model.factory = package.module:function)")
def _build_from_factory(input_shape: tuple[int, ...], num_classes: int, opts: FactoryModelOptions) -> nn.Module:
    from landscape.config.imports import call_factory

    module = call_factory(opts.factory, "model factory")
    if not isinstance(module, nn.Module):
        raise LandscapeError(f"model factory '{opts.factory}' returned {type(module).__name__}, not an nn.Module")
    return module
