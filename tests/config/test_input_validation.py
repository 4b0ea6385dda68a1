"""Inputs validated where they enter: analysis settings, pass options and the sharpness of non-finite points
(issue 20's silently wrong cases) and surface grids of one point or beyond memory give one-line errors, never
a zero or a result under a wrong name; and property-based fuzzing of training recipes, --set overrides,
numeric command-line flags and control characters: each resolves or is refused in one line, never a
traceback."""

import dataclasses
import json
import math

import pytest
import torch
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.helpers import FUZZ, analyze_args, invoke, one_line_error
from torch import nn

import landscape
from landscape.analyze.catalog import pass_options
from landscape.analyze.settings import AnalysisSettings
from landscape.cli import cli
from landscape.config import overrides as recipe_overrides
from landscape.config import recipe as recipes
from landscape.core.errors import LandscapeError
from landscape.store import lifecycle


@pytest.mark.parametrize("settings, message", [
    ({"batch_size": -1}, "settings.batch_size must be >= 1 (got -1)"),
    ({"batch_size": 0}, "settings.batch_size must be >= 1 (got 0)"),
    ({"split": "val"}, "settings.split must be one of train, test (got 'val')"),
    ({"seed": -1}, "settings.seed must be in 0..4294967295 (got -1)"),
    ({"analysis_samples": 2.5}, "settings.analysis_samples must be an integer (got 2.5)"),
    ({"threads": 100000}, "settings.threads must be in 0..4096 (0: every core) (got 100000)"),
    ({"bn_mode": "train"}, "settings.bn_mode must be one of eval, train-batch-stats, recompute"),
])
def test_bad_analysis_settings_are_refused_where_they_enter(settings, message):
    with pytest.raises(LandscapeError, match=message.replace("(", r"\(").replace(")", r"\)")):
        AnalysisSettings(**settings)


@pytest.fixture
def run_dir(one_round_run):
    return one_round_run  # read and dry-run only: nothing may be written into it


@pytest.mark.parametrize("recipe, message", [
    ("[settings]\nbatch_size = -1\n", "settings.batch_size must be >= 1 (got -1)"),
    ("[settings]\nbatch_size = 0\n", "settings.batch_size must be >= 1 (got 0)"),
    ('[settings]\nsplit = "val"\n', "settings.split must be one of train, test (got 'val')"),
    ("[settings]\nseed = -1\n", "settings.seed must be in 0..4294967295 (got -1)"),
    ("[hessian]\ntop_k = 2.5\n", "hessian.top_k must be an integer (got 2.5)"),
    ("[sharpness]\nrhos = [inf]\n", "sharpness.rhos[0] must be finite (got inf)"),
])
def test_bad_analysis_recipes_are_one_line_even_in_a_dry_run(run_dir, tmp_path, recipe, message):
    path = tmp_path / "a.toml"
    path.write_text('passes = ["loss", "hessian", "sharpness"]\n' + recipe)
    result = CliRunner().invoke(cli, ["analyze", str(run_dir), str(path), "--dry-run"])
    assert message in one_line_error(result)
    assert not (run_dir / "analysis").exists()


def test_a_negative_seed_flag_is_refused(run_dir):
    result = CliRunner().invoke(cli, ["analyze", str(run_dir), "--passes", "loss", "--seed", "-1"])
    assert "settings.seed must be in 0..4294967295 (got -1)" in one_line_error(result)


def test_a_number_where_a_list_goes_is_a_one_element_list():
    assert pass_options("sharpness", {"rhos": 0.05}).rhos == (0.05,)
    with pytest.raises(LandscapeError, match=r"hessian.top_k must be an integer \(got 3.0\)"):
        pass_options("hessian", {"top_k": 3.0})


def _tiny():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3)).double()
    x = torch.randn(12, 4, dtype=torch.float64)
    return model, x, torch.arange(12) % 3


def test_the_api_refuses_a_negative_batch_size():
    model, x, y = _tiny()
    with pytest.raises(LandscapeError, match=r"batch_size must be a whole number >= 1 \(got -1\)"):
        landscape.hessian_eigs(model, (x, y), k=2, batch_size=-1)


def test_sharpness_of_a_nan_weight_or_an_overflowing_ball_is_an_error_not_zero():
    model, x, y = _tiny()
    with pytest.raises(LandscapeError, match="rho must be a finite number > 0"):
        landscape.sharpness(model, (x, y), rho=float("inf"))
    with pytest.raises(LandscapeError, match="is not finite on the ball"):
        landscape.sharpness(model, (x, y), rho=1e308, starts=1)
    with torch.no_grad():
        model[0].weight[0, 0] = float("nan")
    with pytest.raises(LandscapeError, match=r"F\(x\) = nan or its gradient is not finite"):
        landscape.sharpness(model, (x, y), rho=0.05)


