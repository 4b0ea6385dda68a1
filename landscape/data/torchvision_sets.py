"""The data sets read from files in the on-disk layout torchvision uses: `mnist`, `fashion-mnist`, `cifar10`
and `cifar100`, registered in ``datasets.DATASETS``.

Small readers of our own read them (IDX files; CIFAR python pickles through a restricted unpickler), and
CIFAR training batches can be augmented (``RandomCropFlip``). torchvision is used only to fetch missing files
when `download=True`.
"""

from __future__ import annotations

import gzip
import http.client
import importlib
import pickle
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from landscape.core.errors import LandscapeError
from landscape.data.datasets import DATASETS, DatasetBundle, make_bundle, require

# ---------------------------------------------------------------------------------------------------------
# Files in torchvision's layout. Normalisation constants are the usual per-channel mean / std.

MNIST_FILES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
               "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}


@dataclass(frozen=True)
class _ImageSource:
    name: str  # our data set name
    title: str  # the data set's own name, for messages
    torchvision_class: str  # only used to download
    folder: str  # under root
    train_files: tuple[str, ...]
    test_files: tuple[str, ...]
    num_classes: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    kind: str  # "IDX files" or "python batches"

    def path(self, root: Path, file: str) -> Path:
        return root / self.folder / file

    def missing(self, root: Path) -> list[Path]:
        def present(path: Path) -> bool:
            return path.is_file() or (self.kind == "IDX files" and path.with_name(path.name + ".gz").is_file())

        files = self.train_files + self.test_files
        return [self.path(root, f) for f in files if not present(self.path(root, f))]

    def normalise(self, images: np.ndarray) -> np.ndarray:
        """uint8 [N, C, H, W] -> float32 ((x / 255) - mean) / std per channel."""
        mean = np.asarray(self.mean, dtype=np.float32)[None, :, None, None]
        std = np.asarray(self.std, dtype=np.float32)[None, :, None, None]
        return (images.astype(np.float32) / 255.0 - mean) / std


SOURCES = {
    "mnist": _ImageSource("mnist", "MNIST", "MNIST", "MNIST/raw", MNIST_FILES["train"], MNIST_FILES["test"], 10,
                          (0.1307,), (0.3081,), "IDX files"),
    "fashion-mnist": _ImageSource("fashion-mnist", "Fashion-MNIST", "FashionMNIST", "FashionMNIST/raw",
                                  MNIST_FILES["train"], MNIST_FILES["test"], 10, (0.2860,), (0.3530,),
                                  "IDX files"),
    "cifar10": _ImageSource("cifar10", "CIFAR-10", "CIFAR10", "cifar-10-batches-py",
                            tuple(f"data_batch_{i}" for i in range(1, 6)), ("test_batch",), 10,
                            (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616), "python batches"),
    "cifar100": _ImageSource("cifar100", "CIFAR-100", "CIFAR100", "cifar-100-python", ("train",), ("test",), 100,
                             (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762), "python batches"),
}


def _ensure_files(source: _ImageSource, root: Path, download: bool) -> None:
    """Fetch missing files with torchvision when asked; otherwise say exactly which files are missing."""
    missing = source.missing(root)
    if not missing:
        return
    if not download:
        raise LandscapeError(
            f"{source.name}: missing {', '.join(str(p) for p in missing)} ({source.title} {source.kind}"
            f"{', .gz accepted' if source.kind == 'IDX files' else ''}); "
            "put the files there or pass --download where a network exists"
        )
    import torchvision.datasets

    try:
        # Downloads (and unpacks) train and test files into the layout read below.
        getattr(torchvision.datasets, source.torchvision_class)(str(root), train=True, download=True)
    except (OSError, RuntimeError, ValueError, EOFError, tarfile.TarError, http.client.HTTPException) as error:
        # network (URLError is an OSError), checksum and archive failures: report them in one line
        first_line = (str(error).strip().splitlines() or [""])[0]
        raise LandscapeError(
            f"{source.name}: download into {root} failed ({type(error).__name__}: {first_line})"
        ) from None
    still_missing = source.missing(root)
    require(not still_missing, f"{source.name}: download finished but {', '.join(map(str, still_missing))} "
                                "is still missing")


# IDX (LeCun's MNIST format): magic = 0x00 0x00 <type code> <number of dims>, then each dim as a big-endian
# int32, then the values. Images: 0x00000803 = 2051 (ubyte, 3 dims); labels: 0x00000801 = 2049 (ubyte, 1 dim).
IDX_UBYTE = 0x08


