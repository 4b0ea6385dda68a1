"""Partitions: exact cover, label skew, determinism and the user-facing errors; and a run's partition.json,
validated where it is read (a tampered file is named in one line by open_run), set aside and written again by
resume, and compared with the run's own partition by analyze (a note)."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
from sklearn.datasets import load_digits
from support.helpers import analyze_args, invoke

import landscape
from landscape.core.errors import LandscapeError
from landscape.data.partitions import (
    PARTITIONS,
    class_histogram,
    format_partition_table,
    heterogeneity,
    make_partition,
    mean_label_entropy,
)
from landscape.train import loop


@pytest.fixture(scope="module")
def digits_labels() -> np.ndarray:
    return load_digits().target.astype(np.int64)


def split(labels: np.ndarray, name: str, clients: int = 10, seed: int = 0, **options) -> list[np.ndarray]:
    return make_partition(name, labels, num_clients=clients, num_classes=10, seed=seed, options=options)


def assert_exact_cover(parts: list[np.ndarray], n: int) -> None:
    for part in parts:
        assert part.dtype == np.int64
        assert np.all(np.diff(part) > 0), "indices sorted, no repeats within a client"
        assert len(part) >= 1
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(n))


CASES = [
    ("iid", {}),
    ("dirichlet", {"alpha": 0.5}),
    ("dirichlet", {"alpha": 0.05, "min_samples": 1}),
    ("dirichlet-client", {"alpha": 0.5}),
    ("dirichlet-client", {"alpha": 0.01}),
    ("pathological", {}),
    ("pathological", {"classes_per_client": 3}),
]


@pytest.mark.parametrize(("name", "options"), CASES)
@pytest.mark.parametrize("clients", [5, 7, 20])
def test_every_sample_in_exactly_one_client(digits_labels, name, options, clients):
    parts = split(digits_labels, name, clients=clients, **options)
    assert len(parts) == clients
    assert_exact_cover(parts, len(digits_labels))


def test_natural_partition_is_the_data_sets_own_split():
    natural = [np.array([4, 0, 2]), np.array([1, 3]), np.array([5])]
    labels = np.array([0, 1, 0, 1, 0, 1])
    parts = make_partition("natural", labels, num_clients=3, num_classes=2, seed=0, options={}, natural=natural)
    assert [p.tolist() for p in parts] == [[0, 2, 4], [1, 3], [5]]
    assert_exact_cover(parts, 6)


@pytest.mark.parametrize(("clients", "c"), [(10, 2), (7, 2), (10, 3), (3, 4), (5, 10), (40, 1)])
def test_pathological_clients_hold_exactly_c_classes(digits_labels, clients, c):
    parts = split(digits_labels, "pathological", clients=clients, classes_per_client=c)
    hist = class_histogram(digits_labels, parts, 10)
    assert np.all((hist > 0).sum(axis=1) == c)
    # each class is shared as equally as possible among the clients holding it
    for column in hist.T:
        held = column[column > 0]
        assert held.max() - held.min() <= 1


@pytest.mark.parametrize("name", ["dirichlet-client", "dirichlet"])
def test_label_entropy_falls_with_alpha(digits_labels, name):
    alphas = [100.0, 1.0, 0.1, 0.01] if name == "dirichlet-client" else [100.0, 1.0, 0.1]
    more = {} if name == "dirichlet-client" else {"min_samples": 1}
    entropies = [
        mean_label_entropy(class_histogram(digits_labels, split(digits_labels, name, alpha=a, **more), 10))
        for a in alphas
    ]
    assert all(a > b for a, b in itertools.pairwise(entropies)), entropies
    assert entropies[0] > 0.95 * np.log(10)  # alpha -> inf is IID: near-uniform labels on every client


@pytest.mark.parametrize(("name", "options"), CASES)
def test_same_seed_same_partition_other_seed_different(digits_labels, name, options):
    first = split(digits_labels, name, seed=3, **options)
    again = split(digits_labels, name, seed=3, **options)
    other = split(digits_labels, name, seed=4, **options)
    assert all(np.array_equal(a, b) for a, b in zip(first, again))
    assert not all(np.array_equal(a, b) for a, b in zip(first, other))


@pytest.mark.parametrize("alpha", [0.01, 0.1, 10.0])
@pytest.mark.parametrize("clients", [10, 13, 100])
def test_dirichlet_client_sizes_differ_by_at_most_one(digits_labels, alpha, clients):
    sizes = [len(p) for p in split(digits_labels, "dirichlet-client", clients=clients, alpha=alpha)]
    assert max(sizes) - min(sizes) <= 1
    assert sum(sizes) == len(digits_labels)


def test_natural_size_dirichlet_respects_min_samples(digits_labels):
    parts = split(digits_labels, "dirichlet", clients=20, alpha=0.1, min_samples=20)
    assert min(len(p) for p in parts) >= 20


def test_a_single_client_gets_everything(digits_labels):
    for name, options in [("iid", {}), ("dirichlet", {}), ("dirichlet-client", {}),
                          ("pathological", {"classes_per_client": 10})]:
        assert_exact_cover(split(digits_labels, name, clients=1, **options), len(digits_labels))


def test_iid_sizes_are_near_equal(digits_labels):
    sizes = [len(p) for p in split(digits_labels, "iid", clients=13)]
    assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize("alpha", [0, -1.0])
def test_alpha_must_be_positive(digits_labels, alpha):
    for name in ("dirichlet", "dirichlet-client"):
        with pytest.raises(LandscapeError, match=rf"partition.alpha must be > 0 \(got {float(alpha)}\)"):
            split(digits_labels, name, alpha=alpha)


def test_unreachable_min_samples_says_what_to_change(digits_labels):
    with pytest.raises(LandscapeError, match="lower partition.min_samples or raise partition.alpha"):
        split(digits_labels, "dirichlet", clients=20, alpha=0.001, min_samples=50)
    with pytest.raises(LandscapeError, match="lower partition.min_samples"):
        split(digits_labels, "dirichlet", clients=20, min_samples=100)  # 20 x 100 > 1797


@pytest.mark.parametrize("name", ["iid", "dirichlet", "pathological"])
def test_more_clients_than_samples(name):
    labels = np.arange(10) % 10
    with pytest.raises(LandscapeError, match="20 clients but only 10 training samples"):
        split(labels, name, clients=20)


def test_need_at_least_one_client(digits_labels):
    with pytest.raises(LandscapeError, match="at least 1 client"):
        split(digits_labels, "iid", clients=0)


def test_pathological_errors(digits_labels):
    with pytest.raises(LandscapeError, match=r"classes_per_client must be in 1..10 \(got 11\)"):
        split(digits_labels, "pathological", classes_per_client=11)
    with pytest.raises(LandscapeError, match="3 clients x 2 classes each cannot cover 10 classes"):
        split(digits_labels, "pathological", clients=3, classes_per_client=2)
    few = np.repeat(np.arange(10), 2)  # 2 samples per class, but 20 clients x 3 classes = 6 holders per class
    with pytest.raises(LandscapeError, match="class 0 has 2 samples but 6 clients must hold it"):
        split(few, "pathological", clients=20, classes_per_client=3)


def test_natural_errors(digits_labels):
    with pytest.raises(LandscapeError, match=r"partition 'natural' needs a data set with its own clients \(synthetic, femnist, shakespeare\)"):
        split(digits_labels, "natural")
    natural = [np.array([0, 1]), np.array([2, 3])]
    with pytest.raises(LandscapeError, match="the data set has 2 clients but num_clients is 3"):
        make_partition("natural", np.zeros(4, int), num_clients=3, num_classes=2, seed=0, options={},
                       natural=natural)
    empty = [np.array([0, 1, 2, 3]), np.array([], dtype=np.int64)]
    with pytest.raises(LandscapeError, match="left client 1 without samples"):
        make_partition("natural", np.zeros(4, int), num_clients=2, num_classes=2, seed=0, options={},
                       natural=empty)


def test_unknown_partition_and_option(digits_labels):
    with pytest.raises(LandscapeError, match="unknown partition 'shards'; choose from: dirichlet, dirichlet-client, dirichlet-client-reuse, iid, natural"):
        split(digits_labels, "shards")
    with pytest.raises(LandscapeError, match=r"unknown option 'partition\.beta'"):
        split(digits_labels, "dirichlet", beta=1.0)
    with pytest.raises(LandscapeError, match="iid takes no options"):
        split(digits_labels, "iid", alpha=1.0)


def test_option_defaults_are_the_reference_ones():
    assert PARTITIONS.get("dirichlet").option_defaults() == {"alpha": 0.1, "balanced": False, "min_samples": 2}
    assert PARTITIONS.get("pathological").option_defaults() == {"classes_per_client": 2}
    assert PARTITIONS.get("iid").option_defaults() == {}


def test_histogram_entropy_and_table_by_hand():
    labels = np.array([0, 0, 1, 2, 2, 2])
    hist = class_histogram(labels, [np.array([0, 2]), np.array([1, 3, 4, 5])], 3)
    np.testing.assert_array_equal(hist, [[1, 1, 0], [1, 0, 3]])
    # client 0: (1/2, 1/2) -> ln 2; client 1: (1/4, 3/4) -> -(1/4 ln 1/4 + 3/4 ln 3/4)
    expected = (np.log(2) - (0.25 * np.log(0.25) + 0.75 * np.log(0.75))) / 2
    assert mean_label_entropy(hist) == pytest.approx(expected)
    lines = format_partition_table(hist).splitlines()
    assert [line.split() for line in lines] == [
        ["client", "0", "1", "2", "total"],
        ["0", "1", "1", "0", "2"],
        ["1", "1", "0", "3", "4"],
        ["total", "2", "1", "3", "6"],
    ]


def test_table_for_many_clients_and_classes():
    hist = np.arange(100 * 100).reshape(100, 100) % 7
    lines = format_partition_table(hist).splitlines()
    assert len(lines) == 102
    assert len({len(line) for line in lines}) == 1  # columns aligned
    assert lines[-1].split()[-1] == str(hist.sum())


def _no_reuse_sampler(labels: np.ndarray, clients: int, alpha: float, rng: np.random.Generator) -> np.ndarray:
    """FL-Simulator's loop without its refill, written out independently: pick any client, redraw a full one;
    draw a class by inverse CDF of its prior restricted to the classes with samples left (where the reference
    refills a used-up class and reuses its samples: tests/data/test_reference_partitions.py). Returns the
    [clients, classes] histogram."""
    priors = rng.dirichlet([alpha] * 10, size=clients)
    amount = np.bincount(labels, minlength=10)
    need = np.full(clients, len(labels) // clients)
    hist = np.zeros((clients, 10), dtype=np.int64)
    while need.sum():
        k = rng.integers(clients)
        if need[k] == 0:
            continue
        need[k] -= 1
        masked = np.where(amount > 0, priors[k], 0.0)
        c = int(np.argmax(rng.uniform() * masked.sum() <= np.cumsum(masked)))
        amount[c] -= 1
        hist[k, c] += 1
    return hist


def test_dirichlet_client_is_the_no_reuse_loop_in_distribution():
    """The same law as the reference loop without its reuse: the TV heterogeneity of 300 seeded draws of each
    agrees (2-sample KS)."""
    from scipy import stats

    labels = np.repeat(np.arange(10), 30)  # 300 samples, 10 clients of 30
    ours, theirs = [], []
    for seed in range(300):
        ours.append(heterogeneity(class_histogram(labels, split(labels, "dirichlet-client", seed=seed, alpha=0.3),
                                                  10)).label_tv)
        theirs.append(heterogeneity(_no_reuse_sampler(labels, 10, 0.3, np.random.default_rng(10_000 + seed)))
                      .label_tv)
    assert stats.ks_2samp(ours, theirs).pvalue > 0.01
    # and it is not the per-class convention, whose heterogeneity at one alpha differs
    per_class = [heterogeneity(class_histogram(labels, split(labels, "dirichlet", seed=s, alpha=0.3, min_samples=1),
                                               10)).label_tv for s in range(300)]
    assert stats.ks_2samp(ours, per_class).pvalue < 1e-6


def test_heterogeneity_by_hand():
    hist = np.array([[3, 1], [0, 4], [2, 2]])  # global p = (5/12, 7/12)
    h = heterogeneity(hist)
    tvs = [abs(3 / 4 - 5 / 12), abs(0 - 5 / 12), abs(2 / 4 - 5 / 12)]  # TV of 2 classes = |p_1 - q_1|
    assert h.label_tv == pytest.approx(np.mean(tvs)) and h.label_tv_max == pytest.approx(max(tvs))
    assert (h.size_min, h.size_max, h.size_mean, h.size_cv) == (4, 4, 4.0, 0.0)
    h = heterogeneity(np.array([[1, 0], [0, 3]]))
    assert h.size_cv == pytest.approx(np.std([1, 3]) / 2) and h.label_tv == pytest.approx((0.75 + 0.25) / 2)


def test_balanced_is_refused_with_the_new_name(digits_labels):
    with pytest.raises(LandscapeError, match='partition.name = "dirichlet-client"'):
        split(digits_labels, "dirichlet", balanced=True)


# ----------------------------------------------------------------------------------------------------------
# a run's partition.json is validated


PARTITION_DAMAGE = {
    "not JSON": lambda rec: "{not json",
    "index out of range": lambda rec: _with(rec, 0, [10**6]),
    "negative index": lambda rec: _with(rec, 0, [-1]),
    "not an integer": lambda rec: _with(rec, 0, ["x"]),
    "a client missing": lambda rec: json.dumps({**rec, "clients": rec["clients"][:-1]}),
    "no clients list": lambda rec: json.dumps({"clients": 5}),
}


def _with(record: dict, client: int, indices: list) -> str:
    clients = [dict(c) for c in record["clients"]]
    clients[client]["indices"] = indices
    return json.dumps({**record, "clients": clients})


@pytest.mark.parametrize("damage", list(PARTITION_DAMAGE))
def test_a_tampered_partition_json_is_named_in_one_line(six_round_copy, damage):
    path = six_round_copy / "partition.json"
    original = path.read_text()
    path.write_text(PARTITION_DAMAGE[damage](json.loads(original)))
    run = landscape.open_run(six_round_copy)
    with pytest.raises(LandscapeError) as caught:
        run.client_data(0)
    assert "partition.json" in str(caught.value) and "\n" not in str(caught.value)
    with pytest.raises(LandscapeError):
        run.partition()


def test_a_repeat_added_to_partition_json_reads_but_is_not_the_recipe_s_partition(six_round_copy):
    """A sample listed twice is a partition's (dirichlet-client-reuse repeats samples), so it reads; one added by
    hand is named where the file is compared with the recipe's seeded partition (resume, analyze)."""
    from landscape.store.checkpoints import partition_problem

    path = six_round_copy / "partition.json"
    record = json.loads(path.read_text())
    path.write_text(_with(record, 1, record["clients"][1]["indices"] + record["clients"][0]["indices"][:1]))
    run = landscape.open_run(six_round_copy)
    assert len(run.client_data(1)) == len(record["clients"][1]["indices"]) + 1
    setup = run.data_setup()
    assert partition_problem(path, setup.client_indices, len(setup.bundle.train)) == (
        "gives client 1 other samples than the recipe's seeded partition")


def test_resume_sets_a_tampered_partition_json_aside_and_writes_it_again(six_round_run, six_round_copy):
    path = six_round_copy / "partition.json"
    path.write_text(_with(json.loads(path.read_text()), 0, [10**6]))
    tampered = path.read_text()
    notes: list[str] = []
    loop.resume_run(six_round_copy, progress=False, warn=notes.append)
    assert len(notes) == 1 and "partition.json" in notes[0] and "partition.json.damaged" in notes[0]
    assert path.read_bytes() == (six_round_run / "partition.json").read_bytes()
    assert (six_round_copy / "partition.json.damaged").read_text() == tampered


def test_analyze_says_when_partition_json_is_not_the_run_s_partition(six_round_copy):
    path = six_round_copy / "partition.json"
    path.write_text(_with(json.loads(path.read_text()), 0, [0, 1, 2]))
    result = invoke(*analyze_args(six_round_copy, "--passes", "loss"))
    assert result.exit_code == 0, result.output
    notes = [line for line in result.output.splitlines() if "partition.json" in line]
    assert len(notes) == 1 and notes[0].startswith(("note:", "warning:"))
