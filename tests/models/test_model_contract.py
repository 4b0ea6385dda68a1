"""The contract every registered model keeps: built from the registry's defaults for an input shape it takes,
it gives finite [B, C] logits, is the same function for the same seed, and a recipe naming it refuses an unknown
option in one line naming the key."""

from __future__ import annotations

import pytest
import torch

from landscape.config import recipe as recipes
from landscape.core.errors import LandscapeError
from landscape.models import MODELS, build_model

SHAPES = {"mlp": (1, 8, 8), "cnn": (1, 8, 8), "lenet5": (1, 28, 28), "resnet18": (3, 32, 32), "factory": (1, 8, 8),
          "stacked-lstm": (10,)}
# a model of token indices reads whole numbers below its classes (the data sets' inputs are float)
TOKENS = {"stacked-lstm"}
# the options a model needs besides its defaults: the factory model names a function of the user's
OPTIONS = {"factory": {"factory": "test_model_contract:seven_logits"}}


def seven_logits() -> torch.nn.Module:
    """A user's model factory (importable as test_model_contract:seven_logits, as pytest imports this file)."""
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 7))


def test_every_model_has_a_shape_here():
    assert sorted(SHAPES) == MODELS.names()


@pytest.mark.parametrize("name", MODELS.names())
def test_logits_are_finite_and_the_seed_fixes_the_function(name):
    generator = torch.Generator().manual_seed(0)
    if name in TOKENS:
        x = torch.randint(0, 7, (3, *SHAPES[name]), generator=generator).float()
    else:
        x = torch.randn(3, *SHAPES[name], generator=generator)
    outputs = []
    for _ in range(2):
        torch.manual_seed(5)
        model = build_model(name, SHAPES[name], 7, OPTIONS.get(name)).eval()
        with torch.no_grad():
            outputs.append(model(x))
    assert outputs[0].shape == (3, 7) and torch.isfinite(outputs[0]).all()
    assert torch.equal(outputs[0], outputs[1])


@pytest.mark.parametrize("name", MODELS.names())
def test_an_unknown_option_is_refused_in_one_line(name):
    with pytest.raises(LandscapeError) as e:
        recipes.resolve({"model": {"name": name, "no_such_option": 1}}, algorithms=False)
    assert "model.no_such_option" in str(e.value) and "\n" not in str(e.value)
