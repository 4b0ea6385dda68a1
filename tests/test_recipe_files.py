"""Every recipe shipped in train/ resolves; the digits ones can be planned without any download."""

from pathlib import Path

import pytest
from click.testing import CliRunner

from landscape import recipe as recipes
from landscape.cli import cli

RECIPES = sorted((Path(__file__).resolve().parents[1] / "train").glob("*.toml"))


def test_there_are_recipes():
    assert len(RECIPES) >= 4


@pytest.mark.parametrize("path", RECIPES, ids=[p.name for p in RECIPES])
def test_recipe_resolves(path):
    runs = recipes.build_sweep(path)
    assert runs
    for recipe, _ in runs:
        assert recipes.resolve(recipes.tomllib.loads(recipes.to_toml(recipe))) == recipe


@pytest.mark.parametrize("path", [p for p in RECIPES if p.name.startswith("digits")], ids=lambda p: p.name)
def test_digits_recipes_plan_offline(path, tmp_path):
    result = CliRunner().invoke(cli, ["train", str(path), "--dry-run", "--out", str(tmp_path / "x")])
    assert result.exit_code == 0, result.output
    assert not (tmp_path / "x").exists()
