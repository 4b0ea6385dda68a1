"""LEAF's FEMNIST and Shakespeare from tiny files in LEAF's real on-disk format (JSON under <name>/data/train and
<name>/data/test, as its preprocess.sh -t sample writes them): read back exactly, one client per writer (role)
through the natural partition, writers drawn by the seed, a one-round `landscape train` (Shakespeare with LEAF's
LSTM), one-line errors for bad files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from support.helpers import invoke
from support.leaf_files import LEAF_LETTERS, ROLES, WRITERS, write_femnist, write_shakespeare, writer_data

from landscape.core.errors import LandscapeError
from landscape.data.datasets import load_dataset
from landscape.data.leaf_sets import SHAKESPEARE_VOCABULARY
from landscape.data.partitions import make_partition


def load(root: Path, num_clients: int = len(WRITERS), seed: int = 0, download: bool = False):
    return load_dataset("femnist", root=root, download=download, augment=False, num_clients=num_clients,
                        seed=seed, options={})


def _images(samples: dict) -> torch.Tensor:
    return torch.tensor(samples["x"], dtype=torch.float32).reshape(-1, 1, 28, 28)


def test_all_writers_read_back_exactly_one_client_each(tmp_path):
    written = write_femnist(tmp_path)
    bundle = load(tmp_path)
    assert bundle.name == "femnist" and bundle.num_classes == 62 and bundle.input_shape == (1, 28, 28)
    assert bundle.train.x.dtype == torch.float32 and bundle.train.y.dtype == torch.int64
    assert len(bundle.train) == sum(n for n, _ in WRITERS.values())
    assert len(bundle.test) == sum(n for _, n in WRITERS.values())
    clients = make_partition("natural", bundle.train.y.numpy(), num_clients=len(WRITERS), num_classes=62, seed=0,
                             options={}, natural=bundle.natural_partition)
    # in file order, each client exactly one writer's samples, pixel for pixel
    for indices, user in zip(clients, WRITERS):
        part = bundle.train.subset(indices)
        assert torch.equal(part.x, _images(written["train"][user]))
        assert part.y.tolist() == written["train"][user]["y"]
    test_users = [u for u in WRITERS if u in written["test"]]
    assert torch.equal(bundle.test.x, torch.cat([_images(written["test"][u]) for u in test_users]))
    assert bundle.test.y.tolist() == sum((written["test"][u]["y"] for u in test_users), [])
    assert float(bundle.train.x.min()) >= 0.0 and float(bundle.train.x.max()) <= 1.0  # LEAF's values, as written


def test_partition_clients_draws_that_many_writers_by_the_seed(tmp_path):
    written = write_femnist(tmp_path)

    def chosen(seed: int) -> list[str]:
        bundle = load(tmp_path, num_clients=2, seed=seed)
        assert len(bundle.natural_partition) == 2
        found = []
        for indices in bundle.natural_partition:
            x = bundle.train.subset(indices).x
            found += [u for u, data in written["train"].items() if torch.equal(x, _images(data))]
        # the test set is these writers' test samples only
        held = [u for u in found if u in written["test"]]
        assert bundle.test.y.tolist() == sum((written["test"][u]["y"] for u in held), [])
        return found

    picks = [chosen(seed) for seed in range(6)]
    assert all(len(set(p)) == 2 for p in picks)
    assert chosen(3) == picks[3]  # the same seed, the same writers
    assert len({tuple(p) for p in picks}) > 1  # other seeds, other writers


def test_natural_partition_needs_as_many_clients_as_writers_drawn(tmp_path):
    write_femnist(tmp_path)
    bundle = load(tmp_path, num_clients=3)
    with pytest.raises(LandscapeError, match="the data set has 3 clients but num_clients is 4"):
        make_partition("natural", bundle.train.y.numpy(), num_clients=4, num_classes=62, seed=0, options={},
                       natural=bundle.natural_partition)
    # another partition splits the drawn writers' samples over the clients instead
    iid = make_partition("iid", bundle.train.y.numpy(), num_clients=3, num_classes=62, seed=0, options={},
                         natural=bundle.natural_partition)
    assert sorted(np.concatenate(iid).tolist()) == list(range(len(bundle.train)))


def test_more_clients_than_writers_is_one_line(tmp_path):
    write_femnist(tmp_path)
    with pytest.raises(LandscapeError) as error:
        load(tmp_path, num_clients=6)
    message = str(error.value)
    assert "\n" not in message and "6 clients asked for" in message and "holds 5 writers" in message
    assert str(tmp_path / "femnist" / "data" / "train") in message


def test_a_writer_without_training_samples_is_not_drawn(tmp_path):
    write_femnist(tmp_path)
    _rewrite(tmp_path / "femnist" / "data" / "train" / FIRST,
             lambda d: (d["users"].append("f0009_00"), d["num_samples"].append(0),
                        d["user_data"].update(f0009_00={"x": [], "y": []})))
    assert len(load(tmp_path).natural_partition) == len(WRITERS)
    with pytest.raises(LandscapeError, match=f"holds {len(WRITERS)} writers with training samples"):
        load(tmp_path, num_clients=len(WRITERS) + 1)


def test_missing_folder_or_files_name_the_path_and_what_is_expected(tmp_path):
    with pytest.raises(LandscapeError) as error:
        load(tmp_path)
    message = str(error.value)
    assert "\n" not in message and message.startswith("femnist: missing folder ")
    assert str(tmp_path / "femnist" / "data" / "train") in message and "femnist/data/test/*.json" in message
    (tmp_path / "femnist" / "data" / "train").mkdir(parents=True)
    with pytest.raises(LandscapeError, match=r"femnist: no \*\.json files in .*train"):
        load(tmp_path)
    write_femnist(tmp_path)
    for file in (tmp_path / "femnist" / "data" / "test").iterdir():
        file.unlink()
    with pytest.raises(LandscapeError, match=r"femnist: no \*\.json files in .*test"):
        load(tmp_path)


def test_download_is_refused_in_one_line(tmp_path):
    write_femnist(tmp_path)
    with pytest.raises(LandscapeError, match="femnist cannot be downloaded here: LEAF's"):
        load(tmp_path, download=True)


def _rewrite(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


FIRST = "all_data_0_niid_0_keep_0_train_9.json"
BAD_FILES = [
    (lambda d: None, "not json", "JSONDecodeError"),
    (lambda d: None, "[1, 2]", "expected a JSON object with users, num_samples and user_data, got list"),
    (lambda d: d.pop("users"), None, "'users' must be a list of names"),
    (lambda d: d["num_samples"].pop(), None, "'num_samples' must be a list with one count per user"),
    (lambda d: d.update(user_data=[]), None, "'user_data' must be an object with an entry per user"),
    (lambda d: d["user_data"].pop("f0001_41"), None, "user f0001_41 needs user_data entry"),
    (lambda d: d["num_samples"].__setitem__(0, 7), None, "user f0000_14: num_samples 7, 5 x and 5 y"),
    (lambda d: d["user_data"]["f0000_14"]["x"][1].pop(), None, "'x' must be a list of images of 784 numbers"),
    (lambda d: d["user_data"]["f0000_14"]["x"][1].__setitem__(3, 255), None, "pixel values must lie in [0, 1]"),
    (lambda d: d["user_data"]["f0000_14"]["y"].__setitem__(0, 62), None, "labels must lie in 0..61"),
    (lambda d: d["user_data"]["f0000_14"]["y"].__setitem__(0, 1.5), None, "'y' must be a list of integer labels"),
]


@pytest.mark.parametrize("change, text, expected", BAD_FILES)
def test_malformed_files_are_one_line_naming_the_file(tmp_path, change, text, expected):
    write_femnist(tmp_path)
    path = tmp_path / "femnist" / "data" / "train" / FIRST
    if text is None:
        _rewrite(path, change)
    else:
        path.write_text(text)
    with pytest.raises(LandscapeError) as error:
        load(tmp_path)
    message = str(error.value)
    assert "\n" not in message and message.startswith(f"malformed LEAF file {path}: ") and expected in message


def test_a_writer_in_two_files_is_named(tmp_path):
    write_femnist(tmp_path)
    folder = tmp_path / "femnist" / "data" / "train"
    _rewrite(folder / "all_data_1_niid_0_keep_0_train_9.json",
             lambda d: (d["users"].append("f0000_14"), d["num_samples"].append(1),
                        d["user_data"].update(f0000_14=writer_data(0, 1, 0))))
    with pytest.raises(LandscapeError, match=r"femnist: user f0000_14 appears in both .*all_data_0.* and "
                                             r".*all_data_1"):
        load(tmp_path)


def test_a_split_by_writer_has_no_test_samples_for_the_drawn_writers(tmp_path):
    """LEAF's -t user puts whole writers in the test files: none of the training writers is there."""
    write_femnist(tmp_path, {"a": (3, 0), "b": (2, 0), "c": (0, 4)})
    with pytest.raises(LandscapeError, match=r"none of the 2 chosen writers has samples in .*test; .*-t sample"):
        load(tmp_path, num_clients=2)


