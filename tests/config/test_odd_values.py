"""Odd values stop at the door (issue 46, T6-T9, W5, U4): a setting of the wrong kind, a size that cannot be
allocated (data dimensions and classes, model widths, a Hessian's top_k, trace probes and SLQ steps,
sharpness starts) and data that overflows are refused in one line naming the setting, with the memory a size
would need, before any work and in --dry-run alike; never a traceback, an allocator error or a silent wrong
number. Then fuzzing: every key of a training recipe, every analysis setting and pass option and every flag
with the odd values of the issue's list."""

import dataclasses
import math
import shutil

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.helpers import FUZZ, invoke, one_line_error

from landscape.analyze.catalog import load_passes
from landscape.analyze.settings import AnalysisSettings
from landscape.config import recipe as recipes
from landscape.config import sections
from landscape.core.errors import LandscapeError
from landscape.data.datasets import DATASETS
from landscape.models import MODELS

LONG = "a" * 5000
HUGE = 99999999999999999999  # past int64: 1e20


@pytest.fixture
def run_dir(one_round_run):
    return one_round_run  # read and dry-run only: nothing may be written into it


# ----------------------------------------------------------------------------------------------------------
# T6: a setting of the wrong kind through --set


@pytest.mark.parametrize("value", ['"x"', '""', "[]", f'"{LONG}"', "true", "nan", "-1"],
                         ids=["x", "empty", "list", "5000 chars", "true", "nan", "negative"])
def test_an_analysis_setting_of_the_wrong_kind_is_one_line(run_dir, value):
    result = invoke("analyze", run_dir, "--passes", "loss", "--set", f"analyze.analysis_samples={value}",
                    "--dry-run")
    line = one_line_error(result)
    assert "analysis_samples" in line and len(line) < 400, line
    assert not (run_dir / "analysis").exists()


# ----------------------------------------------------------------------------------------------------------
# T7, T8, W5: training data and models too big for this machine, or data that overflows


@pytest.mark.parametrize("args, fragments", [
    (["--dataset", "synthetic", "--set", f"dataset.dimension={HUGE}"], ["dataset.dimension", "GiB of memory"]),
    (["--dataset", "synthetic", "--set", f"dataset.classes={HUGE}"], ["dataset.classes", "GiB of memory"]),
    (["--dataset", "synthetic", "--set", "dataset.dimension=1000000000"], ["dimension 1,000,000,000", "GiB of memory"]),
    (["--model", "cnn", "--set", "model.width=1000000"], ["model.width = 1000000", "parameters", "GiB of memory"]),
    (["--model", "cnn", "--set", "model.hidden=1000000000000"], ["model.hidden = 1000000000000", "GiB of memory"]),
    (["--model", "cnn", "--set", f"model.width={HUGE}"], ["model.width", "cannot be built"]),
    (["--model", "mlp", "--set", f"model.hidden=[{HUGE}]"], ["model.hidden", "cannot be built"]),
    (["--model", "mlp", "--set", "model.hidden=[1000000000]"], ["75,000,000,010 parameters", "GiB of memory"]),
    (["--model", "cnn", "--set", "model.width=1e20"], ["model.width must be an integer"]),
    (["--dataset", "synthetic", "--model", "mlp", "--set", "dataset.alpha=1e308"], ["dataset.alpha = 1e+308"]),
    (["--dataset", "synthetic", "--model", "mlp", "--set", "dataset.beta=1e308"],
     ["synthetic", "dataset.beta = 1e+308", "overflow"]),
    (["--dataset", "synthetic", "--model", "mlp", "--set", "dataset.beta=1e39"], ["dataset.beta=1e+39", "not finite in float32"]),
], ids=["dimension", "classes", "dimension 1e9", "cnn width", "cnn hidden", "cnn width 1e20",
        "mlp hidden 1e20", "mlp hidden 1e9", "width float", "alpha", "beta", "beta float32"])
@pytest.mark.parametrize("dry_run", [True, False], ids=["dry-run", "run"])
def test_training_sizes_and_data_beyond_the_machine_are_refused_before_any_work(tmp_path, args, fragments,
                                                                                dry_run):
    out = tmp_path / "out"
    result = invoke("train", *args, "--clients", "8", "--rounds", "1", "--out", out,
                    *(["--dry-run"] if dry_run else []))
    line = one_line_error(result)
    assert all(fragment in line for fragment in fragments), line
    assert not out.exists()


def test_the_model_check_counts_without_allocating_and_changes_no_initialisation():
    import torch

    from landscape.models import build_model, model_parameters

    entry = MODELS.get("cnn")
    opts = entry.make_options({"width": 1000000}, "model")
    assert model_parameters("cnn", entry.factory, (1, 8, 8), 10, opts) == 18_001_036_001_418
    torch.manual_seed(0)
    checked = build_model("mlp", (1, 8, 8), 10, {"hidden": [16]})
    torch.manual_seed(0)
    mlp = MODELS.get("mlp")
    unchecked = mlp.factory((1, 8, 8), 10, mlp.make_options({"hidden": [16]}, "model"))
    assert all(torch.equal(a, b) for a, b in zip(checked.state_dict().values(), unchecked.state_dict().values()))


