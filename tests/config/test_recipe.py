import dataclasses
import json
import typing

import pytest

from landscape.config import overrides as recipe_overrides
from landscape.config import recipe as recipes
from landscape.config import sections as recipe_sections
from landscape.config.sections import PartitionSettings, TopLevelSettings, TrainSettings
from landscape.core import schema
from landscape.core.errors import LandscapeError


def test_defaults_are_all_written_out():
    r = recipe_overrides.build()
    assert r.dataset.name == "digits"
    assert r.to_dict()["partition"] == {"name": "dirichlet-client-reuse", "clients": 20, "alpha": 0.1}
    assert r.to_dict()["model"] == {"name": "cnn", "width": 32, "hidden": 128}
    assert r.to_dict()["algorithm"] == {"name": "fedavg"}
    assert r.train.rounds == 30 and r.train.lr_schedule == "constant"
    assert r.seed == 0


def test_toml_round_trip(tmp_path):
    r = recipe_overrides.build(None, [("model.name", "mlp"), ("model.hidden", [7, 5]), ("train.lr", 0.25)])
    path = tmp_path / "r.toml"
    path.write_text(recipes.to_toml(r))
    assert recipe_overrides.build(path) == r


def test_file_then_overrides_in_order(tmp_path):
    path = tmp_path / "r.toml"
    path.write_text('seed = 3\n[train]\nlr = 0.5\nrounds = 7\n')
    r = recipe_overrides.build(path, [("train.lr", 0.2)])
    assert (r.seed, r.train.lr, r.train.rounds) == (3, 0.2, 7)


@pytest.mark.parametrize(
    "text, value",
    [("0.1", 0.1), ("3", 3), ("true", True), ("[1, 2]", [1, 2]), ('"gn"', "gn"), ("gn", "gn"), ("1e-3", 1e-3)],
)
def test_set_values_parse_as_toml(text, value):
    assert recipe_overrides.parse_assignment(f"train.x={text}") == ("train.x", value)


def test_int_accepted_for_float_and_stored_as_float():
    assert recipe_overrides.build(None, [("train.lr", 1)]).train.lr == 1.0