def test_a_training_thread_count_beyond_any_machine_is_one_line(tmp_path):
    result = CliRunner().invoke(cli, ["train", "--threads", "100000", "--dry-run", "-o", str(tmp_path / "r")])
    assert "train.threads must be in 0..4096 (0: every core) (got 100000)" in one_line_error(result)


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else str(value)  # TOML spells nan, inf, -inf
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return str(value)


_SCALARS = st.one_of(st.integers(-3, 5), st.sampled_from([0, 10 ** 12, -(2 ** 40)]),
                     st.sampled_from([0.0, -0.5, 2.5, 1e-12, 1e308, float("nan"), float("inf"), float("-inf")]),
                     st.booleans(), st.sampled_from(["", "x", "last", "eval", "test", "float64", "cpu"]))
_VALUES = st.one_of(_SCALARS, st.lists(_SCALARS, max_size=3))
_PASSES = ("loss", "hessian", "sharpness", "surface", "alignment", "incompatibility")


def _near_defaults(cls) -> dict[str, st.SearchStrategy]:
    """Per field: its default, a value near it (the same kind), or anything from _VALUES."""
    out = {}
    for f in dataclasses.fields(cls):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        if isinstance(default, tuple):
            default = list(default)
        near = [default]
        if isinstance(default, (int, float)) and not isinstance(default, bool):
            near += [default * 2, default + 1]
        if isinstance(default, list) and default:
            near += [default[:1]]
        out[f.name] = st.one_of(st.sampled_from(near), _VALUES)
    return out


def _draw_table(data, cls, skip=()) -> dict:
    strategies = {k: v for k, v in _near_defaults(cls).items() if k not in skip}
    keys = data.draw(st.lists(st.sampled_from(sorted(strategies)), max_size=3, unique=True))
    return {k: data.draw(strategies[k]) for k in keys}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzz_analysis_recipe_values_are_a_one_line_error_or_a_finite_dry_run(run_dir, tmp_path, data):
    """Random values for the settings and for a pass's options: `analyze --dry-run` either prints a finite
    estimate or refuses in one line; never a traceback, and nothing is written into the run."""
    name = data.draw(st.sampled_from(_PASSES))
    from landscape.analyze.catalog import load_passes

    settings_part = _draw_table(data, AnalysisSettings, skip=("device",))
    options_part = _draw_table(data, load_passes().get(name).options)
    lines = [f'passes = ["{name}"]', "[settings]"]
    lines += [f"{k} = {_toml_value(v)}" for k, v in settings_part.items()]
    lines += [f"[{name}]"] + [f"{k} = {_toml_value(v)}" for k, v in options_part.items()]
    path = tmp_path / "fuzz.toml"
    path.write_text("\n".join(lines) + "\n")
    result = CliRunner().invoke(cli, ["analyze", str(run_dir), str(path), "--dry-run", "--quiet"])
    if result.exit_code == 0:
        assert "nan" not in result.output and "inf " not in result.output, result.output
    else:
        assert result.exit_code == 1 and result.output.count("\n") == 1, (path.read_text(), result.output)
        assert result.output.startswith("error: "), (path.read_text(), result.output)
        assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert not (run_dir / "analysis").exists()


@pytest.mark.parametrize(("grid", "fragments"), [("1", ["at least 3"]), ("100001", ["100001", "memory"])],
                         ids=["one point", "huge"])
def test_a_grid_of_one_point_or_beyond_memory_is_refused_before_memory_is_allocated(six_round_copy, grid,
                                                                                    fragments):
    line = one_line_error(invoke(*analyze_args(six_round_copy, "--passes", "surface", "--grid", grid)))
    assert all(fragment in line for fragment in fragments), line


# ----------------------------------------------------------------------------------------------------------
# property-based fuzzing: training recipes and command-line options

SECTION_KEYS = {
    "dataset": ["name", "root", "augment"],
    "partition": ["name", "clients", "alpha", "min_samples", "classes_per_client"],
    "model": ["name", "hidden", "width"],
    "algorithm": ["name", "rho", "mu", "lam"],
    "train": ["rounds", "participation", "local_epochs", "local_steps", "batch_size", "lr", "lr_schedule",
              "weight_decay", "clip_norm", "eval_every", "checkpoint_every", "swa", "swa_start", "dtype",
              "device"],
}
# Keys and strings without control characters: the recipe module quotes keys as given, so a newline in a
# key would split its message (the command line refuses control characters up front: see below).
TEXT = st.text(st.characters(blacklist_categories=("Cc", "Cs")), max_size=8)
RECIPE_SCALARS = st.one_of(st.booleans(), st.integers(min_value=-(2**70), max_value=2**70), st.floats(), TEXT,
                           st.text(max_size=8),
                           st.sampled_from(["mlp", "cnn", "fedsam", "iid", "cosine", "float64"]))
