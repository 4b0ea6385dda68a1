"""Splitting a training set over clients (label skew), registered by name.

Every partition is a list of sorted int64 index arrays, one per client, and the same seed gives the same split.
Every partition but ``dirichlet-client-reuse`` puts every training sample in exactly one client.

Three Dirichlet conventions are in use, and they give different heterogeneity at one alpha:

- ``dirichlet-client-reuse``: how the papers' reference codes draw (FL-Simulator ``DatasetObject.set_data``, rule
  'Dirichlet', which FedSMOO, FedGAMMA, FedLESAM and FedVSSAM build on; FedNSAM ``data_from_dirichlet``): every
  client draws its class proportions p_i ~ Dir(alpha * 1_C), all clients have (near) equal sizes, each sample's
  class is drawn from p_i, and a class whose samples ran out is refilled with all of them: samples repeat
  (within a client and across clients) and others are left unused. The convention of the papers' numbers.
- ``dirichlet-client``: the same proportions and sizes, but a used-up class is never refilled (the class is
  drawn again among those with samples left): every sample used once. Its label skew is milder than the
  references' at one alpha (tests/data/test_reference_partitions.py tells the two apart).
- ``dirichlet`` (Hsu et al. 2019 / Yurochkin et al. 2019, NIID-Bench's "hetero-dir"): each class c is split over
  the clients by q_c ~ Dir(alpha * 1_N); client sizes vary widely.

``heterogeneity`` measures a partition (label TV, sizes, duplicated and unused shares) so that runs under the
conventions can be told apart.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from landscape.core.errors import LandscapeError
from landscape.core.registry import Registry

PartitionFn = Callable[..., list[np.ndarray]]
PARTITIONS = Registry("partition")  # each factory a PartitionFn


def make_partition(name: str, labels: np.ndarray, *, num_clients: int, num_classes: int, seed: int,
                   options: dict, natural: list[np.ndarray] | None = None) -> list[np.ndarray]:
    """Split the samples with these `labels` over `num_clients` clients; one sorted index array each."""
    entry = PARTITIONS.get(name)
    opts = entry.make_options(dict(options or {}), "partition")
    labels = np.asarray(labels, dtype=np.int64)
    if num_clients < 1:
        raise LandscapeError(f"need at least 1 client (got {num_clients})")
    if num_clients > len(labels):
        raise LandscapeError(f"{num_clients} clients but only {len(labels)} training samples")
    if len(labels) and (labels.min() < 0 or labels.max() >= num_classes):
        raise LandscapeError(f"labels must lie in 0..{num_classes - 1} for {num_classes} classes")
    rng = np.random.default_rng(seed)
    clients = [np.sort(np.asarray(c, dtype=np.int64)) for c in entry.factory(
        labels, num_clients, num_classes, rng, opts, natural)]
    empty = [k for k, c in enumerate(clients) if len(c) == 0]
    if empty:
        raise LandscapeError(f"partition '{name}' left client {empty[0]} without samples "
                             f"({len(empty)} empty of {num_clients}); use fewer clients")
    return clients


@PARTITIONS.register("iid", summary="uniform random split into near-equal parts")
def iid(labels: np.ndarray, num_clients: int, num_classes: int, rng: np.random.Generator, opts: None,
        natural: list[np.ndarray] | None) -> list[np.ndarray]:
    return np.array_split(rng.permutation(len(labels)), num_clients)


@dataclass(frozen=True)
class DirichletOptions:
    alpha: float = 0.1  # concentration: small = few classes per client, large -> IID
    balanced: bool = False  # kept so that recipes written before dirichlet-client still read; true is refused
    min_samples: int = 2  # redraw until every client has this many


DIRICHLET_ATTEMPTS = 1000


@PARTITIONS.register("dirichlet", options=DirichletOptions,
                     summary="per-class split: class c over the clients by q_c ~ Dir(alpha); natural sizes")
def dirichlet(labels: np.ndarray, num_clients: int, num_classes: int, rng: np.random.Generator,
              opts: DirichletOptions, natural: list[np.ndarray] | None) -> list[np.ndarray]:
    if not opts.alpha > 0:
        raise LandscapeError(f"partition.alpha must be > 0 (got {opts.alpha})")
    if opts.balanced:
        raise LandscapeError('partition.balanced = true is partition.name = "dirichlet-client" now (per-client '
                             "proportions, equal sizes, drawn as the papers' reference code draws them)")
    if opts.min_samples < 1:
        raise LandscapeError(f"partition.min_samples must be >= 1 (got {opts.min_samples})")
    if opts.min_samples * num_clients > len(labels):
        raise LandscapeError(f"{num_clients} clients x partition.min_samples {opts.min_samples} exceeds "
                             f"the {len(labels)} training samples; lower partition.min_samples")
    by_class = [np.flatnonzero(labels == c) for c in range(num_classes)]
    for _ in range(DIRICHLET_ATTEMPTS):
        clients: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        for samples in by_class:
            # Per class c: q_c ~ Dir(alpha * 1_N) over clients; split c's shuffled samples by q_c.
            share = rng.dirichlet(np.full(num_clients, opts.alpha))
            cuts = (np.cumsum(share)[:-1] * len(samples)).astype(int)
            for k, part in enumerate(np.split(rng.permutation(samples), cuts)):
                clients[k].append(part)
        merged = [np.concatenate(parts) for parts in clients]
        if min(len(m) for m in merged) >= opts.min_samples:
            return merged
    raise LandscapeError(
        f"dirichlet partition: {DIRICHLET_ATTEMPTS} draws with alpha={opts.alpha} never gave all {num_clients} "
        f"clients >= {opts.min_samples} samples; lower partition.min_samples or raise partition.alpha"
    )


@dataclass(frozen=True)
class DirichletClientOptions:
    alpha: float = 0.1  # concentration of each client's class proportions p_i ~ Dir(alpha * 1_C)


@PARTITIONS.register("dirichlet-client", options=DirichletClientOptions,
                     summary="per-client proportions p_i ~ Dir(alpha), equal sizes, no sample reused (milder than "
                             "the reference codes' dirichlet-client-reuse)")
def dirichlet_client(labels: np.ndarray, num_clients: int, num_classes: int, rng: np.random.Generator,
                     opts: DirichletClientOptions, natural: list[np.ndarray] | None) -> list[np.ndarray]:
    """The reference codes' proportions and sizes without their reuse: p_i ~ Dir(alpha * 1_C) per client, sizes
    ``_equal_sizes``. One sample at a time, a client is picked uniformly among those still short of their size,
    and it takes a sample of class c drawn from p_i restricted to the classes with samples left (where the
    reference codes refill a used-up class: ``dirichlet_client_reuse``), the samples of each class taken in a
    seeded random order. Every sample is used once."""
    _check_alpha(opts.alpha)
    proportions = rng.dirichlet(np.full(num_classes, opts.alpha), size=num_clients)
    proportions = np.nan_to_num(proportions)  # a tiny alpha can underflow a whole row to 0/0
    pools = [rng.permutation(np.flatnonzero(labels == c)) for c in range(num_classes)]
    left = np.array([len(p) for p in pools], dtype=np.int64)
    taken: list[list[int]] = [[] for _ in range(num_clients)]
    for client in _client_order(_equal_sizes(len(labels), num_clients), rng):
        weights = np.where(left > 0, proportions[client], 0.0)
        if not weights.sum() > 0:  # p_i's mass sits on used-up classes only: draw among what is left
            weights = left.astype(np.float64)
        c = int(np.searchsorted(np.cumsum(weights), rng.random() * weights.sum(), side="right"))
        c = min(c, num_classes - 1)
        while left[c] == 0:  # rounding at the top of the cumulative sum: the last class with samples left
            c -= 1
        left[c] -= 1
        taken[client].append(int(pools[c][left[c]]))
    return [np.asarray(t, dtype=np.int64) for t in taken]


@PARTITIONS.register("dirichlet-client-reuse", options=DirichletClientOptions,
                     summary="per-client proportions p_i ~ Dir(alpha), equal sizes, a used-up class refilled "
                             "(samples reused): as the reference codes draw (FL-Simulator, FedNSAM)")
def dirichlet_client_reuse(labels: np.ndarray, num_clients: int, num_classes: int, rng: np.random.Generator,
                           opts: DirichletClientOptions, natural: list[np.ndarray] | None) -> list[np.ndarray]:
    """FL-Simulator's loop (dataset.py, ``DatasetObject.set_data``, rule 'Dirichlet'; FedNSAM's
    ``data_from_dirichlet`` is the same law client by client): p_i ~ Dir(alpha * 1_C) per client; each class's
    samples in a seeded random order (FL-Simulator shuffles the training set). One sample at a time a client is
    picked uniformly among those still short of their size (the reference draws any client and redraws a full
    one: the same law), a class c = argmax(u <= cumsum(p_i)) with u ~ U[0, 1); a class with no samples left is
    refilled with all its samples and the class drawn again; the sample is taken from the end of c's list. So
    samples repeat (within and across clients) and others go unused (``Heterogeneity.duplicated_share``,
    ``unused_share``). Sizes ``_equal_sizes`` (FL-Simulator gives the remainder n % N to client 0, FedNSAM
    drops it). Classes without samples get no mass (the reference loops forever on them)."""
    _check_alpha(opts.alpha)
    pools = [rng.permutation(np.flatnonzero(labels == c)) for c in range(num_classes)]
    present = np.array([len(p) > 0 for p in pools])
    proportions = np.nan_to_num(rng.dirichlet(np.full(num_classes, opts.alpha), size=num_clients)) * present
    proportions[proportions.sum(axis=1) == 0] = present  # a row underflowed, or all on absent classes: uniform
    cumulative = np.cumsum(proportions / proportions.sum(axis=1, keepdims=True), axis=1)
    last = np.flatnonzero(present)[-1]  # u above a rounded-down top of cumsum(p_i): the last class held
    left = np.array([len(p) for p in pools], dtype=np.int64)
    taken: list[list[int]] = [[] for _ in range(num_clients)]
    for client in _client_order(_equal_sizes(len(labels), num_clients), rng):
        while True:
            c = min(int(np.searchsorted(cumulative[client], rng.random(), side="left")), last)
            if left[c] > 0:
                break
            left[c] = len(pools[c])  # refilled with all its samples (reused from now on); the class drawn again
        left[c] -= 1
        taken[client].append(int(pools[c][left[c]]))
    return [np.asarray(t, dtype=np.int64) for t in taken]


def _check_alpha(alpha: float) -> None:
    if not alpha > 0:
        raise LandscapeError(f"partition.alpha must be > 0 (got {alpha})")


def _equal_sizes(n: int, num_clients: int) -> np.ndarray:
    """Client sizes n // N, the first n % N clients one more: every client near n / N and the sizes add up to n."""
    need = np.full(num_clients, n // num_clients, dtype=np.int64)
    need[: n % num_clients] += 1
    return need


def _client_order(need: np.ndarray, rng: np.random.Generator) -> list[int]:
    """The order in which clients take their samples: at each step a client drawn uniformly among those still
    short of their size (the reference code draws any client and redraws a full one: the same distribution)."""
    need = need.copy()
    active = [int(i) for i in np.flatnonzero(need > 0)]
    order: list[int] = []
    while active:
        k = int(rng.integers(len(active)))
        client = active[k]
        order.append(client)
        need[client] -= 1
        if need[client] == 0:
            active[k] = active[-1]
            active.pop()
    return order


@dataclass(frozen=True)
class PathologicalOptions:
    classes_per_client: int = 2


@PARTITIONS.register("pathological", options=PathologicalOptions,
                     summary="each client holds exactly c classes (McMahan et al. 2017)")
def pathological(labels: np.ndarray, num_clients: int, num_classes: int, rng: np.random.Generator,
                 opts: PathologicalOptions, natural: list[np.ndarray] | None) -> list[np.ndarray]:
    c = opts.classes_per_client
    if not 1 <= c <= num_classes:
        raise LandscapeError(f"partition.classes_per_client must be in 1..{num_classes} (got {c})")
    if num_clients * c < num_classes:
        raise LandscapeError(f"{num_clients} clients x {c} classes each cannot cover {num_classes} classes; "
                             "raise partition.classes_per_client or the number of clients")
    # Round-robin over a seeded class permutation: client k holds perm[(k * c + j) % C], j < c.
    perm = rng.permutation(num_classes)
    holders: list[list[int]] = [[] for _ in range(num_classes)]
    for k in range(num_clients):
        for j in range(c):
            holders[perm[(k * c + j) % num_classes]].append(k)
    clients: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for cls, owners in enumerate(holders):
        samples = rng.permutation(np.flatnonzero(labels == cls))
        if len(samples) < len(owners):
            raise LandscapeError(f"pathological partition: class {cls} has {len(samples)} samples but "
                                 f"{len(owners)} clients must hold it; use fewer clients or classes per client")
        for k, part in zip(owners, np.array_split(samples, len(owners))):
            clients[k].append(part)
    return [np.concatenate(parts) for parts in clients]


@PARTITIONS.register("natural", summary="the data set's own clients (synthetic; femnist's writers, shakespeare's roles)")
def natural_split(labels: np.ndarray, num_clients: int, num_classes: int, rng: np.random.Generator, opts: None,
                  natural: list[np.ndarray] | None) -> list[np.ndarray]:
    if natural is None:
        raise LandscapeError("partition 'natural' needs a data set with its own clients (synthetic, femnist, shakespeare)")
    if len(natural) != num_clients:
        raise LandscapeError(f"partition 'natural': the data set has {len(natural)} clients "
                             f"but num_clients is {num_clients}")
    return [np.array(c, dtype=np.int64) for c in natural]


def class_histogram(labels: Any, client_indices: list[np.ndarray], num_classes: int) -> np.ndarray:
    """[clients, classes] sample counts."""
    labels = np.asarray(labels, dtype=np.int64)
    return np.stack([np.bincount(labels[np.asarray(idx, dtype=np.int64)], minlength=num_classes)
                     for idx in client_indices])


def mean_label_entropy(hist: np.ndarray) -> float:
    """Mean over clients of the entropy (nats) of the client's label distribution (0 log 0 = 0)."""
    hist = np.asarray(hist, dtype=np.float64)
    hist = hist[hist.sum(axis=1) > 0]
    p = hist / hist.sum(axis=1, keepdims=True)
    terms = np.where(p > 0, -p * np.log(np.where(p > 0, p, 1.0)), 0.0)
    return float(terms.sum(axis=1).mean())


@dataclass(frozen=True)
class Heterogeneity:
    """How heterogeneous a partition is, comparable across partition conventions.

    ``label_tv``: mean over clients of the total-variation distance TV(p_i, p) = 1/2 sum_c |p_ic - p_c| of client
    i's label distribution p_i from the global one p (the union of the clients, repeats counted), in
    [0, 1 - min_c p_c]; ``label_tv_max`` the largest; ``size_*``: client sizes, ``size_cv`` = std / mean (ddof 0).
    ``duplicated_share``: the fraction of the clients' samples (counted with repeats) that repeat another one,
    1 - distinct / listed; ``unused_share``: the fraction of the training set no client holds, 1 - distinct / n
    (both 0 for a partition that uses every sample once; None where the indices were not given)."""

    label_tv: float
    label_tv_max: float
    size_min: int
    size_max: int
    size_mean: float
    size_cv: float
    duplicated_share: float | None = None
    unused_share: float | None = None

    def record(self) -> dict:
        shares = {} if self.duplicated_share is None else {"duplicated_share": self.duplicated_share,
                                                            "unused_share": self.unused_share}
        return {"label_tv": self.label_tv, "label_tv_max": self.label_tv_max, "size_min": self.size_min,
                "size_max": self.size_max, "size_mean": self.size_mean, "size_cv": self.size_cv, **shares}

    def text(self) -> str:
        shares = "" if self.duplicated_share is None else (
            f"; {self.duplicated_share:.1%} of the client samples repeat another, "
            f"{self.unused_share:.1%} of the training set unused")
        return (f"heterogeneity: mean label TV distance from the global distribution {self.label_tv:.3f} "
                f"(max {self.label_tv_max:.3f}); client sizes {self.size_min}-{self.size_max}, "
                f"mean {self.size_mean:.1f}, CV {self.size_cv:.2f}{shares}")


def heterogeneity(hist: np.ndarray, client_indices: list[np.ndarray] | None = None,
                  num_samples: int | None = None) -> Heterogeneity:
    """The ``Heterogeneity`` of a [clients, classes] histogram; with the clients' indices into the
    ``num_samples`` training samples, its duplicated and unused shares too."""
    hist = np.asarray(hist, dtype=np.float64)
    sizes = hist.sum(axis=1)
    p = hist.sum(axis=0) / hist.sum()
    tv = 0.5 * np.abs(hist / sizes[:, None] - p).sum(axis=1)
    shares: tuple[float | None, float | None] = (None, None)
    if client_indices is not None and num_samples is not None:
        listed = np.concatenate([np.asarray(c, dtype=np.int64) for c in client_indices])
        distinct = np.unique(listed).size
        shares = (1.0 - distinct / listed.size, 1.0 - distinct / num_samples)
    return Heterogeneity(float(tv.mean()), float(tv.max()), int(sizes.min()), int(sizes.max()), float(sizes.mean()),
                         float(sizes.std() / sizes.mean()), *shares)


def format_partition_table(hist: np.ndarray) -> str:
    """One row per client, one column per class, a total column and a totals row."""
    hist = np.asarray(hist, dtype=np.int64)
    body = np.concatenate([hist, hist.sum(axis=1, keepdims=True)], axis=1)
    body = np.concatenate([body, body.sum(axis=0, keepdims=True)], axis=0)
    header = ["client"] + [str(c) for c in range(hist.shape[1])] + ["total"]
    names = [str(k) for k in range(hist.shape[0])] + ["total"]
    rows = [header] + [[name] + [str(v) for v in row] for name, row in zip(names, body)]
    widths = [max(len(row[j]) for row in rows) for j in range(len(header))]
    return "\n".join(" ".join(cell.rjust(width) for cell, width in zip(row, widths)) for row in rows)
