"""Data of the user's own, for runs recorded from a training loop of their own (``landscape.RunWriter``,
``landscape import``): the data set a factory makes (``[dataset] name = "factory"``) and the clients' shares of
it as recorded (``[partition] name = "recorded"``).

A data factory is ``package.module:function``, called with no arguments; it returns ``(inputs, targets)``
tensors, a map-style ``Dataset`` or a ``DataLoader`` (read once, in index order: ``landscape.core.reading``).
Its module is imported as a recipe's ``imports`` are (``landscape.config.recipe.resolve``): a recorded recipe's
only when the user trusts it. The partition's sample indices index the training factory's samples in that
order.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from landscape.core.errors import LandscapeError
from landscape.core.imports import check_factory_spec
from landscape.core.reading import read_data
from landscape.data.datasets import DATASETS, ArrayDataset, DatasetBundle
from landscape.data.partitions import PARTITIONS


@dataclass(frozen=True)
class FactoryDataOptions:
    train: str = ""  # package.module:function making the training samples the partition indexes
    test: str = ""  # package.module:function making the test samples ("": the run records none)
    classes: int = 0  # the number of classes; 0: the largest label of either set + 1

    def __post_init__(self) -> None:
        check_factory_spec(self.train, "dataset.train")
        if self.test:
            check_factory_spec(self.test, "dataset.test")
        if isinstance(self.classes, bool) or not isinstance(self.classes, int) or self.classes < 0:
            raise LandscapeError(f"dataset.classes must be a whole number >= 0 (got {self.classes!r})")


def _factory_set(spec: str, what: str) -> ArrayDataset:
    from landscape.core.imports import call_factory

    x, y = read_data(call_factory(spec, f"{what} factory"), f"{what} factory '{spec}'")
    if y.is_floating_point():
        raise LandscapeError(f"{what} factory '{spec}' gives {y.dtype} targets; a federated run's data set holds "
                             "class labels (integers)")
    return ArrayDataset(x.detach().cpu(), y.detach().cpu().long())


def _empty_like(train: ArrayDataset) -> ArrayDataset:
    return ArrayDataset(train.x[:0], train.y[:0])


@DATASETS.register("factory", options=FactoryDataOptions,
                   summary="the samples functions of yours return (dataset.train / dataset.test = pkg.mod:function)")
def load_factory_data(root: Path, download: bool, augment: bool, num_clients: int, seed: int,
                      opts: FactoryDataOptions) -> DatasetBundle:
    train = _factory_set(opts.train, "training data")
    test = _factory_set(opts.test, "test data") if opts.test else _empty_like(train)
    if test.x.shape[1:] != train.x.shape[1:]:
        raise LandscapeError(f"test data factory '{opts.test}' gives inputs of shape {list(test.x.shape[1:])}, "
                             f"the training data {list(train.x.shape[1:])}")
    labels = torch.cat([train.y, test.y])
    if int(labels.min()) < 0:
        raise LandscapeError(f"data factory '{opts.train}': class labels must be >= 0 (found {int(labels.min())})")
    classes = opts.classes or int(labels.max()) + 1
    if int(labels.max()) >= classes:
        raise LandscapeError(f"dataset.classes = {classes}, but a label is {int(labels.max())}")
    return DatasetBundle(name="factory", train=train, test=test, num_classes=classes,
                         input_shape=tuple(train.x.shape[1:]), augmentation=None, natural_partition=None)


@PARTITIONS.register("recorded", summary="the clients' sample indices recorded in the run's partition.json "
                     "(runs written by landscape.RunWriter or landscape import)")
def recorded(labels: np.ndarray, num_clients: int, num_classes: int, rng: np.random.Generator, opts: None,
             natural: list[np.ndarray] | None) -> list[np.ndarray]:
    """The recorded split, which ``landscape.config.setup.prepare_data`` reads from the run's partition.json and
    hands over as ``natural``; a recipe to train draws its partition (iid, dirichlet, ...)."""
    if natural is None:
        raise LandscapeError("partition 'recorded' is the clients' split recorded in a run directory's "
                             "partition.json, and there is none here; to train, draw one (partition.name = iid, "
                             "dirichlet, dirichlet-client, pathological)")
    if len(natural) != num_clients:
        raise LandscapeError(f"partition 'recorded': partition.json lists {len(natural)} clients, the recipe "
                             f"{num_clients} (partition.clients)")
    return [np.asarray(c, dtype=np.int64) for c in natural]
