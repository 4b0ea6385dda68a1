"""benchmarks/gpu_check.py runs first on a lent GPU machine, where minutes are scarce: here, without a GPU, its
imports resolve and its synthetic CIFAR-shaped data set is what its docstring says (the whole run is the CPU
smoke run of its docstring, minutes long, so it is not part of the suite)."""

from __future__ import annotations

import numpy as np
from support.helpers import load_script


def test_the_synthetic_set_is_cifar_shaped_and_split_iid_over_the_clients():
    gpu_check = load_script("benchmarks/gpu_check.py")
    setup = gpu_check.synthetic_setup(clients=4, per_client=3, test=5, seed=0)
    train, test = setup.bundle.train, setup.bundle.test
    assert tuple(train.x.shape) == (12, 3, 32, 32) and tuple(test.x.shape) == (5, 3, 32, 32)
    assert setup.bundle.num_classes == 10 and int(train.y.max()) < 10
    assert [len(part) for part in setup.client_indices] == [3, 3, 3, 3]
    assert np.array_equal(np.sort(np.concatenate(setup.client_indices)), np.arange(12))
    again = gpu_check.synthetic_setup(clients=4, per_client=3, test=5, seed=0)
    assert np.array_equal(again.bundle.train.x.numpy(), train.x.numpy())  # seeded
