"""Seeds aggregated (landscape.figures.seeds): grouping, mean +- SE, figure recipes with seeds, curves, compare
and report rows over seeds; a single seed drawn and tabled as before."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from matplotlib.collections import PolyCollection
from support.helpers import invoke, tiny_recipe

from landscape.analyze.catalog import pass_options
from landscape.analyze.scheduler import run_analysis
from landscape.analyze.settings import AnalysisSettings
from landscape.core.errors import LandscapeError
from landscape.figures import compare, curves, rundata, seeds
from landscape.figures.recipe import figure as figure_recipe
from landscape.figures.report import build as report
from landscape.figures.report import parts as report_html
from landscape.train import loop
from landscape.workflows.figure import prepare_figure_runs

FAST = {"hessian": {"top_k": 2, "tol": 0.01, "clients": 2, "trace_hvps": 6, "density_steps": 4, "density_runs": 1},
        "sharpness": {"clients": 2, "steps": 2}, "incompatibility": {"clients": 2, "batches": 2},
        "alignment": {"clients": 2, "batches": 2}}


def seeded_runs(root: Path, rounds: str) -> Path:
    """FedAvg at seeds 0, 1, 2 and FedSAM at seed 0 (3 rounds) in ``root/runs``, every pass analysed at
    ``rounds``."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for algorithm, seed in (("fedavg", 0), ("fedavg", 1), ("fedavg", 2), ("fedsam", 0)):
            recipe = tiny_recipe(train__keep_clients=True, train__rounds=3, algorithm__name=algorithm, seed=seed,
                                 model__name="mlp", model__hidden=[16])
            loop.start_run(recipe, root / "runs" / f"{algorithm}-s{seed}", progress=False)
        options = {name: pass_options(name, FAST[name]) for name in FAST}
        run_analysis(root / "runs", rounds=rounds, passes=list(FAST), options=options,
                     settings=AnalysisSettings(device="cpu", analysis_samples=100), progress=False)
    finally:
        torch.set_num_threads(threads)
    return root


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """The seeded runs, every pass analysed at round 3 only."""
    return seeded_runs(tmp_path_factory.mktemp("seeds"), "3")


@pytest.fixture(scope="module")
def runs(root):
    return rundata.load_runs(root / "runs")


def legend_texts(fig) -> list[str]:
    """The entries of a figure's one legend (below its axes: ``style.outside_legend``)."""
    (legend,) = fig.legends
    return [t.get_text() for t in legend.get_texts()]


def hessian_json(run_dir: Path) -> dict:
    (path,) = [p for p in (run_dir / "analysis" / "round-0003").glob("hessian*.json")]
    return json.loads(path.read_text())


def final_acc(run_dir: Path) -> float:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [row["test_acc"] for row in rows if "test_acc" in row][-1]


# -- the statistics ----------------------------------------------------------------------------------------


def test_mean_se_is_the_mean_and_its_standard_error():
    values = [0.25, 1.5, 4.0, -2.0]
    mean, se, n = seeds.mean_se(values)
    assert n == 4 and mean == pytest.approx(np.mean(values))
    assert se == pytest.approx(np.std(values, ddof=1) / math.sqrt(4))
    by_hand = math.sqrt(sum((v - 0.9375) ** 2 for v in values) / 3) / 2  # ddof=1, over sqrt(n)
    assert se == pytest.approx(by_hand)
    assert seeds.mean_se([3.0]) == (3.0, None, 1)
    mean, se, n = seeds.mean_se([np.array([1.0, 2.0]), np.array([3.0, 6.0])])  # arrays: element-wise
    np.testing.assert_allclose(mean, [2.0, 4.0])
    np.testing.assert_allclose(se, [1.0, 2.0])
    with pytest.raises(LandscapeError, match="at least one value"):
        seeds.mean_se([])
    with pytest.raises(LandscapeError, match="one shape"):
        seeds.mean_se([np.zeros(2), np.zeros(3)])


