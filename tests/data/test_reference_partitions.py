"""dirichlet-client-reuse draws as the reference codes draw: over 300 seeds its label skew (mean TV from the clients'
global label mix), classes held per client, duplicated and unused shares are equal in distribution to those of
independent reimplementations of FL-Simulator's loop (dataset.py, DatasetObject.set_data, rule 'Dirichlet') and of
FedNSAM's (dirichlet_data.py, data_from_dirichlet), each on np.random.RandomState as they run; the no-reuse
dirichlet-client is told apart by the same tests. Downstream: a partition.json and a RunWriter partition with
repeats are accepted (out-of-range indices still refused), and the analysis "train" split keeps the repeats."""

from __future__ import annotations

import json
from copy import deepcopy

import numpy as np
import pytest
import torch
from scipy import stats

import landscape
from landscape.core.errors import LandscapeError
from landscape.data.datasets import load_dataset
from landscape.data.partitions import class_histogram, heterogeneity, make_partition
from landscape.store.checkpoints import read_partition

SEEDS = 300
CLIENTS, ALPHA, CLASSES = 20, 0.1, 10
# 8 equality tests (2 references x 4 quantities): at 0.001 each the family errs with probability <= 0.008
# (Bonferroni); the seeds are fixed, so a pass is reproducible, and the no-reuse variant (a different law)
# is rejected by the same tests at p < 1e-20 (from 100 seeds).
LEVEL = 1e-3


@pytest.fixture(scope="module")
def labels() -> np.ndarray:
    """digits' training labels as landscape splits them (1437 samples, 142-146 per class)."""
    return load_dataset("digits", root="data", download=False, augment=False, num_clients=1, seed=0,
                        options={}).train.y.numpy()


def fl_simulator(labels: np.ndarray, n_client: int, alpha: float, seed: int) -> list[np.ndarray]:
    """FL-Simulator's loop: shuffle the training set, sizes n // N with the remainder on client 0, priors by
    np.random.dirichlet; any client, redrawn while full; class argmax(u <= cumsum); an exhausted class is
    refilled and the class drawn again; the sample taken from the end of the class's list."""
    rs = np.random.RandomState(seed)
    perm = rs.permutation(len(labels))
    y = labels[perm]
    sizes = np.ones(n_client, dtype=int) * int(len(y) / n_client)
    diff = np.sum(sizes) - len(y)
    if diff != 0:
        for i in range(n_client):
            if sizes[i] > diff:
                sizes[i] -= diff
                break
    prior_cumsum = np.cumsum(rs.dirichlet(alpha=[alpha] * CLASSES, size=n_client), axis=1)
    idx_list = [np.where(y == c)[0] for c in range(CLASSES)]
    amount = [len(i) for i in idx_list]
    clients: list[list[int]] = [[] for _ in range(n_client)]
    remaining = int(np.sum(sizes))
    while remaining != 0:
        k = rs.randint(n_client)
        if sizes[k] <= 0:
            continue
        sizes[k] -= 1
        remaining -= 1
        while True:
            c = np.argmax(rs.uniform() <= prior_cumsum[k])
            if amount[c] <= 0:
                amount[c] = len(idx_list[c])
                continue
            amount[c] -= 1
            clients[k].append(int(perm[idx_list[c][amount[c]]]))
            break
    return [np.asarray(c) for c in clients]


def _find_cls(inter_sum: list[float], rnd: float) -> int:
    for i in range(len(inter_sum)):
        if rnd < inter_sum[i]:
            break
    return i - 1


