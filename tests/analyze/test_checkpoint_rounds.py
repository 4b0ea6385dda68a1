"""The checkpoints an analysis takes: ``--checkpoints`` and an analysis recipe's ``rounds`` in the one grammar of
rounds (``core.rounds``), parsed where they are read and selected among a source's checkpoints."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.helpers import invoke, one_line_error

from landscape.analyze.recipes import load_analysis_recipe
from landscape.analyze.source import Source, select_rounds
from landscape.core.errors import LandscapeError
from landscape.core.rounds import ALL, LAST, LISTED, Rounds


def source(rounds: list[int]) -> Source:
    """A run's source with checkpoints at ``rounds`` (the files are never read to select them)."""
    return Source("run", None, {r: Path(f"round-{r:04d}.pt") for r in rounds}, Path("analysis"), None)


@pytest.mark.parametrize("spec, chosen", [
    ("last", [6]), ("last 2", [4, 6]), ("last 4", [0, 2, 4, 6]), ("all", [0, 2, 4, 6]), ("4", [4]),
    ("4,0", [4, 0]), ("6, 2,", [6, 2]), ("2,2", [2]), (Rounds(LAST, count=3), [2, 4, 6]),
])
def test_the_checkpoints_chosen(spec, chosen):
    assert select_rounds(source([4, 0, 6, 2]), spec) == chosen


@pytest.mark.parametrize("spec, message", [
    ("3", "round 3 has no checkpoint in run; checkpointed rounds: 0, 2, 4"),
    ("0,5,7", "round 5 has no checkpoint in run; checkpointed rounds: 0, 2, 4"),
    ("last 4", "--checkpoints last 4 asks for 4 checkpoints; run has 3; checkpointed rounds: 0, 2, 4"),
    ("first", "--checkpoints must be last, all, last N (N >= 1), a round, or a list of rounds such as 10,20 or "
              "[10, 20] (got 'first')"),
    ("", "--checkpoints must be last, all, "),  # once analysed nothing, silently
])
def test_checkpoints_a_run_lacks_are_one_line(spec, message):
    with pytest.raises(LandscapeError) as refused:
        select_rounds(source([0, 2, 4]), spec)
    assert str(refused.value).startswith(message), str(refused.value)


def test_a_run_without_checkpoints_says_so_whatever_the_rounds():
    with pytest.raises(LandscapeError, match="^run has no checkpoints to analyse$"):
        select_rounds(source([]), "3")


@pytest.mark.parametrize("text, rounds", [
    ('rounds = "last"', Rounds(LAST)),
    ('rounds = "last 3"', Rounds(LAST, count=3)),
    ('rounds = "all"', Rounds(ALL)),
    ("rounds = 3", Rounds(LISTED, listed=(3,))),
    ("rounds = [0, 4]", Rounds(LISTED, listed=(0, 4))),
    ('rounds = "0, 4"', Rounds(LISTED, listed=(0, 4))),
    ('rounds = ""', None),  # none given: --checkpoints decides
    ('rounds = "mlp-r2,10"', "mlp-r2,10"),  # plain state_dicts' names: kept for their folder to resolve
])
def test_an_analysis_recipe_s_rounds_are_parsed_as_it_is_read(tmp_path, text, rounds):
    (tmp_path / "a.toml").write_text(text + "\n")
    assert load_analysis_recipe(tmp_path / "a.toml").rounds == rounds


@pytest.mark.parametrize("text", ["rounds = 2.5", "rounds = -1", "rounds = [1, -1]", "rounds = []",
                                  'rounds = " , "', "rounds = true"])
def test_an_analysis_recipe_s_rounds_of_no_kind_are_one_line(tmp_path, text):
    (tmp_path / "a.toml").write_text(text + "\n")
    with pytest.raises(LandscapeError) as refused:
        load_analysis_recipe(tmp_path / "a.toml")
    assert str(refused.value).startswith(f"{tmp_path / 'a.toml'}: rounds must be last, all, last N"), refused.value


@pytest.mark.parametrize("checkpoints, recipe_rounds, named", [
    (["--checkpoints", "fisrt"], None, "--checkpoints must be last, all, last N (N >= 1), "),
    (["--checkpoints", "last 0"], None, "--checkpoints must be last, all, last N (N >= 1), "),
    ([], '"mlp-r2"', "a.toml: rounds must be last, all, last N (N >= 1), "),  # file names: not of a run
])
def test_rounds_of_no_kind_are_refused_before_the_run_is_read(tmp_path, checkpoints, recipe_rounds, named):
    """Refused as the command line and the recipe are read: the run (here none) is never looked at."""
    recipe = []
    if recipe_rounds is not None:
        (tmp_path / "a.toml").write_text(f"rounds = {recipe_rounds}\n")
        recipe = [str(tmp_path / "a.toml")]
    line = one_line_error(invoke("analyze", tmp_path / "no-run", *recipe, *checkpoints, "--passes", "loss"))
    assert named in line and "(got " in line, line