RECIPE_VALUES = st.recursive(RECIPE_SCALARS, lambda inner: st.lists(inner, max_size=3)
                             | st.dictionaries(TEXT, inner, max_size=2), max_leaves=5)
TABLES = {section: st.dictionaries(st.sampled_from(keys) | TEXT, RECIPE_VALUES, max_size=4)
          for section, keys in SECTION_KEYS.items()}
RAW = st.fixed_dictionaries({}, optional={
    "name": st.text(max_size=12) | RECIPE_VALUES,
    "seed": st.integers(min_value=-5, max_value=2**40) | RECIPE_VALUES,
    **{section: table | RECIPE_VALUES for section, table in TABLES.items()},
}) | st.dictionaries(TEXT, RECIPE_VALUES, max_size=3)
DOTTED = st.one_of(
    st.sampled_from([f"{s}.{k}" for s, keys in SECTION_KEYS.items() for k in keys] + ["name", "seed"]),
    st.text(st.characters(blacklist_categories=("Cc", "Cs")), max_size=12),
)


@FUZZ
@given(raw=RAW)
def test_fuzz_recipes_resolve_or_say_why_in_one_line(raw):
    try:
        recipe = recipes.resolve(raw)
    except LandscapeError as e:
        assert str(e) and "\n" not in str(e)
        return
    try:
        lifecycle.check_recipe_writable(recipe)
    except LandscapeError as e:
        assert "\n" not in str(e) and "cannot be written to recipe.toml" in str(e)
        return
    assert recipes.resolve(recipes.tomllib.loads(recipes.to_toml(recipe))) == recipe


@FUZZ
@given(assignments=st.lists(st.tuples(DOTTED, RECIPE_VALUES), max_size=4), texts=st.lists(TEXT, max_size=2))
def test_fuzz_overrides_and_set_assignments(assignments, texts):
    try:
        overrides = assignments + [recipe_overrides.parse_assignment(t) for t in texts]
        recipe_overrides.build_sweep(None, overrides)
    except LandscapeError as e:
        assert str(e) and "\n" not in str(e)


def _number_text() -> st.SearchStrategy[str]:
    return st.one_of(
        st.text(max_size=10),
        st.integers(min_value=-3, max_value=30).map(str),
        st.floats(min_value=0.05, max_value=1e6).map(repr),
        st.floats(max_value=0.0).map(repr),
        st.sampled_from(["nan", "inf", "-inf", "1e-400", "0.5,0.5", "0.3,", ",", "[1]", '"0.5"', "true",
                         "1_0", "0x10", "2000", "99999999999999999999", "4,x"]),
    )


FLAG_FIELDS = {"--alpha": "alpha", "--clients": "clients", "--participation": "participation"}


@FUZZ
@given(flag=st.sampled_from(list(FLAG_FIELDS)), value=_number_text())
def test_fuzz_cli_numeric_flags(tmp_path, flag, value):
    result = invoke("train", f"{flag}={value}", "--out", tmp_path / "out", "--dry-run")
    assert result.exception is None or isinstance(result.exception, SystemExit), (value, result.exception)
    if result.exit_code != 0:
        line = one_line_error(result)
        assert FLAG_FIELDS[flag] in line, line
    assert not (tmp_path / "out").exists()


@FUZZ
@given(key=DOTTED, value=st.text(max_size=15) | _number_text())
def test_fuzz_cli_set_key_value(tmp_path, key, value):
    if key in ("dataset.name", "dataset.download"):  # data sets that would look for files or a network
        value = "digits" if key == "dataset.name" else "false"
    result = invoke("train", "--set", f"{key}={value}", "--out", tmp_path / "out", "--dry-run")
    assert result.exception is None or isinstance(result.exception, SystemExit), (key, value,
                                                                                    result.exception)
    if result.exit_code != 0:
        line = one_line_error(result)
        used = f"{key}={value}".split("=", 1)[0].strip()  # the key as --set splits it
        named = [part for part in used.split(".") if part] or ["recipe key"]
        assert any(part in line for part in named) or "--set" in line, (key, line)
    assert not (tmp_path / "out").exists()


@FUZZ
@given(flag=st.sampled_from(["--alpha", "--clients", "--lr", "--set"]), text=st.text(max_size=10),
       control=st.sampled_from(["\n", "\r", "\t", "\x00", "\x1b", "\x7f"]))
def test_fuzz_cli_control_characters_are_refused_in_one_line(tmp_path, flag, text, control):
    value = f"train.lr={text}{control}" if flag == "--set" else f"{text}{control}"
    line = one_line_error(invoke("train", flag, value, "--out", tmp_path / "out", "--dry-run"))
    assert line == f"error: {flag} must not hold control characters (got {value!r})"
