import pytest

from landscape.config import recipe as recipes
from landscape.config import recipe_overrides
from landscape.core.errors import LandscapeError


def test_defaults_are_all_written_out():
    r = recipe_overrides.build()
    assert r.dataset.name == "digits"
    assert r.to_dict()["partition"] == {"name": "dirichlet", "clients": 20, "alpha": 0.1, "balanced": False, "min_samples": 2}
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
        ([("train.participation", 0)], "train.participation must be in (0, 1] (got 0.0)"),
        ([("train.lr_schedule", "step")], "train.lr_schedule must be one of constant, exponential, cosine"),
        ([("partition.clients", 0)], "partition.clients must be >= 1 (got 0)"),
        ([("dataset.name", "imagenet")], "unknown dataset 'imagenet'; choose from: cifar10, cifar100, digits"),
        ([("model.name", "vit")], "unknown model 'vit'; choose from: cnn, lenet5, mlp, resnet18"),
        ([("algorithm.name", "fedfoo")], "unknown algorithm 'fedfoo'; choose from: "),
        ([("partition.name", "zipf")], "unknown partition 'zipf'; choose from: dirichlet, dirichlet-client, iid, natural, pathological"),
        ([("seed", -1)], "seed must be in 0..4294967295 (got -1)"),
        ([("seed", 2**32)], "seed must be in 0..4294967295 (got 4294967296)"),
        ([("train", 3)], "recipe key 'train' is a table"),
        ([("a.b.c.d", 3)], "must be 'key', 'section.key' or 'section.<name>.key'"),
        ([("algorithm.fedsam.rhoo", 0.1)], "unknown recipe key 'algorithm.fedsam.rhoo'; allowed in [algorithm.fedsam]: rho"),
        ([("algorithm.fedfoo.rho", 0.1)], "unknown algorithm 'fedfoo'"),
        ([("algorithm.fedsam.rho", -1)], "algorithm.rho must be >= 0"),
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
    assert recipes.run_name(r) == "digits-fedavg-dir0.6-cnn-c20-s2"


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
    assert names == ["digits-fedavg-dir0.1-cnn-c20-s0-lr0.1", "digits-fedavg-dir0.1-cnn-c20-s0-lr0.05"]


def test_bad_sweep_axis():
    with pytest.raises(LandscapeError, match="must be a non-empty list"):
        recipe_overrides.build_sweep(None, [], {"seed": []})
