"""The workflows called from Python, without click: each does what its command does (same files, same
numbers), takes plain arguments and reports its progress lines to ``notify``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from support.helpers import assert_same_values, invoke, metrics_without_time, snapshot, tiny_recipe

from landscape.analyze.catalog import default_passes
from landscape.config import overrides as recipe_overrides
from landscape.config import recipe as recipes
from landscape.core.errors import LandscapeError
from landscape.core.rounds import Rounds
from landscape.figures.recipe import figure as figure_recipe
from landscape.workflows import claims, demo, figure, sweep
from landscape.workflows.ensure import ensure_run

ROOT = Path(__file__).resolve().parents[2]  # the repository: its recipe folders

FIGURE = """
name = "tiny"
[[runs]]
id = "a"
label = "FedAvg"
set = { "algorithm.name" = "fedavg" }
[[runs]]
id = "b"
label = "FedSAM"
set = { "algorithm.name" = "fedsam" }
[[plots]]
kind = "accuracy"
[train]
set = { "partition.clients" = 4, "train.rounds" = 2, "train.local_steps" = 2, "train.batch_size" = 16 }
"""


def last_checkpoint(run: Path) -> dict:
    """The last checkpoint of a run, loaded."""
    return torch.load(max((run / "checkpoints").glob("round-????.pt")), weights_only=True)


def test_ensure_run_trains_as_the_train_command_then_reuses_the_run(tmp_path):
    recipe = tiny_recipe(train__rounds=2)
    (tmp_path / "r.toml").write_text(recipes.to_toml(recipe))
    assert invoke("train", tmp_path / "r.toml", "-o", tmp_path, "--name", "cli", "--quiet").exit_code == 0
    lines: list[str] = []
    path = tmp_path / "owned" / "run"
    ensure_run(recipe, path, notify=lines.append)
    assert lines == [f"train {path}: new"]
    assert metrics_without_time(path) == metrics_without_time(tmp_path / "cli")
    assert_same_values(last_checkpoint(path), last_checkpoint(tmp_path / "cli"))
    before = snapshot(path)
    ensure_run(recipe, path, notify=lines.append)  # make-like: a finished run is reused as it is
    assert lines[-1] == f"train {path}: done" and snapshot(path) == before


def test_a_sweep_trains_the_runs_of_the_train_commands_sweep(tmp_path):
    flags = {"partition.clients": 4, "train.rounds": 2, "train.local_steps": 2, "train.device": "cpu"}
    runs = recipe_overrides.build_sweep(None, list(flags.items()), {"seed": [0, 1]})
    plan = sweep.plan_sweep(runs, tmp_path / "wf", overwrite=False)
    assert [run.status for run in plan] == ["new", "new"]
    lines: list[str] = []
    trained = list(sweep.run_sweep(plan, overwrite=False, notify=lines.append))
    assert trained == [(run.path, 2) for run in plan]
    assert lines == [f"[{i}/2] new: {run.path}" for i, run in enumerate(plan, start=1)]
    result = invoke("train", "--clients", 4, "--rounds", 2, "--local-steps", 2, "--device", "cpu",
                    "--seed", "0,1", "-o", tmp_path / "cli", "--quiet")
    assert result.exit_code == 0, result.output
    for run in plan:
        assert metrics_without_time(run.path) == metrics_without_time(tmp_path / "cli" / run.path.name)
    again = sweep.plan_sweep(runs, tmp_path / "wf", overwrite=False)
    assert [run.status for run in again] == ["done", "done"]


def test_the_figure_workflow_draws_what_the_figures_command_draws(tmp_path):
    (tmp_path / "fig.toml").write_text(FIGURE)
    fig = figure_recipe.load_figure_recipe(tmp_path / "fig.toml")
    lines: list[str] = []
    written = figure.make_figure(fig, tmp_path / "wf", device="cpu", notify=lines.append)
    assert lines == [f"train {tmp_path / 'wf' / 'runs' / run_id}: new" for run_id in ("a", "b")]
    result = invoke("figures", tmp_path / "fig.toml", "--out", tmp_path / "cli", "--device", "cpu", "--quiet")
    assert result.exit_code == 0, result.output
    shown = result.output.strip().removeprefix("figure tiny: ").split(", ")
    assert [p.relative_to(tmp_path / "wf") for p in written] == [
        Path(p).relative_to(tmp_path / "cli") for p in shown]
    for run_id in ("a", "b"):
        assert metrics_without_time(tmp_path / "wf" / "runs" / run_id) == metrics_without_time(
            tmp_path / "cli" / "runs" / run_id)
    png = tmp_path / "wf" / "tiny.png"  # the plot's file: the figure's name
    assert png in written and png.read_bytes() == (tmp_path / "cli" / "tiny.png").read_bytes()
    figure.make_figure(fig, tmp_path / "wf", device="cpu", notify=lines.append)  # its runs are reused
    assert lines[2:] == [f"train {tmp_path / 'wf' / 'runs' / run_id}: done" for run_id in ("a", "b")] + [
        f"note: replaced 3 file(s) in {tmp_path / 'wf'} that were there before: tiny.png, tiny.pdf, tiny.caption.txt"]


def test_claims_are_planned_from_python_as_the_claims_command_plans_them(tmp_path):
    path = ROOT / "claims" / "fednsam-wider-surface.toml"
    (work,) = claims.plan_claims([path], figures_out=tmp_path, seeds=[0, 1])
    assert work.claim.seeds == (0, 1) and {spec.id for spec in work.fig.runs} == set(work.claim.run_ids())
    assert work.out == figure.figure_folder(work.fig, tmp_path)
    result = invoke("claims", path, "--figures-out", tmp_path, "--seeds", "0,1", "--dry-run")
    assert result.exit_code == 0, result.output
    assert f"in {work.out}, seeds 0,1: {', '.join(work.claim.run_ids())}" in result.output


def test_the_demo_is_a_figure_recipe_training_the_shipped_recipe_with_its_few_changes(tmp_path):
    fig = demo.demo_recipe()
    assert demo.DEMO_FIGURE == ROOT / "figures" / "demo.toml" and fig.train_recipe == ROOT / "train" / "digits-fedavg.toml"
    plan = figure.figure_plan(fig, tmp_path, demo.DEVICE)
    assert {run_id: [path for _, _, path in entries] for run_id, entries in plan.items()} == {
        name: [tmp_path / "runs" / name] for name in ("fedavg", "fedsam", "fednsam")}
    recipes = [entries[0][1] for entries in plan.values()]
    assert [r.algorithm.name for r in recipes] == ["fedavg", "fedsam", "fednsam"]
    assert all(r.train.keep_clients and r.train.device == "cpu" for r in recipes)
    fedavg = recipes[0].with_values({"train.keep_clients": False, "train.device": "auto"})
    # the shipped recipe, but for the demo's two changes
    assert fedavg == recipe_overrides.build(fig.train_recipe)
    # every pass of `landscape analyze` at the last round and a surface; S_rho at 10, 20 and 30 (its curve)
    last = Rounds.parse("last")
    assert fig.pass_rounds == {"surface": last, "sharpness": Rounds.parse("10,20,30"), "hessian": last,
                               "alignment": last, "flatness": last, "incompatibility": last, "loss": last}
    assert set(fig.pass_rounds) == {*default_passes(), "surface"}
    assert [plot.file for plot in fig.plots] == ["surfaces", "surfaces-3d", "accuracy", "flatness-sharpness",
                                                 "hessian", "alignment"]


def test_the_demo_is_shrunk_as_any_figure_recipe_is():
    fig = demo.demo_recipe(["train.rounds=4", "sharpness.rounds=2,4", "surface.grid=5", "analyze.analysis_samples=50"])
    assert fig.forced == {"train.rounds": 4} and fig.pass_rounds["sharpness"] == Rounds.parse("2,4")
    assert fig.pass_options["surface"]["grid"] == 5 and fig.settings == {"analysis_samples": 50}
    with pytest.raises(LandscapeError, match=r"^--set hessian: give hessian.<option>=VALUE$"):
        demo.demo_recipe(["hessian=1"])
