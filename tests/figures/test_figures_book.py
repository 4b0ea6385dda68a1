"""Figure recipes (figures/*.toml), `landscape figures` and `landscape compare`."""

from __future__ import annotations

import csv
import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.helpers import invoke, result_file

from landscape.cli import cli
from landscape.config import overrides as recipe_overrides
from landscape.core.errors import LandscapeError
from landscape.figures import plot_kinds
from landscape.figures.recipe import figure as figure_recipe

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
FIGURE_RECIPES = sorted((ROOT / "figures").glob("*.toml"))

# Every figure recipe, shrunk to seconds: the same runs, plots and passes on 4 clients and 2 rounds.
TINY_TRAIN = ["train.rounds=2", "partition.clients=4", "train.local_steps=2", "train.checkpoint_every=1",
              "train.batch_size=16", "analyze.analysis_samples=64"]
TINY_PASSES = {
    "surface": ["surface.grid=3"],
    "hessian": ["hessian.top_k=2", "hessian.trace_hvps=6", "hessian.density_runs=1", "hessian.density_steps=5",
                "hessian.clients=-1"],
    "sharpness": ["sharpness.steps=1", "sharpness.clients=2"],
    "incompatibility": ["incompatibility.clients=2", "incompatibility.batches=2"],
    "alignment": ["alignment.batches=2"],
    "loss": ["loss.clients=2"],
    "flatness": [],
}


def tiny_sets(fig: figure_recipe.FigureRecipe) -> list[str]:
    """TINY_TRAIN and the tiny options of the figure's passes; rounds a recipe names (10,20,30) become the tiny
    runs' two."""
    texts = TINY_TRAIN + [s for name in fig.pass_rounds for s in TINY_PASSES[name]]
    texts += [f"{name}.rounds=1,2" for name, rounds in fig.pass_rounds.items() if rounds not in ("last", "all")]
    return [arg for text in texts for arg in ("--set", text)]


