"""The report's plotly figures over seeds (landscape.figures.report.build): a group of n >= 2 seeds is one mean trace
with a +-SE band and "(n=3)" in the legend, densities a thin line per seed, gradient cosines the mean matrix; a
single-seed report's figures are as before. The numbers are checked against the run files with numpy."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
from support.helpers import result_file
from test_figures_seeds import seeded_runs
from test_report import decode, plot_divs, plot_spec

from landscape.figures import extract, rundata
from landscape.figures.report import build as report
from landscape.figures.report import plots as report_plotly

GROUP = "FedAvg alpha=0.5"
SINGLE = "FedSAM alpha=0.5"
ROUNDS = [2, 3]
PLOTS = {"accuracy", "train_loss", "flatness_distance", "global_sharpness", "spectral_density", "incompatibility",
         "gradient_cosine"}


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """FedAvg at seeds 0, 1, 2 and FedSAM at seed 0 (3 rounds), every pass analysed at rounds 2 and 3."""
    return seeded_runs(tmp_path_factory.mktemp("report-seeds"), ",".join(map(str, ROUNDS)))


@pytest.fixture(scope="module")
def page(root, tmp_path_factory) -> str:
    return report.write_report(root / "runs", tmp_path_factory.mktemp("html") / "report.html").read_text()


@pytest.fixture(scope="module")
def single_page(root, tmp_path_factory) -> str:
    """Seed 0 of FedAvg and FedSAM: no group of several seeds."""
    runs = [root / "runs" / "fedavg-s0", root / "runs" / "fedsam-s0"]
    return report.write_report(runs, tmp_path_factory.mktemp("html") / "single.html").read_text()


def seeds_dirs(root: Path) -> list[Path]:
    return [root / "runs" / f"fedavg-s{s}" for s in range(3)]


def metric(run_dir: Path, key: str) -> np.ndarray:
    return np.array([row[key] for row in metric_rows(run_dir) if key in row], dtype=float)


def metric_rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def result(run_dir: Path, round: int, pass_name: str) -> dict:
    return json.loads(result_file(run_dir / "analysis" / f"round-{round:04d}", pass_name).read_text())["result"]


def by_hand(values) -> tuple[np.ndarray, np.ndarray]:
    """Mean and standard error of the mean over the first axis, std(ddof=1) / sqrt(n)."""
    values = np.asarray(values, dtype=float)
    return values.mean(axis=0), values.std(axis=0, ddof=1) / math.sqrt(len(values))


def group_traces(data: list[dict], name: str, xaxis: str = "x") -> tuple[dict, dict, dict]:
    """The (upper, lower, mean) traces of the band named ``name`` (in the subplot of ``xaxis``)."""
    here = [t for t in data if t.get("xaxis", "x") == xaxis]
    (k,) = [i for i, t in enumerate(here) if t.get("name") == name]
    upper, lower, mean = here[k - 2:k + 1]
    return upper, lower, mean


def check_band(traces: tuple[dict, dict, dict], rounds, mean, se, legendgroup: str) -> None:
    upper, lower, line = traces
    for trace in traces:
        assert trace["legendgroup"] == legendgroup
        np.testing.assert_array_equal(decode(trace["x"]), rounds)
    np.testing.assert_allclose(decode(line["y"]), mean, rtol=1e-6)
    np.testing.assert_allclose(decode(upper["y"]), mean + se, rtol=1e-6)
    np.testing.assert_allclose(decode(lower["y"]), mean - se, rtol=1e-6)
    assert lower["fill"] == "tonexty" and lower["fillcolor"].startswith("rgba(") and lower["fillcolor"].endswith(
        ", 0.2)")
    assert "fill" not in upper and "fill" not in line
    assert upper["showlegend"] is False and lower["showlegend"] is False
    assert upper["hoverinfo"] == lower["hoverinfo"] == "skip"
    assert "n=3" in line["hovertemplate"] and "SE" in line["hovertemplate"] and "seeds 0, 1, 2" in line["hovertemplate"]
    np.testing.assert_allclose([float(c[0]) for c in line["customdata"]], se, rtol=1e-4)


def test_every_plot_is_there_once(page):
    assert set(plot_divs(page)) == PLOTS


@pytest.mark.parametrize("plot, key, scale", [("accuracy", "test_acc", 100.0), ("train_loss", "train_loss", 1.0),
                                              ("flatness_distance", "flatness_distance", 1.0)])
def test_curves_are_the_mean_with_a_standard_error_band(page, root, plot, key, scale):
    spec = plot_spec(page, plot)
    data = spec["data"]
    assert len(data) == 4  # upper, lower, mean of the group; the single seed's line
    legend = [t["name"] for t in data if t.get("showlegend") is not False]
    assert legend == [f"{GROUP} (n=3)", SINGLE]
    values = [scale * metric(d, key) for d in seeds_dirs(root)]
    mean, se = by_hand(values)
    rounds = [row["round"] for row in metric_rows(seeds_dirs(root)[0]) if key in row]
    traces = group_traces(data, f"{GROUP} (n=3)")
    check_band(traces, rounds, mean, se, f"{GROUP} (n=3)")
    line = traces[2]
    assert line["line"]["color"] == traces[1]["line"]["color"] and line["mode"] == "lines+markers"
    each = [[float(v) for v in c[1].split("; ")] for c in line["customdata"]]  # each seed's value, in the hover
    np.testing.assert_allclose(each, np.array(values).T, rtol=1e-3)
    single = data[3]
    assert single["name"] == SINGLE and "fill" not in single and "customdata" not in single
    np.testing.assert_allclose(decode(single["y"]), scale * metric(root / "runs" / "fedsam-s0", key))
    assert "mean over seeds" in spec["layout"]["title"]["text"]


def test_sharpness_and_lambda_are_means_with_bands(page, root):
    spec = plot_spec(page, "global_sharpness")
    data = spec["data"]
    rho = extract.choose_rho(rundata.load_runs(root / "runs"), None)
    sharp, lam = [], []
    for d in seeds_dirs(root):
        found = [result(d, r, "sharpness")["global"] for r in ROUNDS]
        sharp.append([g["sharpness"][g["rhos"].index(rho)] for g in found])
        lam.append([result(d, r, "hessian")["top"]["values"][0] for r in ROUNDS])
    for axis, values in (("x", sharp), ("x2", lam)):
        mean, se = by_hand(values)
        check_band(group_traces(data, f"{GROUP} (n=3)", axis), ROUNDS, mean, se, f"{GROUP} (n=3)")
    assert [t["showlegend"] for t in data if t["name"] == f"{GROUP} (n=3)"] == [True, False]  # one legend entry
    assert [t["name"] for t in data if "SE" not in t["name"]] == [f"{GROUP} (n=3)", SINGLE] * 2
    assert len(data) == 8


def test_incompatibility_parts_are_means_over_the_seeds(page, root):
    spec = plot_spec(page, "incompatibility")
    data = spec["data"]
    first = [t for t in data if t.get("xaxis", "x") == "x"]
    assert len(first) == 12 and len([t for t in data if t.get("xaxis") == "x2"]) == 4
    for key, name in (("incompatibility", "Δ<sub>FI</sub>"), ("heterogeneity", "heterogeneity"),
                      ("batch_part", "batch part"), ("cross", "2 × cross")):
        scale = 2.0 if key == "cross" else 1.0
        mean, se = by_hand([[scale * result(d, r, "incompatibility")[key] for r in ROUNDS] for d in seeds_dirs(root)])
        check_band(group_traces(data, name, "x"), ROUNDS, mean, se, name)
    titles = [a["text"] for a in spec["layout"]["annotations"]]
    assert titles[0].startswith(f"{GROUP} (n=3)") and titles[1].startswith(SINGLE) and "n=" not in titles[1]


def test_densities_are_a_thin_line_per_seed(page, root):
    data = plot_spec(page, "spectral_density")["data"]
    assert len(data) == 4
    group, single = data[:3], data[3]
    assert {t["legendgroup"] for t in group} == {f"{GROUP} (n=3)"}
    assert [t["showlegend"] for t in group] == [True, False, False]
    assert {t["line"]["color"] for t in group} == {group[0]["line"]["color"]} and group[0]["line"]["width"] == 1
    assert group[0]["name"] == f"{GROUP} (n=3) (round 3)"
    assert [t["hovertemplate"].split(",")[0] for t in group] == ["seed 0", "seed 1", "seed 2"]
    assert single["name"] == f"{SINGLE} (round 3)" and "legendgroup" not in single


def test_gradient_cosines_are_the_mean_matrix(page, root):
    spec = plot_spec(page, "gradient_cosine")
    matrices = [np.array(result(d, 3, "alignment")["gradients"]["cosine_matrix"]) for d in seeds_dirs(root)]
    mean, se = by_hand(matrices)
    group, single = spec["data"]
    np.testing.assert_allclose(decode(group["z"]), mean, rtol=1e-6)
    assert group["text"][0][1].startswith(f"± {se[0, 1]:.2g} (SE, n=3)")
    off, off_se = by_hand([result(d, 3, "alignment")["gradients"]["mean_off_diagonal"] for d in seeds_dirs(root)])
    titles = [a["text"].replace("<br>", " ") for a in spec["layout"]["annotations"]]  # wrapped to the panel
    assert titles[0].startswith(f"{GROUP}, round 3, mean of n=3 seeds mean off-diagonal {off:.3f} ± {off_se:.2g}")
    assert "n=" not in titles[1]
    np.testing.assert_allclose(decode(single["z"]), result(root / "runs" / "fedsam-s0", 3, "alignment")["gradients"]
                               ["cosine_matrix"])


def test_seeds_of_other_clients_keep_their_own_heatmaps(root, tmp_path):
    copies = []
    for d in seeds_dirs(root):
        shutil.copytree(d, tmp_path / d.name)
        copies.append(tmp_path / d.name)
    path = result_file(copies[2] / "analysis" / "round-0003", "alignment")
    record = json.loads(path.read_text())
    record["result"]["gradients"]["clients"] = [c + 1 for c in record["result"]["gradients"]["clients"]]
    path.write_text(json.dumps(record))
    fig = report_plotly.cosine_figure(rundata.load_runs(copies))
    assert len(fig.data) == 3
    titles = [a.text for a in fig.layout.annotations]
    assert [t.split(",")[1] for t in titles] == [" seed 0", " seed 1", " seed 2"] and not any("n=" in t for t in titles)
    # each panel's axes label client numbers at a step that keeps them apart (three panels: at most 13 each)
    steps = {(axis.dtick, axis.tickmode) for axis in (fig.layout.xaxis, fig.layout.yaxis3)}
    assert steps == {(report_plotly.client_tick_step(len(fig.data[0].x), 3), "linear")}


def test_heatmap_axes_label_every_client_while_the_numbers_fit():
    """1, 2, 5, 10, 20, 50, ...: the least step that labels at most 20 clients along a panel's axis with one or
    two panels in a row (20 of 100 clients ran together at every 4th), 13 with three."""
    assert [report_plotly.client_tick_step(n) for n in (1, 20, 21, 40, 41, 100, 101, 1000, 3500)] == \
        [1, 1, 2, 2, 5, 5, 10, 50, 200]
    assert report_plotly.client_tick_step(100, 2) == 5
    assert [report_plotly.client_tick_step(n, 3) for n in (13, 14, 20, 100)] == [1, 2, 2, 10]


def test_a_single_seed_report_draws_its_figures_as_before(single_page, root):
    assert set(plot_divs(single_page)) == PLOTS
    expected = {  # trace names, as before seeds were aggregated
        "accuracy": [f"{GROUP}", SINGLE], "train_loss": [GROUP, SINGLE], "flatness_distance": [GROUP, SINGLE],
        "global_sharpness": [GROUP, SINGLE, GROUP, SINGLE],
        "spectral_density": [f"{GROUP} (round 3)", f"{SINGLE} (round 3)"],
        "incompatibility": ["Δ<sub>FI</sub>", "heterogeneity", "batch part", "2 × cross"] * 2,
        "gradient_cosine": [None, None]}
    for plot, names in expected.items():
        spec = plot_spec(single_page, plot)
        assert [t.get("name") for t in spec["data"]] == names, plot
        for trace in spec["data"]:
            assert "fill" not in trace and "customdata" not in trace and "text" not in trace
        text = json.dumps(spec)
        assert "n=" not in text and "mean over seeds" not in text and "SE over seeds" not in text
    sharp = plot_spec(single_page, "global_sharpness")["data"]
    assert [t["showlegend"] for t in sharp] == [True, True, False, False]
    assert [t["legendgroup"] for t in sharp] == [GROUP, SINGLE, GROUP, SINGLE]
    incompatibility = plot_spec(single_page, "incompatibility")
    assert incompatibility["layout"]["title"]["text"].endswith("(error bars: Monte-Carlo SE)")
    delta = incompatibility["data"][0]
    np.testing.assert_allclose(decode(delta["error_y"]["array"]),
                               [result(root / "runs" / "fedavg-s0", r, "incompatibility")["incompatibility_se"]
                                for r in ROUNDS])
    accuracy = plot_spec(single_page, "accuracy")
    assert accuracy["layout"]["title"]["text"] == "Test accuracy over rounds"
    np.testing.assert_allclose(decode(accuracy["data"][0]["y"]), 100 * metric(root / "runs" / "fedavg-s0", "test_acc"))