def test_one_round_of_training_on_the_writers(tmp_path):
    write_femnist(tmp_path / "data")
    out = tmp_path / "run"
    result = invoke("train", "--dataset", "femnist", "--data-root", tmp_path / "data", "--partition", "natural",
                    "--clients", "4", "--participation", "0.5", "--rounds", "1", "--local-steps", "1",
                    "--batch-size", "2", "--device", "cpu", "--quiet", "--out", tmp_path, "--name", "run")
    assert result.exit_code == 0, result.output
    assert (out / "checkpoints" / "round-0001.pt").is_file()
    partition = json.loads((out / "partition.json").read_text())
    sizes = sorted(len(c) for c in partition["clients"])
    assert len(sizes) == 4 and set(sizes) <= {n for n, _ in WRITERS.values()}
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert metrics[-1]["round"] == 1 and np.isfinite(metrics[-1]["test_loss"])


def test_train_without_the_files_is_one_line(tmp_path):
    out = tmp_path / "run"
    result = invoke("train", "--dataset", "femnist", "--data-root", tmp_path / "data", "--partition", "natural",
                    "--clients", "4", "--rounds", "1", "--device", "cpu", "--out", tmp_path, "--name", "run")
    assert result.exit_code != 0
    line = result.output.strip()
    assert len(line.splitlines()) == 1 and line.startswith("error: femnist: missing folder ")
    assert str(tmp_path / "data" / "femnist" / "data" / "train") in line and not out.exists()