def write(tmp_path: Path, text: str, name: str = "fig.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


BASE = """
name = "tiny"
[[runs]]
id = "a"
label = "FedAvg"
set = { "algorithm.name" = "fedavg" }
[[runs]]
id = "b"
label = "FedSAM"
set = { "algorithm.name" = "fedsam" }
digits = { "algorithm.fedsam.rho" = 0.02 }
paper = { "algorithm.fedsam.rho" = 0.2 }
[[plots]]
kind = "accuracy"
[digits.train]
set = { "partition.clients" = 4, "train.rounds" = 2, "train.local_steps" = 2 }
[paper.train]
set = { "partition.clients" = 8, "train.rounds" = 3 }
"""


# -- the recipes of figures/ -----------------------------------------------------------------------------


def test_the_paper_figures_are_there():
    names = {p.stem for p in FIGURE_RECIPES}
    assert names == {"fednsam-fig1-surfaces", "fednsam-fig2-flatness", "fedsam-hessian", "fedvssam-incompatibility",
                     "alignment", "accuracy", "fedvssam-heterogeneity", "global-guidance-flatness", "demo"}


@pytest.mark.parametrize("path", FIGURE_RECIPES, ids=lambda p: p.stem)
@pytest.mark.parametrize("scale", ["digits", "paper"])
def test_every_figure_recipe_builds_its_runs_at_both_scales(path, scale):
    if scale not in tomllib.loads(path.read_text()) and scale != "digits":  # the demo: digits only
        with pytest.raises(LandscapeError, match=rf"^{re.escape(str(path))}: no \[{scale}\] table: this figure "
                                                 "is drawn at digits scale only$"):
            figure_recipe.load_figure_recipe(path, scale)
        return
    fig = figure_recipe.load_figure_recipe(path, scale)
    assert fig.scale == scale and fig.name == path.stem
    built = [recipe_overrides.build(fig.train_recipe, fig.overrides(run)) for run in fig.runs]
    datasets = {r.dataset.name for r in built}
    assert len(datasets) == 1 and datasets <= ({"digits"} if scale == "digits" else {"cifar10", "cifar100"})
    if scale == "paper":
        assert all(r.model.name in ("resnet18", "lenet5") for r in built)
    for run, recipe in zip(fig.runs, built):  # each run's own keys reach its recipe
        assert recipe.algorithm.name == run.set["algorithm.name"]


# the demo's recipe is drawn through `landscape demo` by tests/cli/test_cli.py::test_demo_and_report, which checks
# its files as below: drawing it here too would train and analyse its runs a second time
@pytest.mark.slow  # each shipped figure recipe trained and drawn
@pytest.mark.parametrize("path", [p for p in FIGURE_RECIPES if p.stem != "demo"], ids=lambda p: p.stem)
def test_every_figure_recipe_renders(path, tmp_path):
    fig = figure_recipe.load_figure_recipe(path)
    result = invoke("figures", path, "--out", tmp_path, "--quiet", "--device", "cpu", *tiny_sets(fig))
    assert result.exit_code == 0, result.output
    for plot in fig.plots:
        for suffix in (".png", ".pdf"):
            assert (tmp_path / f"{plot.file}{suffix}").stat().st_size > 5000, plot.file
        caption = (tmp_path / f"{plot.file}.caption.txt").read_text()  # what the plain titles leave out
        assert all(f"({r.id}" in caption for r in fig.runs if plot.runs is None or r.id in plot.runs), caption
        html = tmp_path / f"{plot.file}.html"
        # one interactive page per view: the contour and 3D plots of the same surfaces share the first one's
        assert html.is_file() == (plot is next((p for p in fig.plots if p.kind in ("surfaces", "surfaces-3d")),
                                              None))
        if html.is_file():
            assert "Plotly.newPlot" in html.read_text() and "<script src=\"http" not in html.read_text()
    assert sorted(p.name for p in (tmp_path / "runs").iterdir() if p.is_dir()) == sorted(r.id for r in fig.runs)


def test_a_scale_without_its_table_is_refused_unless_it_is_the_recipes_own(tmp_path):
    digits_only = write(tmp_path, BASE.split("[paper.train]")[0], "digits-only.toml")
    assert figure_recipe.load_figure_recipe(digits_only).scale == "digits"
    with pytest.raises(LandscapeError, match=r"digits-only.toml: no \[paper\] table: this figure is drawn at digits "
                                             r"scale only$"):
        figure_recipe.load_figure_recipe(digits_only, "paper")
    result = invoke("figures", digits_only, "--scale", "paper", "--dry-run")
    assert result.exit_code == 1 and result.output.count("\n") == 1 and "no [paper] table" in result.output
    own = write(tmp_path, 'scale = "paper"\n' + BASE.split("[digits.train]")[0], "paper-only.toml")
    assert figure_recipe.load_figure_recipe(own).scale == "paper"  # its own scale needs no table


# -- make-like: reuse, resume, retrain -------------------------------------------------------------------


def test_figures_trains_and_analyses_only_what_is_missing(tmp_path):
    path = write(tmp_path, BASE.replace('kind = "accuracy"', 'kind = "surfaces"') + '[analyze.surface]\ngrid = "3"\n')
    out = tmp_path / "out"
    first = invoke("figures", path, "--out", out)  # not --quiet: the lines "train <run>: new|done|..." are progress
    assert first.exit_code == 0, first.output
    assert first.output.count(": new") == 2
    surface = result_file(out / "runs" / "b" / "analysis" / "round-0002", "surface")
    stamp = surface.stat().st_mtime_ns
    png = out / "tiny.png"
    again = invoke("figures", path, "--out", out)
    assert again.exit_code == 0 and again.output.count(": done") == 2
    assert surface.stat().st_mtime_ns == stamp and png.is_file()  # analysis reused, figure drawn again
    # a longer run continues from its checkpoint; another learning rate retrains only the runs it changes
    longer = invoke("figures", path, "--out", out, "--set", "train.rounds=3")
    assert longer.exit_code == 0 and longer.output.count(": resume") == 2
    assert (out / "runs" / "a" / "checkpoints" / "round-0003.pt").is_file()
    changed = path.read_text().replace('"algorithm.fedsam.rho" = 0.02', '"algorithm.fedsam.rho" = 0.03')
    write(tmp_path, changed)
    retrain = invoke("figures", path, "--out", out)
    assert retrain.exit_code == 0, retrain.output
    assert "train " + str(out / "runs" / "a") + ": replace" in retrain.output  # rounds 3 -> 2: not the recipe
    assert "train " + str(out / "runs" / "b") + ": replace" in retrain.output


def test_figures_runs_option_draws_existing_runs(tmp_path):
    path = write(tmp_path, BASE)
    assert invoke("figures", path, "--out", tmp_path / "out", "--quiet").exit_code == 0
    result = invoke("figures", ROOT / "figures" / "accuracy.toml", "--runs", tmp_path / "out" / "runs",
                    "--out", tmp_path / "mine", "--quiet")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "mine" / "accuracy.png").stat().st_size > 5000
    assert not (tmp_path / "mine" / "runs").exists()  # nothing trained
    dry = invoke("figures", ROOT / "figures" / "accuracy.toml", "--runs", tmp_path / "out" / "runs", "--out",
                 tmp_path / "dry", "--dry-run")
    assert dry.exit_code == 0 and "over 2 given run(s)" in dry.output and not (tmp_path / "dry").exists()
    bad = invoke("figures", ROOT / "figures" / "accuracy.toml", "--runs", tmp_path / "out" / "runs", "--set",
                 "train.rounds=3")
    assert bad.exit_code == 1 and "with --runs nothing is trained" in bad.output


