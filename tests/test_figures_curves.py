"""Curves and summary figures from run directories (landscape.figures.curves): files in, PNG/PDF out."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import tiny_recipe

from landscape.analyze.catalog import pass_options
from landscape.analyze.context import AnalysisSettings
from landscape.analyze.scheduler import run_analysis
from landscape.errors import LandscapeError
from landscape.figures import curves
from landscape.train import loop

FAST = {"hessian": {"top_k": 2, "tol": 0.01, "clients": 2, "trace_hvps": 6, "density_steps": 4, "density_runs": 1},
        "sharpness": {"clients": 2, "steps": 2}, "incompatibility": {"clients": 2, "batches": 2},
        "alignment": {"clients": 2, "batches": 2}}
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def tiny_run(path: Path, algorithm: str) -> None:
    recipe = tiny_recipe(train__keep_clients=True, train__rounds=3, algorithm__name=algorithm, model__name="mlp",
                         model__hidden=[16])
    loop.start_run(recipe, path, progress=False)


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """Two analysed runs (FedAvg, FedSAM) at rounds 2 and 3, and one run with no analysis."""
    root = tmp_path_factory.mktemp("curves")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: one thread is several times faster on a busy machine
    try:
        for algorithm in ("fedavg", "fedsam"):
            tiny_run(root / "analysed" / algorithm, algorithm)
        options = {name: pass_options(name, FAST.get(name, {})) for name in FAST}
        options["flatness"] = None
        run_analysis(root / "analysed", rounds="2,3", passes=[*FAST, "flatness"], options=options,
                     settings=AnalysisSettings(device="cpu", analysis_samples=100), progress=False)
    finally:
        torch.set_num_threads(threads)
    bare = root / "bare" / "fedavg"
    bare.mkdir(parents=True)
    for name in ("recipe.toml", "metrics.jsonl"):
        shutil.copy(root / "analysed" / "fedavg" / name, bare / name)
    return root


@pytest.fixture(scope="module")
def runs(root):
    return curves.load_runs(root / "analysed")


def assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and len(data) > 10_000, path


def test_load_runs_reads_recipe_metrics_and_every_analysis(runs):
    assert [r.label for r in runs] == ["FedAvg alpha=0.5", "FedSAM alpha=0.5"]
    for run in runs:
        assert [row["round"] for row in run.metrics] == [1, 2, 3]
        assert sorted(run.analyses) == [2, 3]
        assert set(run.analyses[3]) == {"hessian", "sharpness", "incompatibility", "alignment", "flatness"}
        assert run.recipe["model"]["name"] == "mlp"


def test_values_come_from_the_json_or_the_npz(runs):
    rec = runs[0].pass_record("hessian")
    record = json.loads(rec.path.read_text())
    assert "density" in record["arrays"] and isinstance(record["result"]["density"], dict)
    with np.load(rec.path.with_suffix(".npz")) as f:
        np.testing.assert_array_equal(rec.value("density"), f["density"])  # the NPZ array, not the JSON dict
    assert rec.value("top.values") == record["result"]["top"]["values"]
    assert rec.value("missing.key", 7) == 7
    with pytest.raises(LandscapeError, match="has no 'missing.key'"):
        rec.value("missing.key")


def test_a_split_result_is_found_in_either_file(tmp_path):
    folder = tmp_path / "analysis" / "round-0004"
    folder.mkdir(parents=True)
    matrix = np.arange(25.0).reshape(5, 5) / 25
    np.savez(folder / "alignment.npz", **{"gradients.cosine_matrix": matrix})
    record = {"pass": "alignment", "round": 4, "arrays": ["gradients.cosine_matrix"],
              "result": {"gradients": {"clients": [0, 1, 2, 3, 4], "mean_off_diagonal": "nan"},
                         "minibatch": {"mean_cosine": 0.5, "client_mean_cosine": [0.25, "inf"]}}}
    (folder / "alignment.json").write_text(json.dumps(record))
    rec = curves.PassRecord(folder / "alignment.json", record)
    np.testing.assert_array_equal(rec.value("gradients.cosine_matrix"), matrix)
    assert np.isnan(rec.value("gradients.mean_off_diagonal"))
    assert rec.value("minibatch.client_mean_cosine") == [0.25, float("inf")]
    assert rec.round == 4 and rec.name == "alignment"


def test_labels_name_the_keys_runs_differ_in(root, tmp_path):
    source = root / "analysed" / "fedavg"
    for seed in (1, 2):
        copy = tmp_path / f"seed{seed}"
        copy.mkdir()
        text = (source / "recipe.toml").read_text()
        assert "\nseed = 0\n" in text
        (copy / "recipe.toml").write_text(text.replace("\nseed = 0\n", f"\nseed = {seed}\n"))
        shutil.copy(source / "metrics.jsonl", copy / "metrics.jsonl")
    twin = tmp_path / "twin"
    shutil.copytree(tmp_path / "seed1", twin)
    runs = curves.load_runs([tmp_path / "seed1", tmp_path / "seed2", twin, root / "analysed" / "fedsam"])
    assert [r.label for r in runs] == ["FedAvg alpha=0.5 seed=1 (seed1)", "FedAvg alpha=0.5 seed=2",
                                       "FedAvg alpha=0.5 seed=1 (twin)", "FedSAM alpha=0.5"]
    assert len({r.color for r in runs}) == 4


def test_event_rows_are_skipped(root, tmp_path):
    copy = tmp_path / "run"
    copy.mkdir()
    shutil.copy(root / "analysed" / "fedavg" / "recipe.toml", copy / "recipe.toml")
    rows = (root / "analysed" / "fedavg" / "metrics.jsonl").read_text()
    (copy / "metrics.jsonl").write_text(rows + json.dumps({"event": "diverged", "round": 3, "test_acc": 9.0}) + "\n")
    (run,) = curves.load_runs(copy)
    assert len(run.metrics) == 3 and all("event" not in row for row in run.metrics)
    assert 9.0 not in run.series("test_acc")[1]


def test_accuracy_is_drawn_in_percent_on_the_eval_rounds(runs, root, tmp_path):
    fig = curves.accuracy_figure(runs)
    (ax,) = fig.axes
    for line, run in zip(ax.lines, runs):
        rows = [r for r in run.metrics if r.get("test_acc") is not None]
        np.testing.assert_array_equal(line.get_xdata(), [r["round"] for r in rows])
        np.testing.assert_allclose(line.get_ydata(), [100 * r["test_acc"] for r in rows])
        assert line.get_label() == run.label
    assert "%" in ax.get_ylabel()
    assert_png(curves.plot_accuracy(root / "analysed", tmp_path / "accuracy.png"))


@pytest.mark.parametrize("key", ["flatness_distance", "train_loss", "update_norm"])
def test_metric_over_rounds(runs, tmp_path, key):
    out = curves.plot_metric_over_rounds(runs, key, tmp_path / f"{key}.png")
    assert_png(out)
    fig = curves.metric_figure(runs, key, "my label")
    assert fig.axes[0].get_ylabel() == "my label"
    np.testing.assert_allclose(fig.axes[0].lines[1].get_ydata(), runs[1].series(key)[1])


def test_a_missing_metric_is_named(runs, tmp_path):
    with pytest.raises(LandscapeError, match="has no 'no_such_key' in metrics.jsonl"):
        curves.plot_metric_over_rounds(runs, "no_such_key", tmp_path / "x.png")


def test_flatness_and_sharpness_reads_the_passes(runs, tmp_path):
    fig = curves.flatness_and_sharpness_figure(runs)
    ax_d, ax_s, ax_l = fig.axes
    assert "0.05" in ax_s.get_title()
    assert "[analysis_samples=100, clients=2, steps=2]" in ax_s.get_title()  # the settings shown, off the defaults
    for k, run in enumerate(runs):
        np.testing.assert_allclose(ax_d.lines[k].get_ydata(), run.series("flatness_distance")[1])
        expected_s = [json.loads((run.path / f"analysis/round-{r:04d}/sharpness@analysis_samples-100_clients-2_"
                                             "steps-2.json").read_text())["result"]["global"]["sharpness"][1]
                      for r in (2, 3)]  # rhos (0.01, 0.05, 0.1)
        np.testing.assert_allclose(ax_s.lines[k].get_ydata(), expected_s)
        np.testing.assert_array_equal(ax_s.lines[k].get_xdata(), [2, 3])
        expected_l = [run.analyses[r]["hessian"].summary["lambda_max"] for r in (2, 3)]
        np.testing.assert_allclose(ax_l.lines[k].get_ydata(), expected_l)
    assert "0.1" in curves.flatness_and_sharpness_figure(runs, rho=0.1).axes[1].get_title()
    with pytest.raises(LandscapeError, match=r"rho=0.3 .*0.01, 0.05, 0.1"):
        curves.plot_flatness_and_sharpness(runs, tmp_path / "x.png", rho=0.3)
    assert_png(curves.plot_flatness_and_sharpness(runs, tmp_path / "fig2.png"))


def test_hessian_summary(runs, tmp_path):
    fig = curves.hessian_figure(runs)
    ax_max, ax_ratio, ax_density = fig.axes
    heights = [p.get_height() for p in ax_max.patches]
    assert heights == pytest.approx([run.pass_record("hessian").summary["lambda_max"] for run in runs])
    ratios = [p.get_height() for p in ax_ratio.patches]
    assert ratios == pytest.approx([run.pass_record("hessian").summary["lambda_ratio"] for run in runs])
    assert ax_density.get_yscale() == "log" and len(ax_density.lines) == 2
    assert_png(curves.plot_hessian_summary(runs, tmp_path / "hessian.png"))
    pdf = curves.plot_hessian_summary(runs, tmp_path / "hessian.pdf", round=2)
    assert pdf.read_bytes()[:5] == b"%PDF-"


def test_incompatibility(runs, tmp_path):
    fig = curves.incompatibility_figure(runs)
    ax = fig.axes[0]
    rec = runs[0].pass_record("incompatibility", 3)
    # errorbar containers: Delta_FI, heterogeneity, batch part, 2 x cross
    delta_fi, _, _, cross = ax.containers
    assert delta_fi.lines[0].get_ydata()[-1] == pytest.approx(rec.value("incompatibility"))
    assert cross.lines[0].get_ydata()[-1] == pytest.approx(2 * rec.value("cross"))
    assert delta_fi.has_yerr
    assert_png(curves.plot_incompatibility(runs, tmp_path / "incompatibility.png"))


def test_alignment_heatmaps_share_one_colour_scale(runs, tmp_path):
    fig = curves.alignment_figure(runs)
    images = [im for ax in fig.axes for im in ax.images]
    assert len(images) == 2
    assert {im.get_clim() for im in images} == {(-1.0, 1.0)}
    assert images[0].norm is images[1].norm
    assert len(fig.axes) == 3  # two heatmaps and one colour bar
    clients = runs[0].pass_record("alignment").value("gradients.clients")
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == [str(c) for c in clients]
    np.testing.assert_allclose(images[0].get_array(), runs[0].pass_record("alignment").value("gradients.cosine_matrix"))
    assert_png(curves.plot_alignment_heatmaps(runs, tmp_path / "alignment.png"))


@pytest.mark.parametrize("plot, passes", [
    (curves.plot_hessian_summary, "hessian"),
    (curves.plot_incompatibility, "incompatibility"),
    (curves.plot_alignment_heatmaps, "alignment"),
    (curves.plot_flatness_and_sharpness, "sharpness,hessian"),
])
def test_missing_analysis_names_the_run_and_the_command(root, tmp_path, plot, passes):
    bare = root / "bare" / "fedavg"
    with pytest.raises(LandscapeError) as err:
        plot([root / "analysed" / "fedsam", bare], tmp_path / "x.png")
    message = str(err.value)
    assert f"run fedavg has no {passes.replace(',', ', ')} analysis" in message
    assert f"`landscape analyze {bare} --passes {passes}`" in message
    assert "fedsam" not in message


def test_bad_inputs(root, runs, tmp_path):
    with pytest.raises(LandscapeError, match="does not exist"):
        curves.load_runs(tmp_path / "nowhere")
    with pytest.raises(LandscapeError, match="not a run directory"):
        curves.load_runs(tmp_path)
    with pytest.raises(LandscapeError, match=r"must end in \.png, \.pdf or \.svg"):
        curves.plot_accuracy(runs, tmp_path / "accuracy.jpg")
    with pytest.raises(LandscapeError, match="no alignment analysis at round 1 .*analysed rounds: 2, 3"):
        curves.plot_alignment_heatmaps(runs, tmp_path / "x.png", round=1)
