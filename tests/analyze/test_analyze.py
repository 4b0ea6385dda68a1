"""`landscape analyze`: targets, result files, skipping, errors (the passes' numerics are tested elsewhere);
result files of another shape (recomputed) and a one-point surface on disk, read by compare and report without
a traceback; and rounds without kept client models (skipped with a note, or how to keep them)."""

import json
import shutil

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from support.helpers import (
    analyze_args,
    drop_recorded_recipes,
    invoke,
    no_traceback,
    one_line_error,
    recipe6,
    tiny_recipe,
)

import landscape
from landscape.analyze.catalog import pass_options
from landscape.analyze.scheduler import run_analysis
from landscape.analyze.settings import AnalysisSettings
from landscape.analyze.source import find_sources
from landscape.cli import cli
from landscape.core.errors import LandscapeError
from landscape.store.results.files import SCHEMA_VERSION
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
    assert record["schema_version"] == SCHEMA_VERSION and record["pass"] == "loss" and record["round"] == 4
    assert record["settings"]["analysis"]["bn_mode"] == "eval" and record["settings"]["pass"] == {"clients": 0}
    assert len(record["checkpoint_sha256"]) == 64
    # F and accuracy over the clients' training data, a sample repeated as often as clients hold it (the reference
    # partition reuses samples: the references' global objective), computed independently here
    run = landscape.open_run(run_copy)
    train, _ = run.data()
    held = np.concatenate(run.partition())
    assert len(held) == len(train) and len(np.unique(held)) < len(held)  # repeats, some samples unused
    x, y = train.x[torch.as_tensor(held)], train.y[torch.as_tensor(held)]
    with torch.no_grad():
        logits = run.model(4)(x)
    assert record["result"]["loss"] == pytest.approx(torch.nn.functional.cross_entropy(logits, y).item(), rel=1e-5)
    assert record["result"]["accuracy"] == pytest.approx((logits.argmax(1) == y).float().mean().item(), abs=1e-6)
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
    result = analyze(loose, "--passes", "loss", "--checkpoints", "all")
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
    """The one-line error (``one_line_error``: exit 1, no traceback) that starts with ``message``."""
    assert one_line_error(result).startswith(f"error: {message}"), result.output


