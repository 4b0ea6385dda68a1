"""Results addressed by their settings: analyses of one checkpoint with different settings stand side by side,
and figures, compare and report read the ones whose settings match what they draw, and say which."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from support.helpers import tiny_recipe

from landscape.analyze.passes import PASSES, RESULT_NAMES
from landscape.analyze.plan import pass_settings_record
from landscape.analyze.settings import READ_BY_DECLARATION, AnalysisSettings
from landscape.cli import cli
from landscape.core.errors import LandscapeError
from landscape.core.rounds import LAST, LISTED, Rounds
from landscape.figures import extract, labels, rundata
from landscape.figures.compare import compare
from landscape.figures.report.build import build_report
from landscape.store.results.files import stored_results
from landscape.store.results.names import NAME_KEY_LIMIT, settings_record, value_text
from landscape.store.results.selection import Selection
from landscape.train import loop

result_name, settings_diff = RESULT_NAMES.result_name, RESULT_NAMES.settings_diff

SHARP = ["--set", "sharpness.rhos=[0.05]", "--set", "sharpness.steps=1", "--set", "sharpness.adaptive=false",
         "--set", "sharpness.clients=2", "--analysis-samples", "64"]
TRAIN_NAME = "sharpness@adaptive-false_analysis_samples-64_clients-2_rhos-0.05_steps-1"
TEST_NAME = "sharpness@adaptive-false_analysis_samples-64_clients-2_rhos-0.05_split-test_steps-1"


def pass_options(name: str, values: dict):
    return PASSES.get(name).make_options(values)


def analyze(*args):
    return CliRunner().invoke(cli, ["analyze", *map(str, args), "--quiet", "--device", "cpu"])


def name_of(pass_name: str, analysis: AnalysisSettings | None = None, **options) -> str:
    return result_name(pass_name, settings_record(analysis or AnalysisSettings(), pass_options(pass_name, options)))


def results_of(folder: Path, pass_name: str) -> dict[str, dict]:
    """file stem -> record of every result of ``pass_name`` in a round folder."""
    return {path.stem: record for path, record in stored_results(folder) if record["pass"] == pass_name}


# -- the naming rule -----------------------------------------------------------------------------------------


def test_names_are_the_output_at_the_defaults_and_name_the_settings_otherwise():
    assert name_of("sharpness") == "sharpness"
    assert name_of("sharpness", AnalysisSettings(device="cpu")) == "sharpness"  # the device changes no number
    assert name_of("sharpness", AnalysisSettings(split="test")) == "sharpness@split-test"
    assert name_of("surface") == "surface"
    assert name_of("surface", data="client:3", grid="9") == "surface@data-client~3_grid-9"
    assert name_of("surface", directions="pca") == "surface-pca"  # the output name says the directions
    assert name_of("surface", directions="pca", grid=9) == "surface-pca@grid-9"
    assert name_of("surface", grid="21", save_every=5, cells_per_batch=4) == "surface@grid-21"
    assert name_of("sharpness", AnalysisSettings(analysis_samples=100), rhos=[0.05]) == \
        "sharpness@analysis_samples-100_rhos-0.05"
    # an option named like an analysis setting keeps its pass
    assert name_of("incompatibility", AnalysisSettings(batch_size=64), batch_size=32) == \
        "incompatibility@batch_size-64_incompatibility.batch_size-32"
    # long keys and characters outside a-z0-9.,:- are cut and end in a hash of the settings
    long = name_of("hessian", AnalysisSettings(analysis_samples=100), top_k=2, tol=0.01, clients=2, trace_hvps=6,
                   density_steps=4, density_runs=1)
    assert re.fullmatch(r"hessian@analysis_samples-100_[a-z0-9_.,-]+\+[0-9a-f]{12}", long)
    assert len(long) <= len("hessian@") + NAME_KEY_LIMIT
    odd = name_of("surface", directions="interpolate", target="/tmp/My Run/round-0003.pt")
    assert re.fullmatch(r"surface-interpolate@target--tmp-my-run-round-0003\.pt\+[0-9a-f]{12}", odd)


SAFE = re.compile(r"[a-z0-9@._,~+-]+")
VALUES = st.one_of(st.text(max_size=24), st.integers(-10**6, 10**6), st.booleans(),
                   st.floats(allow_nan=False, allow_infinity=False, width=32),
                   st.lists(st.floats(0, 1, width=32) | st.integers(0, 9), max_size=4))
ANALYSIS = st.fixed_dictionaries({}, optional={
    "split": st.sampled_from(["train", "test"]) | st.text(max_size=12), "analysis_samples": st.integers(0, 10**5),
    "bn_mode": st.sampled_from(["eval", "recompute"]), "dtype": st.sampled_from(["float32", "float64"]),
    "seed": st.integers(0, 10**9), "batch_size": st.integers(1, 4096), "device": st.text(max_size=8)})
OPTIONS = st.dictionaries(st.sampled_from(["data", "grid", "span", "target", "clients", "directions", "rhos",
                                           "steps", "top_k", "Odd Key", "x_y", "käse"]), VALUES, max_size=5)


@settings(max_examples=150, deadline=None, database=None)
@given(st.lists(st.tuples(st.sampled_from(["sharpness", "surface", "hessian", "flatness"]), ANALYSIS, OPTIONS),
                min_size=2, max_size=6))
def test_names_are_safe_bounded_and_never_shared_by_different_settings(cases):
    seen: dict[str, tuple] = {}
    for pass_name, analysis, options in cases:
        record = {"analysis": {**AnalysisSettings().record(), **analysis}, "pass": options}
        name = result_name(pass_name, record)
        output, _, key = name.partition("@")
        assert SAFE.fullmatch(name), name  # no / \ : * ? " < > | or spaces, one case: Linux, macOS, Windows
        assert len(key) <= NAME_KEY_LIMIT, name
        assert output.startswith(pass_name)
        diff = settings_diff(pass_name, record)
        identity = (output, tuple(sorted((k, value_text(v)) for k, v in diff.items())))
        assert (not key) == (not diff)
        assert seen.setdefault(name, identity) == identity, (name, seen[name], identity)


def test_a_setting_a_pass_does_not_read_neither_names_its_results_nor_sets_them_apart():
    """--backend and --hvp change the passes that declare them (``PassSpec.reads``) alone: every other pass
    records them at their defaults, so its results keep their names and are found done whatever they are."""
    other = AnalysisSettings(backend="pyhessian", hvp="forward-over-reverse")
    readers = []
    for name in PASSES.names():
        spec = PASSES.get(name)
        assert spec.reads <= READ_BY_DECLARATION
        options = spec.make_options({})
        mine, default = pass_settings_record(name, options, other), pass_settings_record(name, options,
                                                                                         AnalysisSettings())
        assert default == settings_record(AnalysisSettings(), options)  # at the defaults: the record as before
        if spec.reads:
            readers.append(name)
            assert {"backend-pyhessian", "hvp-forward-over-reverse"} <= set(result_name(name, mine)
                                                                            .split("@")[1].split("_"))
            assert not RESULT_NAMES.same_settings(name, mine, default)
        else:
            assert mine == default and result_name(name, mine) == result_name(name, default)
            assert mine["analysis"]["backend"] == "native" and mine["analysis"]["hvp"] == "auto"
    assert readers  # the hessian pass reads them
    with pytest.raises(ValueError, match="only backend, hvp are declared per pass"):
        AnalysisSettings().read_by(frozenset({"split"}))


# -- analyses of one checkpoint with different settings ----------------------------------------------------------


@pytest.fixture(scope="module")
def analysed(tmp_path_factory) -> Path:
    """Two tiny runs, each analysed with sharpness on the training and the test split (rounds 2 and 3) and with
    a global 5 x 5 and a client-1 3 x 3 surface (round 3)."""
    root = tmp_path_factory.mktemp("settings")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for algorithm in ("fedavg", "fedsam"):
            recipe = tiny_recipe(train__keep_clients=True, algorithm__name=algorithm, model__name="mlp",
                                 model__hidden=[16])
            loop.start_run(recipe, root / "runs" / algorithm, progress=False)
        for split in ("train", "test"):
            result = analyze(root / "runs", "--checkpoints", "2,3", "--passes", "sharpness", "--split", split, *SHARP)
            assert result.exit_code == 0, result.output
        for flags in (["--grid", "5"], ["--grid", "3", "--data", "client:1"]):
            result = analyze(root / "runs", "--passes", "surface", "--analysis-samples", "64", *flags)
            assert result.exit_code == 0, result.output
    finally:
        torch.set_num_threads(threads)
    return root / "runs"


@pytest.fixture
def runs(analysed, tmp_path) -> Path:
    shutil.copytree(analysed, tmp_path / "runs")
    return tmp_path / "runs"


def test_both_analyses_stay_on_disk_and_both_are_skipped_on_a_rerun(runs):
    folder = runs / "fedsam" / "analysis" / "round-0003"
    sharp = results_of(folder, "sharpness")
    assert sorted(sharp) == [TEST_NAME, TRAIN_NAME]
    assert {r["settings"]["analysis"]["split"] for r in sharp.values()} == {"train", "test"}
    surfaces = results_of(folder, "surface")
    assert sorted(surfaces) == ["surface@analysis_samples-64_data-client~1_grid-3", "surface@analysis_samples-64_grid-5"]
    assert sorted(tuple(r["result"]["grid"]) for r in surfaces.values()) == [(3, 3), (5, 5)]
    for path in folder.glob("*.json"):
        if json.loads(path.read_text()).get("arrays"):
            assert path.with_suffix(".npz").is_file()
    for split in ("train", "test"):
        again = analyze(runs, "--checkpoints", "2,3", "--passes", "sharpness", "--split", split, *SHARP)
        assert "0 computed, 4 already done" in again.output, again.output
    for flags in (["--grid", "5"], ["--grid", "3", "--data", "client:1"]):
        again = analyze(runs, "--passes", "surface", "--analysis-samples", "64", *flags)
        assert "0 computed, 2 already done" in again.output, again.output


def test_force_recomputes_one_variant_and_touches_no_other(runs):
    folder = runs / "fedavg" / "analysis" / "round-0003"
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    result = analyze(runs / "fedavg", "--passes", "sharpness", "--split", "test", "--force", *SHARP)
    assert "1 computed, 0 already done" in result.output
    assert "split=test" in result.output  # the summary names the settings of what it shows
    after = {p.name: p.read_bytes() for p in folder.iterdir()}
    changed = {name for name in before if before[name] != after[name]}
    assert f"{TEST_NAME}.json" in changed and changed <= {f"{TEST_NAME}.json", f"{TEST_NAME}.npz"}
    assert set(after) == set(before)


def _column(comparison, header: str) -> list[str]:
    i = comparison.header.index(header)
    return [row[i] for row in comparison.rows]


def _sharpness_at(run: Path, round: int, split: str) -> float:
    (record,) = [r for r in results_of(run / "analysis" / f"round-{round:04d}", "sharpness").values()
                 if r["settings"]["analysis"]["split"] == split]
    return record["result"]["global"]["sharpness"][0]


def test_compare_reads_the_defaults_and_says_so_and_reads_others_when_asked(runs, tmp_path):
    default = compare(runs, tmp_path / "a")
    train = [f"{_sharpness_at(runs / name, 3, 'train'):.4g}" for name in ("fedavg", "fedsam")]
    test = [f"{_sharpness_at(runs / name, 3, 'test'):.4g}" for name in ("fedavg", "fedsam")]
    assert train != test
    assert _column(default, "S_rho(0.05)") == train
    assert default.settings[0].startswith("settings: the defaults")
    assert "sharpness read with adaptive=false, analysis_samples=64, clients=2, rhos=0.05, steps=1" in default.settings
    assert "surface read with analysis_samples=64, grid=5" in default.settings  # the global surface, not client 1's
    assert [run.pass_record("surface").value("data") for run in default.runs] == ["global", "global"]

    other = compare(runs, tmp_path / "b", selection=Selection.parse(RESULT_NAMES, ["split=test"]))
    assert _column(other, "S_rho(0.05)") == test
    assert other.settings[0].startswith("settings: split=test")
    assert any("split=test" in line and line.startswith("sharpness read with") for line in other.settings)
    # the surfaces were computed on the training split: none is drawn, and the note says what there is
    assert not any(run.analysed_rounds("surface") for run in other.runs)
    assert any("has no surface analysis (it has surface with analysis_samples=64, data=client:1, grid=3; "
               "analysis_samples=64, grid=5)" in line and "--split test" in line for line in other.missing)

    local = compare(runs, tmp_path / "c", selection=Selection.parse(RESULT_NAMES, ["surface.data=client:1"]))
    assert [run.pass_record("surface").value("data") for run in local.runs] == ["client:1", "client:1"]
    assert "surface read with analysis_samples=64, data=client:1, grid=3" in local.settings
    assert _column(local, "S_rho(0.05)") == train


def test_compare_command_prints_the_settings_and_refuses_unknown_ones(runs, tmp_path):
    result = CliRunner().invoke(cli, ["compare", str(runs), "--out", str(tmp_path / "c"), "--settings", "split=test"])
    assert result.exit_code == 0, result.output
    assert "settings: split=test" in result.output
    for bad, message in ((["--settings", "nope=1"], "--settings nope: unknown setting"),
                         (["--settings", "surface.nope=1"], "surface has no option 'nope'"),
                         (["--settings", "split"], "--settings takes KEY=VALUE"),
                         (["--settings", "device=cpu"], "results are not told apart by device")):
        result = CliRunner().invoke(cli, ["compare", str(runs), "--out", str(tmp_path / "d"), *bad])
        assert result.exit_code == 1 and message in result.output, result.output
        assert len(result.output.strip().splitlines()) == 1


def test_a_curve_over_rounds_never_mixes_settings(runs):
    run = runs / "fedsam"
    loaded = rundata.load_runs(run)[0]
    rounds, values = extract.global_sharpness_series(loaded, 0.05)
    assert rounds.tolist() == [2, 3]
    assert values.tolist() == [_sharpness_at(run, r, "train") for r in (2, 3)]
    rounds, values = extract.global_sharpness_series(rundata.load_runs(run, Selection.parse(RESULT_NAMES, ["split=test"]))[0], 0.05)
    assert values.tolist() == [_sharpness_at(run, r, "test") for r in (2, 3)]

    # Round 3 analysed only on the test split: the training-split curve leaves it out and says so.
    for path, record in stored_results(run / "analysis" / "round-0003"):
        if record["pass"] == "sharpness" and record["settings"]["analysis"]["split"] == "train":
            path.unlink()
    loaded = rundata.load_runs(run)[0]
    rounds, values = extract.global_sharpness_series(loaded, 0.05)
    assert rounds.tolist() == [2] and values.tolist() == [_sharpness_at(run, 2, "train")]
    (note,) = loaded.notes()
    assert "sharpness of round(s) 3 left out" in note and "split=test" in note
    assert f"`landscape analyze {run} --checkpoints 3 --passes sharpness" in note
    # Unpinned settings (steps) that differ between rounds: one of them is read, labelled, never both.
    for path, record in stored_results(run / "analysis" / "round-0002"):
        if record["pass"] == "sharpness" and record["settings"]["analysis"]["split"] == "test":
            record["settings"]["pass"]["steps"] = 3
            path.write_text(json.dumps(record))
    loaded = rundata.load_runs(run, Selection.parse(RESULT_NAMES, ["split=test"]))[0]
    rounds, _ = extract.global_sharpness_series(loaded, 0.05)
    assert rounds.tolist() == [3]  # the settings with steps=1 (fewer off their defaults)
    assert "steps=1" in labels.settings_caption([loaded], "sharpness")
    assert "steps=3" in loaded.notes()[0]


def test_a_figure_recipe_reads_exactly_its_own_settings(runs):
    sharp = pass_options("sharpness", {"rhos": [0.05], "steps": 1, "adaptive": False, "clients": 2})
    wanted = settings_record(AnalysisSettings(split="test", analysis_samples=64, device="cpu"), sharp)
    loaded = rundata.load_runs(runs / "fedavg", Selection(RESULT_NAMES, exact={"sharpness": wanted}))[0]
    assert [rec.settings["analysis"]["split"] for rec in loaded.pass_records("sharpness")] == ["test", "test"]
    assert loaded.shown("sharpness") == "" and labels.settings_caption([loaded], "sharpness") == ""
    other = settings_record(AnalysisSettings(split="test", analysis_samples=32), sharp)
    missing = rundata.load_runs(runs / "fedavg", Selection(RESULT_NAMES, exact={"sharpness": other}))[0]
    with pytest.raises(LandscapeError, match="--analysis-samples 32"):
        missing.pass_records("sharpness")


def test_an_old_style_file_is_read_by_the_settings_it_records(runs):
    run = runs / "fedavg"
    folder = run / "analysis" / "round-0003"
    test_name, train_name = TEST_NAME, TRAIN_NAME
    # As written before results were named by their settings: the test-split result under the pass's name.
    (folder / f"{train_name}.json").unlink()
    (folder / f"{train_name}.npz").unlink(missing_ok=True)
    (folder / f"{test_name}.json").rename(folder / "sharpness.json")
    if (folder / f"{test_name}.npz").is_file():
        (folder / f"{test_name}.npz").rename(folder / "sharpness.npz")

    loaded = rundata.load_runs(run)[0]
    assert loaded.analysed_rounds("sharpness") == [2]  # round 3 holds the test split only: not the default
    assert "split=test" in " ".join(loaded.notes())
    assert rundata.load_runs(run, Selection.parse(RESULT_NAMES, ["split=test"]))[0].analysed_rounds("sharpness") == [2, 3]
    with pytest.raises(LandscapeError, match="it has sharpness with .*split=test"):
        rundata.load_runs(run, Selection.parse(RESULT_NAMES, ["split=train", "analysis_samples=0"]))[0].pass_records("sharpness")

    # analyze finds it by what it records (nothing to compute), and the training split goes beside it
    assert "0 computed, 1 already done" in analyze(run, "--passes", "sharpness", "--split", "test", *SHARP).output
    assert "1 computed" in analyze(run, "--passes", "sharpness", *SHARP).output
    names = results_of(folder, "sharpness")
    assert sorted(names) == ["sharpness", train_name]
    assert names["sharpness"]["settings"]["analysis"]["split"] == "test"


def test_a_result_at_the_defaults_moves_an_old_style_file_of_other_settings_to_its_own_name(runs):
    run = runs / "fedavg"
    folder = run / "analysis" / "round-0003"
    assert analyze(run, "--passes", "loss", "--split", "test").exit_code == 0
    (folder / "loss@split-test.json").rename(folder / "loss.json")  # as written before: the pass's name
    old = json.loads((folder / "loss.json").read_text())
    assert "0 computed, 1 already done" in analyze(run, "--passes", "loss", "--split", "test").output
    assert "1 computed" in analyze(run, "--passes", "loss").output  # the default lands on loss.json ...
    names = results_of(folder, "loss")
    assert sorted(names) == ["loss", "loss@split-test"]  # ... and the test split is kept under its own name
    assert names["loss@split-test"] == old
    assert names["loss"]["settings"]["analysis"]["split"] == "train"
    assert "0 computed, 1 already done" in analyze(run, "--passes", "loss", "--split", "test").output


def test_report_names_the_settings_it_shows_and_draws_every_surface(runs):
    page = build_report(runs)
    assert "settings: the defaults where computed" in page
    assert "grid=3" in page and "data=client:1" in page  # the client-1 surface is drawn too, titled by its settings
    assert build_report(runs, selection=Selection.parse(RESULT_NAMES, ["split=test"])).count("settings: split=test") == 1


def test_a_surface_of_other_settings_leaves_the_partial_grid_of_another_alone(runs):
    folder = runs / "fedavg" / "analysis" / "round-0003"
    partial = folder / "surface@analysis_samples-64_grid-5.partial.npz"  # an interrupted 5 x 5 global surface
    partial.write_bytes(b"partial grid of the global surface")
    result = analyze(runs / "fedavg", "--passes", "surface", "--analysis-samples", "64", "--grid", "3", "--data",
                     "client:1", "--force")
    assert "1 computed" in result.output, result.output
    assert partial.read_bytes() == b"partial grid of the global surface"
    assert not (folder / "surface@analysis_samples-64_data-client~1_grid-3.partial.npz").exists()  # its own: done


@pytest.mark.parametrize("key, value", [("data", 0), ("clients", 1), ("target", 3), ("span", 1.0), ("grid", True)])
def test_surface_options_that_are_not_text_are_refused_in_one_line(key, value):
    # found by the naming fuzz above: numbers reached str methods (a traceback from --set surface.data=0)
    with pytest.raises(LandscapeError, match=f"surface.{key} must be a string"):
        pass_options("surface", {key: value})


# -- analysis recipes: the top-level keys, [settings] and the passes' tables, read by the one loader ---------

@pytest.mark.parametrize("text, message", [
    ('pases = ["loss"]\n', "unknown analysis recipe key 'pases'; allowed top-level: rounds, passes, settings, "
                           "title, alignment, flatness, hessian, incompatibility, loss, sharpness, surface; did you "
                           "mean 'passes'?"),
    ("passes = []\n", "passes must have at least 1 item(s) (got ())"),
    ('passes = ["curvature"]\n', "unknown analysis pass 'curvature'; choose from: alignment, flatness, "),
    ("[settings]\nbacth_size = 3\n", "unknown analysis setting 'settings.bacth_size'; allowed in [settings]: split, "),
    ('[settings]\nbn_mode = "train"\n', "settings.bn_mode must be one of eval, train-batch-stats, recompute "
                                        "(got 'train')"),
    ("settings = 3\n", "settings must be a table (got 3)"),
    ("hessian = 3\n", "hessian must be a table (got 3)"),
    ("[flatness]\nx = 1\n", "flatness takes no options (got x)"),
    ("[hessian]\ntop_k = 0\n", "hessian.top_k must be >= 1 (got 0)"),
    ('[surface]\ndirections = "pca"\nnormalization = "euclidean"\n', "surface normalization 'euclidean' is for "
                                                                      "random directions"),
])
def test_an_analysis_recipe_is_refused_in_one_line_naming_the_file_and_key(tmp_path, text, message):
    from landscape.analyze.recipes import load_analysis_recipe

    path = tmp_path / "a.toml"
    path.write_text(text)
    with pytest.raises(LandscapeError) as refused:
        load_analysis_recipe(path)
    assert str(refused.value).startswith(f"{path}: {message}"), str(refused.value)


def test_an_analysis_recipe_keeps_its_values_as_given_for_the_flags_to_win_over():
    from landscape.analyze.recipes import load_analysis_recipe

    path = Path(__file__).resolve().parents[2] / "analyze" / "quick.toml"
    recipe = load_analysis_recipe(path)
    assert recipe.rounds == Rounds(LAST) and recipe.settings == {"analysis_samples": 500}
    assert recipe.options["sharpness"] == {"rhos": [0.05], "starts": 4, "adaptive": False, "clients": 4}


def test_rounds_given_as_a_number_is_that_round(tmp_path):
    from landscape.analyze.recipes import load_analysis_recipe

    (tmp_path / "a.toml").write_text('rounds = 3\n[surface]\ngrid = 41\n')
    recipe = load_analysis_recipe(tmp_path / "a.toml")
    assert recipe.rounds == Rounds(LISTED, listed=(3,)) and recipe.passes is None and recipe.options == {"surface": {"grid": 41}}
