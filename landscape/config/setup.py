"""What training and analysis both build from a recipe: the device, the seeded data set and partition, the
model. One home for each, so that a run and its analysis see the same data and the same model.

Randomness is derived, never carried (``derived_seed``): the model's initialisation from the seed, the
partition and data splits from the seed, so that rebuilding them from a recorded recipe gives the same bits.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from landscape.config import recipe as recipes
from landscape.config import sections as recipe_sections
from landscape.core import parallel
from landscape.core.errors import LandscapeError
from landscape.core.rng import derived_seed
from landscape.data.datasets import DatasetBundle, load_dataset
from landscape.data.partitions import class_histogram, make_partition
from landscape.models import build_model, check_model

DTYPES = {name: getattr(torch, name) for name in recipe_sections.DTYPES}  # the recipe's dtype names -> torch


def thread_count(threads: int) -> int:
    """The CPU threads a ``threads`` setting means: the number itself, or (0) every core this process may use."""
    if threads > 0:
        return threads
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


@contextlib.contextmanager
def using_threads(threads: int) -> Iterator[int]:
    """torch's CPU threads set to ``thread_count(threads)`` for the block, then set back.

    Results on the CPU depend on the count (a reduction split over more threads adds in another order), so
    training and analysis set it from their settings, never from the machine or the environment."""
    count, before = thread_count(threads), torch.get_num_threads()
    if count != before:
        torch.set_num_threads(count)
    try:
        yield count
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a recipe's or a flag's dtype name (float32, float64)."""
    try:
        return DTYPES[name]
    except KeyError:
        raise LandscapeError(f"unknown dtype '{name}'; use {' or '.join(DTYPES)}") from None


def resolve_device(name: str) -> torch.device:
    """The torch device of a recipe's or a flag's device name. Under torchrun, ``cuda`` (and ``auto`` on a
    machine with GPUs) is this rank's GPU, cuda:LOCAL_RANK."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError:
        raise LandscapeError(f"unknown device '{name}'; use auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise LandscapeError(f"device '{name}' asked for, but no CUDA device is available here")
    if device.type not in ("cpu", "cuda"):
        raise LandscapeError(f"unsupported device '{name}'; use auto, cpu, cuda or cuda:N")
    if device.type == "cuda" and device.index is None and parallel.launched():
        device = torch.device("cuda", parallel.local_rank())
    return device


@dataclass
class DataSetup:
    bundle: DatasetBundle
    client_indices: list[np.ndarray]
    histogram: np.ndarray


def prepare_data(recipe: recipes.Recipe, partition_file: Path | None = None) -> DataSetup:
    """Load the data set and partition it exactly as the recipe says (no files written), its inputs in the
    run's ``train.dtype`` cast once from the data set's own precision (a float64 run's digits, synthetic and
    MNIST-1D inputs are the float64 values, never rounded to float32 on the way; its analysis sees the same).
    The partition ``recorded`` (a run written by ``landscape.RunWriter`` or ``landscape import``) is read from
    ``partition_file``, the run's partition.json (checked: ``store.checkpoints.read_partition``)."""
    ds, part = recipe.dataset, recipe.partition
    # A download goes to one shared folder: rank 0 fetches, the other ranks then read what it fetched.
    with parallel.main_first() if ds.download else contextlib.nullcontext():
        bundle = load_dataset(
            ds.name,
            root=ds.root,
            download=ds.download,
            augment=ds.augment,
            num_clients=part.clients,
            seed=recipe.seed,
            options=dict(ds.options),
            dtype=torch_dtype(recipe.train.dtype),
        )
    labels = bundle.train.y.numpy()
    natural = bundle.natural_partition
    if part.name == "recorded" and partition_file is not None and Path(partition_file).is_file():
        from landscape.store.checkpoints import read_partition

        natural = read_partition(Path(partition_file), len(labels), part.clients, recorded=True)
    indices = make_partition(
        part.name,
        labels,
        num_clients=part.clients,
        num_classes=bundle.num_classes,
        seed=recipe.seed,
        options=dict(part.options),
        natural=natural,
    )
    return DataSetup(bundle, indices, class_histogram(labels, indices, bundle.num_classes))


def build_module(recipe: recipes.Recipe, bundle: DatasetBundle) -> torch.nn.Module:
    """The recipe's model for this data set, initialised from the recipe's seed (CPU, float32)."""
    torch.manual_seed(derived_seed(recipe.seed))
    return build_model(recipe.model.name, bundle.input_shape, bundle.num_classes, dict(recipe.model.options))


def check_module(recipe: recipes.Recipe, bundle: DatasetBundle) -> None:
    """What ``build_module`` checks, nothing built (a dry run): the model's options, its fit to the data and
    to this machine's memory (a built-in model's size from the meta device)."""
    check_model(recipe.model.name, bundle.input_shape, bundle.num_classes, dict(recipe.model.options))