def test_recipes_group_by_everything_but_the_seed():
    r = {"name": "a", "seed": 0, "train": {"lr": 0.1, "device": "cpu", "threads": 1}, "dataset": {"root": "data"}}
    same = {**r, "name": "b", "seed": 1, "train": {"lr": 0.1, "device": "cuda", "threads": 4, "vectorize": "on",
                                                   "memory_format": "channels-last"},
            "dataset": {"root": "/elsewhere"}}  # where and how a round is computed: the same experiment
    other = {**r, "seed": 2, "train": {"lr": 0.2, "device": "cpu", "threads": 1}}
    assert seeds.recipe_groups([r, other, same]) == [[0, 2], [1]]
    twin = dict(same)  # seed 1 twice: two copies of one run, not seeds
    assert seeds.recipe_groups([r, same, twin]) == [[0], [1], [2]]
    assert seeds.compact_names(["x-s0", "x-s1", "x-s12"]) == "x-s{0,1,12}"
    assert seeds.compact_names(["a-seed0-b", "a-seed1-b"]) == "a-seed{0,1}-b"
    assert seeds.compact_names(["only"]) == "only"


def test_loaded_runs_that_differ_only_in_seed_are_one_group(runs):
    found = seeds.groups(runs)
    assert [g.n for g in found] == [3, 1]
    fedavg, fedsam = found
    assert fedavg.seeds == [0, 1, 2] and fedsam.seeds == [0]
    assert fedavg.label == "FedAvg alpha=0.5" and fedavg.legend == "FedAvg alpha=0.5 (n=3)"
    assert fedsam.label == fedsam.legend == fedsam.runs[0].label  # one seed: its label as before
    assert len({run.color for run in fedavg.runs}) == 1 and fedavg.colour != fedsam.colour
    assert fedavg.name == "fedavg-s{0,1,2}"


# -- figure recipes with seeds -----------------------------------------------------------------------------

RECIPE = """
name = "tiny"
seeds = [0, 1]
[[runs]]
id = "a"
label = "FedAvg"
set = { "algorithm.name" = "fedavg" }
[[runs]]
id = "b"
label = "FedSAM"
set = { "algorithm.name" = "fedsam", "seed" = 7 }
[[plots]]
kind = "accuracy"
[train]
set = { "partition.clients" = 4, "train.rounds" = 2, "train.local_steps" = 2, "train.batch_size" = 16 }
[paper]
seeds = [3, 4, 5]
"""


def test_a_figure_recipe_with_seeds_expands_into_one_run_per_seed(tmp_path):
    path = tmp_path / "fig.toml"
    path.write_text(RECIPE)
    fig = figure_recipe.load_figure_recipe(path)
    assert fig.seeds == [0, 1]
    assert fig.seed_runs(tmp_path / "out") == {
        "a": [(0, tmp_path / "out" / "runs" / "a-seed0"), (1, tmp_path / "out" / "runs" / "a-seed1")],
        "b": [(0, tmp_path / "out" / "runs" / "b-seed0"), (1, tmp_path / "out" / "runs" / "b-seed1")]}
    assert fig.overrides(fig.run("b"), 1)[-1] == ("seed", 1)  # over the run's own seed = 7
    # the scale table's seeds, merged
    assert figure_recipe.load_figure_recipe(path, "paper").seeds == [3, 4, 5]
    fig = fig.with_seeds([4])
    assert [p.name for _, p in fig.seed_runs(tmp_path)["a"]] == ["a-seed4"]
    plain = tmp_path / "plain.toml"
    plain.write_text(RECIPE.replace("seeds = [0, 1]\n", "").replace("[paper]\nseeds = [3, 4, 5]\n", ""))
    one = figure_recipe.load_figure_recipe(plain)
    assert one.seeds is None and one.seed_runs(tmp_path) == {"a": [(None, tmp_path / "runs" / "a")],
                                                             "b": [(None, tmp_path / "runs" / "b")]}
    assert ("seed", 7) in one.overrides(one.run("b")) and one.overrides(one.run("b"))[-1] != ("seed", None)

    dry = invoke("figures", path, "--out", tmp_path / "dry", "--dry-run")
    assert dry.exit_code == 0, dry.output
    for run_id in ("a", "b"):
        for seed in (0, 1):
            assert f"run {run_id} seed {seed}" in dry.output and str(tmp_path / "dry" / "runs" / f"{run_id}-seed{seed}") \
                in dry.output
    assert "2 seeds: 0,1" in dry.output and not (tmp_path / "dry").exists()
    over = invoke("figures", path, "--out", tmp_path / "dry", "--dry-run", "--seeds", "5,6,7")
    assert over.exit_code == 0 and "a-seed7" in over.output and "a-seed0" not in over.output


