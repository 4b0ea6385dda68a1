"""The contract every registered partition and in-memory data set keeps. A partition gives every client a
non-empty, sorted array of training indices, disjoint across clients (all of them, or a subset) but for the one
that draws as the reference codes do (repeats within and across clients, n in all), and the same split for the same
seed; an in-memory data set gives float32 inputs of its declared shape and int64 labels in 0..C-1, the same for
the same seed; a recipe naming either refuses an unknown option in one line. torchvision sets need files
(tests/data/test_datasets.py writes tiny ones in the real formats); LEAF's sets too, which this contract writes
(support.leaf_files) and holds to the same terms, its natural partition among the partitions."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from support.leaf_files import write_femnist, write_shakespeare

from landscape.config import recipe as recipes
from landscape.core.errors import LandscapeError
from landscape.data.datasets import DATASETS, load_dataset
from landscape.data.partitions import PARTITIONS, make_partition

IN_MEMORY = ["digits", "mnist1d", "synthetic"]
# Read from tiny files in the real on-disk format, written to a folder of the test's own.
ON_DISK = {"femnist": write_femnist, "shakespeare": write_shakespeare}
# A partition that reads the data set's own clients is split on each data set that has them; the others on digits.
OWN_CLIENTS = {"natural": ["synthetic", "femnist", "shakespeare"]}
REUSES = {"dirichlet-client-reuse"}  # refills a used-up class: samples repeat (tests/data/test_reference_partitions.py)


def _load(name: str, root: Path, num_clients: int, seed: int):
    if name in ON_DISK:
        ON_DISK[name](root)
    return load_dataset(name, root=root, download=False, augment=False, num_clients=num_clients, seed=seed,
                        options={})


def _split(name: str, seed: int, dataset: str, root: Path) -> tuple[list[np.ndarray], int]:
    bundle = _load(dataset, root, 5, 0)
    labels = bundle.train.y.numpy()
    natural = bundle.natural_partition
    if name == "recorded":  # the split a run recorded in its partition.json (config.setup.prepare_data reads it)
        natural = [np.arange(i, len(labels), 7) for i in range(5)]
    return make_partition(name, labels, num_clients=5, num_classes=bundle.num_classes, seed=seed, options={},
                          natural=natural), len(labels)


@pytest.mark.parametrize("name, dataset", [(name, dataset) for name in PARTITIONS.names()
                                           for dataset in OWN_CLIENTS.get(name, ["digits"])])
def test_every_partition_splits_disjointly_and_by_its_seed(name, dataset, tmp_path):
    clients, n = _split(name, 3, dataset, tmp_path)
    assert len(clients) == 5 and all(len(c) > 0 for c in clients)
    assert all(np.array_equal(c, np.sort(c)) for c in clients)
    joined = np.concatenate(clients)
    assert joined.min() >= 0 and joined.max() < n
    assert len(joined) == n if name in REUSES else len(np.unique(joined)) == len(joined)
    again, _ = _split(name, 3, dataset, tmp_path)
    assert all(np.array_equal(a, b) for a, b in zip(clients, again))


@pytest.mark.parametrize("name", IN_MEMORY + list(ON_DISK))
def test_every_data_set_without_a_download_holds_its_declared_kinds(name, tmp_path):
    bundles = [_load(name, tmp_path, 4, 1) for _ in range(2)]
    bundle = bundles[0]
    for part in (bundle.train, bundle.test):
        assert part.x.dtype == torch.float32 and part.y.dtype == torch.int64
        assert tuple(part.x.shape[1:]) == tuple(bundle.input_shape)
        assert int(part.y.min()) >= 0 and int(part.y.max()) < bundle.num_classes
        assert torch.isfinite(part.x).all()
    assert torch.equal(bundle.train.x, bundles[1].train.x) and torch.equal(bundle.test.y, bundles[1].test.y)


def test_the_sets_here_are_those_the_registry_holds_beside_torchvision_and_factory():
    from landscape.data.torchvision_sets import SOURCES

    assert set(IN_MEMORY) | set(ON_DISK) | set(SOURCES) | {"factory"} == set(DATASETS.names())


@pytest.mark.parametrize("section, names", [("partition", PARTITIONS.names()), ("dataset", DATASETS.names())])
def test_an_unknown_option_is_refused_in_one_line(section, names):
    for name in names:
        with pytest.raises(LandscapeError) as e:
            recipes.resolve({section: {"name": name, "no_such_option": 1}}, algorithms=False)
        assert f"{section}.no_such_option" in str(e.value) and "\n" not in str(e.value)
