"""Data sets: digits, synthetic, and tiny files in torchvision's real on-disk formats."""

from __future__ import annotations

import gzip
import io
import os
import pickle
import struct
from pathlib import Path
from typing import ClassVar
from urllib.error import URLError

import numpy as np
import pytest
import torch
import torchvision.datasets

from landscape.core.errors import LandscapeError
from landscape.data.datasets import DATASETS, dataset_option_defaults, load_dataset


def load(name: str, root: Path | str = "unused", augment: bool = False, download: bool = False, seed: int = 0,
         num_clients: int = 10, **options):
    return load_dataset(name, root=root, download=download, augment=augment, num_clients=num_clients,
                        seed=seed, options=options)


# ---------------------------------------------------------------------------------------------------------
# digits


@pytest.fixture(scope="module")
def digits():
    return load("digits")


def test_digits_shapes_and_types(digits):
    assert digits.name == "digits" and digits.num_classes == 10 and digits.input_shape == (1, 8, 8)
    assert digits.train.x.shape == (1437, 1, 8, 8) and digits.test.x.shape == (360, 1, 8, 8)
    assert len(digits.train) == 1437 and len(digits.test) == 360
    assert digits.train.x.dtype == torch.float32 and digits.train.y.dtype == torch.int64
    assert digits.natural_partition is None


def test_digits_normalised_by_train_statistics(digits):
    assert digits.train.x.mean().item() == pytest.approx(0.0, abs=1e-5)
    assert digits.train.x.std(unbiased=False).item() == pytest.approx(1.0, abs=1e-5)
    # the pixels were 0..16; one affine map (the train mean / std) sends them all to the same 17 levels
    levels = torch.unique(torch.cat([digits.train.x.flatten(), digits.test.x.flatten()]))
    assert len(levels) == 17
    steps = levels.diff()
    assert torch.allclose(steps, steps[0].expand_as(steps), rtol=1e-4)


def test_digits_split_is_stratified_and_seeded(digits):
    train_counts = torch.bincount(digits.train.y, minlength=10)
    test_counts = torch.bincount(digits.test.y, minlength=10)
    share = test_counts.float() / (train_counts + test_counts).float()
    assert torch.all((share - 0.2).abs() < 0.02)
    again, other = load("digits"), load("digits", seed=1)
    assert torch.equal(digits.train.x, again.train.x) and torch.equal(digits.test.y, again.test.y)
    assert not torch.equal(digits.train.y, other.train.y)


def test_digits_has_no_augmentation_even_when_asked():
    assert load("digits", augment=True).augmentation is None


def test_digits_options(digits):
    assert dataset_option_defaults("digits") == {"test_fraction": 0.2}
    half = load("digits", test_fraction=0.5)
    assert abs(len(half.train) - len(half.test)) <= 1
    with pytest.raises(LandscapeError, match=r"dataset.test_fraction must be in \(0, 1\) \(got 1.5\)"):
        load("digits", test_fraction=1.5)
    with pytest.raises(LandscapeError, match=r"unknown option 'dataset\.alpha'; allowed in \[dataset\]: test_fraction"):
        load("digits", alpha=1.0)


def test_subset(digits):
    part = digits.train.subset(np.array([5, 0, 7]))
    assert torch.equal(part.x, digits.train.x[[5, 0, 7]]) and torch.equal(part.y, digits.train.y[[5, 0, 7]])
    from_tensor = digits.train.subset(torch.tensor([5, 0, 7]))
    assert torch.equal(from_tensor.x, part.x) and torch.equal(from_tensor.y, part.y)


def test_unknown_dataset():
    with pytest.raises(LandscapeError, match="unknown dataset 'svhn'; choose from: cifar10, cifar100, digits"):
        load("svhn")


# ---------------------------------------------------------------------------------------------------------
# synthetic (FedProx Synthetic(alpha, beta))


def test_synthetic_shapes_and_natural_partition():
    bundle = load("synthetic", num_clients=12)
    assert bundle.input_shape == (60,) and bundle.num_classes == 10
    assert bundle.train.x.dtype == torch.float32 and bundle.train.y.dtype == torch.int64
    assert bundle.test.x.shape[1] == 60
    natural = bundle.natural_partition
    assert natural is not None and len(natural) == 12
    np.testing.assert_array_equal(np.sort(np.concatenate(natural)), np.arange(len(bundle.train)))
    # every client has >= 50 samples in the reference law, int(0.9 n) of them for training
    assert min(len(c) for c in natural) >= 45
    assert 0.07 < len(bundle.test) / (len(bundle.train) + len(bundle.test)) < 0.12
    assert int(bundle.train.y.min()) >= 0 and int(bundle.train.y.max()) < 10