@pytest.mark.parametrize("change, message", [
    (("seeds = [0, 1]", "seeds = [0, 0]"), "must not repeat a seed"),
    (("seeds = [0, 1]", "seeds = []"), "non-empty list of seeds"),
    (("seeds = [0, 1]", 'seeds = "0,1"'), "fig.toml: seeds must be a list (got '0,1')"),
    (("seeds = [0, 1]", "seeds = [-1]"), "fig.toml: seeds[0] must be >= 0 (got -1)"),
    (("seeds = [0, 1]", "seeds = [0, 4294967296]"), "fig.toml: seeds[1] must be <= 4294967295 (got 4294967296)"),
    (("seeds = [0, 1]", "seeds = [true]"), "fig.toml: seeds[0] must be an integer (got True)"),
])
def test_bad_seeds_are_named_in_one_line(tmp_path, change, message):
    path = tmp_path / "fig.toml"
    path.write_text(RECIPE.replace(*change))
    result = invoke("figures", path, "--dry-run")
    assert result.exit_code == 1 and result.output.startswith("error: ") and message in result.output
    assert "Traceback" not in result.output and result.output.count("\n") == 1


def test_bad_seeds_option(tmp_path, root):
    path = tmp_path / "fig.toml"
    path.write_text(RECIPE)
    for text, message in (("0,x", "comma list of seeds"), ("1,1", "must not repeat"), ("", "comma list of seeds")):
        result = invoke("figures", path, "--dry-run", "--seeds", text)
        assert result.exit_code == 1 and message in result.output and "Traceback" not in result.output
    given = invoke("figures", path, "--runs", root / "runs", "--seeds", "0,1", "--dry-run")
    assert given.exit_code == 1 and "--seeds needs the recipe's runs" in given.output
    forced = invoke("figures", path, "--set", "seed=3", "--dry-run")
    assert forced.exit_code == 1 and "give the seeds with --seeds" in forced.output


def test_figures_trains_each_seed_and_draws_their_mean(tmp_path):
    path = tmp_path / "fig.toml"
    path.write_text(RECIPE)
    fig = figure_recipe.load_figure_recipe(path)
    out = tmp_path / "out"
    threads = torch.get_num_threads()
    try:
        by_id = prepare_figure_runs(fig, out, device="cpu")
    finally:
        torch.set_num_threads(threads)
    assert by_id == {run_id: [out / "runs" / f"{run_id}-seed{s}" for s in (0, 1)] for run_id in ("a", "b")}
    for run_id in ("a", "b"):
        for s in (0, 1):
            text = (out / "runs" / f"{run_id}-seed{s}" / "recipe.toml").read_text()
            assert f"\nseed = {s}\n" in text
    result = invoke("figures", path, "--out", out, "--quiet")
    assert result.exit_code == 0, result.output
    assert (out / "tiny.png").stat().st_size > 5000
    assert sorted(p.name for p in (out / "runs").iterdir() if p.is_dir()) == ["a-seed0", "a-seed1", "b-seed0",
                                                                              "b-seed1"]
    loaded = {run_id: rundata.load_runs(paths) for run_id, paths in by_id.items()}
    drawn = figure_recipe.figure_runs(fig, fig.plots[0], loaded)
    fig = curves.accuracy_figure(drawn)
    ax = fig.axes[0]
    assert legend_texts(fig) == ["FedAvg (n=2)", "FedSAM (n=2)"]
    for line, run_id in zip(ax.lines, ("a", "b")):
        accs = [[json.loads(r)["test_acc"] for r in (p / "metrics.jsonl").read_text().splitlines()]
                for p in by_id[run_id]]
        np.testing.assert_allclose(line.get_ydata(), 100 * np.mean(accs, axis=0))