def read_idx(path: Path, ndim: int) -> np.ndarray:
    """Read an uncompressed IDX file, or `path`.gz when only that exists."""
    if not path.is_file():
        path = path.with_name(path.name + ".gz")
    try:
        data = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except (OSError, EOFError) as error:
        raise LandscapeError(f"malformed IDX file {path}: {error}") from None
    if len(data) < 4 + 4 * ndim:
        raise LandscapeError(f"malformed IDX file {path}: too short for its header")
    zero, type_code, dims_count = int.from_bytes(data[:2], "big"), data[2], data[3]
    if zero != 0 or type_code != IDX_UBYTE or dims_count != ndim:
        raise LandscapeError(
            f"malformed IDX file {path}: magic {int.from_bytes(data[:4], 'big')}, expected "
            f"{(IDX_UBYTE << 8) | ndim} (unsigned bytes, {ndim} dims)"
        )
    shape = tuple(int(d) for d in np.frombuffer(data, dtype=">i4", count=ndim, offset=4))
    body = data[4 + 4 * ndim:]
    if len(body) != int(np.prod(shape)):
        raise LandscapeError(f"malformed IDX file {path}: header says {shape} but holds {len(body)} bytes")
    return np.frombuffer(body, dtype=np.uint8).reshape(shape)


def _check_labels(labels: np.ndarray, num_classes: int, path: Path) -> None:
    if labels.ndim != 1 or (len(labels) and (labels.min() < 0 or labels.max() >= num_classes)):
        raise LandscapeError(f"malformed labels in {path}: values must lie in 0..{num_classes - 1}")


