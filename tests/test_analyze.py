"""`landscape analyze`: targets, result files, skipping, errors (the passes' numerics are tested elsewhere)."""

import json
import shutil

import pytest
import torch
from click.testing import CliRunner
from conftest import tiny_recipe

import landscape
from landscape.analyze.context import AnalysisSettings, find_sources
from landscape.analyze.passes import pass_options, run_analysis
from landscape.cli import cli
from landscape.errors import LandscapeError
from landscape.train import loop


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("analyze")
    loop.start_run(tiny_recipe(train__keep_clients=True, train__checkpoint_every=2, train__rounds=4), root / "run",
                   progress=False)
    return root / "run"


@pytest.fixture
def run_copy(trained, tmp_path):
    shutil.copytree(trained, tmp_path / "run")
    return tmp_path / "run"


def analyze(*args):
    return CliRunner().invoke(cli, ["analyze", *map(str, args), "--quiet", "--device", "cpu"])


def test_loss_pass_writes_json_with_schema_and_settings(run_copy):
    result = analyze(run_copy, "--passes", "loss")
    assert result.exit_code == 0, result.output
    record = json.loads((run_copy / "analysis" / "round-0004" / "loss.json").read_text())
    assert record["schema_version"] == 1 and record["pass"] == "loss" and record["round"] == 4
    assert record["settings"]["analysis"]["bn_mode"] == "eval" and record["settings"]["pass"] == {"clients": 0}
    assert len(record["checkpoint_sha256"]) == 64
    # F and accuracy over the union of the clients' training data, computed independently here
    run = landscape.open_run(run_copy)
    train, _ = run.data()
    with torch.no_grad():
        logits = run.model(4)(train.x)
    assert record["result"]["loss"] == pytest.approx(torch.nn.functional.cross_entropy(logits, train.y).item(), rel=1e-5)
    assert record["result"]["accuracy"] == pytest.approx((logits.argmax(1) == train.y).float().mean().item(), abs=1e-6)
    assert "run" in result.output and "1 computed, 0 already done" in result.output


def test_same_settings_are_skipped_and_force_or_new_settings_recompute(run_copy):
    assert "1 computed" in analyze(run_copy, "--passes", "loss").output
    assert "0 computed, 1 already done" in analyze(run_copy, "--passes", "loss").output
    assert "1 computed" in analyze(run_copy, "--passes", "loss", "--force").output
    assert "1 computed" in analyze(run_copy, "--passes", "loss", "--analysis-samples", "100").output
    assert "1 computed" in analyze(run_copy, "--passes", "loss", "--set", "loss.clients=2").output


@pytest.mark.parametrize("target", ["run", "checkpoints", "file", "parent"])
def test_every_kind_of_path(run_copy, target):
    path = {"run": run_copy, "checkpoints": run_copy / "checkpoints",
            "file": run_copy / "checkpoints" / "round-0002.pt", "parent": run_copy.parent}[target]
    result = analyze(path, "--passes", "loss")
    assert result.exit_code == 0, result.output
    expected = "round-0002" if target == "file" else "round-0004"
    assert (run_copy / "analysis" / expected / "loss.json").is_file()


def test_a_loose_folder_of_checkpoints_uses_their_recipe(run_copy, tmp_path):
    loose = tmp_path / "ckpt"
    loose.mkdir()
    for name in ("round-0002.pt", "round-0004.pt"):
        shutil.copy(run_copy / "checkpoints" / name, loose / name)
    result = analyze(loose, "--passes", "loss", "--rounds", "all")
    assert result.exit_code == 0, result.output
    ours = json.loads((loose / "analysis" / "round-0004" / "loss.json").read_text())["result"]["loss"]
    analyze(run_copy, "--passes", "loss")
    theirs = json.loads((run_copy / "analysis" / "round-0004" / "loss.json").read_text())["result"]["loss"]
    assert ours == theirs
    assert (loose / "analysis" / "round-0002" / "loss.json").is_file()


def test_rounds_selection(run_copy):
    _sources, _ = find_sources(run_copy)
    settings = AnalysisSettings(device="cpu")
    report = run_analysis(run_copy, rounds="all", passes=["loss"], settings=settings,
                          options={"loss": pass_options("loss", {})}, progress=False)
    assert [row["round"] for row in report.rows] == [0, 2, 4]
    report = run_analysis(run_copy, rounds="0,4", passes=["loss"], settings=settings,
                          options={"loss": pass_options("loss", {})}, progress=False)
    assert [row["round"] for row in report.rows] == [0, 4] and report.skipped == 2


def _one_line_error(result, message):
    assert result.exit_code != 0
    assert result.output.strip() == f"error: {message}" or result.output.strip().startswith(f"error: {message}")
    assert len(result.output.strip().splitlines()) == 1


def test_not_a_run_directory(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    _one_line_error(analyze(tmp_path), f"{tmp_path} is not a run directory (no recipe.toml), a folder of runs")


def test_no_checkpoints(run_copy):
    shutil.rmtree(run_copy / "checkpoints")
    _one_line_error(analyze(run_copy, "--passes", "loss"), "run has no checkpoints to analyse")


def test_round_that_does_not_exist(run_copy):
    _one_line_error(analyze(run_copy, "--passes", "loss", "--rounds", "3"),
                    "round 3 has no checkpoint in run; checkpointed rounds: 0, 2, 4")


def test_checkpoint_that_does_not_match_the_recipe(run_copy):
    recipe = run_copy / "recipe.toml"
    recipe.write_text(recipe.read_text().replace("width = 32", "width = 8"))
    result = analyze(run_copy, "--passes", "loss")
    _one_line_error(result, f"{run_copy / 'checkpoints' / 'round-0004.pt'} does not match the recipe's model 'cnn'")
    assert not (run_copy / "analysis").exists()


def test_unknown_pass_and_bad_set(run_copy):
    _one_line_error(analyze(run_copy, "--passes", "curvature"), "unknown analysis pass 'curvature'; choose from: ")
    _one_line_error(analyze(run_copy, "--passes", "loss", "--set", "loss.nope=1"),
                    "unknown option 'nope' for loss; allowed: clients")
    with pytest.raises(LandscapeError):
        find_sources(run_copy / "nothing-here")