# -- curves ------------------------------------------------------------------------------------------------


def test_curves_draw_the_mean_with_a_standard_error_band(runs):
    fig = curves.accuracy_figure(runs)
    ax = fig.axes[0]
    assert legend_texts(fig) == ["FedAvg alpha=0.5 (n=3)", "FedSAM alpha=0.5"]
    group_line, single_line = ax.lines
    accs = np.array([100 * runs[k].series("test_acc")[1] for k in range(3)])
    np.testing.assert_allclose(group_line.get_ydata(), accs.mean(axis=0))
    (band,) = [c for c in ax.collections if isinstance(c, PolyCollection)]  # only the group has a band
    se = accs.std(axis=0, ddof=1) / math.sqrt(3)
    ys = band.get_paths()[0].vertices[:, 1]
    assert ys.max() == pytest.approx((accs.mean(axis=0) + se).max())
    assert ys.min() == pytest.approx((accs.mean(axis=0) - se).min())
    np.testing.assert_allclose(single_line.get_ydata(), 100 * runs[3].series("test_acc")[1])


def test_a_single_analysed_round_is_drawn_by_run_not_over_rounds(runs, tmp_path):
    fig = curves.flatness_and_sharpness_figure(runs)
    ax_d, ax_s, ax_l = fig.axes
    assert ax_d.lines and ax_d.get_xlabel() == "round"  # Delta_D: every round training logged, over rounds
    lam = [float(hessian_json(runs[k].path)["result"]["top"]["values"][0]) for k in range(4)]
    for ax in (ax_s, ax_l):  # analysed at round 3 only: no panel "over rounds", a bar per configuration
        assert all(line.get_marker() in ("_", "None") for line in ax.lines)  # error bars' caps only, no dots
        assert ax.get_xlabel() == "" and ax.get_title().endswith("at round 3")
        assert [t.get_text() for t in ax.get_xticklabels()] == ["FedAvg alpha=0.5\n(n=3)", "FedSAM alpha=0.5"]
    mean, se, _ = seeds.mean_se(lam[:3])
    assert [p.get_height() for p in ax_l.patches] == pytest.approx([mean, lam[3]])
    (bars,) = ax_l.containers[1:]  # the group's error bar: mean +- SE
    assert bars.lines[2][0].get_segments()[0][:, 1] == pytest.approx([mean - se, mean + se])
    curves.plot_flatness_and_sharpness(runs, tmp_path / "fig2.png")
    caption = (tmp_path / "fig2.caption.txt").read_text()
    assert "(b) round 3 only, drawn by run (bars), not over rounds" in caption
    single = curves.flatness_and_sharpness_figure(runs[3:]).axes[2]  # one seed: a bar, no error bar
    assert len(single.patches) == 1 and len(single.containers) == 1


