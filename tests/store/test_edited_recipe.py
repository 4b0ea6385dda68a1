"""A run's recipe is the one its checkpoints record (issue 46, W4): a recipe.toml edited after training (a fedavg
run's made to say fedsam, rho = 0.1) is not what report, compare, the figures, ``open_run(...).recipe`` and
``open_run(...).model()`` use; one line says it was edited (the CLI's ``note:``, the library's
``RecipeEditedWarning``); ``analyze`` takes the recorded recipe too. Checkpoints that disagree among themselves
are refused in one line; a checkpoint changed after the run was opened is checked by ``.model()`` as
``analyze`` checks it. Runs whose checkpoints carry no recipe read recipe.toml, as before; the keys a resume
may change are recipe.toml's."""

from __future__ import annotations

import os
import shutil
import warnings

import pytest
import torch
from support.helpers import ROOT, analyze_args, drop_recorded_recipes, invoke, recipe6

import landscape
from landscape.config import recipe as recipes
from landscape.core.errors import LandscapeError, RecipeEditedWarning
from landscape.store.checkpoints import Checkpoint, load_checkpoint, read_recipe_text
from landscape.store.directory import RunDir
from landscape.train import loop


def edit(run, **changes) -> None:
    """recipe.toml of ``run`` with ``changes`` ('section__key': value) written over it, by hand."""
    tables = recipes.tomllib.loads((run / "recipe.toml").read_text())
    for key, value in changes.items():
        section, name = key.split("__")
        tables[section][name] = value
    (run / "recipe.toml").write_text(recipes.to_toml(tables))


@pytest.fixture
def edited(six_round_run, tmp_path):
    """A copy of the six-round fedavg run (mlp, hidden [16]) whose recipe.toml now says fedsam, rho = 0.1."""
    run = tmp_path / "edited"
    shutil.copytree(six_round_run, run)
    edit(run, algorithm__name="fedsam", algorithm__rho=0.1)
    return run


def note(run) -> str:
    return (f"{run}'s recipe.toml was edited after training (algorithm.name is \"fedavg\" in its checkpoints, "
            "\"fedsam\" in recipe.toml); the recorded recipe is used")


@pytest.mark.parametrize("reader", ["report", "compare", "figures", "open_run().recipe", "open_run().model()"])
def test_readers_take_the_recipe_the_run_was_trained_with(edited, six_round_run, tmp_path, reader):
    if reader == "report":
        result = invoke("report", edited, "-o", tmp_path / "report.html")
        assert result.exit_code == 0, result.output
        assert result.output.count(f"note: {note(edited)}") == 1, result.output
        page = (tmp_path / "report.html").read_text()
        assert "FedAvg" in page and "FedSAM" not in page and "fedsam" not in page
    elif reader == "compare":
        result = invoke("compare", edited, six_round_run, "-o", tmp_path / "cmp", "--quiet")
        assert result.exit_code == 0, result.output
        assert result.output.count(f"note: {note(edited)}") == 1, result.output
        table = (tmp_path / "cmp" / "compare.csv").read_text()
        assert "FedSAM" not in table and "FedSAM" not in result.output
        assert "FedAvg alpha=0.5 (edited)" in table
    elif reader == "figures":
        result = invoke("figures", ROOT / "figures" / "accuracy.toml", "--runs", edited, "-o", tmp_path / "fig", "--quiet")
        assert result.exit_code == 0, result.output
        assert result.output.count(f"note: {note(edited)}") == 1, result.output
        caption = (tmp_path / "fig" / "accuracy.caption.txt").read_text()
        assert "Runs: FedAvg alpha=0.5 (edited)." in caption and "FedSAM" not in caption
    elif reader == "open_run().recipe":
        with pytest.warns(RecipeEditedWarning) as caught:
            run = landscape.open_run(edited)
        assert [str(w.message) for w in caught] == [note(edited)]
        assert caught[0].filename == __file__  # the line that read the run, not landscape's
        assert run.recipe.algorithm.name == "fedavg" and "rho" not in run.recipe.algorithm.options
        assert run.recipe_table()["algorithm"] == {"name": "fedavg"}
        assert run.recipe_here == "in its checkpoints"
    else:  # the model the checkpoints hold: recipe.toml's hidden [8] would not even load them
        edit(edited, model__hidden=[8])
        with pytest.warns(RecipeEditedWarning, match="model.hidden is \\[16\\] in its checkpoints, \\[8\\] in "):
            model = landscape.open_run(edited).model()
        assert model[1].out_features == 16
        expected = load_checkpoint(RunDir(edited).checkpoint(6))["model"]
        assert all(torch.equal(t, expected[k]) for k, t in model.state_dict().items())