def test_dry_run_and_scale_switch(tmp_path):
    path = write(tmp_path, BASE)
    result = invoke("figures", path, "--dry-run", "--out", tmp_path / "out")
    assert result.exit_code == 0 and "digits scale" in result.output and "2 rounds" in result.output
    assert not (tmp_path / "out").exists()
    paper = figure_recipe.load_figure_recipe(path, "paper")
    assert paper.train_set == {"partition.clients": 8, "train.rounds": 3}
    assert paper.run("b").set == {"algorithm.name": "fedsam", "algorithm.fedsam.rho": 0.2}
    assert figure_recipe.load_figure_recipe(path).run("b").set["algorithm.fedsam.rho"] == 0.02
    result = invoke("figures", path, "--dry-run", "--scale", "paper")
    assert result.exit_code == 0 and "paper scale" in result.output and "runs/figures/tiny-paper" in result.output


@pytest.mark.parametrize("change, message", [
    (("", "colour = 1\n"), "unknown figure recipe key 'colour'; allowed top-level: name, title, seeds, train, "),
    (('kind = "accuracy"', 'kind = "pie"'), "kind must be one of accuracy, alignment"),
    (('kind = "accuracy"', 'kind = "accuracy"\nruns = ["z"]'), "names unknown run(s) z"),
    (('id = "b"', 'id = "a"'), "run ids must be unique"),
    (('id = "b"', 'id = "../b"'), "must be letters, digits"),
    (('kind = "accuracy"', 'kind = "metric"'), "fig.toml: plots[0].key is required"),
    (('kind = "accuracy"', 'kind = "accuracy"\nrho = 0.1'),
     "unknown accuracy plot key 'plots[0].rho'; allowed in [plots[0]]: kind, file, runs, title"),
    (('kind = "accuracy"', 'kind = "surfaces"\nquantity = "acc"'),
     "plots[0].quantity must be one of loss, accuracy (got 'acc')"),
    (('kind = "accuracy"', 'kind = "accuracy"\nfile = "a/b"'), "plots[0].file must be letters, digits"),
    (('label = "FedAvg"', 'label = 3'), "runs[0].label must be a string (got 3)"),
    (("", 'scale = "huge"\n'), "scale must be one of digits, paper"),
    (("", '[train]\nrecipe = "nope.toml"\n'), "train.recipe 'nope.toml' not found"),
    (("", "[analyze]\nsplit = 3\n"), "analyze.split must be one of train, test (got 3)"),
    (("", "[analyze]\nwhatever = 3\n"), "unknown analysis setting 'analyze.whatever'; allowed in [analyze]: split"),
    (("", "[paper.trian]\nrecipe = 1\n"), "unknown figure recipe key 'paper.trian'; allowed in [paper]: name, "
                                          "title, seeds, train, runs, analyze, plots; did you mean 'paper.train'?"),
    (("", "[train]\nrecipe = 3\n"), "fig.toml: train.recipe must be a string (got 3)"),
])
def test_bad_figure_recipes_are_named(tmp_path, change, message):
    old, new = change
    if old:
        text = BASE.replace(old, new, 1)
    else:  # a top-level key goes before the tables, a table after them
        text = BASE + new if new.startswith("[") else new + BASE
    result = invoke("figures", write(tmp_path, text), "--dry-run")
    assert result.exit_code == 1
    assert result.output.startswith("error: ") and message in result.output, result.output
    assert "Traceback" not in result.output