def test_not_a_run_directory(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    _one_line_error(analyze(tmp_path), f"{tmp_path} is not a run directory (no recipe.toml), a folder of runs")


def test_no_checkpoints(run_copy):
    shutil.rmtree(run_copy / "checkpoints")
    _one_line_error(analyze(run_copy, "--passes", "loss"), "run has no checkpoints to analyse")


def test_round_that_does_not_exist(run_copy):
    _one_line_error(analyze(run_copy, "--passes", "loss", "--checkpoints", "3"),
                    "round 3 has no checkpoint in run; checkpointed rounds: 0, 2, 4")


def test_checkpoint_that_does_not_match_the_recipe(run_copy):
    drop_recorded_recipes(run_copy)  # else the recipe the checkpoints record is used (tests/store/test_edited_recipe.py)
    recipe = run_copy / "recipe.toml"
    recipe.write_text(recipe.read_text().replace("width = 32", "width = 8"))
    result = analyze(run_copy, "--passes", "loss")
    _one_line_error(result, f"{run_copy / 'checkpoints' / 'round-0004.pt'} does not match the model 'cnn'")
    assert not (run_copy / "analysis").exists()


def test_unknown_pass_and_bad_set(run_copy):
    _one_line_error(analyze(run_copy, "--passes", "curvature"), "unknown analysis pass 'curvature'; choose from: ")
    _one_line_error(analyze(run_copy, "--passes", "loss", "--set", "loss.nope=1"),
                    "unknown pass option 'loss.nope'; allowed in [loss]: clients")
    with pytest.raises(LandscapeError):
        find_sources(run_copy / "nothing-here")


def test_every_pass_leaves_the_model_untouched(trained):
    from landscape.analyze.catalog import load_passes
    from landscape.analyze.context import CheckpointContext

    PASSES = load_passes()

    sources, _ = find_sources(trained)
    ctx = CheckpointContext(sources[0], 4, AnalysisSettings(device="cpu", analysis_samples=200))  # 4x faster
    module = ctx.flat.module
    module.train()
    before = {k: v.clone() for k, v in module.state_dict().items()}
    w0 = ctx.w.clone()
    fast = {"hessian": {"clients": 2, "trace_hvps": 6, "density_steps": 5, "density_runs": 1},
            "sharpness": {"clients": 2, "steps": 2}, "incompatibility": {"clients": 2, "batches": 2},
            "alignment": {"clients": 2, "batches": 2}, "loss": {"clients": 2}}
    for name in ("loss", "hessian", "sharpness", "flatness", "incompatibility", "alignment"):
        PASSES.get(name).factory(ctx, pass_options(name, fast.get(name, {})))
        assert module.training, name
        assert all(p.grad is None for p in module.parameters()), name
        assert all(torch.equal(before[k], v) for k, v in module.state_dict().items()), name
        assert torch.equal(ctx.w, w0), name


def test_default_passes_write_their_files(run_copy):
    result = analyze(run_copy, "--analysis-samples", "200", "--set", "hessian.trace_hvps=6", "--set", "hessian.density_steps=5",
                     "--set", "sharpness.steps=2", "--set", "incompatibility.batches=2", "--set", "alignment.batches=2")
    assert result.exit_code == 0, result.output
    written = sorted(p.name for p in (run_copy / "analysis" / "round-0004").iterdir())
    # results are named by their settings: the pass's name, then the settings off their defaults (the analysis's
    # and the pass's, in name order)
    for name in ("alignment@analysis_samples-200_batches-2", "flatness@analysis_samples-200",
                 "hessian@analysis_samples-200_density_steps-5_trace_hvps-6",
                 "incompatibility@analysis_samples-200_batches-2", "loss@analysis_samples-200",
                 "sharpness@analysis_samples-200_steps-2"):
        assert f"{name}.json" in written, written
    hessian_name = "hessian@analysis_samples-200_density_steps-5_trace_hvps-6"
    assert f"{hessian_name}.npz" in written
    hessian = json.loads((run_copy / "analysis" / "round-0004" / f"{hessian_name}.json").read_text())
    assert len(hessian["result"]["top"]["values"]) == 5 and hessian["result"]["hvp_count"] > 0
    assert hessian["summary"]["lambda_max"] == hessian["result"]["top"]["values"][0]
    for column in ("lambda_max", "trace", "Delta_D", "Delta_FI", "mean_grad_cos", "acc"):
        assert column in result.output


def test_flatness_without_kept_clients_says_how_to_get_them(tmp_path):
    loop.start_run(tiny_recipe(train__rounds=1), tmp_path / "plain", progress=False)
    _one_line_error(analyze(tmp_path / "plain", "--passes", "flatness"),
                    "nothing to analyse: plain: flatness skipped at round 1: no client models were kept (train "
                    "with --keep-clients to save them at checkpoints)")


def test_pyhessian_backend_cross_check_recomputes_the_hessian_pass_alone(run_copy):
    """--backend pyhessian after a native analysis: the hessian pass (the one that reads the backend,
    ``PassSpec.reads``) is computed under its own name beside the native result; sharpness is found done."""
    small = ("--analysis-samples", "200", "--set", "hessian.clients=-1", "--set", "hessian.trace_hvps=6",
             "--set", "hessian.density_steps=5", "--set", "sharpness.steps=1", "--set", "sharpness.starts=1",
             "--set", "sharpness.rhos=0.05", "--set", "sharpness.adaptive=false", "--set", "sharpness.clients=1")
    native = analyze(run_copy, "--passes", "hessian,sharpness", *small)
    assert native.exit_code == 0 and "2 computed, 0 already done" in native.output, native.output
    folder = run_copy / "analysis" / "round-0004"
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    result = analyze(run_copy, "--passes", "hessian,sharpness", "--backend", "pyhessian", *small)
    assert result.exit_code == 0, result.output
    assert "1 computed, 1 already done" in result.output, result.output  # sharpness reused, not recomputed
    assert {p.name: p.read_bytes() for p in folder.iterdir() if p.name in before} == before
    (path,) = folder.glob("hessian@*backend-pyhessian_*.json")
    assert {p.name for p in folder.iterdir()} - set(before) == {path.name, path.with_suffix(".npz").name}
    record = json.loads(path.read_text())
    summary = record["summary"]
    assert summary["pyhessian_lambda_max"] == pytest.approx(summary["lambda_max"], rel=0.01)
    assert summary["pyhessian_trace"] == record["result"]["pyhessian"]["trace"] > 0  # shown, not only stored
    assert "pyhessian_trace" in result.output


def test_surface_flags_run_the_surface_pass_only(run_copy):
    result = analyze(run_copy, "--directions", "random", "--grid", "5x3", "--span", "-0.5:0.5")
    assert result.exit_code == 0, result.output
    written = sorted(p.name for p in (run_copy / "analysis" / "round-0004").iterdir())
    assert written == ["surface@grid-5x3_span--0.5~0.5.json", "surface@grid-5x3_span--0.5~0.5.npz"]
    record = json.loads((run_copy / "analysis" / "round-0004" / written[0]).read_text())
    assert record["settings"]["pass"]["grid"] == "5x3" and record["settings"]["pass"]["span"] == "-0.5:0.5"
    _one_line_error(analyze(run_copy, "--passes", "loss", "--grid", "5"),
                    "--directions, --grid, --span and --data set the surface pass; add it: --passes surface")


def test_surface_options_alone_run_the_surface_pass_as_its_flags_do(run_copy):
    result = analyze(run_copy, "--set", "surface.grid=3", "--set", "surface.normalization=filter-reference",
                     "--set", "surface.reference=round:0", "--analysis-samples", "50")
    assert result.exit_code == 0, result.output
    (written,) = (run_copy / "analysis" / "round-0004").glob("*.json")
    assert written.name.startswith("surface@") and "normalization-filter-reference" in written.name
    _one_line_error(analyze(run_copy, "--set", "surface.grid=3", "--set", "hessian.top_k=2"),
                    "--set takes PASS.KEY=VALUE for a chosen pass (surface); got 'hessian.top_k'")


def test_written_files_are_readable_by_others(run_copy):
    analyze(run_copy, "--passes", "loss")
    assert (run_copy / "analysis" / "round-0004" / "loss.json").stat().st_mode & 0o044 == 0o044


# ----------------------------------------------------------------------------------------------------------
# result files of another shape; a one-point surface on disk


def test_a_one_point_surface_on_disk_does_not_break_compare(six_round_copy, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(six_round_copy, other)
    for run in (six_round_copy, other):
        assert invoke(*analyze_args(run, "--passes", "surface", "--grid", "3")).exit_code == 0
    # a one-point grid written by hand (or by an older version)
    npz = next((six_round_copy / "analysis" / "round-0006").glob("surface*.npz"))
    with np.load(npz) as f:
        arrays = {k: f[k] for k in f.files}
    arrays.update(loss=np.ones((1, 1)), accuracy=np.ones((1, 1)), x_coords=np.zeros(1), y_coords=np.zeros(1))
    np.savez(npz, **arrays)
    result = invoke("compare", six_round_copy, other, "--out", tmp_path / "cmp")
    no_traceback(result)


@pytest.mark.parametrize("content", ["[]", "null", "7", '{"summary": [], "settings": [], "result": []}'])
def test_an_analysis_json_of_another_shape_is_recomputed_and_read_without_traceback(six_round_copy, tmp_path,
                                                                                    content):
    other = tmp_path / "other"
    shutil.copytree(six_round_copy, other)
    args = ("--passes", "loss,surface", "--grid", "3")
    for run in (six_round_copy, other):
        assert invoke(*analyze_args(run, *args)).exit_code == 0
    for path in (six_round_copy / "analysis").rglob("*.json"):
        path.write_text(content)
    for command in (["compare", six_round_copy, other, "--out", tmp_path / "cmp"],
                    ["report", six_round_copy, other, "-o", tmp_path / "report.html"]):
        no_traceback(invoke(*command))
    result = invoke(*analyze_args(six_round_copy, *args))
    assert result.exit_code == 0, result.output
    assert "2 computed" in result.output
    for path in (six_round_copy / "analysis").rglob("*.json"):
        assert isinstance(json.loads(path.read_text()), dict)


# ----------------------------------------------------------------------------------------------------------
# rounds without kept client models


def test_analyze_all_rounds_of_flatness_skips_rounds_without_kept_clients_with_one_note(six_round_copy):
    args = [a for a in analyze_args(six_round_copy, "--checkpoints", "all", "--passes", "flatness")
            if a != "--quiet"]
    result = invoke(*args)  # without --quiet, which drops notes
    assert result.exit_code == 0, result.output
    notes = [line for line in result.output.splitlines() if line.startswith("note:")]
    assert len(notes) == 1 and "round 0" in notes[0] and "flatness" in notes[0], result.output
    assert "3 computed" in result.output
    for r in (2, 4, 6):
        assert list((six_round_copy / "analysis" / f"round-{r:04d}").glob("flatness*.json"))


def test_flatness_of_a_run_without_kept_clients_still_says_how_to_keep_them(tmp_path):
    out = tmp_path / "run"
    loop.start_run(recipe6(train__keep_clients=False, train__rounds=2), out, progress=False)
    line = one_line_error(invoke(*analyze_args(out, "--checkpoints", "all", "--passes", "flatness")))
    assert "--keep-clients" in line