def test_analyze_uses_the_recorded_recipe_and_says_so(edited):
    result = invoke(*analyze_args(edited, "--passes", "loss"))
    assert result.exit_code == 0, result.output
    assert result.output.count(f"note: {note(edited)}") == 1, result.output
    assert "1 computed" in result.output and list((edited / "analysis" / "round-0006").glob("loss*.json"))


def copy_in_another_seeds_checkpoint(run, tmp_path, round: int = 6):
    other = tmp_path / "other"
    loop.start_run(recipe6(seed=1, train__rounds=2), other, progress=False)
    shutil.copy(RunDir(other).checkpoint(2), RunDir(run).checkpoint(round))
    return RunDir(run).checkpoint(round)


def test_a_checkpoint_changed_after_the_run_was_opened_is_checked_by_model(six_round_copy, tmp_path):
    run = landscape.open_run(six_round_copy)
    assert run.model(6) is not None
    newest = copy_in_another_seeds_checkpoint(six_round_copy, tmp_path)
    with pytest.raises(LandscapeError) as caught:
        run.model(6)
    assert str(caught.value) == (f"{newest} was written by another recipe (seed is 1 there, 0 in recipe.toml); it "
                                 f"is not a checkpoint of run: move it away, or analyse it where it came from")
    with pytest.raises(LandscapeError, match="seed is 1 there, 0 in recipe.toml"):  # opened again: refused
        landscape.open_run(six_round_copy)


def test_checkpoints_that_disagree_among_themselves_are_refused(edited, tmp_path):
    copy_in_another_seeds_checkpoint(edited, tmp_path, round=4)  # and recipe.toml agrees with none of them
    with pytest.raises(LandscapeError) as caught:
        landscape.open_run(edited)
    assert str(caught.value) == (f"the checkpoints of {edited} disagree on the recipe they were trained with: "
                                 f"{RunDir(edited).checkpoint(4)} (seed is 1 there, 0 in round-0006.pt); move the "
                                 "one that is not this run's away")
    result = invoke("report", edited, "-o", tmp_path / "report.html")
    assert result.exit_code == 1 and result.output.strip() == f"error: {caught.value}"


def test_keys_a_resume_may_change_are_recipe_tomls(edited):
    edit(edited, train__eval_every=3, dataset__root="elsewhere")
    with pytest.warns(RecipeEditedWarning):
        run = landscape.open_run(edited)
    assert run.recipe.train.eval_every == 3 and run.recipe.dataset.root == "elsewhere"
    assert run.recipe.algorithm.name == "fedavg"
    edit(edited, algorithm__name="fedavg")
    del_rho = recipes.tomllib.loads((edited / "recipe.toml").read_text())
    del del_rho["algorithm"]["rho"]
    (edited / "recipe.toml").write_text(recipes.to_toml(del_rho))
    with warnings.catch_warnings():
        warnings.simplefilter("error", RecipeEditedWarning)  # only free keys differ: no word, recipe.toml read
        run = landscape.open_run(edited)
    assert run.recipe.train.eval_every == 3 and run.recipe_here == "in recipe.toml"


def test_checkpoints_without_a_recipe_read_recipe_toml(edited):
    """Checkpoints of a version before they carried the recipe (as a RunWriter's or an imported run's carry
    none): recipe.toml is all there is, read as before."""
    drop_recorded_recipes(edited)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RecipeEditedWarning)
        run = landscape.open_run(edited)
    assert run.recipe.algorithm.name == "fedsam"


def test_the_recorded_recipe_is_read_without_the_weights(six_round_run, monkeypatch):
    path = RunDir(six_round_run).checkpoint(6)
    expected = Checkpoint.load(path).recipe_text
    assert expected is not None

    def no_load(*args, **kwargs):
        raise AssertionError("torch.load called")

    monkeypatch.setattr(torch, "load", no_load)
    assert read_recipe_text(path) == expected


class _Payload:
    def __init__(self, marker) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_reading_the_recorded_recipe_runs_no_code(six_round_copy, tmp_path):
    marker = tmp_path / "PWNED"
    path = RunDir(six_round_copy).checkpoint(6)
    torch.save({"format": 1, "round": 6, "model": _Payload(marker), "recipe": "seed = 0\n"}, path)
    assert read_recipe_text(path) == "seed = 0\n"  # the record is read, the global never called
    assert not marker.exists()