# ----------------------------------------------------------------------------------------------------------
# T9, U4: a Hessian's and the sharpness ascent's sizes: the dry-run never plans what the run refuses


@pytest.mark.parametrize("pass_name, assignment, fragments", [
    ("hessian", f"hessian.top_k={HUGE}", ["hessian.top_k must be at most the Hessian's dimension"]),
    ("hessian", "hessian.top_k=99999", ["hessian.top_k must be at most the Hessian's dimension"]),
    ("hessian", "hessian.trace_hvps=2147483648", ["hessian.trace_hvps = 2,147,483,648", "GiB of memory"]),
    ("hessian", "hessian.density_steps=2147483648", ["hessian.density_steps", "GiB of memory"]),
    ("sharpness", "sharpness.starts=1000000000000", ["sharpness.starts = 1,000,000,000,000", "GiB of memory"]),
], ids=["top_k 1e20", "top_k", "trace_hvps", "density_steps", "starts"])
@pytest.mark.parametrize("dry_run", [True, False], ids=["dry-run", "run"])
def test_analysis_sizes_beyond_the_model_or_memory_are_refused_in_the_dry_run_as_in_the_run(
        run_dir, tmp_path, pass_name, assignment, fragments, dry_run):
    if not dry_run:
        run_dir = shutil.copytree(run_dir, tmp_path / "run")
    before = sorted(p.relative_to(run_dir) for p in run_dir.rglob("*"))
    result = invoke("analyze", run_dir, "--device", "cpu", "--analysis-samples", "200", "--passes", pass_name,
                    "--set", assignment, *(["--dry-run"] if dry_run else ["--quiet"]))
    line = one_line_error(result)
    assert all(fragment in line for fragment in fragments), line
    assert not list((run_dir / "analysis").rglob("*.json")), "a refused job wrote a result"
    if dry_run:
        assert sorted(p.relative_to(run_dir) for p in run_dir.rglob("*")) == before


def test_a_pass_s_vectors_are_checked_against_the_free_memory_of_the_analysis_device():
    """The device's free bytes are the ones checked (a GPU's on a GPU): unknown (None) passes."""
    spec = load_passes().get("hessian")
    options = spec.make_options({})
    spec.size_check(options, 1000, 4, None)
    spec.size_check(options, 1000, 4, 60 * 1000 * 4)
    with pytest.raises(LandscapeError, match=r"hessian.trace_hvps = 60 \(60 vectors of the dimension 1,000, 4 bytes"):
        spec.size_check(options, 1000, 4, 60 * 1000 * 4 - 1)


@pytest.mark.parametrize("setting, message", [
    ("split=nan", "--settings split=nan: settings.split must be one of train, test (got nan)"),
    ("seed=-1", "--settings seed=-1: settings.seed must be in 0..4294967295 (got -1)"),
    ("hessian.top_k=0", "--settings hessian.top_k=0: hessian.top_k must be >= 1 (got 0)"),
    ("grid=nan", "--settings grid=nan: surface.grid must be a string (got nan)"),
])
@pytest.mark.parametrize("command", ["compare", "report"])
def test_compare_and_report_refuse_a_settings_filter_no_result_can_have(run_dir, tmp_path, setting, message,
                                                                        command):
    out = tmp_path / ("cmp" if command == "compare" else "report.html")
    line = one_line_error(invoke(command, run_dir, run_dir, "--out", out, "--settings", setting))
    assert line == f"error: {message}"
    assert not out.exists()


def test_the_sharpness_estimate_counts_its_starts():
    cost = load_passes().get("sharpness").cost
    options = load_passes().get("sharpness").make_options
    assert cost(options({"starts": 80})).gradients > 9 * cost(options({"starts": 8})).gradients


# ----------------------------------------------------------------------------------------------------------
# fuzzing with the odd values: every recipe key, every analysis setting and pass option, every flag

ODD = [math.nan, math.inf, -math.inf, -1, 0, 1e308, 1e309, "", "ünïcødé ✓", LONG, True, [], 1e20, HUGE,
       "<script>"]


def _keys(cls, prefix: str) -> list[str]:
    return [f"{prefix}.{f.name}" for f in dataclasses.fields(cls) if f.init and f.name != "options"]


def _recipe_keys() -> list[str]:
    """Every key of a training recipe: the sections' own and the options of every data set and model a recipe
    names with them (mlp and cnn on digits, the synthetic set)."""
    keys = [f.name for f in dataclasses.fields(sections.TopLevelSettings)]
    keys += [key for name, cls in sections.SECTIONS.items() for key in _keys(cls, name)]
    for registry, section in ((DATASETS, "dataset"), (MODELS, "model")):
        for name in registry.names():
            options = registry.get(name).options
            if options is not None:
                keys += [f"{section}.{f.name}" for f in dataclasses.fields(options)]
    return sorted(set(keys))


