"""Run directories read for the figures (landscape.figures.rundata): recipe, metrics, pass records, labels."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from support.figure_runs import analysed_runs
from support.helpers import shared_folder

from landscape.core.errors import LandscapeError
from landscape.figures import rundata
from landscape.store.run import PassRecord


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """Two analysed runs (FedAvg, FedSAM) at rounds 2 and 3, and one run with no analysis."""
    return shared_folder(tmp_path_factory, "analysed-runs", analysed_runs)


@pytest.fixture(scope="module")
def runs(root):
    return rundata.load_runs(root / "analysed")


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
    rec = PassRecord(folder / "alignment.json", record)
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
    runs = rundata.load_runs([tmp_path / "seed1", tmp_path / "seed2", twin, root / "analysed" / "fedsam"])
    assert [r.label for r in runs] == ["FedAvg alpha=0.5 seed=1 (seed1)", "FedAvg alpha=0.5 seed=2",
                                       "FedAvg alpha=0.5 seed=1 (twin)", "FedSAM alpha=0.5"]
    assert len({r.color for r in runs}) == 4


def test_event_rows_are_skipped(root, tmp_path):
    copy = tmp_path / "run"
    copy.mkdir()
    shutil.copy(root / "analysed" / "fedavg" / "recipe.toml", copy / "recipe.toml")
    rows = (root / "analysed" / "fedavg" / "metrics.jsonl").read_text()
    (copy / "metrics.jsonl").write_text(rows + json.dumps({"event": "diverged", "round": 3, "test_acc": 9.0}) + "\n")
    (run,) = rundata.load_runs(copy)
    assert len(run.metrics) == 3 and all("event" not in row for row in run.metrics)
    assert 9.0 not in run.series("test_acc")[1]


def test_figures_compare_report_claims_and_open_run_read_one_model(root, tmp_path, monkeypatch):
    """A figure, compare, the report and a claim read the runs that open_run gives through the one read model
    (landscape.store.run.Run): each run's metrics.jsonl and analysis results are read once, and every reader
    shows the numbers of the same rows and records."""
    import landscape
    from landscape.claims import checks
    from landscape.figures import compare, curves
    from landscape.figures.report import build as report
    from landscape.store import run as store_run
    from landscape.store.directory import RunDir

    reads = []
    read_rows, read_results = RunDir.read_rows, store_run.read_results
    monkeypatch.setattr(RunDir, "read_rows", lambda self: reads.append(("metrics", self.path)) or read_rows(self))
    monkeypatch.setattr(store_run, "read_results", lambda path: reads.append(("results", path)) or read_results(path))
    opened = [landscape.open_run(root / "analysed" / name) for name in ("fedavg", "fedsam")]
    assert all(isinstance(run, store_run.Run) for run in opened)
    runs = rundata.load_runs(opened)
    assert [r.run for r in runs] == opened and [r.label for r in runs] == ["FedAvg alpha=0.5", "FedSAM alpha=0.5"]

    lines = curves.metric_figure(runs, "train_loss").axes[0].get_lines()
    table = compare.compare(runs, tmp_path / "compare")
    page = report.build_report(runs)
    claimed, at = checks.run_value(runs[0], "Delta_FI", "last")
    assert sorted(reads) == sorted((kind, run.path) for run in opened for kind in ("metrics", "results"))

    for run, seen, line, row in zip(opened, runs, lines, table.rows):
        assert seen.metrics is run.metrics() and run.metrics() == RunDir(run.path).read_metrics()
        assert list(line.get_ydata()) == [r["train_loss"] for r in run.metrics()]
        acc = f"{100 * run.metrics()[-1]['test_acc']:.4g}"
        assert row[table.header.index("test acc (%)")] == acc and acc in page
        (incompatibility,) = [rec for rec in run.records()[3] if rec.name == "incompatibility"]
        assert seen.analyses[3]["incompatibility"] is incompatibility
        delta = incompatibility.value("incompatibility")
        assert row[table.header.index("Delta_FI")].startswith(f"{delta:.4g} +- ") and f"{delta:.4g}" in page
    assert at == [3] and claimed == float(
        next(rec for rec in opened[0].records()[3] if rec.name == "incompatibility").value("incompatibility"))
    fresh = rundata.load_runs(root / "analysed")  # read again from the files: the same rows and records
    for run, again in zip(opened, fresh):
        assert again.metrics == run.metrics() and again.recipe == run.recipe_table()
        assert ({r: [rec.record for rec in recs] for r, recs in again.results.items()}
                == {r: [rec.record for rec in recs] for r, recs in run.records().items()})
