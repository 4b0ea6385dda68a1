"""The contract every registered partition and in-memory data set keeps. A partition gives every client a
non-empty, sorted array of training indices, disjoint across clients (all of them, or a subset) but for the one
that draws as the reference codes do (repeats within and across clients, n in all), and the same split for the same
seed; an in-memory data set gives float32 inputs of its declared shape and int64 labels in 0..C-1, the same for
the same seed; a recipe naming either refuses an unknown option in one line. torchvision sets need files
(tests/data/test_datasets.py writes tiny ones in the real formats)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from landscape.config import recipe as recipes
from landscape.core.errors import LandscapeError
from landscape.data.datasets import DATASETS, load_dataset
from landscape.data.partitions import PARTITIONS, make_partition

IN_MEMORY = ["digits", "mnist1d", "synthetic"]
# A partition that reads the data set's own clients is split on the data set that has them; the others on digits.
OWN_CLIENTS = {"natural": "synthetic"}
REUSES = {"dirichlet-client-reuse"}  # refills a used-up class: samples repeat (tests/data/test_reference_partitions.py)


def _split(name: str, seed: int) -> tuple[list[np.ndarray], int]:
    bundle = load_dataset(OWN_CLIENTS.get(name, "digits"), root="data", download=False, augment=False, num_clients=6, seed=0,
                          options={})
    labels = bundle.train.y.numpy()
    natural = bundle.natural_partition
    if name == "recorded":  # the split a run recorded in its partition.json (config.setup.prepare_data reads it)
        natural = [np.arange(i, len(labels), 7) for i in range(6)]
    return make_partition(name, labels, num_clients=6, num_classes=bundle.num_classes, seed=seed, options={},
                          natural=natural), len(labels)


@pytest.mark.parametrize("name", PARTITIONS.names())
def test_every_partition_splits_disjointly_and_by_its_seed(name):
    clients, n = _split(name, 3)
    assert len(clients) == 6 and all(len(c) > 0 for c in clients)
    assert all(np.array_equal(c, np.sort(c)) for c in clients)
    joined = np.concatenate(clients)
    assert joined.min() >= 0 and joined.max() < n
    assert len(joined) == n if name in REUSES else len(np.unique(joined)) == len(joined)
    again, _ = _split(name, 3)
    assert all(np.array_equal(a, b) for a, b in zip(clients, again))


@pytest.mark.parametrize("name", IN_MEMORY)
def test_every_in_memory_data_set_holds_its_declared_kinds(name):
    bundles = [load_dataset(name, root="data", download=False, augment=False, num_clients=4, seed=1, options={})
               for _ in range(2)]
    bundle = bundles[0]
    for part in (bundle.train, bundle.test):
        assert part.x.dtype == torch.float32 and part.y.dtype == torch.int64
        assert tuple(part.x.shape[1:]) == tuple(bundle.input_shape)
        assert int(part.y.min()) >= 0 and int(part.y.max()) < bundle.num_classes
        assert torch.isfinite(part.x).all()
    assert torch.equal(bundle.train.x, bundles[1].train.x) and torch.equal(bundle.test.y, bundles[1].test.y)


def test_the_in_memory_sets_are_those_the_registry_holds_beside_torchvision():
    assert set(IN_MEMORY) <= set(DATASETS.names())


@pytest.mark.parametrize("section, names", [("partition", PARTITIONS.names()), ("dataset", DATASETS.names())])
def test_an_unknown_option_is_refused_in_one_line(section, names):
    for name in names:
        with pytest.raises(LandscapeError) as e:
            recipes.resolve({section: {"name": name, "no_such_option": 1}}, algorithms=False)
        assert f"{section}.no_such_option" in str(e.value) and "\n" not in str(e.value)