def test_hessian_bars_are_means_with_standard_errors_and_seed_dots(runs):
    fig = curves.hessian_figure(runs)
    ax_max, ax_ratio, ax_density = fig.axes
    lam = [float(hessian_json(runs[k].path)["result"]["top"]["values"][0]) for k in range(4)]
    ratio = [float(hessian_json(runs[k].path)["result"]["lambda_ratio"]) for k in range(4)]
    heights = [p.get_height() for p in ax_max.patches]
    assert heights == pytest.approx([np.mean(lam[:3]), lam[3]])
    assert [p.get_height() for p in ax_ratio.patches] == pytest.approx([np.mean(ratio[:3]), ratio[3]])
    dots = [c for c in ax_ratio.collections if c.get_label() == "each seed"]
    np.testing.assert_allclose(sorted(dots[0].get_offsets()[:, 1]), sorted(ratio[:3]))
    (err,) = ax_ratio.containers[1:]
    se = np.std(ratio[:3], ddof=1) / math.sqrt(3)
    assert err.lines[2][0].get_segments()[0][:, 1] == pytest.approx([np.mean(ratio[:3]) - se, np.mean(ratio[:3]) + se])
    assert "lower: flatter" in ax_max.get_title() and "lower: flatter" not in ax_ratio.get_title()
    assert "proxy" in ax_ratio.get_title()
    assert [t.get_text() for t in ax_ratio.get_xticklabels()] == ["FedAvg alpha=0.5\n(n=3)", "FedSAM alpha=0.5"]
    assert len(ax_density.lines) == 4  # every seed a thin line of the group's colour, one legend entry each group
    assert len({ax_density.lines[k].get_color() for k in range(3)}) == 1
    assert legend_texts(fig)[0] == "each seed" and legend_texts(fig)[-2:] == ["FedAvg alpha=0.5 (n=3)",
                                                                             "FedSAM alpha=0.5"]


def test_alignment_and_incompatibility_average_the_seeds(runs):
    fig = curves.alignment_figure(runs)
    matrices = [runs[k].pass_record("alignment").array("gradients.cosine_matrix") for k in range(3)]
    np.testing.assert_allclose(fig.axes[0].images[0].get_array(), np.mean(matrices, axis=0))
    assert "n=3" in fig.axes[0].get_title() and "n=" not in fig.axes[1].get_title()
    fig = curves.incompatibility_figure(runs)
    delta = [runs[k].pass_record("incompatibility").value("incompatibility") for k in range(3)]
    # one analysed round: each part a bar (the mean over seeds +- SE), Delta_FI the first
    assert fig.axes[0].patches[0].get_height() == pytest.approx(np.mean(delta))
    segment = fig.axes[0].containers[0].lines[2][0].get_segments()[0][:, 1]
    assert segment[1] - segment[0] == pytest.approx(2 * np.std(delta, ddof=1) / math.sqrt(3))
    assert "(n=3)" in fig.axes[0].get_title()


def test_single_seed_figures_are_drawn_as_before(runs, tmp_path):
    one = rundata.load_runs([runs[0].path, runs[3].path])  # seeds 0 of FedAvg and FedSAM: no group of several
    assert all(run.group is None for run in one) and [run.index for run in one] == [0, 1]
    fig = curves.accuracy_figure(one)
    ax = fig.axes[0]
    assert not ax.collections and all("n=" not in text for text in legend_texts(fig))
    np.testing.assert_allclose(ax.lines[0].get_ydata(), 100 * one[0].series("test_acc")[1])
    ax_max = curves.hessian_figure(one).axes[0]
    assert len(ax_max.containers) == 1 and not [c for c in ax_max.collections if c.get_label() == "each seed"]
    assert [t.get_text() for t in ax_max.texts] == [f"{p.get_height():.3g}" for p in ax_max.patches]


# -- compare and report ------------------------------------------------------------------------------------