def test_inputs_come_in_the_dtype_asked_for_from_the_sources_precision():
    # synthetic is drawn in float64: a float64 load holds those values, a float32 load them rounded once
    float64 = load_dataset("synthetic", root="unused", download=False, augment=False, num_clients=3, seed=4,
                           options={}, dtype=torch.float64)
    float32 = load("synthetic", num_clients=3, seed=4)
    assert float64.train.x.dtype == float64.test.x.dtype == torch.float64
    assert torch.equal(float64.train.x.float(), float32.train.x) and torch.equal(float64.test.x.float(), float32.test.x)
    assert not torch.equal(float64.train.x.float().double(), float64.train.x)  # more precise than float32
    assert torch.equal(float64.train.y, float32.train.y)


def test_synthetic_is_seeded():
    first, again, other = load("synthetic", seed=5), load("synthetic", seed=5), load("synthetic", seed=6)
    assert torch.equal(first.train.x, again.train.x) and torch.equal(first.test.y, again.test.y)
    assert first.train.x.shape != other.train.x.shape or not torch.equal(first.train.x, other.train.x)


def test_synthetic_input_covariance_is_diag_j_pow_minus_1_2():
    # within one client x ~ N(v_k, Sigma) with Sigma_jj = j^-1.2: the per-coordinate variance decays that way
    bundle = load("synthetic", num_clients=4, seed=0, dimension=8, classes=3)
    natural = bundle.natural_partition
    assert natural is not None
    largest = max(natural, key=len)
    variance = bundle.train.x[largest].double().var(dim=0).numpy()
    expected = np.arange(1, 9) ** -1.2
    n = len(largest)
    assert n > 100
    np.testing.assert_allclose(variance, expected, rtol=6 / np.sqrt(n))  # sd of a variance estimate: sqrt(2/n)


def test_synthetic_options():
    assert dataset_option_defaults("synthetic") == {
        "alpha": 1.0, "beta": 1.0, "dimension": 60, "classes": 10, "test_fraction": 0.1,
    }
    small = load("synthetic", num_clients=3, dimension=5, classes=4)
    assert small.input_shape == (5,) and small.num_classes == 4 and int(small.train.y.max()) < 4


# ---------------------------------------------------------------------------------------------------------
# Tiny files in torchvision's on-disk layout

IDX_IMAGES_MAGIC, IDX_LABELS_MAGIC = 2051, 2049  # 0x00000803 / 0x00000801: unsigned bytes, 3 / 1 dims


def write_idx(path: Path, array: np.ndarray, magic: int, gz: bool = False) -> None:
    header = struct.pack(">I", magic) + b"".join(struct.pack(">I", d) for d in array.shape)
    data = header + array.astype(np.uint8).tobytes()
    path.parent.mkdir(parents=True, exist_ok=True)
    if gz:
        path.with_name(path.name + ".gz").write_bytes(gzip.compress(data))
    else:
        path.write_bytes(data)