def test_bad_figure_options_are_named(tmp_path):
    path = write(tmp_path, BASE)
    result = invoke("figures", path, "--set", "hessian.top_k=3", "--dry-run")
    assert result.exit_code == 1 and "this figure runs no hessian pass" in result.output
    result = invoke("figures", path, "--set", "analyze.colour=1", "--dry-run")
    assert result.exit_code == 1 and ("--set analyze.colour: unknown analysis setting 'analyze.colour'; allowed in "
                                      "[analyze]: split, ") in result.output
    result = invoke("figures", tmp_path / "missing.toml")
    assert result.exit_code == 1 and "recipe file not found" in result.output
    with pytest.raises(LandscapeError, match="must be last, all"):
        figure_recipe.load_figure_recipe(write(tmp_path, BASE + "[analyze.loss]\nrounds = \"some\"\n"))


# -- the plot kinds: one registry entry each, with its options and the passes it reads ------------------------


def _smallest_table(kind: plot_kinds.PlotKind) -> dict:
    """The smallest [[plots]] table of a kind: its kind, and the first choice of every option it requires."""
    import dataclasses

    from landscape.core.schema import choices

    required = [f.name for f in dataclasses.fields(kind.options)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING and f.name != "kind"]
    table = {"kind": kind.name}
    for name in required:
        assert choices(kind.options, name), f"{kind.name}.{name}: a required option the contract cannot fill"
        table[name] = choices(kind.options, name)[0]
    return table


@pytest.mark.parametrize("name", sorted(plot_kinds.PLOT_KINDS))
def test_every_plot_kind_declares_its_options_and_the_passes_it_reads(name, tmp_path):
    from landscape.analyze.catalog import load_passes

    kind = plot_kinds.PLOT_KINDS.get(name)
    assert kind.name == name and kind.summary and callable(kind.factory)
    assert issubclass(kind.options, plot_kinds.PlotTable)
    assert set(kind.passes) <= set(load_passes().names()), kind.passes  # passes that exist
    assert set(kind.passes.values()) <= {"last", "all"}
    raw = tomllib.loads(BASE)
    raw["plots"] = [_smallest_table(kind)]
    fig = figure_recipe.parse_figure_recipe(raw, tmp_path / "fig.toml")
    (plot,) = fig.plots
    assert isinstance(plot.options, kind.options) and plot.runs == ("a", "b") and plot.file == "tiny"
    assert set(kind.passes) <= set(fig.pass_rounds)  # the figure analyses what its plot reads
    raw["plots"] = [{**_smallest_table(kind), "colour": "red"}]  # an option no kind has: one line naming it
    with pytest.raises(LandscapeError) as e:
        figure_recipe.parse_figure_recipe(raw, tmp_path / "fig.toml")
    message = str(e.value)
    assert "\n" not in message and message.startswith(f"{tmp_path / 'fig.toml'}: unknown {name} plot key "
                                                        "'plots[0].colour'; allowed in [plots[0]]: kind, file, runs")


