"""The incompatibility's loss level on a seeded sample of (client, draw) pairs (``loss_level_pairs``): against
every pair evaluated and the same pairs averaged by hand, its standard error, bit-identity where every pair is
evaluated, the pass's cost and its results' names."""

import dataclasses

import numpy as np
import pytest
from support.problems import digits_clients

from landscape.analyze.passes import PASSES, RESULT_NAMES
from landscape.analyze.passes.incompatibility import FORWARD_COST
from landscape.analyze.settings import AnalysisSettings
from landscape.core.errors import LandscapeError
from landscape.core.rng import derived_seed
from landscape.measure.flatness import flatness_incompatibility
from landscape.measure.incompatibility import loss_level_mask

RHO, BATCH, DRAWS, SEED = 0.05, 16, 6, 1  # 4 clients x 6 draws = 24 pairs
LOSS_LEVEL = {"local_perturbed_loss", "local_perturbed_loss_se", "loss_gap", "loss_gap_se", "loss_level_pairs",
              "client_perturbed_loss", "perturbed_loss_samples"}


@pytest.fixture(scope="module")
def digits():
    return digits_clients()


def incompatibility(digits, **options):
    _, glob, clients, w = digits
    return flatness_incompatibility(glob, clients, w, RHO, batch_size=BATCH, batches=DRAWS, seed=SEED, **options)


@pytest.fixture(scope="module")
def every_pair(digits):
    return incompatibility(digits)


