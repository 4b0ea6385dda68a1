"""Recipe files: every recipe shipped in train/ resolves and the digits ones can be planned without any
download; a recipe with a UTF-8 byte order mark reads; a path that is not a regular file, a huge unknown key
and an empty recipe (given, or the recipe.toml of a run) are one line that says so."""

from pathlib import Path

import pytest
from click.testing import CliRunner
from support.helpers import analyze_args, invoke, one_line_error

from landscape.cli import cli
from landscape.config import overrides as recipe_overrides
from landscape.config import recipe as recipes

RECIPES = sorted((Path(__file__).resolve().parents[2] / "train").glob("*.toml"))


def test_there_are_recipes():
    assert len(RECIPES) >= 4


@pytest.mark.parametrize("path", RECIPES, ids=[p.name for p in RECIPES])
def test_recipe_resolves(path):
    runs = recipe_overrides.build_sweep(path)
    assert runs
    for recipe, _ in runs:
        assert recipes.resolve(recipes.tomllib.loads(recipes.to_toml(recipe))) == recipe


@pytest.mark.parametrize("path", [p for p in RECIPES if p.name.startswith("digits")], ids=lambda p: p.name)
def test_digits_recipes_plan_offline(path, tmp_path):
    result = CliRunner().invoke(cli, ["train", str(path), "--dry-run", "--out", str(tmp_path / "x")])
    assert result.exit_code == 0, result.output
    assert not (tmp_path / "x").exists()


def test_a_recipe_with_a_utf8_byte_order_mark_reads(tmp_path):
    path = tmp_path / "bom.toml"
    path.write_bytes("\ufeff[train]\nrounds = 2\n".encode())
    assert recipes.read_recipe(path).train.rounds == 2


def test_a_recipe_that_is_not_a_regular_file_says_so():
    line = one_line_error(invoke("train", "/dev/zero", "--dry-run"))
    assert line == "error: /dev/zero is a character device, not a regular file (a recipe is a TOML file)"


def test_a_huge_unknown_key_is_not_echoed_in_full(tmp_path):
    key = "k" * (5 << 20)
    path = tmp_path / "big.toml"
    path.write_text(f"[train]\n{key} = 1\n")
    line = one_line_error(invoke("train", path, "--dry-run"))
    assert len(line) < 1000 and "unknown recipe key" in line and "5,242,886 characters" in line
    line = one_line_error(invoke("train", "--set", f"train.{'x' * 100_000}=1", "--dry-run"))
    assert len(line) < 1000


def test_an_empty_recipe_says_so(tmp_path, six_round_copy):
    path = tmp_path / "empty.toml"
    path.write_text("\n  \n")
    line = one_line_error(invoke("train", path, "--dry-run"))
    assert line == f"error: {path} is empty (no recipe keys)"
    (six_round_copy / "recipe.toml").write_text("")
    line = one_line_error(invoke("train", "--resume", six_round_copy, "--quiet"))
    assert f"{six_round_copy / 'recipe.toml'} is empty" in line
    line = one_line_error(invoke(*analyze_args(six_round_copy, "--passes", "loss")))
    assert f"{six_round_copy / 'recipe.toml'} is empty" in line
