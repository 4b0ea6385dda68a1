"""Flatness distance (against the trainer's log) and flatness incompatibility (against direct computations)."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from support.helpers import tiny_recipe
from support.problems import digits_clients

from landscape.config import setup
from landscape.core.errors import LandscapeError
from landscape.core.flat import FlatModel
from landscape.data.partitions import make_partition
from landscape.measure.flatness import (
    client_minibatch_indices,
    client_models,
    draw_mean_se,
    flatness_distance,
    flatness_incompatibility,
    pair_mean_se,
)
from landscape.store.checkpoints import load_checkpoint
from landscape.store.directory import RunDir
from landscape.train import loop

RHO = 0.05


# ----------------------------------------------------------------------------------------------------------
# flatness distance


def test_flatness_distance_direct():
    x = torch.tensor([1.0, 2.0, 0.0], dtype=torch.float64)
    ys = {3: torch.tensor([1.0, 0.0, 1.0], dtype=torch.float64), 1: torch.tensor([2.0, 2.0, 2.0], dtype=torch.float64)}
    r = flatness_distance(x, ys)
    assert r.clients == [1, 3]
    # around the clients' mean ybar = (1.5, 1, 1.5): ||y_i - ybar||^2 = 0.25 + 1 + 0.25 for both
    np.testing.assert_array_equal(r.client_distance, [1.5, 1.5])
    assert r.distance == 1.5 and r.mean_norm_sq == 5.5 and r.distance_normalized == pytest.approx(1.5 / 5.5)
    # the distance to the given global model x is another quantity: Delta_D + ||ybar - x||^2
    np.testing.assert_array_equal(r.client_distance_to_global, [5.0, 5.0])
    assert r.distance_to_global == 5.0 and r.global_norm_sq == 5.0 and r.distance_to_global_normalized == 1.0
    assert r.global_offset_sq == 3.5 and r.distance + r.global_offset_sq == r.distance_to_global
    with pytest.raises(LandscapeError, match="at least one client model"):
        flatness_distance(x, {})
    with pytest.raises(LandscapeError, match="client 0's model has 2 parameters"):
        flatness_distance(x, {0: torch.zeros(2)})


def test_flatness_distance_recomputed_from_saved_clients_equals_the_logged_value(tmp_path):
    recipe = tiny_recipe(train__keep_clients=True, train__dtype="float64", train__rounds=3)
    loop.start_run(recipe, tmp_path / "run", progress=False)
    run = RunDir(tmp_path / "run")
    flat = FlatModel(setup.build_module(recipe, setup.prepare_data(recipe).bundle).double())
    rows = {row["round"]: row for row in run.read_metrics()}
    assert sorted(rows) == [1, 2, 3]
    for t, row in rows.items():
        x = flat.from_state_dict(load_checkpoint(run.checkpoint(t))["model"])[0]
        clients = client_models(flat, load_checkpoint(run.clients_checkpoint(t)))
        assert sorted(clients) == row["clients"]
        r = flatness_distance(x, clients)
        assert r.distance == pytest.approx(row["flatness_distance"], rel=1e-12)
        assert r.distance_normalized == pytest.approx(row["flatness_distance_normalized"], rel=1e-12)
        assert r.distance_to_global == pytest.approx(row["flatness_distance_to_global"], rel=1e-12)
        assert r.distance_to_global_normalized == pytest.approx(row["flatness_distance_to_global_normalized"],
                                                                rel=1e-12)
    with pytest.raises(LandscapeError, match="not a clients checkpoint"):
        client_models(flat, load_checkpoint(run.checkpoint(1)))


# ----------------------------------------------------------------------------------------------------------
# flatness incompatibility on an MLP over digits, in float64


@pytest.fixture(scope="module")
def digits():
    return digits_clients()


@pytest.fixture(scope="module")
def result(digits):
    _, glob, clients, w = digits
    return flatness_incompatibility(glob, clients, w, RHO, batch_size=16, batches=6, seed=1)


def _grad(flat, x, y, w):
    w = w.detach().clone().requires_grad_(True)
    (g,) = torch.autograd.grad(F.cross_entropy(flat.logits(w, x, {}), y), w)
    return g


def _ce(flat, x, y, w):
    return float(F.cross_entropy(flat.logits(w, x, {}), y))


def test_terms_add_up_exactly_on_the_sample(result):
    r = result
    assert r.heterogeneity + r.batch_part + 2 * r.cross == pytest.approx(r.incompatibility, abs=1e-10)
    np.testing.assert_allclose(r.client_heterogeneity + r.client_batch_part + 2 * r.client_cross,
                               r.client_incompatibility, atol=1e-10, rtol=0)
    total = r.gradient_heterogeneity + r.gradient_noise + 2 * r.gradient_cross
    assert total == pytest.approx(r.gradient_total, abs=1e-10 * max(1.0, r.gradient_total))
    np.testing.assert_allclose(
        r.client_gradient_heterogeneity + r.client_gradient_noise + 2 * r.client_gradient_cross,
        r.client_gradient_total, rtol=1e-10, atol=1e-14)
    assert 0 <= r.incompatibility <= 4 * RHO**2
    assert ((r.incompatibility_samples >= 0) & (r.incompatibility_samples <= 4 * RHO**2)).all()
    assert r.heterogeneity_share + r.noise_share == pytest.approx(1.0, abs=1e-14)
    assert 0 < r.heterogeneity_share < 1
    assert abs(r.gradient_cross) < 4 * r.gradient_cross_se  # zero in expectation
    assert r.friendly_pairs == 4 * 6 * 5 and r.incompatibility_samples.shape == (4, 6)


def test_every_term_against_a_direct_computation(digits, result):
    flat, glob, clients, w = digits
    x_all, y_all = glob.data.x, glob.data.y
    grad = _grad(flat, x_all, y_all, w)
    e_star = RHO * grad / grad.norm()
    f_star = _ce(flat, x_all, y_all, w + e_star)
    assert result.perturbed_global_loss == pytest.approx(f_star, rel=1e-12)
    losses, full = [], []
    for k, c in enumerate(result.clients):
        data = clients[c].data
        g_i = _grad(flat, data.x, data.y, w)
        e_i = RHO * g_i / g_i.norm()
        assert result.client_heterogeneity[k] == pytest.approx(float(((e_i - e_star) ** 2).sum()), rel=1e-10)
        assert result.client_gradient_heterogeneity[k] == pytest.approx(float(((g_i - grad) ** 2).sum()), rel=1e-10)
        full.append(_ce(flat, x_all, y_all, w + e_i))
        index = client_minibatch_indices(len(data), 16, 6, seed=1, client=c)
        es, base, row = [], [], []
        for b, idx in enumerate(index):
            g_b = _grad(flat, data.x[idx], data.y[idx], w)
            e_b = RHO * g_b / g_b.norm()
            assert float(e_b.norm()) == pytest.approx(RHO, rel=1e-12)
            assert result.incompatibility_samples[k, b] == pytest.approx(float(((e_b - e_star) ** 2).sum()),
                                                                         rel=1e-10)
            row.append(_ce(flat, x_all, y_all, w + e_b))
            es.append(e_b)
            base.append(_ce(flat, data.x[idx], data.y[idx], w))
        losses.append(row)
        friendly = [_ce(flat, data.x[index[b2]], data.y[index[b2]], w + es[b]) < base[b2]
                    for b in range(6) for b2 in range(6) if b != b2]
        assert result.client_friendly_rate[k] == pytest.approx(np.mean(friendly), abs=1e-15)
    np.testing.assert_allclose(result.perturbed_loss_samples, losses, rtol=1e-12)
    assert result.loss_gap == pytest.approx(f_star - np.mean(losses), rel=1e-10)
    assert result.full_local_loss_gap == pytest.approx(f_star - np.mean(full), rel=1e-10)


def test_friendly_rate_is_a_fraction_and_deterministic_given_the_seed(digits, result):
    _, glob, clients, w = digits
    assert 0 <= result.friendly_rate <= 1
    assert ((result.client_friendly_rate >= 0) & (result.client_friendly_rate <= 1)).all()
    again = flatness_incompatibility(glob, clients, w, RHO, batch_size=16, batches=6, seed=1)
    assert again.friendly_rate == result.friendly_rate
    np.testing.assert_array_equal(again.incompatibility_samples, result.incompatibility_samples)
    other = flatness_incompatibility(glob, clients, w, RHO, batch_size=16, batches=6, seed=2, loss_level=False)
    assert not np.array_equal(other.incompatibility_samples, result.incompatibility_samples)
    assert np.isnan(other.loss_gap) and np.isnan(other.perturbed_loss_samples).all()
    # A client's draws depend on (seed, client) only, not on which other clients are analysed.
    alone = flatness_incompatibility(glob, {2: clients[2]}, w, RHO, batch_size=16, batches=6, seed=1,
                                     loss_level=False)
    np.testing.assert_array_equal(alone.incompatibility_samples[0], result.incompatibility_samples[2])


def test_identical_client_data_has_no_heterogeneity(digits):
    _, glob, clients, w = digits
    shared = glob.with_data(clients[0].data)  # every client and F hold the same data
    same = {0: shared, 1: shared.with_data(clients[0].data), 2: shared.with_data(clients[0].data)}
    r = flatness_incompatibility(shared, same, w, RHO, batch_size=16, batches=4, seed=0, loss_level=False)
    assert r.heterogeneity == 0.0 and r.gradient_heterogeneity == 0.0
    assert r.cross == 0.0 and r.gradient_cross == 0.0
    assert r.incompatibility == pytest.approx(r.batch_part, abs=1e-15) and r.batch_part > 0
    assert r.heterogeneity_share == 0.0 and r.noise_share == 1.0


def test_full_batch_draws_have_no_batch_part(digits):
    _, glob, clients, w = digits
    biggest = max(len(c.data) for c in clients.values())
    r = flatness_incompatibility(glob, clients, w, RHO, batch_size=biggest, batches=3, seed=0, loss_level=False)
    assert r.batch_part < 1e-20 and r.gradient_noise < 1e-20 and abs(r.cross) < 1e-12
    assert r.incompatibility == pytest.approx(r.heterogeneity, rel=1e-9)
    assert r.heterogeneity > 1e-4  # non-IID clients: their full gradients disagree with F's
    assert r.friendly_rate == 0.0  # the ascent step on the whole data raises that same loss


def test_iid_clients_have_small_heterogeneity(digits):
    _, glob, clients, w = digits
    labels = glob.data.y.numpy()
    parts = make_partition("iid", labels, num_clients=4, num_classes=10, seed=0, options={})
    iid = {k: glob.with_data(glob.data.subset(torch.as_tensor(ix))) for k, ix in enumerate(parts)}
    r_iid = flatness_incompatibility(glob, iid, w, RHO, batch_size=16, batches=4, seed=0, loss_level=False)
    r_skew = flatness_incompatibility(glob, clients, w, RHO, batch_size=16, batches=4, seed=0, loss_level=False)
    # IID full gradients differ from F's only by sampling: ~2% of the minibatch-gradient spread here.
    assert r_iid.gradient_heterogeneity < 0.1 * r_skew.gradient_heterogeneity
    assert r_iid.heterogeneity_share < 0.05 and r_skew.heterogeneity_share > 0.3
    assert r_iid.heterogeneity < 0.5 * r_skew.heterogeneity


def test_minibatch_draws():
    a = client_minibatch_indices(50, 8, 5, seed=3, client=7)
    assert len(a) == 5 and all(len(i) == 8 and len(set(i.tolist())) == 8 for i in a)
    assert all(int(i.max()) < 50 for i in a)
    b = client_minibatch_indices(50, 8, 5, seed=3, client=7)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not all(torch.equal(x, y) for x, y in zip(a, client_minibatch_indices(50, 8, 5, seed=3, client=8)))
    whole = client_minibatch_indices(10, 64, 2, seed=0, client=0)
    assert all(sorted(i.tolist()) == list(range(10)) for i in whole)


def test_standard_errors():
    s = np.array([[1.0, 3.0], [2.0, 2.0], [0.0, 4.0]])
    means, ses, mean, se = draw_mean_se(s)
    np.testing.assert_allclose(means, [2.0, 2.0, 2.0])
    np.testing.assert_allclose(ses, [1.0, 0.0, 2.0])  # std (ddof 1) / sqrt(2)
    assert mean == 2.0 and se == pytest.approx(np.sqrt(1.0 + 0.0 + 4.0) / 3)
    # One client, 3 draws, symmetric h: SE = sqrt(4 Var(r_b) / M), r_b the mean of row b off the diagonal.
    h = np.array([[[9.0, 1.0, 2.0], [1.0, 9.0, 3.0], [2.0, 3.0, 9.0]]])
    means, ses, mean, se = pair_mean_se(h)
    r = np.array([1.5, 2.0, 2.5])
    assert means[0] == pytest.approx(2.0) and mean == pytest.approx(2.0)
    assert ses[0] == pytest.approx(np.sqrt(4 * r.var(ddof=1) / 3)) and se == ses[0]


def test_bad_settings_are_named(digits):
    _, glob, clients, w = digits
    with pytest.raises(LandscapeError, match="rho must be > 0"):
        flatness_incompatibility(glob, clients, w, 0.0, batch_size=16, batches=4)
    with pytest.raises(LandscapeError, match="batches must be an integer >= 2"):
        flatness_incompatibility(glob, clients, w, RHO, batch_size=16, batches=1)
    with pytest.raises(LandscapeError, match="batch_size must be an integer >= 1"):
        flatness_incompatibility(glob, clients, w, RHO, batch_size=0, batches=4)
    with pytest.raises(LandscapeError, match="at least one client objective"):
        flatness_incompatibility(glob, {}, w, RHO, batch_size=16, batches=4)


@pytest.mark.parametrize("algorithm, extra", [("fednsam", {"algorithm__fednsam__lam": 0.85}),
                                              ("fedsam", {})])
def test_paper_flatness_distance_and_the_distance_to_the_new_global_model(tmp_path, algorithm, extra):
    """FedNSAM: x^{t+1} = x^t + lam m^{t-1} + Delta_bar = ybar + lam m^{t-1}, so the distance to the new global
    model exceeds the paper's Delta_D (around the clients' mean) by exactly lam^2 ||m^{t-1}||^2; FedSAM with
    server_lr 1 averages: the two are equal."""
    recipe = tiny_recipe(algorithm__name=algorithm, train__dtype="float64", train__rounds=3,
                         train__checkpoint_every=1, **extra)
    loop.start_run(recipe, tmp_path / "run", progress=False)
    run = RunDir(tmp_path / "run")
    rows = {row["round"]: row for row in run.read_metrics()}
    for t in (2, 3):
        gap = rows[t]["flatness_distance_to_global"] - rows[t]["flatness_distance"]
        if algorithm == "fedsam":
            assert gap == pytest.approx(0.0, abs=1e-12 * rows[t]["flatness_distance"])
            continue
        m_before = load_checkpoint(run.checkpoint(t - 1))["server_state"]["m"]  # m^{t-1}, broadcast in round t
        expected = 0.85**2 * float((m_before.double() ** 2).sum())
        assert expected > 0.1 * rows[t]["flatness_distance"]  # the term is not negligible here
        assert gap == pytest.approx(expected, rel=1e-9)


def test_rows_of_the_former_definition_are_read_under_their_true_name(tmp_path):
    """Before the paper's Delta_D, the distance to x^{t+1} was logged as flatness_distance: such a row must not
    be read as the paper's quantity."""
    run = RunDir(tmp_path / "old")
    run.path.mkdir()
    run.append_metrics({"round": 1, "flatness_distance": 2.0, "flatness_distance_normalized": 0.5})
    run.append_metrics({"round": 2, "flatness_distance": 1.0, "flatness_distance_normalized": 0.1,
                        "flatness_distance_to_global": 3.0})
    old, new = run.read_metrics()
    assert "flatness_distance" not in old and "flatness_distance_normalized" not in old
    assert old["flatness_distance_to_global"] == 2.0 and old["flatness_distance_to_global_normalized"] == 0.5
    assert new["flatness_distance"] == 1.0 and new["flatness_distance_to_global"] == 3.0