SPELLINGS = ["1.0", "1", "0.5843137254901961", "5.843137254901961e-1", "58.43137254901961E-2", "0.0", "-0.0", "0",
             "1e-320", "0.1000000000000000055511151231257827", "0.30000000000000004", "3e-1", "0.3"]


@pytest.mark.parametrize("texts_kept", [1 << 16, 3])
def test_pixels_are_the_numbers_json_reads_whatever_their_spelling(tmp_path, monkeypatch, texts_kept):
    """Each float's text is converted once per file (and, past the limit of texts kept, again each time): the
    images are exactly those of the numbers json.loads reads, float32 as numpy casts them."""
    from landscape.data import leaf_sets

    monkeypatch.setattr(leaf_sets, "_FLOAT_TEXTS", texts_kept)
    rng = np.random.default_rng(5)
    rows = [", ".join(rng.choice(SPELLINGS, size=784)) for _ in range(6)]
    folder = tmp_path / "femnist" / "data"
    for split, users in (("train", ["a", "b"]), ("test", ["a"])):
        (folder / split).mkdir(parents=True)
        data = {u: f'{{"x": [{", ".join(f"[{r}]" for r in rows[3 * i:3 * i + 3])}], "y": [1, 2, 61]}}'
                for i, u in enumerate(users)}
        body = (f'{{"users": {json.dumps(users)}, "num_samples": {json.dumps([3] * len(users))}, "user_data": '
                f'{{{", ".join(f"{json.dumps(u)}: {d}" for u, d in data.items())}}}}}')
        (folder / split / f"all_data_0_{split}.json").write_text(body)
    bundle = load(tmp_path, num_clients=2)
    expected = np.asarray(json.loads("[" + ", ".join(f"[{r}]" for r in rows) + "]"), dtype=np.float32)
    assert np.array_equal(bundle.train.x.numpy().reshape(6, 784), expected)
    assert np.array_equal(np.signbit(bundle.train.x.numpy().reshape(6, 784)), np.signbit(expected))  # -0.0 too
    assert np.array_equal(bundle.test.x.numpy().reshape(3, 784), expected[:3])


# ---------------------------------------------------------------------------------------------------------
# shakespeare