def test_a_plot_kind_is_registered_once():
    with pytest.raises(ValueError, match="declared twice"):
        plot_kinds.plot_kind("accuracy", "again")(lambda runs, plot, surface: None)


# -- --set: one grammar for every command, each refusing the kinds it does not take -------------------------


def test_a_set_key_is_classified_by_its_first_part():
    passes = ["hessian", "surface"]
    kinds = {key: recipe_overrides.classify_assignment(key, passes) for key in (
        "train.lr", "dataset.name", "partition.alpha", "model.name", "algorithm.fedsam.rho", "seed", "name",
        "analyze.split", "hessian.top_k", "surface.rounds", "colour.x")}
    assert kinds == {"train.lr": recipe_overrides.RECIPE_KEY, "dataset.name": recipe_overrides.RECIPE_KEY,
                     "partition.alpha": recipe_overrides.RECIPE_KEY, "model.name": recipe_overrides.RECIPE_KEY,
                     "algorithm.fedsam.rho": recipe_overrides.RECIPE_KEY, "seed": recipe_overrides.RECIPE_KEY,
                     "name": recipe_overrides.RECIPE_KEY, "analyze.split": recipe_overrides.ANALYSIS_SETTING,
                     "hessian.top_k": recipe_overrides.PASS_OPTION, "surface.rounds": recipe_overrides.PASS_OPTION,
                     "colour.x": None}
    # the pass names are asked for only when the key names no recipe table or key and is not analyze.<setting>
    asked = []
    assert recipe_overrides.classify_assignment("train.lr", lambda: asked.append(1) or passes) == "a training recipe key"
    assert asked == []
    # a command that takes training recipe keys reads an unknown first part as one (the recipe names its keys)
    assert recipe_overrides.classify_assignment("colour.x", passes, "figures") == recipe_overrides.RECIPE_KEY


ELSEWHERE = "landscape analyze, landscape figures, landscape claims or landscape demo"


@pytest.mark.parametrize("args, message", [
    (["train", "--set", "hessian.top_k=10", "--dry-run"],
     f"--set hessian.top_k is a pass option: give it to {ELSEWHERE}"),
    (["train", "--set", "analyze.analysis_samples=500", "--dry-run"],
     f"--set analyze.analysis_samples is an analysis setting: give it to {ELSEWHERE}"),
    (["analyze", "no-run", "--set", "train.rounds=10", "--dry-run"],
     "--set train.rounds is a training recipe key: give it to landscape train, landscape figures, landscape "
     "claims or landscape demo"),
    (["analyze", "no-run", "--set", "seed=3", "--dry-run"], "--set seed is a training recipe key: give it to "),
    (["analyze", "no-run", "--set", "hesian.top_k=3", "--dry-run"],
     "--set hesian.top_k: 'hesian' is neither analyze (analyze.<setting>) nor a pass (alignment, "),
    (["analyze", "no-run", "--set", "analyze.colour=1", "--dry-run"],
     "unknown analysis setting 'analyze.colour'; allowed in [analyze]: split, analysis_samples, "),
    (["analyze", "no-run", "--set", "hessian.top_k=3", "--passes", "loss", "--dry-run"],
     "--set takes PASS.KEY=VALUE for a chosen pass (loss); got 'hessian.top_k'"),
])
def test_each_command_refuses_the_set_keys_it_does_not_take(args, message):
    result = invoke(*args)
    assert result.exit_code == 1 and "Traceback" not in result.output
    (line,) = result.output.strip().splitlines()
    assert line.startswith("error: ") and message in line, line