def _read_idx_pair(source: _ImageSource, root: Path, files: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    images_path, labels_path = (source.path(root, f) for f in files)
    images, labels = read_idx(images_path, 3), read_idx(labels_path, 1)
    require(len(images) == len(labels),
             f"malformed IDX files {images_path} and {labels_path}: {len(images)} images but {len(labels)} labels")
    _check_labels(labels, source.num_classes, labels_path)
    return images[:, None], labels.astype(np.int64)  # [N, 1, H, W]


# CIFAR python batches: a pickled dict with 'data' (uint8 [n, 3072], each row the 1024 red, then green, then
# blue values of a 32x32 image, row-major) and 'labels' (CIFAR-10) or 'fine_labels' (CIFAR-100). The real
# files are Python 2 pickles; encoding='latin1' turns their str keys into str and their array bytes back.


def _numpy_global(module: str, name: str) -> Any:
    # numpy 2 renamed numpy.core to numpy._core; resolve either spelling to whichever this numpy has.
    for candidate in (module.replace("numpy.core", "numpy._core"), module.replace("numpy._core", "numpy.core")):
        try:
            return getattr(importlib.import_module(candidate), name)
        except (ImportError, AttributeError):
            continue
    raise LandscapeError(f"numpy has no {module}.{name}")


class _ArrayUnpickler(pickle.Unpickler):
    """Rebuilds plain containers and numpy arrays only; any other global (code to run) is refused."""

    ALLOWED: ClassVar[set[tuple[str, str]]] = {
        ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
        ("numpy.core.numeric", "_frombuffer"), ("numpy._core.numeric", "_frombuffer"),  # pickle protocol 5
        ("numpy", "ndarray"), ("numpy", "dtype"),
    }

    def __init__(self, file: Any, path: Path) -> None:
        super().__init__(file, encoding="latin1")
        self.path = path

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in self.ALLOWED:
            raise LandscapeError(f"refusing to load {self.path}: it asks for {module}.{name}, not a numpy array")
        return _numpy_global(module, name)


def read_cifar_batch(path: Path, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """One CIFAR python batch -> (uint8 [n, 3, 32, 32], int64 labels [n])."""
    try:
        with open(path, "rb") as file:
            batch = _ArrayUnpickler(file, path).load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError, KeyError, AttributeError,
            OverflowError, OSError) as error:  # truncated, corrupt or not a pickle at all
        raise LandscapeError(f"malformed CIFAR batch {path}: {type(error).__name__}: {error}") from None
    if not isinstance(batch, dict):
        raise LandscapeError(f"malformed CIFAR batch {path}: expected a dict, got {type(batch).__name__}")
    batch = {k.decode("latin1") if isinstance(k, bytes) else k: v for k, v in batch.items()}
    data = batch.get("data")
    labels = batch.get("labels", batch.get("fine_labels"))
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
        raise LandscapeError(f"malformed CIFAR batch {path}: 'data' must be a uint8 array [n, 3072]")
    if labels is None or len(labels) != len(data):
        raise LandscapeError(f"malformed CIFAR batch {path}: needs 'labels' or 'fine_labels', one per row")
    try:
        labels = np.asarray(labels, dtype=np.int64)
    except (TypeError, ValueError):
        raise LandscapeError(f"malformed CIFAR batch {path}: labels must be integers") from None
    _check_labels(labels, num_classes, path)
    return data.reshape(-1, 3, 32, 32), labels


def _read_cifar(source: _ImageSource, root: Path, files: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    parts = [read_cifar_batch(source.path(root, f), source.num_classes) for f in files]
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


@dataclass(frozen=True)
class RandomCropFlip:
    """Random crop (same size, `padding` on each side) + random horizontal flip of a normalised batch.

    The standard CIFAR training augmentation. Padding uses `fill`, the value a zero pixel has after
    normalisation (-mean / std per channel), so it equals torchvision's pad-then-normalise.
    """

    fill: tuple[float, ...]
    padding: int = 4

    def __call__(self, batch: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        b, c, h, w = batch.shape
        p = self.padding
        fill = torch.tensor(self.fill, dtype=batch.dtype, device=batch.device)
        padded = fill.view(1, c, 1, 1).expand(b, c, h + 2 * p, w + 2 * p).clone()
        padded[:, :, p:p + h, p:p + w] = batch
        # Draw on the generator's device, then move: the same generator state gives the same crops anywhere.
        top = torch.randint(0, 2 * p + 1, (b,), generator=generator, device=generator.device).to(batch.device)
        left = torch.randint(0, 2 * p + 1, (b,), generator=generator, device=generator.device).to(batch.device)
        flip = (torch.rand(b, generator=generator, device=generator.device) < 0.5).to(batch.device)
        rows = top[:, None] + torch.arange(h, device=batch.device)  # [B, H]
        cols = left[:, None] + torch.arange(w, device=batch.device)  # [B, W]
        cols = torch.where(flip[:, None], cols.flip(1), cols)  # a flip reads the crop's columns backwards
        samples = torch.arange(b, device=batch.device)[:, None, None, None]
        channels = torch.arange(c, device=batch.device)[None, :, None, None]
        return padded[samples, channels, rows[:, None, :, None], cols[:, None, None, :]]


def _load_images(name: str, root: Path, download: bool, augment: bool) -> DatasetBundle:
    source = SOURCES[name]
    _ensure_files(source, root, download)
    read = _read_idx_pair if source.kind == "IDX files" else _read_cifar
    x_train, y_train = read(source, root, source.train_files)
    x_test, y_test = read(source, root, source.test_files)
    augmentation = None
    if augment and source.kind == "python batches":
        augmentation = RandomCropFlip(fill=tuple(-m / s for m, s in zip(source.mean, source.std)))
    return make_bundle(name, source.normalise(x_train), y_train, source.normalise(x_test), y_test,
                       num_classes=source.num_classes, augmentation=augmentation)


@DATASETS.register("mnist", summary="MNIST from <root>/MNIST/raw (IDX files)")
def load_mnist(root: Path, download: bool, augment: bool, num_clients: int, seed: int, opts: None) -> DatasetBundle:
    return _load_images("mnist", root, download, augment)


@DATASETS.register("fashion-mnist", summary="Fashion-MNIST from <root>/FashionMNIST/raw (IDX files)")
def load_fashion_mnist(root: Path, download: bool, augment: bool, num_clients: int, seed: int,
                       opts: None) -> DatasetBundle:
    return _load_images("fashion-mnist", root, download, augment)


@DATASETS.register("cifar10", summary="CIFAR-10 from <root>/cifar-10-batches-py (crop + flip when augmenting)")
def load_cifar10(root: Path, download: bool, augment: bool, num_clients: int, seed: int,
                 opts: None) -> DatasetBundle:
    return _load_images("cifar10", root, download, augment)


@DATASETS.register("cifar100", summary="CIFAR-100 from <root>/cifar-100-python (crop + flip when augmenting)")
def load_cifar100(root: Path, download: bool, augment: bool, num_clients: int, seed: int,
                  opts: None) -> DatasetBundle:
    return _load_images("cifar100", root, download, augment)
