"""Data sets held in memory as tensors, registered by name: ``ArrayDataset``, ``DatasetBundle`` and the
``DATASETS`` registry, looked up by ``load_dataset``, which gives the inputs in the dtype asked for (the run's
``train.dtype``) cast once from the source's precision: float64 for the data sets made in float64 (`digits`,
`synthetic`, `mnist1d`), so that a float64 run never sees inputs rounded to float32; float32 for the image
sets (uint8 pixels normalised in float32, as torchvision's transforms do).

The data sets themselves register from their modules, which the package imports (so the registry is
complete wherever it is read): ``builtin_sets`` (`digits`, `synthetic`, `mnist1d`: no files),
``torchvision_sets`` (`mnist`, `fashion-mnist`, `cifar10`, `cifar100`: files in torchvision's layout) and
``leaf_sets`` (`femnist`: LEAF's JSON files, one client per writer).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from landscape.core.errors import LandscapeError
from landscape.core.reading import first_line
from landscape.core.registry import Registry

Augmentation = Callable[[torch.Tensor, torch.Generator], torch.Tensor]


@dataclass(frozen=True)
class ArrayDataset:
    """A whole data set in memory: x float32 or float64 (images [N, C, H, W], signals [N, C, L], features
    [N, D]), y int64."""

    x: torch.Tensor
    y: torch.Tensor

    def __len__(self) -> int:
        return int(self.y.shape[0])

    def subset(self, indices: Any) -> ArrayDataset:
        """The samples at `indices` (an int array, list or tensor), in that order."""
        if isinstance(indices, torch.Tensor):
            index = indices.long()
        else:
            index = torch.as_tensor(np.asarray(indices, dtype=np.int64))
        return ArrayDataset(self.x[index], self.y[index])


@dataclass(frozen=True)
class DatasetBundle:
    name: str
    train: ArrayDataset
    test: ArrayDataset
    num_classes: int
    input_shape: tuple[int, ...]  # (C, H, W), (C, L) or (D,)
    augmentation: Augmentation | None  # for training batches only; None when off or not applicable
    natural_partition: list[np.ndarray] | None  # per-client train indices when the data set has its own clients


DATASETS = Registry("dataset")


def load_dataset(
    name: str, *, root: str | Path, download: bool, augment: bool, num_clients: int, seed: int, options: dict,
    dtype: torch.dtype = torch.float32,
) -> DatasetBundle:
    """Build data set `name` with recipe `options` (unknown keys and bad values are a LandscapeError), its
    inputs cast once to ``dtype`` from the precision the data set was made in (``make_bundle``)."""
    entry = DATASETS.get(name)
    opts = entry.make_options(dict(options or {}), "dataset")
    with warnings.catch_warnings(record=True) as caught:  # numpy's overflow warnings, explained or passed on
        warnings.simplefilter("always")
        bundle = entry.factory(Path(root), download, augment, num_clients, seed, opts)
        bundle = dataclasses.replace(bundle, train=ArrayDataset(bundle.train.x.to(dtype), bundle.train.y),
                                     test=ArrayDataset(bundle.test.x.to(dtype), bundle.test.y))
    problem = _non_finite_inputs(bundle, dtype)
    if problem:
        changed = {k: v for k, v in (dataclasses.asdict(opts) if opts is not None else {}).items()
                   if entry.option_defaults().get(k) != v}
        scales = {k: v for k, v in changed.items() if isinstance(v, float)}  # alpha, beta: not sizes or names
        changed = scales or changed
        setting = ", ".join(f"dataset.{k}={v:g}" if isinstance(v, float) else f"dataset.{k}={v!r}"
                            for k, v in changed.items())
        numpy = next((first_line(w.message) for w in caught if issubclass(w.category, RuntimeWarning)), "")
        raise LandscapeError(
            f"data set {name}" + (f" with {setting}" if setting else "") + f": {problem}"
            + (f" (numpy: {numpy})" if numpy else "") + "; training on it diverges whatever train.lr is: "
            + ("choose smaller values of " + ", ".join(f"dataset.{k}" for k in changed) if changed
               else "the data set's files hold such values"))
    for w in caught:  # nothing wrong with the inputs: the warnings are the factory's to give
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)
    return bundle


def _non_finite_inputs(bundle: DatasetBundle, dtype: torch.dtype) -> str:
    """'' when every input of the bundle is finite in ``dtype`` (the run's), else what is not: how many values
    of the training / test inputs are NaN or inf there (they overflow it where the source held them finite)."""
    for split, x in (("training", bundle.train.x), ("test", bundle.test.x)):
        if not x.is_floating_point() or bool(torch.isfinite(x.sum(dtype=torch.float64))):
            continue  # a finite sum: every value is finite (fast); else count them
        bad = int((~torch.isfinite(x)).sum())
        if bad:
            return (f"{bad:,} of its {x.numel():,} {split} input values are not finite in {str(dtype).split('.')[-1]} "
                    f"(NaN or inf; the largest finite value there is {torch.finfo(dtype).max:.3g})")
    return ""


def dataset_option_defaults(name: str) -> dict[str, Any]:
    return DATASETS.get(name).option_defaults()


def require(ok: bool, message: str) -> None:
    """A LandscapeError with ``message`` unless ``ok`` (the data sets' checks of their options)."""
    if not ok:
        raise LandscapeError(message)


def make_bundle(name: str, x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray, y_test: np.ndarray,
                num_classes: int, augmentation: Augmentation | None = None,
                natural_partition: list[np.ndarray] | None = None) -> DatasetBundle:
    """A bundle of numpy arrays as tensors (labels int64; inputs float64 where x_train is float64, the
    source's precision, which ``load_dataset`` casts to the run's dtype; else float32); its input shape from
    x_train."""
    precision = np.float64 if x_train.dtype == np.float64 else np.float32

    def arrays(x: np.ndarray, y: np.ndarray) -> ArrayDataset:
        return ArrayDataset(torch.from_numpy(np.ascontiguousarray(x, dtype=precision)),
                            torch.from_numpy(np.asarray(y, dtype=np.int64)))

    return DatasetBundle(name=name, train=arrays(x_train, y_train), test=arrays(x_test, y_test),
                         num_classes=num_classes, input_shape=tuple(x_train.shape[1:]),
                         augmentation=augmentation, natural_partition=natural_partition)