def test_analyze_takes_an_analysis_setting_with_set(tmp_path):
    from landscape.train.loop import start_run

    run = tmp_path / "run"
    start_run(recipe_overrides.build(None, [("partition.clients", 4), ("train.rounds", 1), ("train.local_steps", 1),
                                            ("model.name", "mlp")]), run, progress=False)
    result = invoke("analyze", run, "--passes", "loss", "--split", "train", "--set", "analyze.split=test",
                    "--set", "analyze.analysis_samples=32", "--quiet")
    assert result.exit_code == 0, result.output
    (found,) = (run / "analysis" / "round-0001").glob("loss*.json")
    recorded = json.loads(found.read_text())["settings"]["analysis"]
    assert recorded["split"] == "test" and recorded["analysis_samples"] == 32  # --set over the flags
    bad = invoke("analyze", run, "--passes", "loss", "--set", "analyze.split=tset", "--dry-run")
    assert bad.exit_code == 1 and "split must be one of train, test" in bad.output


# -- compare ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def analysed(tmp_path_factory):
    """Two tiny runs with every pass the comparison reads, and surfaces."""
    tmp = tmp_path_factory.mktemp("compare")
    fig = tmp / "fig.toml"
    fig.write_text(BASE + """
[[plots]]
kind = "surfaces"
file = "s"
[[plots]]
kind = "hessian"
file = "h"
[[plots]]
kind = "incompatibility"
file = "i"
[[plots]]
kind = "alignment"
file = "al"
[[plots]]
kind = "flatness-sharpness"
file = "fs"
[analyze.surface]
grid = "5"
""")
    fig_recipe = figure_recipe.load_figure_recipe(fig)
    result = invoke("figures", fig, "--out", tmp / "out", "--quiet", *tiny_sets(fig_recipe))
    assert result.exit_code == 0, result.output
    return tmp / "out" / "runs"


def test_compare_table_and_surfaces(analysed, tmp_path):
    result = invoke("compare", analysed / "a", analysed / "b", "--out", tmp_path)
    assert result.exit_code == 0, result.output
    header = result.output.splitlines()[0].split()
    for column in ("lambda_max", "trace", "S_rho(0.05)", "Delta_D", "Delta_FI", "acc"):
        assert column in header
    with open(tmp_path / "compare.csv") as f:
        rows = list(csv.reader(f))
    assert rows[0][:4] == ["run", "directory", "rounds", "test acc (%) mean"]
    by_name = {row[1]: dict(zip(rows[0], row)) for row in rows[1:]}
    # the display text is the printed table's: compare.csv holds numbers (the names aside), empty where none
    for row in rows[1:]:
        assert [float(cell) for cell in row[2:] if cell]  # "0.85 (online, round 3)" or "-" would not read
    for name in ("a", "b"):
        hessian_json = result_file(analysed / name / "analysis" / "round-0002", "hessian")
        hessian = json.loads(hessian_json.read_text())
        lam = np.atleast_1d(np.load(hessian_json.with_suffix(".npz"))["top.values"])[0] \
            if "top.values" in hessian.get("arrays", []) else hessian["result"]["top"]["values"][0]
        assert f" {lam:.4g} " in result.output  # the printed cell, 4 digits
        assert float(by_name[name]["lambda_max mean"]) == lam and by_name[name]["lambda_max n"] == "1"  # in full
        metrics = [json.loads(line) for line in (analysed / name / "metrics.jsonl").read_text().splitlines()]
        acc = [m["test_acc"] for m in metrics if "test_acc" in m][-1]
        assert f" {100 * acc:.4g} " in result.output
        assert float(by_name[name]["test acc (%) mean"]) == 100 * acc
        alignment = json.loads(result_file(analysed / name / "analysis" / "round-0002", "alignment").read_text())
        assert float(by_name[name]["mean grad cos mean"]) == alignment["result"]["gradients"]["mean_off_diagonal"]
    for stem in ("surfaces", "surfaces-3d"):
        assert (tmp_path / f"{stem}.png").stat().st_size > 5000 and (tmp_path / f"{stem}.pdf").is_file()
        caption = (tmp_path / f"{stem}.caption.txt").read_text()  # the settings the titles no longer carry
        assert "surface read with analysis_samples=" in caption and "grid=" in caption
        assert f"{tmp_path / stem}.caption.txt" in result.output  # named with what compare wrote
    assert "Plotly.newPlot" in (tmp_path / "surfaces.html").read_text()