def test_compare_collapses_seeds_into_one_row(root, runs, tmp_path):
    result = compare.compare(runs, tmp_path)
    assert result.header[:5] == ["run", "directory", "n", "rounds", "test acc (%)"]
    with open(tmp_path / "compare.csv") as f:
        rows = list(csv.reader(f))
    header = rows[0]
    # compare.csv: the row's names, then numbers only (the display text is the printed table's)
    assert header[:5] == ["run", "directory", "n", "rounds", "test acc (%) mean"]
    assert len(rows) == 3 and header == ["run", "directory"] + result.numbers_header
    assert not set(result.header[4:]) & set(header)  # no display column
    group, single = (dict(zip(header, row)) for row in rows[1:])
    shown_group, shown_single = (dict(zip(result.header, row)) for row in result.rows)
    assert group["n"] == "3" and group["directory"] == shown_group["directory"] == "fedavg-s{0,1,2}"
    lam = [float(hessian_json(root / "runs" / f"fedavg-s{s}")["result"]["top"]["values"][0]) for s in range(3)]
    mean, se, _ = seeds.mean_se(lam)
    assert shown_group["lambda_max"] == f"{mean:.4g} +- {se:.2g}"
    # the numeric columns: the mean, SE and n over the seeds, and each seed's value, as in the runs' files
    assert [float(group[f"lambda_max {part}"]) for part in ("mean", "se", "n")] == [mean, se, 3]
    assert [float(group[f"lambda_max seed {s}"]) for s in range(3)] == lam
    accs = [100 * final_acc(root / "runs" / f"fedavg-s{s}") for s in range(3)]
    mean, se, _ = seeds.mean_se(accs)
    assert shown_group["test acc (%)"] == f"{mean:.4g} +- {se:.2g}"
    assert float(group["test acc (%) mean"]) == mean and float(group["test acc (%) se"]) == se
    assert [float(group[f"test acc (%) seed {s}"]) for s in range(3)] == accs
    sam = float(hessian_json(root / "runs" / "fedsam-s0")["result"]["top"]["values"][0])
    assert single["n"] == "1" and "+-" not in shown_single["lambda_max"] and shown_single["lambda_max"] == f"{sam:.4g}"
    assert (float(single["lambda_max mean"]), single["lambda_max se"], single["lambda_max n"]) == (sam, "", "1")
    assert float(single["lambda_max seed 0"]) == sam and single["lambda_max seed 1"] == ""
    # the trace cell of one run shows the pass's own standard error: so does its se column
    trace = hessian_json(root / "runs" / "fedsam-s0")["result"]["trace"]
    assert [float(single[f"trace {part}"]) for part in ("mean", "se")] == [trace["estimate"], trace["stderr"]]
    # where each value comes from: the round it was read at, the rounds trained
    assert single["lambda_max round"] == str(hessian_json(root / "runs" / "fedsam-s0")["round"])
    assert single["rounds"] == shown_single["rounds"]
    # and pandas reads every column but the names as numbers
    import pandas as pd

    table = pd.read_csv(tmp_path / "compare.csv")
    assert table["lambda_max mean"].dtype == float and table["lambda_max n"].tolist() == [3, 1]
    assert table["lambda_max mean"].tolist() == [seeds.mean_se(lam)[0], sam]
    assert [c for c in table.columns if not pd.api.types.is_numeric_dtype(table[c])] == ["run", "directory"]


def test_single_seed_compare_and_report_are_as_before(runs, tmp_path):
    one = rundata.load_runs([runs[0].path, runs[3].path])
    result = compare.compare(one, tmp_path)
    assert result.header[:4] == ["run", "directory", "rounds", "test acc (%)"]
    assert not [name for name in result.numbers_header if " seed " in name]  # no seed columns
    with open(tmp_path / "compare.csv") as f:
        header, *rows = list(csv.reader(f))
    assert header == ["run", "directory"] + result.numbers_header
    assert header[2:6] == ["rounds", "test acc (%) mean", "test acc (%) se", "test acc (%) n"]
    for run, row in zip(one, rows):
        lam = float(hessian_json(run.path)["result"]["top"]["values"][0])
        assert float(dict(zip(header, row))["lambda_max mean"]) == lam
    table = report_html.comparison_table(one, 0.05)
    assert "<th>n</th>" not in table and "(n=" not in table


def test_report_rows_aggregate_seeds(root, runs, tmp_path):
    page = report.write_report(root / "runs", tmp_path / "report.html").read_text()
    table = page[page.index('<table class="comparison">'):]
    table = table[:table.index("</table>")]
    assert table.count("<tr>") == 3 and "<th>n</th>" in table and "fedavg-s{0,1,2}" in table
    lam = [float(hessian_json(root / "runs" / f"fedavg-s{s}")["result"]["top"]["values"][0]) for s in range(3)]
    mean, se, _ = seeds.mean_se(lam)
    assert f'<span class="v">{mean:.4g}</span> <span class="v">&plusmn; {se:.2g}</span>' in table
    assert "mean over the seeds" in page
