"""The data sets that need no files: `digits` (scikit-learn's bundled 8x8 digits), `synthetic` (FedProx's
Synthetic(alpha, beta)) and `mnist1d` (MNIST-1D, made by the `mnist1d` package's generator), registered in
``datasets.DATASETS``.
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from landscape.core.errors import LandscapeError
from landscape.core.machine import require_memory
from landscape.data.datasets import DATASETS, DatasetBundle, make_bundle, require

# ---------------------------------------------------------------------------------------------------------
# digits: sklearn.datasets.load_digits (1797 8x8 images, 16 grey levels), bundled with scikit-learn.


@dataclass(frozen=True)
class DigitsOptions:
    test_fraction: float = 0.2  # held-out share, split stratified by class


@DATASETS.register("digits", options=DigitsOptions, summary="scikit-learn 8x8 digits (offline, default)")
def load_digits(root: Path, download: bool, augment: bool, num_clients: int, seed: int,
                opts: DigitsOptions) -> DatasetBundle:
    from sklearn.datasets import load_digits as sklearn_digits
    from sklearn.model_selection import train_test_split

    require(0 < opts.test_fraction < 1, f"dataset.test_fraction must be in (0, 1) (got {opts.test_fraction})")
    raw = sklearn_digits()
    x = (raw.data / 16.0).reshape(-1, 1, 8, 8)
    x_train, x_test, y_train, y_test = train_test_split(
        x, raw.target, test_size=opts.test_fraction, stratify=raw.target, random_state=seed
    )
    # Standardise with the TRAIN set's scalar mean / std so no test statistic leaks into training.
    mean, std = x_train.mean(), x_train.std()
    return make_bundle("digits", (x_train - mean) / std, y_train, (x_test - mean) / std, y_test, num_classes=10)


# ---------------------------------------------------------------------------------------------------------
# synthetic: Synthetic(alpha, beta) of Li et al. 2020, "Federated optimization in heterogeneous networks"
# (FedProx), following its generator data/synthetic_1_1/generate_synthetic.py in litian96/FedProx.

SYNTHETIC_LOGNORMAL_MEAN = 4.0  # samples per client: int(LogNormal(4, 2)) + 50, as in the reference
SYNTHETIC_LOGNORMAL_SIGMA = 2.0
SYNTHETIC_MIN_SAMPLES = 50


@dataclass(frozen=True)
class SyntheticOptions:
    alpha: float = 1.0  # spread of the clients' models: u_k ~ N(0, alpha), W_k, b_k ~ N(u_k, 1)
    beta: float = 1.0  # spread of the clients' inputs: B_k ~ N(0, beta), v_k ~ N(B_k, 1)
    dimension: int = 60
    classes: int = 10
    test_fraction: float = 0.1  # per client, as the reference's int(0.9 * n) train split


@DATASETS.register("synthetic", options=SyntheticOptions,
                   summary="FedProx Synthetic(alpha, beta): one logistic model per client (own clients)")
def load_synthetic(root: Path, download: bool, augment: bool, num_clients: int, seed: int,
                   opts: SyntheticOptions) -> DatasetBundle:
    require(num_clients >= 1, f"synthetic needs at least 1 client (got {num_clients})")
    require(opts.alpha >= 0, f"dataset.alpha must be >= 0 (got {opts.alpha})")
    require(opts.beta >= 0, f"dataset.beta must be >= 0 (got {opts.beta})")
    require(opts.dimension >= 1, f"dataset.dimension must be >= 1 (got {opts.dimension})")
    require(opts.classes >= 2, f"dataset.classes must be >= 2 (got {opts.classes})")
    require(0 < opts.test_fraction < 1, f"dataset.test_fraction must be in (0, 1) (got {opts.test_fraction})")
    rng = np.random.default_rng(seed)
    d, c = opts.dimension, opts.classes
    sizes = rng.lognormal(SYNTHETIC_LOGNORMAL_MEAN, SYNTHETIC_LOGNORMAL_SIGMA, num_clients).astype(int)
    sizes = sizes + SYNTHETIC_MIN_SAMPLES
    _check_synthetic_memory(opts, num_clients, int(sizes.sum(dtype=object)))  # before the data is drawn
    model_mean = rng.normal(0.0, opts.alpha, num_clients)  # u_k (the mean of both W_k and b_k)
    input_mean_of_mean = rng.normal(0.0, opts.beta, num_clients)  # B_k
    input_mean = rng.normal(input_mean_of_mean[:, None], 1.0, (num_clients, d))  # v_k
    input_std = np.arange(1, d + 1, dtype=np.float64) ** -0.6  # Sigma = diag(j^-1.2), so std = j^-0.6

    x_train, y_train, x_test, y_test, natural = [], [], [], [], []
    offset = 0
    for k in range(num_clients):
        weight = rng.normal(model_mean[k], 1.0, (d, c))
        bias = rng.normal(model_mean[k], 1.0, c)
        x = input_mean[k] + input_std * rng.normal(size=(sizes[k], d))
        with np.errstate(all="ignore"):  # overflow is refused just below, naming the setting
            logits = x @ weight + bias
        _check_synthetic_values(opts, x, logits)
        y = np.argmax(logits, axis=1)  # argmax of softmax(W x + b) = argmax of the logits
        order = rng.permutation(sizes[k])
        n_train = int((1.0 - opts.test_fraction) * sizes[k])
        train, test = order[:n_train], order[n_train:]
        x_train.append(x[train])
        y_train.append(y[train])
        x_test.append(x[test])
        y_test.append(y[test])
        natural.append(np.arange(offset, offset + n_train, dtype=np.int64))
        offset += n_train
    return make_bundle("synthetic", np.concatenate(x_train), np.concatenate(y_train), np.concatenate(x_test),
                       np.concatenate(y_test), num_classes=c, natural_partition=natural)


# Peak memory of the generator per input value (float64): a client's x, the lists of the splits and their
# concatenation, then the bundle's copy.
SYNTHETIC_COPIES = 4


def _check_synthetic_memory(opts: SyntheticOptions, num_clients: int, samples: int) -> None:
    """Refuse in one line, before anything is drawn, a data set that cannot fit in this machine's memory."""
    d, c = opts.dimension, opts.classes
    needed = 8 * (SYNTHETIC_COPIES * samples * d + num_clients * d + 2 * d * c + samples * c)
    require_memory(needed, f"the synthetic data set of dimension {d:,} with {c:,} classes ({num_clients:,} "
                           f"clients, {samples:,} samples)", "choose a smaller dataset.dimension or dataset.classes")