def test_shakespeare_reads_characters_as_leaf_s_indices_one_client_per_role(tmp_path):
    written = write_shakespeare(tmp_path)
    bundle = load_dataset("shakespeare", root=tmp_path, download=False, augment=False, num_clients=len(ROLES),
                          seed=0, options={})
    assert bundle.num_classes == 80 and bundle.input_shape == (80,)
    assert len(bundle.train) == sum(n for n, _ in ROLES.values())
    for indices, role in zip(bundle.natural_partition, ROLES):
        part = bundle.train.subset(indices)
        assert [[LEAF_LETTERS[int(i)] for i in row] for row in part.x] == [list(s) for s in written["train"][role]["x"]]
        assert [LEAF_LETTERS[int(i)] for i in part.y] == written["train"][role]["y"]
    assert "".join(LEAF_LETTERS[int(i)] for i in bundle.test.y) == "".join(
        "".join(written["test"][role]["y"]) for role in ROLES)
    # LEAF's word_to_indices: the index of each character in its vocabulary
    assert SHAKESPEARE_VOCABULARY == LEAF_LETTERS and bundle.train.x.max() <= 79 and bundle.train.x.min() >= 0


@pytest.mark.parametrize("change, expected", [
    (lambda d: d["x"].__setitem__(0, d["x"][0][:79]), "'x' must be a list of 80-character strings"),
    (lambda d: d["y"].__setitem__(0, "ab"), "'y' must be a list of single characters"),
    (lambda d: d["x"].__setitem__(0, "~" + d["x"][0][1:]), "character '~' is not in LEAF's 80-character vocabulary"),
])
def test_shakespeare_bad_samples_are_one_line(tmp_path, change, expected):
    write_shakespeare(tmp_path)
    path = tmp_path / "shakespeare" / "data" / "train" / "all_data_niid_0_keep_0_train_8.json"
    _rewrite(path, lambda d: change(d["user_data"]["THE_TEMPEST_ARIEL"]))
    with pytest.raises(LandscapeError) as error:
        load_dataset("shakespeare", root=tmp_path, download=False, augment=False, num_clients=3, seed=0, options={})
    message = str(error.value)
    assert "\n" not in message and message.startswith(f"malformed LEAF file {path}: user THE_TEMPEST_ARIEL: ")
    assert expected in message


def test_one_round_of_leaf_s_lstm_on_the_roles(tmp_path):
    write_shakespeare(tmp_path / "data")
    out = tmp_path / "run"
    result = invoke("train", "--dataset", "shakespeare", "--model", "stacked-lstm", "--set", "model.hidden=16",
                    "--data-root", tmp_path / "data", "--partition", "natural", "--clients", "3",
                    "--participation", "1", "--rounds", "1", "--local-steps", "2", "--batch-size", "2",
                    "--device", "cpu", "--quiet", "--out", tmp_path, "--name", "run")
    assert result.exit_code == 0, result.output
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert metrics[-1]["round"] == 1 and np.isfinite(metrics[-1]["test_loss"])
    assert 0.0 <= metrics[-1]["test_acc"] <= 1.0


def test_leaf_s_lstm_trains_the_roles_together_as_one_after_another(tmp_path):
    """train.vectorize = on (the round's clients vmapped through the written-out LSTM) gives the sequential
    loop's global model to 1e-9 relative in float64."""
    from landscape.store.checkpoints import load_checkpoint

    write_shakespeare(tmp_path / "data")
    models = {}
    for vectorize in ("on", "off"):
        out = tmp_path / vectorize
        result = invoke("train", "--dataset", "shakespeare", "--model", "stacked-lstm", "--set", "model.hidden=8",
                        "--set", "train.dtype=float64", "--set", f"train.vectorize={vectorize}",
                        "--data-root", tmp_path / "data", "--partition", "natural", "--clients", "5",
                        "--participation", "1", "--rounds", "1", "--local-steps", "2", "--batch-size", "2",
                        "--device", "cpu", "--quiet", "--out", tmp_path, "--name", vectorize)
        assert result.exit_code == 0, result.output
        checkpoint = load_checkpoint(out / "checkpoints" / "round-0001.pt")
        assert checkpoint["vectorized"]["used"] == (vectorize == "on")
        models[vectorize] = checkpoint["model"]
    start = load_checkpoint(tmp_path / "off" / "checkpoints" / "round-0000.pt")["model"]
    assert models["on"].keys() == models["off"].keys() == start.keys()
    for name, expected in models["off"].items():
        got = models["on"][name]
        assert got.dtype == torch.float64
        assert float((got - expected).norm()) <= 1e-9 * float(expected.norm()), name
    # the round moved every tensor: the comparison is not of two untouched starts
    assert all(not torch.equal(models["off"][k], start[k]) for k in start)