def write_mnist(root: Path, folder: str, gz: bool = False, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    arrays = {
        "train-images-idx3-ubyte": rng.integers(0, 256, (5, 28, 28), dtype=np.uint8),
        "train-labels-idx1-ubyte": rng.integers(0, 10, 5, dtype=np.uint8),
        "t10k-images-idx3-ubyte": rng.integers(0, 256, (3, 28, 28), dtype=np.uint8),
        "t10k-labels-idx1-ubyte": rng.integers(0, 10, 3, dtype=np.uint8),
    }
    for name, array in arrays.items():
        magic = IDX_IMAGES_MAGIC if "images" in name else IDX_LABELS_MAGIC
        write_idx(root / folder / "raw" / name, array, magic, gz)
    return arrays


MNIST_LIKE = [("mnist", "MNIST", 0.1307, 0.3081), ("fashion-mnist", "FashionMNIST", 0.2860, 0.3530)]


@pytest.mark.parametrize(("name", "folder", "mean", "std"), MNIST_LIKE)
@pytest.mark.parametrize("gz", [False, True])
def test_idx_files_read_back_exactly(tmp_path, name, folder, mean, std, gz):
    arrays = write_mnist(tmp_path, folder, gz)
    bundle = load(name, tmp_path)
    assert bundle.input_shape == (1, 28, 28) and bundle.num_classes == 10 and bundle.augmentation is None
    for split, prefix in ((bundle.train, "train"), (bundle.test, "t10k")):
        pixels = (split.x[:, 0].double() * std + mean) * 255
        np.testing.assert_allclose(pixels.numpy(), arrays[f"{prefix}-images-idx3-ubyte"], atol=1e-3)
        np.testing.assert_array_equal(split.y.numpy(), arrays[f"{prefix}-labels-idx1-ubyte"])
    assert load(name, tmp_path, augment=True).augmentation is None  # no crop / flip for digits of MNIST


def cifar_batch(rng: np.random.Generator, n: int, classes: int, label_key: bytes) -> dict[bytes, object]:
    data = rng.integers(0, 256, (n, 3072), dtype=np.uint8)  # rows: 1024 R, 1024 G, 1024 B, each row-major
    batch = {b"batch_label": b"tiny batch", b"data": data, label_key: rng.integers(0, classes, n).tolist(),
             b"filenames": [b"img%d.png" % i for i in range(n)]}
    if label_key == b"fine_labels":
        batch[b"coarse_labels"] = [0] * n
    return batch


def write_cifar(root: Path, name: str, seed: int = 0, dump=pickle.dumps) -> tuple[list[dict], list[dict]]:
    rng = np.random.default_rng(seed)
    if name == "cifar10":
        folder, train_files, test_files, classes, key = (
            "cifar-10-batches-py", [f"data_batch_{i}" for i in range(1, 6)], ["test_batch"], 10, b"labels")
    else:
        folder, train_files, test_files, classes, key = "cifar-100-python", ["train"], ["test"], 100, b"fine_labels"
    (root / folder).mkdir(parents=True, exist_ok=True)
    batches = {f: cifar_batch(rng, 2 + i, classes, key) for i, f in enumerate(train_files + test_files)}
    for file, batch in batches.items():
        (root / folder / file).write_bytes(dump(batch))
    return [batches[f] for f in train_files], [batches[f] for f in test_files]


CIFAR = [("cifar10", (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616), b"labels", 10),
         ("cifar100", (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762), b"fine_labels", 100)]


def denormalise(x: torch.Tensor, mean: tuple, std: tuple) -> np.ndarray:
    m, s = torch.tensor(mean).view(1, 3, 1, 1), torch.tensor(std).view(1, 3, 1, 1)
    return ((x.double() * s.double() + m.double()) * 255).numpy()


@pytest.mark.parametrize(("name", "mean", "std", "key", "classes"), CIFAR)
def test_cifar_batches_read_back_exactly(tmp_path, name, mean, std, key, classes):
    train_batches, test_batches = write_cifar(tmp_path, name)
    bundle = load(name, tmp_path)
    assert bundle.input_shape == (3, 32, 32) and bundle.num_classes == classes
    for split, batches in ((bundle.train, train_batches), (bundle.test, test_batches)):
        data = np.concatenate([b[b"data"] for b in batches])
        labels = np.concatenate([b[key] for b in batches])
        np.testing.assert_allclose(denormalise(split.x, mean, std), data.reshape(-1, 3, 32, 32), atol=1e-3)
        np.testing.assert_array_equal(split.y.numpy(), labels)
    # channel c of image i is data[i, 1024 c : 1024 (c + 1)], row-major 32 x 32
    first = train_batches[0][b"data"][0]
    np.testing.assert_allclose(denormalise(bundle.train.x[:1], mean, std)[0, 2, 0, :],
                               first[2048:2080], atol=1e-3)


class _Py2Pickler(pickle._Pickler):
    """Writes bytes as Python 2 `str` opcodes (BINSTRING), as the real CIFAR batches (cPickle, Python 2) do."""

    dispatch: ClassVar[dict] = dict(pickle._Pickler.dispatch)

    def save_py2_str(self, obj: bytes) -> None:
        self.write(pickle.BINSTRING + struct.pack("<i", len(obj)) + obj)
        self.memoize(obj)

    dispatch[bytes] = save_py2_str


def py2_dumps(obj: object) -> bytes:
    buffer = io.BytesIO()
    _Py2Pickler(buffer, protocol=2).dump(obj)
    # Python 2 era numpy named its module numpy.core.multiarray
    return buffer.getvalue().replace(b"numpy._core.multiarray\n", b"numpy.core.multiarray\n")


def test_cifar_python2_pickles_read_like_the_real_files(tmp_path):
    train_batches, _ = write_cifar(tmp_path, "cifar10", dump=py2_dumps)
    raw = (tmp_path / "cifar-10-batches-py" / "data_batch_1").read_bytes()
    assert b"cnumpy.core.multiarray\n_reconstruct" in raw and pickle.BINSTRING + b"\x04\x00\x00\x00data" in raw
    bundle = load("cifar10", tmp_path)
    data = np.concatenate([b[b"data"] for b in train_batches]).reshape(-1, 3, 32, 32)
    np.testing.assert_allclose(denormalise(bundle.train.x, *CIFAR[0][1:3]), data, atol=1e-3)


def test_cifar_pickle_protocol_5_reads(tmp_path):
    train_batches, _ = write_cifar(tmp_path, "cifar100", dump=lambda b: pickle.dumps(b, protocol=5))
    bundle = load("cifar100", tmp_path)
    np.testing.assert_array_equal(bundle.train.y.numpy(), train_batches[0][b"fine_labels"])


class Payload:
    """Would create `marker` through os.system when unpickled by a plain pickle.load."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_malicious_cifar_pickle_is_refused_and_does_not_run(tmp_path):
    write_cifar(tmp_path, "cifar10")
    marker = tmp_path / "pwned"
    evil = {b"data": Payload(marker), b"labels": [0]}
    (tmp_path / "cifar-10-batches-py" / "data_batch_3").write_bytes(pickle.dumps(evil))
    with pytest.raises(LandscapeError, match=r"refusing to load .*data_batch_3: it asks for posix.system"):
        load("cifar10", tmp_path)
    assert not marker.exists()
    # the payload is live: an unrestricted unpickler does run it
    pickle.loads(pickle.dumps(Payload(tmp_path / "control")))
    assert (tmp_path / "control").exists()


@pytest.mark.parametrize("name", ["mnist", "fashion-mnist", "cifar10", "cifar100"])
def test_missing_files_name_the_path_and_download(tmp_path, name):
    expected = {"mnist": "MNIST/raw/train-images-idx3-ubyte",
                "fashion-mnist": "FashionMNIST/raw/t10k-labels-idx1-ubyte",
                "cifar10": "cifar-10-batches-py/data_batch_1", "cifar100": "cifar-100-python/train"}[name]
    with pytest.raises(LandscapeError) as error:
        load(name, tmp_path)
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(f"{name}: missing ")
    assert str(tmp_path / expected) in message and "pass --download where a network exists" in message


def test_only_the_missing_files_are_named(tmp_path):
    write_cifar(tmp_path, "cifar10")
    (tmp_path / "cifar-10-batches-py" / "test_batch").unlink()
    with pytest.raises(LandscapeError, match=r"cifar10: missing \S+/test_batch \(CIFAR-10 python batches\);"):
        load("cifar10", tmp_path)


def test_download_failure_is_one_line(tmp_path, monkeypatch):
    class Offline:
        def __init__(self, root, train, download):
            raise URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(torchvision.datasets, "CIFAR10", Offline)
    with pytest.raises(LandscapeError, match=r"cifar10: download into .* failed \(URLError: .*name resolution"):
        load("cifar10", tmp_path, download=True)


def test_download_fetches_with_torchvision_then_reads_our_way(tmp_path, monkeypatch):
    calls = []

    class FakeMNIST:  # stands in for torchvision.datasets.MNIST: puts the files in its layout
        def __init__(self, root, train, download):
            calls.append((root, train, download))
            write_mnist(Path(root), "MNIST", gz=True, seed=1)

    monkeypatch.setattr(torchvision.datasets, "MNIST", FakeMNIST)
    bundle = load("mnist", tmp_path, download=True)
    assert calls == [(str(tmp_path), True, True)] and len(bundle.train) == 5
    load("mnist", tmp_path, download=True)
    assert len(calls) == 1  # files present: no second fetch


def test_malformed_files_are_named(tmp_path):
    write_mnist(tmp_path, "MNIST")
    bad = tmp_path / "MNIST" / "raw" / "t10k-labels-idx1-ubyte"
    write_idx(bad, np.zeros(3, np.uint8), IDX_IMAGES_MAGIC)  # image magic on a 1-d label file
    with pytest.raises(LandscapeError, match=rf"malformed IDX file {bad}: magic 2051, expected 2049"):
        load("mnist", tmp_path)
    bad.write_bytes(struct.pack(">II", IDX_LABELS_MAGIC, 3) + b"\x01")  # header says 3 labels, holds 1
    with pytest.raises(LandscapeError, match=rf"malformed IDX file {bad}: header says \(3,\) but holds 1 bytes"):
        load("mnist", tmp_path)
    write_idx(bad, np.full(3, 12, np.uint8), IDX_LABELS_MAGIC)
    with pytest.raises(LandscapeError, match=rf"malformed labels in {bad}: values must lie in 0..9"):
        load("mnist", tmp_path)

    write_cifar(tmp_path, "cifar100")
    batch = tmp_path / "cifar-100-python" / "test"
    batch.write_bytes(b"not a pickle at all")
    with pytest.raises(LandscapeError, match=rf"malformed CIFAR batch {batch}"):
        load("cifar100", tmp_path)
    batch.write_bytes(pickle.dumps({b"data": np.zeros((2, 100), np.uint8), b"fine_labels": [0, 1]}))
    with pytest.raises(LandscapeError, match=rf"malformed CIFAR batch {batch}: 'data' must be a uint8 array"):
        load("cifar100", tmp_path)


# ---------------------------------------------------------------------------------------------------------
# CIFAR augmentation: random crop 32 (padding 4) + horizontal flip on normalised batches


@pytest.fixture()
def cifar10(tmp_path):
    write_cifar(tmp_path, "cifar10")
    return load("cifar10", tmp_path, augment=True)


def test_augmentation_only_when_asked(tmp_path):
    write_cifar(tmp_path, "cifar10")
    assert load("cifar10", tmp_path).augmentation is None
    assert load("cifar10", tmp_path, augment=True).augmentation is not None


def test_augmentation_is_deterministic_for_a_generator(cifar10):
    batch = cifar10.train.x
    augment = cifar10.augmentation
    first = augment(batch, torch.Generator().manual_seed(0))
    again = augment(batch, torch.Generator().manual_seed(0))
    other = augment(batch, torch.Generator().manual_seed(1))
    assert first.shape == batch.shape and first.dtype == batch.dtype
    assert torch.equal(first, again) and not torch.equal(first, other)


def test_augmentation_is_a_crop_of_the_zero_padded_image_maybe_flipped(cifar10):
    # Independent reference: pad the UNnormalised image with 0 (torchvision's pad), crop, flip, then normalise.
    mean, std = torch.tensor(CIFAR[0][1]).view(3, 1, 1), torch.tensor(CIFAR[0][2]).view(3, 1, 1)
    images = cifar10.train.x[:4].repeat(16, 1, 1, 1)  # 64 samples
    out = cifar10.augmentation(images, torch.Generator().manual_seed(3))
    seen = set()
    for image, result in zip(images, out):
        pixels = image * std + mean
        padded = (torch.nn.functional.pad(pixels, (4, 4, 4, 4), value=0.0) - mean) / std
        crops = {(top, left): padded[:, top:top + 32, left:left + 32] for top in range(9) for left in range(9)}
        matches = [(top, left, flip) for (top, left), crop in crops.items() for flip in (False, True)
                   if torch.allclose(result, crop.flip(-1) if flip else crop, atol=1e-5)]
        assert matches, "every output is a (possibly flipped) 32x32 crop of the padded image"
        seen.update(matches)
    assert {flip for _, _, flip in seen} == {False, True}
    assert len({(top, left) for top, left, _ in seen}) > 10
    assert any(top != 4 or left != 4 for top, left, _ in seen)


def test_augmentation_pads_with_the_normalised_zero_pixel(cifar10):
    mean, std = torch.tensor(CIFAR[0][1]), torch.tensor(CIFAR[0][2])
    white = ((1.0 - mean) / std).view(1, 3, 1, 1).expand(64, 3, 32, 32).contiguous()
    out = cifar10.augmentation(white, torch.Generator().manual_seed(0))
    zero = (-mean / std).view(1, 3, 1, 1).expand_as(out)
    is_padding = torch.isclose(out, zero)
    assert torch.all(is_padding | torch.isclose(out, white))
    assert is_padding.any() and (~is_padding).any()
    assert torch.all(is_padding.all(dim=1) == is_padding.any(dim=1))  # padding covers whole pixels


def test_every_registered_dataset_is_covered():
    # mnist1d is covered in tests/data/test_mnist1d.py, femnist and shakespeare in tests/data/test_leaf.py,
    # factory (a user's data functions) in tests/store/test_run_writer.py
    assert DATASETS.names() == ["cifar10", "cifar100", "digits", "factory", "fashion-mnist", "femnist", "mnist",
                                "mnist1d", "shakespeare", "synthetic"]