def _check_synthetic_values(opts: SyntheticOptions, x: np.ndarray, logits: np.ndarray) -> None:
    """Inputs that overflow as they are made (float64) or non-finite logits (labels from argmax of NaN: all one
    class) refused, naming the settings that made them. Inputs finite here but beyond the run's dtype (float32's
    range) are refused where every data set enters, which knows the dtype (``datasets.load_dataset``)."""
    settings = f"dataset.alpha = {opts.alpha:g}, dataset.beta = {opts.beta:g}"
    require(bool(np.isfinite(x).all()), f"synthetic inputs overflow (not finite even in float64) with {settings}: "
            "choose a smaller dataset.beta")
    require(bool(np.isfinite(logits).all()),
            f"synthetic labels are not defined with {settings} (the logits W x + b overflow to inf or NaN): "
            "choose a smaller dataset.alpha or dataset.beta")


# ---------------------------------------------------------------------------------------------------------
# mnist1d: MNIST-1D of Greydanus 2020, "Scaling down deep learning", generated offline by the `mnist1d` package
# (its make_dataset, never its get_dataset, which tries to download a pickle first and writes one to the
# working folder). Default arguments: 5,000 signals of length 40, 10 classes, the first 4,000 for training.

MNIST1D_DEFAULT_SEED = 42  # the package's default, so the data set is the same for every recipe seed


@dataclass(frozen=True)
class Mnist1dOptions:
    data_seed: int = MNIST1D_DEFAULT_SEED  # the generator's seed (not the recipe's: that splits and initialises)


@functools.lru_cache(maxsize=4)
def _mnist1d_arrays(data_seed: int) -> tuple[np.ndarray, ...]:
    """(x_train, y_train, x_test, y_test) as the package makes them, read-only (shared by later loads)."""
    try:
        from mnist1d.data import get_dataset_args, make_dataset
    except ImportError as error:
        raise LandscapeError(f"mnist1d needs the mnist1d package (pip install mnist1d): {error}") from None
    args = get_dataset_args()
    args.seed = data_seed
    # make_dataset seeds and draws from numpy's and Python's global generators: put both back afterwards.
    numpy_state, python_state = np.random.get_state(), random.getstate()
    try:
        data = make_dataset(args)
    finally:
        np.random.set_state(numpy_state)
        random.setstate(python_state)
    arrays = tuple(np.array(data[key]) for key in ("x", "y", "x_test", "y_test"))
    for array in arrays:
        array.setflags(write=False)
    return arrays


@DATASETS.register("mnist1d", options=Mnist1dOptions,
                   summary="MNIST-1D (Greydanus 2020): 40-long 1D signals, generated offline")
def load_mnist1d(root: Path, download: bool, augment: bool, num_clients: int, seed: int,
                 opts: Mnist1dOptions) -> DatasetBundle:
    value = opts.data_seed
    require(isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**32,
             f"dataset.data_seed must be an integer in 0..{2**32 - 1} (got {value!r})")
    x_train, y_train, x_test, y_test = _mnist1d_arrays(value)
    # The package standardises all 5,000 signals together; standardising again with the TRAIN set's scalar
    # mean / std (as digits) makes the composed affine map the train statistics' alone.
    mean, std = x_train.mean(), x_train.std()
    return make_bundle("mnist1d", ((x_train - mean) / std)[:, None], y_train.copy(),
                       ((x_test - mean) / std)[:, None], y_test.copy(), num_classes=10)
