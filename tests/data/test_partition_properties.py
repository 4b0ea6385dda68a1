"""Properties every partition keeps, checked by hypothesis on random label vectors: every client gets an index
array of training samples; the partitions without reuse hand out every sample exactly once; the reference
codes' partition (with reuse) takes n samples of the training set, gives each client its share, and refills a
class only once all its samples are taken."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from support.helpers import FUZZ

from landscape.data.partitions import make_partition

LABELS = st.tuples(st.integers(2, 6), st.integers(60, 400), st.integers(0, 2**31 - 1))  # classes, samples, seed
EVERY_SAMPLE_ONCE = {"iid": {}, "dirichlet": {"alpha": 0.5}, "dirichlet-client": {"alpha": 0.5}}


def labels_of(classes: int, n: int, seed: int) -> np.ndarray:
    labels = np.random.default_rng(seed).integers(0, classes, n)
    labels[:classes] = np.arange(classes)  # every class present
    return labels


@FUZZ
@given(LABELS, st.integers(2, 8), st.sampled_from(sorted(EVERY_SAMPLE_ONCE)))
def test_partitions_without_reuse_hand_out_every_sample_once(shape, clients, name):
    classes, n, seed = shape
    labels = labels_of(classes, n, seed)
    parts = make_partition(name, labels, num_clients=clients, num_classes=classes, seed=seed,
                           options=EVERY_SAMPLE_ONCE[name])
    assert len(parts) == clients
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(n))


@FUZZ
@given(LABELS, st.integers(2, 8), st.floats(0.05, 10))
def test_the_reference_partition_takes_training_samples_and_gives_each_client_its_share(shape, clients, alpha):
    classes, n, seed = shape
    labels = labels_of(classes, n, seed)
    parts = make_partition("dirichlet-client-reuse", labels, num_clients=clients, num_classes=classes, seed=seed,
                           options={"alpha": alpha})
    assert len(parts) == clients
    every = np.concatenate(parts)
    assert every.min() >= 0 and every.max() < n and len(every) == n  # samples may repeat, others go unused
    sizes = sorted(len(p) for p in parts)
    assert sizes[0] == n // clients and sizes[-1] - sizes[0] == (n % clients > 0)  # equal shares, n % N get one more
    # a class is refilled only once all its samples are taken: no sample is taken k+1 times before all k times
    counts = np.bincount(every, minlength=n)
    for c in range(classes):
        held = counts[labels == c]
        assert held.max() - held.min() <= 1