def fednsam(labels: np.ndarray, nums_wk: int, alpha: float, seed: int, nums_sample: np.ndarray) -> list[np.ndarray]:
    """FedNSAM's data_from_dirichlet: class lists in argsort order, p_j by normalised np.random.gamma draws
    (class by class, client by client); client by client, a class by inverse CDF, popped from the end, an empty
    class refilled from its full list. ``nums_sample`` per client (the code takes one number, n / N on CIFAR:
    100 x 500 = 50,000; here the sizes landscape uses, which add up to n)."""
    rs = np.random.RandomState(seed)
    dct: dict = {}
    for idx in np.argsort(labels):
        dct.setdefault(labels[idx], []).append(int(idx))
    sort_index = [dct[key] for key in dct]
    tag_index = deepcopy(sort_index)
    gamma_rnd = np.zeros([CLASSES, nums_wk])
    dirichlet_rnd = np.zeros([CLASSES, nums_wk])
    for n in range(nums_wk):
        for i in range(CLASSES):
            gamma_rnd[i, n] = rs.gamma(alpha, 1)
        dirichlet_rnd[:, n] = gamma_rnd[:, n] / np.sum(gamma_rnd[:, n])
    data_idx = []
    for j in range(nums_wk):
        inter_sum = [0.0]
        for p in dirichlet_rnd[:, j]:
            inter_sum.append(p + inter_sum[-1])
        sample_index = []
        for _ in range(nums_sample[j]):
            cls = _find_cls(inter_sum, rs.random())
            if not tag_index[cls]:
                tag_index[cls] = deepcopy(sort_index[cls])
            sample_index.append(tag_index[cls].pop())
        data_idx.append(np.asarray(sample_index))
    return data_idx


def quantities(labels: np.ndarray, clients: list[np.ndarray]) -> tuple[float, float, float, float]:
    """(mean label TV, mean classes held per client, duplicated share, unused share)."""
    hist = class_histogram(labels, clients, CLASSES)
    h = heterogeneity(hist, clients, len(labels))
    return h.label_tv, float((hist > 0).sum(axis=1).mean()), h.duplicated_share, h.unused_share


def ours(labels: np.ndarray, name: str, seed: int) -> list[np.ndarray]:
    return make_partition(name, labels, num_clients=CLIENTS, num_classes=CLASSES, seed=seed,
                          options={"alpha": ALPHA})


@pytest.fixture(scope="module")
def draws(labels) -> dict[str, np.ndarray]:
    sizes = [len(c) for c in ours(labels, "dirichlet-client-reuse", 0)]
    makers = {
        "reuse": lambda s: ours(labels, "dirichlet-client-reuse", s),
        "no-reuse": lambda s: ours(labels, "dirichlet-client", s),
        "FL-Simulator": lambda s: fl_simulator(labels, CLIENTS, ALPHA, s),
        "FedNSAM": lambda s: fednsam(labels, CLIENTS, ALPHA, s, sizes),
    }
    seeds = {"no-reuse": 100}  # enough to tell it apart (it is only the power check)
    return {name: np.array([quantities(labels, make(seed)) for seed in range(seeds.get(name, SEEDS))])
            for name, make in makers.items()}


NAMES = ["label TV", "classes held", "duplicated share", "unused share"]


@pytest.mark.parametrize("reference", ["FL-Simulator", "FedNSAM"])
def test_dirichlet_client_reuse_is_each_reference_loop_in_distribution(draws, reference):
    for j, name in enumerate(NAMES):
        p = stats.ks_2samp(draws["reuse"][:, j], draws[reference][:, j]).pvalue
        assert p > LEVEL, f"{name}: KS p = {p:.2g} against {reference}"
    assert draws[reference][:, 2].mean() > 0.1  # the reference reuses samples (about a fifth at alpha 0.1)


def test_the_no_reuse_variant_is_told_apart_by_the_same_tests(draws):
    for reference in ("FL-Simulator", "FedNSAM", "reuse"):
        for j in (0, 1, 2):
            assert stats.ks_2samp(draws["no-reuse"][:, j], draws[reference][:, j]).pvalue < 1e-20
        # milder label skew, more classes per client, nothing repeated or unused
        assert draws["no-reuse"][:, 0].mean() < draws[reference][:, 0].mean() - 0.03
        assert draws["no-reuse"][:, 1].mean() > draws[reference][:, 1].mean()
    assert np.all(draws["no-reuse"][:, 2:] == 0)