def test_every_figure_written_has_its_pdf_and_its_caption(analysed):
    """``landscape figures`` over every plot kind (the ``analysed`` fixture drew them): each PNG has a PDF and
    a caption file beside it, and the caption names the runs and the rounds."""
    out = analysed.parent
    pngs = sorted(out.glob("*.png"))
    assert [p.stem for p in pngs] == ["al", "fs", "h", "i", "s", "tiny"]
    for png in pngs:
        assert png.with_suffix(".pdf").read_bytes()[:5] == b"%PDF-", png
        caption = (out / f"{png.stem}.caption.txt").read_text()
        assert "Runs: " in caption and "(a)" in caption and "(b)" in caption and "round" in caption.lower(), png


def test_compare_names_what_is_missing(analysed, tmp_path):
    bare = tmp_path / "bare"
    recipe = recipe_overrides.build(None, [("partition.clients", 4), ("train.rounds", 1),
                                           ("train.local_steps", 1)])
    from landscape.train.loop import start_run

    start_run(recipe, bare, progress=False)
    result = CliRunner().invoke(cli, ["compare", str(analysed / "a"), str(bare), "--out", str(tmp_path / "c")])
    assert result.exit_code == 0, result.output
    assert f"run {bare.name} has no alignment, hessian, incompatibility, sharpness analysis" in result.output
    assert f"landscape analyze {bare} --passes alignment,hessian,incompatibility,sharpness" in result.output
    assert f"run {bare.name} has no surface analysis" in result.output
    # what the table prints as "-" and "(online, round 1)" is in compare.csv an empty cell and its own columns
    with open(tmp_path / "c" / "compare.csv") as f:
        header, *rows = list(csv.reader(f))
    row = next(dict(zip(header, r)) for r in rows if r[1] == bare.name)
    assert (row["lambda_max mean"], row["lambda_max se"], row["lambda_max n"], row["lambda_max round"]) == (
        "", "", "0", "")
    logged = [json.loads(line) for line in (bare / "metrics.jsonl").read_text().splitlines()][-1]
    assert float(row["Delta_D mean"]) == logged["flatness_distance"] and row["Delta_D online"] == "1"
    assert row["Delta_D round"] == row["rounds"] == "1" and "(online, round 1)" in result.output
    analysed_row = next(dict(zip(header, r)) for r in rows if r[1] == "a")
    flatness_ran = bool(list((analysed / "a" / "analysis").glob("round-*/flatness*.json")))
    assert analysed_row["Delta_D online"] == ("0" if flatness_ran else "1")
    one = invoke("compare", analysed / "a")
    assert one.exit_code == 1 and "at least two runs" in one.output


def test_hessian_options_refuse_a_trace_budget_hutchpp_cannot_use():
    from landscape.analyze.catalog import pass_options

    with pytest.raises(LandscapeError, match=r"hessian.trace_hvps must be >= 6 \(Hutch\+\+\)"):
        pass_options("hessian", {"trace_hvps": 5})
    assert pass_options("hessian", {"trace_hvps": 6}).trace_hvps == 6


def test_figures_never_replaces_a_run_it_did_not_make(tmp_path):
    path = write(tmp_path, BASE)
    foreign = tmp_path / "out" / "runs" / "a"
    recipe = recipe_overrides.build(None, [("partition.clients", 4), ("train.rounds", 1),
                                           ("train.local_steps", 1)])
    from landscape.train.loop import start_run

    start_run(recipe, foreign, progress=False)
    before = sorted(p.relative_to(foreign) for p in foreign.rglob("*"))
    result = invoke("figures", path, "--out", tmp_path / "out", "--quiet")
    assert result.exit_code == 1
    assert f"{foreign} holds a run this command did not make" in result.output
    assert sorted(p.relative_to(foreign) for p in foreign.rglob("*")) == before
    # the figure's own runs are retrained when their recipe changes (the folder is marked as theirs)
    assert invoke("figures", path, "--out", tmp_path / "own", "--quiet").exit_code == 0
    assert (tmp_path / "own" / "runs" / ".landscape-owned").is_file()
    changed = invoke("figures", path, "--out", tmp_path / "own", "--set", "train.lr=0.05")  # progress lines on
    retrained = [line for line in changed.output.splitlines() if line.startswith("train ") and line.endswith(": replace")]
    assert changed.exit_code == 0 and len(retrained) == 2, changed.output