def same(a, b) -> bool:
    """Equal to the last bit (NaN equal to NaN)."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.array_equal(np.asarray(a), np.asarray(b), equal_nan=a.dtype.kind == "f")
    return a == b or (isinstance(a, float) and np.isnan(a) and np.isnan(b))


def differing(a, b) -> set[str]:
    return {f.name for f in dataclasses.fields(a) if not same(getattr(a, f.name), getattr(b, f.name))}


def test_a_sample_of_pairs_is_the_mean_of_those_pairs_evaluated_by_hand(digits, every_pair):
    k = 10
    sampled = incompatibility(digits, loss_level_pairs=k)
    # the pairs: K of the N * M flat (client, draw) indices, from a generator of their own seeded by (seed, 102)
    chosen = np.random.default_rng(derived_seed(SEED, 102)).choice(4 * DRAWS, size=k, replace=False)
    mask = np.zeros(4 * DRAWS, dtype=bool)
    mask[chosen] = True
    mask = mask.reshape(4, DRAWS)
    np.testing.assert_array_equal(loss_level_mask(4, DRAWS, k, SEED), mask)
    every = every_pair.perturbed_loss_samples
    assert not np.isnan(every).any()
    # evaluated pairs are the all-pairs values to the last bit, the others NaN
    np.testing.assert_array_equal(sampled.perturbed_loss_samples, np.where(mask, every, np.nan))
    values = every[mask]
    assert values.size == k and sampled.loss_level_pairs == k and every_pair.loss_level_pairs == 4 * DRAWS
    assert sampled.local_perturbed_loss == pytest.approx(values.mean(), rel=1e-15)
    assert sampled.local_perturbed_loss_se == pytest.approx(np.std(values, ddof=1) / np.sqrt(k), rel=1e-12)
    assert sampled.loss_gap_se == sampled.local_perturbed_loss_se
    assert sampled.loss_gap == pytest.approx(every_pair.perturbed_global_loss - values.mean(), rel=1e-12)
    for i in range(4):
        want = every[i][mask[i]].mean() if mask[i].any() else np.nan
        np.testing.assert_allclose(sampled.client_perturbed_loss[i], want, rtol=1e-15)
    # the estimate lies within a few of its SEs of the mean over every pair, and not on it
    assert abs(sampled.local_perturbed_loss - every_pair.local_perturbed_loss) < 4 * sampled.local_perturbed_loss_se
    assert sampled.local_perturbed_loss != every_pair.local_perturbed_loss
    # nothing else moves: the full-local term (N evaluations) stays exact, every other figure bit-identical
    assert differing(sampled, every_pair) == LOSS_LEVEL
    assert sampled.full_local_loss_gap == every_pair.full_local_loss_gap


def test_a_client_without_an_evaluated_draw_has_no_perturbed_loss(digits, every_pair):
    k = 3  # 3 of 24 pairs: a client without any is certain for this seed (checked)
    mask = loss_level_mask(4, DRAWS, k, SEED)
    empty = ~mask.any(axis=1)
    assert empty.any()
    sampled = incompatibility(digits, loss_level_pairs=k)
    assert np.isnan(sampled.client_perturbed_loss[empty]).all()
    assert not np.isnan(sampled.client_perturbed_loss[~empty]).any()
    assert sampled.local_perturbed_loss == pytest.approx(every_pair.perturbed_loss_samples[mask].mean(), rel=1e-15)


@pytest.mark.parametrize("k", [0, 24, 25, 1000])
def test_every_pair_is_evaluated_where_they_are_no_more_than_k_bit_identically(digits, every_pair, k):
    result = incompatibility(digits, loss_level_pairs=k)
    assert differing(result, every_pair) == set()
    assert result.loss_level_pairs == 24


def test_without_the_loss_level_no_pair_is_evaluated(digits, every_pair):
    result = incompatibility(digits, loss_level=False, loss_level_pairs=10)
    assert result.loss_level_pairs == 0 and np.isnan(result.perturbed_loss_samples).all()
    assert np.isnan(result.local_perturbed_loss) and np.isnan(result.local_perturbed_loss_se)
    assert result.incompatibility == every_pair.incompatibility


def test_the_sample_of_pairs_follows_the_seed():
    a, b = loss_level_mask(100, 8, 64, 0), loss_level_mask(100, 8, 64, 1)
    assert a.sum() == b.sum() == 64 and a.shape == (100, 8)
    assert np.array_equal(a, loss_level_mask(100, 8, 64, 0)) and not np.array_equal(a, b)
    assert loss_level_mask(8, 8, 64, 0).all() and loss_level_mask(100, 8, 0, 0).all()


@pytest.mark.parametrize("bad", [-1, 1.5, True, "8"])
def test_a_bad_number_of_pairs_is_one_line(digits, bad):
    with pytest.raises(LandscapeError, match=r"loss_level_pairs must be an integer >= 0 \(0: every pair\)"):
        incompatibility(digits, loss_level_pairs=bad)
    with pytest.raises(LandscapeError, match="loss_level_pairs"):
        PASSES.get("incompatibility").make_options({"loss_level_pairs": -1})


def test_the_cost_counts_k_pairs():
    spec = PASSES.get("incompatibility")

    def cost(**values) -> float:
        return spec.cost(spec.make_options(values)).gradients

    assert cost(loss_level_pairs=100) - cost(loss_level_pairs=10) == pytest.approx(90 * FORWARD_COST)
    assert cost() == pytest.approx(cost(loss_level_pairs=64))
    assert cost(loss_level=False, loss_level_pairs=100) == cost(loss_level=False, loss_level_pairs=10) < cost()


def test_the_option_names_a_result_only_off_its_default():
    def name(**values) -> str:
        options = PASSES.get("incompatibility").make_options(values)
        record = {"analysis": AnalysisSettings().record(), "pass": dataclasses.asdict(options)}
        return RESULT_NAMES.result_name("incompatibility", record)

    assert name() == name(loss_level_pairs=64) == "incompatibility"
    assert name(loss_level_pairs=0) == "incompatibility@loss_level_pairs-0"
    assert name(loss_level_pairs=200) == "incompatibility@loss_level_pairs-200"
    # a result recorded before the option evaluated every pair: it is named (and looked up) as such, so the
    # default's sampled computation never takes it for done
    old = dataclasses.asdict(PASSES.get("incompatibility").make_options({}))
    del old["loss_level_pairs"]
    before = {"analysis": AnalysisSettings().record(), "pass": old}
    assert RESULT_NAMES.result_name("incompatibility", before) == "incompatibility@loss_level_pairs-0"
    now = {"analysis": AnalysisSettings().record(), "pass": {**old, "loss_level_pairs": 64}}
    assert not RESULT_NAMES.same_settings("incompatibility", before, now)
    assert RESULT_NAMES.same_settings("incompatibility", before, {**now, "pass": {**old, "loss_level_pairs": 0}})


def test_the_model_is_switched_to_the_bn_mode_once_per_pass_not_per_evaluation(digits, every_pair, monkeypatch):
    """The analysis model stays in training mode: each evaluation switched every module's flag to eval and
    back, about as long as a small client's forward pass. The pass sets it once, with the same numbers."""
    flat = digits[0]
    assert flat.module.training  # as the analysis holds it
    switches = []
    train = type(flat.module).train
    monkeypatch.setattr(type(flat.module), "train", lambda self, mode=True: switches.append(mode) or train(self, mode))
    result = incompatibility(digits)
    assert switches == [False] and flat.module.training
    assert differing(result, every_pair) == set()