def test_a_class_used_up_is_refilled_and_taken_again_from_its_end():
    """A class of m samples drawn k times in all is taken from the end of its seeded order, refilled when
    empty: every one of its samples is held k // m or k // m + 1 times."""
    labels = np.zeros(7, dtype=np.int64)
    labels[3:] = 1  # class 0: samples 0..2; class 1: samples 3..6
    # two clients of 4 and 3 (7 // 2, the first one more); what each holds of class 0 repeats after 3
    for seed in range(20):
        clients = make_partition("dirichlet-client-reuse", labels, num_clients=2, num_classes=2, seed=seed,
                                 options={"alpha": 0.05})
        assert [len(c) for c in clients] == [4, 3]
        joined = np.concatenate(clients)
        for c, members in ((0, 3), (1, 4)):
            counts = np.bincount(joined[labels[joined] == c], minlength=7)[labels == c]
            k = counts.sum()  # taken k times from a list of `members`, refilled when empty
            assert sorted(counts) == sorted([k // members + (i < k % members) for i in range(members)])


def test_sizes_indices_and_seed(labels):
    a = ours(labels, "dirichlet-client-reuse", 7)
    assert [len(c) for c in a] == [72] * 17 + [71] * 3  # 1437 = 20 x 71 + 17
    assert all(c.dtype == np.int64 and np.all(np.diff(c) >= 0) and c.min() >= 0 and c.max() < len(labels)
               for c in a)
    assert all(np.array_equal(x, y) for x, y in zip(a, ours(labels, "dirichlet-client-reuse", 7)))
    assert not all(np.array_equal(x, y) for x, y in zip(a, ours(labels, "dirichlet-client-reuse", 8)))


def test_heterogeneity_shares_by_hand():
    hist = np.array([[2, 1], [0, 2]])
    h = heterogeneity(hist, [np.array([0, 0, 3]), np.array([1, 1])], 5)  # 3 distinct of 5 listed, of 5 samples
    assert (h.duplicated_share, h.unused_share) == pytest.approx((2 / 5, 2 / 5))
    h = heterogeneity(hist, [np.array([0, 2, 3]), np.array([1, 4])], 8)
    assert (h.duplicated_share, h.unused_share) == pytest.approx((0.0, 3 / 8))
    assert "duplicated_share" in h.record() and "37.5% of the training set unused" in h.text()
    assert heterogeneity(hist).duplicated_share is None and "duplicated_share" not in heterogeneity(hist).record()


def test_partition_json_with_repeats_is_read_and_out_of_range_still_refused(tmp_path):
    path = tmp_path / "partition.json"
    path.write_text(json.dumps({"clients": [{"indices": [0, 0, 3]}, {"indices": [3, 1]}]}))
    parts = read_partition(path, 5, 2)
    assert [p.tolist() for p in parts] == [[0, 0, 3], [3, 1]]
    for bad, message in (([0, 5], "client 0 has sample 5, outside the 5 training samples"),
                         ([0, 1.0], "indices are not a list of whole numbers")):
        path.write_text(json.dumps({"clients": [{"indices": bad}, {"indices": [1]}]}))
        with pytest.raises(LandscapeError, match=message):
            read_partition(path, 5, 2)


def test_a_run_writer_partition_may_repeat_samples(tmp_path):
    parts = {0: [0, 0, 1, 2], 1: [2, 3, 3]}
    with landscape.RunWriter(tmp_path / "run", model="cnn", data="digits", partition=parts) as writer:
        assert [p.tolist() for p in writer.parts] == [[0, 0, 1, 2], [2, 3, 3]]
    record = json.loads((tmp_path / "run" / "partition.json").read_text())
    n = record["heterogeneity"]
    assert record["clients"][0]["indices"] == [0, 0, 1, 2]
    assert n["duplicated_share"] == pytest.approx(3 / 7) and n["unused_share"] == pytest.approx(1 - 4 / 1437)
    with pytest.raises(LandscapeError, match="client 1 has sample 100000, outside"):
        landscape.RunWriter(tmp_path / "bad", model="cnn", data="digits", partition={0: [0], 1: [100000]})


def test_the_analysis_train_split_is_the_clients_data_with_repeats(labels):
    """The "train" split of an analysis is every client's samples, a repeat counted as often as clients hold it:
    the loss over it is the reference codes' global objective sum_i n_i f_i / sum_i n_i."""
    from landscape.analyze.source import Source
    from landscape.config import recipe as recipes

    recipe = recipes.resolve({"partition": {"name": "dirichlet-client-reuse", "clients": CLIENTS, "alpha": ALPHA}})
    source = Source("r", recipe, {}, None, None)
    x, y = source.analysis_set("train")
    clients = source.setup.client_indices
    assert len(y) == len(labels) and np.unique(np.concatenate(clients)).size < len(labels)
    expected = np.sort(np.concatenate(clients))
    train = source.setup.bundle.train
    assert torch.equal(x, train.x[torch.as_tensor(expected)]) and torch.equal(y, train.y[torch.as_tensor(expected)])