# -- fuzzing: any figure recipe is read, or refused in one line ---------------------------------------------

LEAF = st.one_of(st.booleans(), st.integers(-3, 50), st.floats(allow_nan=True), st.text(max_size=8),
                 st.sampled_from(["fedsam", "surfaces", "hessian", "metric", "last", "all", "1,2", "digits", "paper",
                                  "algorithm.name", "a", "random", "pca"]))
VALUE = st.recursive(LEAF, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
    st.sampled_from(["id", "label", "set", "kind", "file", "runs", "rounds", "grid", "directions", "key", "recipe",
                     "surface", "hessian", "split", "digits", "paper", "x"]), inner, max_size=3), max_leaves=8)
RUN = st.fixed_dictionaries({"id": st.sampled_from(["a", "b", "../c", ""]) | LEAF},
                            optional={"label": VALUE, "set": st.dictionaries(
                                st.sampled_from(["algorithm.name", "train.rounds", "x"]), LEAF, max_size=2),
                                "digits": VALUE, "paper": VALUE})
PLOT = st.fixed_dictionaries({"kind": st.sampled_from(list(plot_kinds.PLOT_KINDS)) | LEAF},
                             optional={"file": VALUE, "runs": st.lists(st.sampled_from(["a", "b", "z"]), max_size=3)
                                       | VALUE, "rho": VALUE, "key": VALUE, "log": VALUE, "title": VALUE})
FIGURE = st.fixed_dictionaries({}, optional={
    "name": VALUE, "title": VALUE, "scale": VALUE, "train": VALUE, "analyze": VALUE, "digits": VALUE,
    "paper": VALUE, "runs": st.lists(RUN, max_size=3) | VALUE, "plots": st.lists(PLOT, max_size=3) | VALUE,
}) | st.dictionaries(st.text(max_size=6), VALUE, max_size=3)


@settings(max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=FIGURE, scale=st.sampled_from([None, "digits", "paper"]))
def test_fuzz_figure_recipes_are_read_or_refused_in_one_line(tmp_path_factory, raw, scale):
    where = tmp_path_factory.getbasetemp() / "fuzz.toml"
    try:
        fig = figure_recipe.parse_figure_recipe(raw, where, scale)
    except LandscapeError as e:
        assert str(e) and "\n" not in str(e)
        return
    assert fig.runs and fig.plots and all(set(p.runs) <= {r.id for r in fig.runs} for p in fig.plots)


def test_a_figure_recipe_is_frozen_and_its_changes_are_copies():
    fig = figure_recipe.load_figure_recipe(ROOT / "figures" / "fedsam-hessian.toml")
    changed = fig.with_sets(["hessian.top_k=2", "analyze.analysis_samples=32", "train.rounds=4",
                             "hessian.rounds=all"], "figures")
    assert changed.pass_options["hessian"]["top_k"] == 2 and changed.settings["analysis_samples"] == 32
    assert changed.forced == {"train.rounds": 4} and str(changed.pass_rounds["hessian"]) != str(
        fig.pass_rounds["hessian"])
    # the recipe read is as it was
    assert fig.pass_options["hessian"]["top_k"] == 5 and fig.settings["analysis_samples"] == 1000
    assert fig.forced == {} and fig.with_seeds([1, 2]).seeds == [1, 2] and fig.seeds != [1, 2]
    with pytest.raises(AttributeError):  # dataclasses.FrozenInstanceError
        fig.runs = []
    first = fig.runs[0].id
    assert [spec.id for spec in fig.only(runs=[first]).runs] == [first] and len(fig.runs) > 1
    assert list(fig.only(passes=[]).pass_rounds) == [] and list(fig.pass_rounds) == ["hessian"]
