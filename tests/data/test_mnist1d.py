"""MNIST-1D (Greydanus 2020), made offline by the mnist1d package's generator; the 1D cnn that fits it."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from landscape.cli import cli
from landscape.core.errors import LandscapeError
from landscape.data.builtin_sets import _mnist1d_arrays
from landscape.data.datasets import dataset_option_defaults, load_dataset
from landscape.models import build_model

pytest.importorskip("mnist1d", reason="the mnist1d package is not installed (pip install mnist1d); "
                                      "it is a main dependency, so these run in CI")

RECIPE = Path(__file__).resolve().parents[2] / "train" / "mnist1d-quick.toml"


def load(seed: int = 0, **options):
    return load_dataset("mnist1d", root="unused", download=False, augment=False, num_clients=20, seed=seed,
                        options=options)


@pytest.fixture(scope="module")
def bundle():
    return load()


def test_shapes_classes_and_types(bundle):
    assert bundle.name == "mnist1d" and bundle.num_classes == 10 and bundle.input_shape == (1, 40)
    assert bundle.train.x.shape == (4000, 1, 40) and bundle.test.x.shape == (1000, 1, 40)
    assert bundle.train.x.dtype == torch.float32 and bundle.train.y.dtype == torch.int64
    assert bundle.augmentation is None and bundle.natural_partition is None
    for split in (bundle.train, bundle.test):
        counts = torch.bincount(split.y, minlength=10)
        assert len(counts) == 10 and counts.min() >= 0.08 * len(split)  # 500 per class, shuffled, then split


def test_normalised_by_train_statistics(bundle):
    assert bundle.train.x.mean().item() == pytest.approx(0.0, abs=1e-5)
    assert bundle.train.x.std(unbiased=False).item() == pytest.approx(1.0, abs=1e-5)
    assert abs(bundle.test.x.mean().item()) < 0.05 and bundle.test.x.std().item() == pytest.approx(1.0, abs=0.05)


def test_is_the_packages_generator_output(bundle):
    from mnist1d.data import get_dataset_args, make_dataset

    state = np.random.get_state()
    raw = make_dataset(get_dataset_args())
    np.random.set_state(state)
    assert np.array_equal(raw["y"], bundle.train.y.numpy()) and np.array_equal(raw["y_test"], bundle.test.y.numpy())
    x, x_test = raw["x"], raw["x_test"]
    expected = (x - x.mean()) / x.std()
    np.testing.assert_allclose(bundle.train.x[:, 0].numpy(), expected, atol=1e-5)
    np.testing.assert_allclose(bundle.test.x[:, 0].numpy(), (x_test - x.mean()) / x.std(), atol=1e-5)

    # in float64 (a float64 run's): exactly the generator's float64 signals standardised in float64
    float64 = load_dataset("mnist1d", root="unused", download=False, augment=False, num_clients=20, seed=0,
                           options={}, dtype=torch.float64)
    assert np.array_equal(float64.train.x[:, 0].numpy(), expected)
    assert np.array_equal(float64.test.x[:, 0].numpy(), (x_test - x.mean()) / x.std())
    assert torch.equal(float64.train.x.float(), bundle.train.x)


def test_the_data_are_pinned(bundle):
    # numbers of mnist1d 0.0.2.post1 with its default seed 42: a release that generates other signals fails here
    assert torch.bincount(bundle.train.y).tolist() == [398, 396, 411, 394, 394, 402, 401, 404, 402, 398]
    assert torch.bincount(bundle.test.y).tolist() == [102, 104, 89, 106, 106, 98, 99, 96, 98, 102]
    assert bundle.train.y[:10].tolist() == [2, 6, 4, 5, 6, 6, 6, 0, 3, 1]
    np.testing.assert_allclose(bundle.train.x[0, 0, :4].tolist(), [-0.332464, -0.472698, -0.780208, -1.011797],
                               atol=1e-5)
    np.testing.assert_allclose(bundle.test.x[-1, 0, -2:].tolist(), [0.880128, 1.196289], atol=1e-5)
    assert bundle.train.x.abs().double().sum().item() == pytest.approx(118618.07, rel=1e-6)


def test_generation_is_deterministic_and_leaves_the_global_generators_alone(bundle):
    _mnist1d_arrays.cache_clear()  # generate again rather than reuse the first load's arrays
    np.random.seed(7)
    random.seed(7)
    again = load()
    assert np.random.rand() == np.random.RandomState(7).rand()
    assert random.random() == random.Random(7).random()
    assert torch.equal(bundle.train.x, again.train.x) and torch.equal(bundle.test.x, again.test.x)
    assert torch.equal(bundle.train.y, again.train.y) and torch.equal(bundle.test.y, again.test.y)


def test_the_data_seed_changes_the_data_and_the_recipe_seed_does_not(bundle):
    other = load(data_seed=43)
    assert not torch.equal(bundle.train.x, other.train.x) and not torch.equal(bundle.train.y, other.train.y)
    assert torch.equal(load(seed=5).train.x, bundle.train.x)  # the recipe seed splits clients, not the data


def test_loads_share_no_memory():
    first = load()
    x, y = first.train.x.clone(), first.train.y.clone()
    first.train.x.add_(1.0)
    first.train.y.zero_()
    second = load()
    assert torch.equal(second.train.x, x) and torch.equal(second.train.y, y)


def test_writes_no_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the package's get_dataset would write ./mnist1d_data.pkl here
    _mnist1d_arrays.cache_clear()
    load(data_seed=3)
    assert list(tmp_path.iterdir()) == []


def test_options_and_bad_values():
    assert dataset_option_defaults("mnist1d") == {"data_seed": 42}
    for bad in (-1, 2**32):
        with pytest.raises(LandscapeError, match=r"^dataset.data_seed must be an integer in 0\.\.4294967295 \(got"):
            load(data_seed=bad)
    for bad in (1.5, "x", True):  # not an integer: the schema's kind check comes first
        with pytest.raises(LandscapeError, match=r"^dataset.data_seed must be an integer \(got"):
            load(data_seed=bad)
    with pytest.raises(LandscapeError, match=r"unknown option 'dataset\.alpha'; allowed in \[dataset\]: data_seed"):
        load(alpha=1.0)


def test_missing_package_is_one_line(monkeypatch):
    _mnist1d_arrays.cache_clear()
    monkeypatch.setitem(sys.modules, "mnist1d.data", None)  # import mnist1d.data raises ImportError
    with pytest.raises(LandscapeError, match=r"mnist1d needs the mnist1d package \(pip install mnist1d\)") as info:
        load()
    assert "\n" not in str(info.value)


def test_models_on_signals(bundle):
    x = bundle.train.x[:3]
    for name, parameters in (("cnn", 89674), ("mlp", 50410)):
        torch.manual_seed(0)
        model = build_model(name, bundle.input_shape, 10)
        assert sum(p.numel() for p in model.parameters()) == parameters
        out = model(x)
        assert out.shape == (3, 10) and torch.isfinite(out).all()
    cnn = build_model("cnn", (1, 40), 10)
    assert isinstance(cnn.conv1, torch.nn.Conv1d) and isinstance(cnn.pool2, torch.nn.MaxPool1d)
    assert isinstance(build_model("cnn", (1, 8, 8), 10).conv1, torch.nn.Conv2d)  # images keep the 2D net
    with pytest.raises(LandscapeError, match=r"^cnn needs a signal at least 4 long \(two max-pools of 2\), got 3$"):
        build_model("cnn", (1, 3), 10)
    for name in ("lenet5", "resnet18"):
        with pytest.raises(LandscapeError, match=rf"^{name} needs image input \(C, H, W\), got input shape \(1, 40\)"):
            build_model(name, (1, 40), 10)


def test_train_two_rounds_from_the_cli(tmp_path):
    out = tmp_path / "run"
    args = ["train", "--dataset", "mnist1d", "--model", "cnn", "--partition", "dirichlet", "--alpha", "0.1",
            "--clients", "5", "--participation", "0.4", "--rounds", "2", "--local-steps", "3", "--device", "cpu",
            "--threads", "1", "--out", str(tmp_path), "--name", "run", "--quiet"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert f"run {out}: 2 rounds; test accuracy" in result.output
    assert 'name = "mnist1d"' in (out / "recipe.toml").read_text()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [1, 2]
    assert all(np.isfinite(r["train_loss"]) and 0.0 <= r["test_acc"] <= 1.0 for r in rows)
    part = json.loads((out / "partition.json").read_text())
    assert part["num_clients"] == 5


def test_recipe_plans_offline(tmp_path):
    result = CliRunner().invoke(cli, ["train", str(RECIPE), "--dry-run", "--out", str(tmp_path / "x")])
    assert result.exit_code == 0, result.output
    assert "mnist1d-fedavg-dirr0.1-cnn-c20-s0" in result.output
    assert not (tmp_path / "x").exists()