RECIPE_KEYS = _recipe_keys()
BASES = {"dataset.alpha": "synthetic", "dataset.beta": "synthetic", "dataset.dimension": "synthetic",
         "dataset.classes": "synthetic", "dataset.data_seed": "mnist1d"}


@FUZZ
@given(key=st.sampled_from(RECIPE_KEYS), value=st.sampled_from(ODD))
def test_fuzz_every_recipe_key_with_odd_values_resolves_or_is_one_line(key, value):
    from landscape.config.setup import check_module, prepare_data

    section, _, name = key.rpartition(".")
    raw: dict = {"partition": {"clients": 4}, "train": {"rounds": 1, "device": "cpu"}}
    if key in BASES:
        raw["dataset"] = {"name": BASES[key]}
    if section == "model" and name in ("width",):
        raw["model"] = {"name": "cnn"}
    if section:
        raw.setdefault(section, {})[name] = value
    else:
        raw[name] = value
    try:
        recipe = recipes.resolve(raw)
        if recipe.dataset.name in ("digits", "synthetic") and recipe.model.name in ("mlp", "cnn"):
            check_module(recipe, prepare_data(recipe).bundle)
    except LandscapeError as e:
        assert str(e) and "\n" not in str(e), str(e)


ANALYSIS_KEYS = sorted([f"analyze.{f.name}" for f in dataclasses.fields(AnalysisSettings)
                        if f.init and f.name != "device"]
                       + [f"{name}.{f.name}" for name in load_passes().names()
                          if load_passes().get(name).options is not None
                          for f in dataclasses.fields(load_passes().get(name).options)])


def _toml(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else {math.inf: "inf", -math.inf: "-inf"}.get(value, "nan")
    if isinstance(value, str):
        return '"' + value + '"'
    return "[]" if value == [] else str(value)


@FUZZ
@given(key=st.sampled_from(ANALYSIS_KEYS), value=st.sampled_from(ODD))
def test_fuzz_every_analysis_setting_and_pass_option_with_odd_values(run_dir, key, value):
    """--dry-run with one odd --set value: a plan or one line; never a traceback, nothing written."""
    pass_name = key.split(".", 1)[0]
    passes = pass_name if pass_name in load_passes().names() else "loss"
    result = invoke("analyze", run_dir, "--passes", passes, "--analysis-samples", "50", "--set",
                    f"{key}={_toml(value)}", "--dry-run", "--quiet")
    assert result.exception is None or isinstance(result.exception, SystemExit), (key, value, result.exception)
    if result.exit_code != 0:
        one_line_error(result)
    assert not (run_dir / "analysis").exists()


ODD_TEXT = [_toml(v).strip('"') if isinstance(v, str) else str(v) for v in ODD] + ["1e309", "-inf"]


def _flags(command: str, skip: tuple[str, ...]) -> list[str]:
    """Every option of ``command`` that takes a value, but ``skip``."""
    import click

    from landscape.cli import cli

    return sorted(p.opts[0] for p in cli.commands[command].params
                  if isinstance(p, click.Option) and not p.is_flag and p.opts[0] not in skip)


# -o is the test's own folder; --resume continues the run it names (train's resume tests).
TRAIN_FLAGS = _flags("train", ("-o", "--resume"))
ANALYZE_FLAGS = _flags("analyze", ())


def _refused(result) -> None:
    """One line of ours (exit 1), or click's usage error (exit 2, its last line 'Error: ...')."""
    if result.exit_code == 2:
        assert result.output.strip().splitlines()[-1].startswith("Error: "), result.output
    else:
        one_line_error(result)


@FUZZ
@given(flag=st.sampled_from(TRAIN_FLAGS), value=st.sampled_from(ODD_TEXT))
def test_fuzz_every_train_flag_with_odd_values(tmp_path, flag, value):
    result = invoke("train", flag, value, "--out", tmp_path / "out", "--dry-run")
    assert result.exception is None or isinstance(result.exception, SystemExit), (flag, value, result.exception)
    if result.exit_code != 0:
        _refused(result)
    assert not (tmp_path / "out").exists()


@FUZZ
@given(flag=st.sampled_from(ANALYZE_FLAGS), value=st.sampled_from(ODD_TEXT))
def test_fuzz_every_analyze_flag_with_odd_values(run_dir, flag, value):
    result = invoke("analyze", run_dir, "--passes", "loss", flag, value, "--dry-run", "--quiet")
    assert result.exception is None or isinstance(result.exception, SystemExit), (flag, value, result.exception)
    if result.exit_code != 0:
        _refused(result)
    assert not (run_dir / "analysis").exists()