@pytest.mark.parametrize(
    "overrides, message",
    [
        ([("train.lrr", 1.0)], "unknown recipe key 'train.lrr'; allowed in [train]: rounds, participation"),
        ([("colour", 1)], "unknown recipe key 'colour'; allowed top-level keys: name, seed, imports, dataset"),
        ([("partition.name", "iid"), ("partition.alpha", 0.5)],
         "unknown recipe key 'partition.alpha'; allowed in [partition] with partition.name = 'iid': name, clients"),
        ([("train.lr", "fast")], "train.lr must be a number (got 'fast')"),
        ([("train.rounds", 2.5)], "train.rounds must be an integer (got 2.5)"),
        ([("train.keep_clients", 1)], "train.keep_clients must be true or false (got 1)"),
        ([("train.participation", 1.5)], "train.participation must be in (0, 1] (got 1.5)"),
        ([("train.participation", 0)], "train.participation must be in (0, 1] (got 0)"),
        ([("train.lr_schedule", "step")], "train.lr_schedule must be one of constant, exponential, cosine"),
        ([("partition.clients", 0)], "partition.clients must be >= 1 (got 0)"),
        ([("dataset.name", "imagenet")], "unknown dataset 'imagenet'; choose from: cifar10, cifar100, digits"),
        ([("model.name", "vit")], "unknown model 'vit'; choose from: cnn, factory, lenet5, mlp, resnet18"),
        ([("algorithm.name", "fedfoo")], "unknown algorithm 'fedfoo'; choose from: "),
        ([("partition.name", "zipf")], "unknown partition 'zipf'; choose from: dirichlet, dirichlet-client, dirichlet-client-reuse, iid, natural, pathological"),
        ([("seed", -1)], "seed must be in 0..4294967295 (got -1)"),
        ([("seed", 2**32)], "seed must be in 0..4294967295 (got 4294967296)"),
        ([("train", 3)], "recipe key 'train' is a table"),
        ([("a.b.c.d", 3)], "must be 'key', 'section.key' or 'section.<name>.key'"),
        ([("algorithm.fedsam.rhoo", 0.1)], "unknown recipe key 'algorithm.fedsam.rhoo'; allowed in [algorithm.fedsam]: rho"),
        ([("algorithm.fedfoo.rho", 0.1)], "unknown algorithm 'fedfoo'"),
        ([("algorithm.fedsam.rho", -1)], "algorithm.fedsam.rho must be >= 0 (got -1)"),
    ],
)
def test_validation_names_the_key_and_the_allowed_values(overrides, message):
    with pytest.raises(LandscapeError) as err:
        recipe_overrides.build(None, overrides)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_bad_toml_and_missing_file(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[train\nlr = ")
    with pytest.raises(LandscapeError, match="not valid TOML"):
        recipe_overrides.build(bad)
    with pytest.raises(LandscapeError, match="recipe file not found"):
        recipe_overrides.build(tmp_path / "nope.toml")


def test_set_without_equals():
    with pytest.raises(LandscapeError, match="--set takes key=value"):
        recipe_overrides.parse_assignment("train.lr")


def test_run_name_is_systematic():
    r = recipe_overrides.build(None, [("partition.alpha", 0.6), ("seed", 2)])
    assert recipes.run_name(r) == "digits-fedavg-dirr0.6-cnn-c20-s2"


def test_per_algorithm_tables_apply_to_their_algorithm_only(tmp_path):
    path = tmp_path / "r.toml"
    path.write_text('[algorithm]\nname = "fedsam"\n[algorithm.fedsam]\nrho = 0.07\n[algorithm.fedavg]\n')
    assert recipe_overrides.build(path).to_dict()["algorithm"] == {"name": "fedsam", "rho": 0.07}
    assert recipe_overrides.build(path, [("algorithm.name", "fedavg")]).to_dict()["algorithm"] == {
        "name": "fedavg"}
    # a plain [algorithm] key wins over the per-algorithm table
    assert recipe_overrides.build(path, [("algorithm.rho", 0.2)]).algorithm.options["rho"] == 0.2


def test_sweep_is_the_product_of_its_axes_in_order(tmp_path):
    path = tmp_path / "r.toml"
    path.write_text('[sweep]\n"algorithm.name" = ["fedavg", "fedsam"]\n"partition.alpha" = [0.6, 0.1]\n'
                    '[algorithm.fedsam]\nrho = 0.05\n')
    runs = recipe_overrides.build_sweep(path)
    assert [(r.algorithm.name, r.partition.options["alpha"]) for r, _ in runs] == [
        ("fedavg", 0.6), ("fedavg", 0.1), ("fedsam", 0.6), ("fedsam", 0.1)]
    assert runs[3][0].algorithm.options["rho"] == 0.05 and runs[3][1] == {"algorithm.name": "fedsam", "partition.alpha": 0.1}
    # an override replaces the axis; extra axes (comma lists on the command line) are added
    runs = recipe_overrides.build_sweep(path, [("partition.alpha", 0.3)], {"seed": [0, 1]})
    assert [(r.algorithm.name, r.partition.options["alpha"], r.seed) for r, _ in runs] == [
        ("fedavg", 0.3, 0), ("fedavg", 0.3, 1), ("fedsam", 0.3, 0), ("fedsam", 0.3, 1)]
    with pytest.raises(LandscapeError, match="a sweep of 4 runs"):
        recipe_overrides.build(path)


def test_sweep_run_names_are_systematic_and_show_extra_axes():
    runs = recipe_overrides.build_sweep(None, [], {"train.lr": [0.1, 0.05], "algorithm.name": ["fedavg"]})
    names = [recipe_overrides.sweep_run_name(r, swept) for r, swept in runs]
    assert names == ["digits-fedavg-dirr0.1-cnn-c20-s0-lr0.1",
                     "digits-fedavg-dirr0.1-cnn-c20-s0-lr0.05"]


def test_bad_sweep_axis():
    with pytest.raises(LandscapeError, match="must be a non-empty list"):
        recipe_overrides.build_sweep(None, [], {"seed": []})


# ----------------------------------------------------------------------------------------------------------
# ranges and choices come from the settings' annotations (landscape.core.schema), generated from the fields


def _ruled_fields(cls):
    """(field, kind, its FieldInfo) for every field of ``cls`` annotated with a ``rule``."""
    hints = typing.get_type_hints(cls, include_extras=True)
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if typing.get_origin(hint) is typing.Annotated:
            for info in hint.__metadata__:
                yield f.name, typing.get_args(hint)[0], info


def _outside(kind, info):
    """A value just outside each bound of a rule, and the bound value itself when the bound is inclusive."""
    step = 1 if kind is int else 0.5
    for bound in info.metadata:
        for attr, sign, inclusive in (("ge", -1, True), ("gt", 0, False), ("le", 1, True), ("lt", 0, False)):
            if hasattr(bound, attr):
                edge = kind(getattr(bound, attr))
                yield kind(edge + sign * step), edge if inclusive else None


def _cases(cls, where):
    return [(f"{where}.{name}" if where else name, value, edge, info)
            for name, kind, info in _ruled_fields(cls) for value, edge in _outside(kind, info)]


TRAIN_CASES = _cases(TrainSettings, "train") + _cases(PartitionSettings, "partition") + _cases(TopLevelSettings, "")


def test_the_ranges_are_declared_on_the_settings():
    ruled = {key.split(".")[-1] for key, *_ in TRAIN_CASES}
    assert len(ruled) >= 17 and {"threads", "participation", "swa_start", "clients", "seed"} <= ruled


@pytest.mark.parametrize("key, value, edge, info", TRAIN_CASES, ids=[f"{c[0]}={c[1]}" for c in TRAIN_CASES])
def test_every_range_refuses_a_value_outside_it_in_one_line_naming_the_key(key, value, edge, info):
    with pytest.raises(LandscapeError) as err:
        recipe_overrides.build(None, [(key, value)])
    message = str(err.value)
    assert message.startswith(f"{key} must ") and message.endswith(f"(got {value!r})") and "\n" not in message
    for words in (info.description, info.title):  # the rule's own words ("(0: every core)") are kept
        assert words is None or words in message
    if edge is not None:  # an inclusive bound is itself allowed
        assert recipe_overrides.build(None, [(key, edge)]).get(key) == edge


def _algorithm_cases():
    from landscape.train.algorithms import ALGORITHMS

    return [(entry.name, key.split(".")[-1], value) for entry in ALGORITHMS.entries() if entry.options
            for key, value, _, _ in _cases(entry.options, "algorithm")]


ALGORITHM_CASES = _algorithm_cases()


@pytest.mark.parametrize("name, key, value", ALGORITHM_CASES, ids=[f"{c[0]}.{c[1]}={c[2]}" for c in ALGORITHM_CASES])
def test_every_algorithm_option_range_comes_from_its_options_dataclass(name, key, value):
    with pytest.raises(LandscapeError) as err:
        recipe_overrides.build(None, [("algorithm.name", name), (f"algorithm.{key}", value)])
    assert str(err.value).startswith(f"algorithm.{key} must ") and str(err.value).endswith(f"(got {value!r})")
    with pytest.raises(LandscapeError) as err:  # a [algorithm.<name>] table names its own key
        recipe_overrides.build(None, [(f"algorithm.{name}.{key}", value)])
    assert str(err.value).startswith(f"algorithm.{name}.{key} must ")


def test_there_are_algorithm_option_ranges():
    assert len({(name, key) for name, key, _ in ALGORITHM_CASES}) >= 20


@pytest.mark.parametrize("field", ["lr_schedule", "dtype", "precision"])
def test_choices_come_from_the_literal_annotations(field):
    allowed = schema.choices(TrainSettings, field)
    assert allowed == {"lr_schedule": recipe_sections.LR_SCHEDULES, "dtype": recipe_sections.DTYPES,
                       "precision": recipe_sections.PRECISIONS}[field]
    with pytest.raises(LandscapeError) as err:
        recipe_overrides.build(None, [(f"train.{field}", "nope")])
    assert str(err.value) == f"train.{field} must be one of {', '.join(allowed)} (got 'nope')"
    for value in allowed:
        assert recipe_overrides.build(None, [(f"train.{field}", value)]).get(f"train.{field}") == value


def test_bf16_with_float64_is_refused_in_one_line():
    assert recipe_overrides.build(None, [("train.precision", "bf16")]).train.precision == "bf16"
    with pytest.raises(LandscapeError, match='train.precision = "bf16" autocasts a float32 model'):
        recipe_overrides.build(None, [("train.precision", "bf16"), ("train.dtype", "float64")])


def test_an_entry_choice_comes_from_its_options_literal():
    with pytest.raises(LandscapeError) as err:
        recipe_overrides.build(None, [("algorithm.name", "fednsam-code"), ("algorithm.server", "latest")])
    assert str(err.value) == "algorithm.server must be one of momentum, latest-revision (got 'latest')"


@pytest.mark.parametrize("overrides, message", [
    ([("imports", "mylab")], "imports must be a list (got 'mylab')"),
    ([("imports", [3])], "imports[0] must be a string (got 3)"),
    ([("name", 3)], "name must be a string (got 3)"),
    ([("model.name", "mlp"), ("model.hidden", [8, "x"])], "model.hidden[1] must be an integer (got 'x')"),
    ([("model.name", "mlp"), ("model.hidden", 8)], "model.hidden must be a list (got 8)"),
    ([("model.name", "mlp"), ("model.hidden", [8, 0])], "mlp option 'hidden' must be a positive integer, got 0"),
    ([("algorithm.name", "dynsam"), ("algorithm.rho_max", 0.0001)],
     "algorithm.rho_max must be >= rho_min (0.001) (got 0.0001)"),  # a check across keys stays in __post_init__
    ([("train.lr", float("nan"))], "train.lr must be finite (got nan)"),
    ([("train.device", 1)], "train.device must be a string (got 1)"),
    ([("train.lr", {"x": 1})], "recipe key 'train.lr' is a value, not a table: set train.lr=VALUE"),
    ([("train.foo.x", 1)], "unknown recipe key 'train.foo'; allowed in [train]: rounds"),
    ([("partition.clients.x", 1)], "recipe key 'partition.clients' is a value, not a table"),
    ([("algorithm.fedavg.rho", 1)], "unknown recipe key 'algorithm.fedavg.rho'; allowed in [algorithm.fedavg]: "),
])
def test_kinds_and_tables_are_refused_in_one_line(overrides, message):
    with pytest.raises(LandscapeError) as err:
        recipe_overrides.build(None, overrides)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_help_defaults_are_read_from_the_fields_at_each_call(monkeypatch):
    monkeypatch.setattr(TrainSettings.__dataclass_fields__["lr"], "default", 0.37)
    assert recipes.resolve({}).train.lr == 0.37


# ----------------------------------------------------------------------------------------------------------
# recipe.toml: written by tomli-w; the recipe.toml of a run written before (arrays inline) reads the same


def _written_before(recipe) -> str:
    """recipe.toml as the hand-written writer wrote it: ``key = value`` lines, arrays inline, a blank line and
    ``[section]`` before each table (JSON spells these values as TOML does)."""
    tables = recipe.to_dict()
    lines = [f"{k} = {json.dumps(v)}" for k, v in tables.items() if not isinstance(v, dict)]
    for k, v in tables.items():
        if isinstance(v, dict):
            lines += ["", f"[{k}]"] + [f"{kk} = {json.dumps(vv)}" for kk, vv in v.items()]
    return "\n".join(lines) + "\n"


def test_a_recipe_toml_written_before_reads_and_compares_the_same(tmp_path):
    recipe = recipe_overrides.build(None, [("model.name", "mlp"), ("model.hidden", [7, 5]), ("train.lr", 1e-05),
                                           ("algorithm.name", "fedsam"), ("name", "old")])
    before = _written_before(recipe)
    assert "hidden = [7, 5]" in before and before != recipes.to_toml(recipe)
    assert recipes.difference(before, recipe) is None
    (tmp_path / "recipe.toml").write_text(before)
    assert recipes.read_recipe(tmp_path / "recipe.toml") == recipe
    assert recipes.difference(before, recipe.with_values({"model.hidden": [7]})) == (
        "model.hidden is [7, 5] there, [7] in recipe.toml")


def test_to_toml_is_tomli_w_and_refuses_none():
    recipe = recipe_overrides.build(None, [("model.name", "mlp")])
    text = recipes.to_toml(recipe)
    assert text == schema.dump_toml(recipe.to_dict()) and 'name = "mlp"' in text.splitlines()
    assert recipes.tomllib.loads(text) == recipe.to_dict()
    with pytest.raises(TypeError):
        recipes.to_toml({"v": None})
    with pytest.raises(TypeError):
        recipes.to_toml({"t": {"v": [1, None]}})


@pytest.mark.parametrize("value, text", [
    ([200, 200], "[200, 200]"), ((0.01, 0.05), "[0.01, 0.05]"), (True, "true"), ('say "x"', '"say \\"x\\""'),
    (1e-3, "0.001"), (float("inf"), "inf"), ([], "[]"),
])
def test_toml_value_is_one_line(value, text):
    assert recipes.toml_value(value) == text
    assert recipes.tomllib.loads(f"v = {text}")["v"] == (list(value) if isinstance(value, tuple) else value)
