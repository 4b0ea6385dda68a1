"""Threads: ``train.threads`` is a recipe key recorded in the run and its checkpoints; training and analysis
set their own thread count whatever the process has (and restore it); a resume with another count warns; and
analysis numbers do not depend on the process's thread count."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest
import torch
from support.helpers import invoke, recipe6

from landscape.analyze.catalog import load_passes, pass_options
from landscape.analyze.scheduler import run_analysis
from landscape.analyze.settings import AnalysisSettings
from landscape.config import overrides as recipe_overrides
from landscape.config import recipe as recipes
from landscape.core.errors import LandscapeError
from landscape.store.checkpoints import load_checkpoint
from landscape.store.directory import RunDir
from landscape.train import loop


def test_train_threads_is_a_recipe_key_recorded_in_the_run(tmp_path):
    recipe = recipe6(train__rounds=2)
    assert recipe.train.threads == 1
    assert "threads = 1" in recipes.to_toml(recipe)
    result = invoke("train", "--rounds", "1", "--threads", "2", "--out", tmp_path, "--name", "run", "--quiet")
    assert result.exit_code == 0, result.output
    assert recipes.read_recipe(tmp_path / "run" / "recipe.toml").train.threads == 2
    assert load_checkpoint(RunDir(tmp_path / "run").checkpoint(1))["threads"] == 2
    with pytest.raises(LandscapeError, match="train.threads"):
        recipe_overrides.build(None, [("train.threads", -1)])


def test_training_and_analysis_use_their_thread_count_whatever_the_process_has(tmp_path, monkeypatch):
    seen: list[int] = []
    original_round = loop.Trainer.run_round

    def run_round(self, state):
        seen.append(torch.get_num_threads())
        return original_round(self, state)

    monkeypatch.setattr(loop.Trainer, "run_round", run_round)
    ambient = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        loop.start_run(recipe6(train__rounds=2), tmp_path / "run", progress=False)
        assert seen == [1, 1] and torch.get_num_threads() == 2  # restored afterwards
        counts: list[int] = []
        entry = load_passes().get("loss")

        def loss_pass(ctx, opts):
            counts.append(torch.get_num_threads())
            return entry.factory(ctx, opts)

        monkeypatch.setitem(load_passes()._entries, "loss", dataclasses.replace(entry, factory=loss_pass))
        settings = AnalysisSettings(device="cpu", analysis_samples=100)
        run_analysis(tmp_path / "run", passes=["loss"], settings=settings,
                     options={"loss": pass_options("loss", {})}, progress=False)
        assert counts == [1] and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(ambient)


def test_resume_with_another_thread_count_warns(six_round_copy):
    result = invoke("train", "--resume", six_round_copy, "--rounds", "7", "--threads", "2", "--quiet")
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.output.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "with 1 CPU thread, this resume uses 2" in warnings[0], result.output
    assert recipes.read_recipe(six_round_copy / "recipe.toml").train.threads == 2
    result = invoke("train", "--resume", six_round_copy, "--rounds", "8", "--quiet")
    assert result.exit_code == 0 and "warning" not in result.output, result.output


def test_analysis_numbers_do_not_depend_on_the_process_thread_count(six_round_run, tmp_path):
    """The cause of the flaky kill-during-analyze test: its forked child analysed with one thread
    (OMP_NUM_THREADS=1), the test process with the machine's default, and the per-client sharpness differed in
    the last bits. The analysis now sets its own thread count."""
    options = {"sharpness": pass_options("sharpness", {"rhos": [0.05], "steps": 1, "adaptive": False})}
    results = []
    ambient = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            copy = tmp_path / f"t{n}"
            shutil.copytree(six_round_run, copy)
            run_analysis(copy, rounds="all", passes=["sharpness"], options=options, progress=False,
                         settings=AnalysisSettings(device="cpu", analysis_samples=300))
            results.append({p.relative_to(copy).as_posix(): json.loads(p.read_text())["result"]
                            for p in sorted((copy / "analysis").rglob("*.json"))})
    finally:
        torch.set_num_threads(ambient)
    assert results[0] == results[1]
