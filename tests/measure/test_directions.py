"""Surface directions: filter normalisation, seeding, PCA of a trajectory, the client plane (METRICS.md)."""

import numpy as np
import pytest
import torch

from landscape.core.errors import LandscapeError
from landscape.core.flat import FlatModel
from landscape.measure.directions import (
    client_plane,
    direction_seed,
    filter_normalized_direction,
    interpolation_direction,
    pca_plane,
    random_plane,
)
from landscape.models import build_model


@pytest.fixture(scope="module")
def cnn():
    torch.manual_seed(0)
    flat = FlatModel(build_model("cnn", (1, 8, 8), 10, {"width": 4, "hidden": 16}))
    return flat, flat.vector()


def _tensors(flat, v):
    return [t.view(s) for t, s in zip(v.split(flat.numels), flat.shapes)]


def test_each_filter_has_the_norm_of_the_models_filter_and_1d_parts_are_zero(cnn):
    flat, w = cnn
    d = filter_normalized_direction(flat, w, seed=3)
    assert d.shape == w.shape and d.dtype == w.dtype
    checked = 0
    for name, d_t, w_t in zip(flat.names, _tensors(flat, d), _tensors(flat, w)):
        if w_t.dim() <= 1:
            assert torch.count_nonzero(d_t) == 0, name
            continue
        for k in range(w_t.shape[0]):  # filter by filter, independently of the implementation's reshape
            expected = torch.linalg.vector_norm(w_t[k].double())
            got = torch.linalg.vector_norm(d_t[k].double())
            assert got.item() == pytest.approx(expected.item(), rel=1e-6), (name, k)
            checked += 1
    assert checked == 4 + 8 + 16 + 10  # conv1, conv2, fc, out filters


def test_each_filter_points_along_the_seeded_gaussian_draw(cnn):
    flat, w = cnn
    d = filter_normalized_direction(flat, w, seed=11)
    g = torch.randn(flat.dim, generator=torch.Generator().manual_seed(11))
    for d_t, g_t in zip(_tensors(flat, d), _tensors(flat, g)):
        if d_t.dim() > 1:
            for k in range(d_t.shape[0]):
                cos = torch.nn.functional.cosine_similarity(d_t[k].reshape(1, -1).double(),
                                                            g_t[k].reshape(1, -1).double())
                assert cos.item() == pytest.approx(1.0, abs=1e-6)


def test_keeping_1d_tensors_scales_them_as_whole_tensors_and_leaves_the_weights_alone(cnn):
    flat, w = cnn
    ignored = filter_normalized_direction(flat, w, seed=5)
    kept = filter_normalized_direction(flat, w, seed=5, ignore_1d=False)
    for d_i, d_k, w_t in zip(_tensors(flat, ignored), _tensors(flat, kept), _tensors(flat, w)):
        if w_t.dim() <= 1:
            assert d_k.double().norm().item() == pytest.approx(w_t.double().norm().item(), rel=1e-6)
        else:
            assert torch.equal(d_i, d_k)


def test_seeded_directions_are_reproducible_and_seeds_differ(cnn):
    flat, w = cnn
    assert torch.equal(filter_normalized_direction(flat, w, 7), filter_normalized_direction(flat, w, 7))
    assert not torch.equal(filter_normalized_direction(flat, w, 7), filter_normalized_direction(flat, w, 8))
    a, b = random_plane(flat, w, 0), random_plane(flat, w, 0)
    assert torch.equal(a.d1, b.d1) and torch.equal(a.d2, b.d2)
    assert a.seeds == (direction_seed(0, 0), direction_seed(0, 1))
    assert torch.equal(a.d1, filter_normalized_direction(flat, w, a.seeds[0]))
    assert not torch.equal(a.d1, a.d2)
    other = random_plane(flat, w, 1)
    assert not torch.equal(other.d1, a.d1)
    assert not torch.equal(other.d1, a.d2)  # seed 1's d1 is not seed 0's d2


def test_orthogonalised_plane(cnn):
    flat, w = cnn
    plain = random_plane(flat, w, 4)
    ortho = random_plane(flat, w, 4, orthogonalize=True)
    assert torch.equal(ortho.d1, plain.d1)
    d1, d2 = ortho.d1.double(), ortho.d2.double()
    assert abs((d1 @ d2).item()) / (d1.norm() * d2.norm()).item() < 1e-6
    assert d2.norm().item() == pytest.approx(plain.d2.double().norm().item(), rel=1e-6)  # d2 keeps its norm
    # orthogonalising removes exactly the d1 component
    p1, p2 = plain.d1.double(), plain.d2.double()
    expected = p2 - (p2 @ p1) / (p1 @ p1) * p1
    torch.testing.assert_close(d2 / d2.norm(), expected / expected.norm(), rtol=0, atol=1e-6)


def _trajectory(seed=0, dim=60, steps=12):
    g = torch.Generator().manual_seed(seed)
    final = torch.randn(dim, generator=g, dtype=torch.float64)
    u = torch.randn(dim, generator=g, dtype=torch.float64)
    u /= u.norm()
    v = torch.randn(dim, generator=g, dtype=torch.float64)
    v -= (v @ u) * u
    v /= v.norm()
    t = torch.linspace(1, 0, steps, dtype=torch.float64)  # cov(s, cos 2 pi s) = 0: u and v are the axes
    noise = [1e-3 * torch.randn(dim, generator=g, dtype=torch.float64) for _ in t]
    points = [final + 5.0 * s * u + 0.8 * torch.cos(2 * torch.pi * s) * v + e for s, e in zip(t, noise)]
    return points, final, u, v


def test_pca_recovers_the_dominant_directions_and_matches_an_independent_pca():
    points, final, u, v = _trajectory()
    plane = pca_plane(points, final)
    d1, d2 = plane.d1, plane.d2
    assert d1.norm().item() == pytest.approx(1.0, abs=1e-12)
    assert d2.norm().item() == pytest.approx(1.0, abs=1e-12)
    assert abs((d1 @ d2).item()) < 1e-12
    assert abs((d1 @ u).item()) > 0.999 and abs((d2 @ v).item()) > 0.99
    ev = plane.explained_variance
    assert 0 <= ev[1] <= ev[0] <= 1 and ev.sum() <= 1 + 1e-12
    # independent: eigen-decomposition of the covariance of the rows (numpy)
    rows = np.stack([(p - final).numpy() for p in points])
    cov = np.cov(rows.T, bias=True)
    eigenvalues = np.sort(np.linalg.eigvalsh(cov))[::-1]
    np.testing.assert_allclose(ev, eigenvalues[:2] / eigenvalues.sum(), rtol=1e-8)
    basis = np.stack([d1.numpy(), d2.numpy()], axis=1)
    np.testing.assert_allclose(plane.coordinates, rows @ basis, rtol=1e-10)
    assert plane.coordinates.shape == (len(points), 2)


def test_pca_needs_three_points_spanning_a_plane():
    points, final, u, _ = _trajectory()
    with pytest.raises(LandscapeError, match="at least 3 checkpoints"):
        pca_plane(points[:2], final)
    with pytest.raises(LandscapeError, match="spans less than a plane"):
        pca_plane([final + s * u for s in (0.0, 1.0, 2.0, 3.0)], final)


def test_client_plane_coordinates_and_distances():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(30, generator=g, dtype=torch.float64)
    ys = {i: x + torch.randn(30, generator=g, dtype=torch.float64) for i in (2, 5, 9, 4)}
    plane = client_plane(x, ys[5], ys[2], ys, (5, 2))
    d1, d2 = plane.d1, plane.d2
    assert d1.norm().item() == pytest.approx(1.0) and d2.norm().item() == pytest.approx(1.0)
    assert abs((d1 @ d2).item()) < 1e-12
    coords = dict(zip(plane.ids.tolist(), plane.coordinates))
    dist = dict(zip(plane.ids.tolist(), plane.distances))
    ua, ub = ys[5] - x, ys[2] - x
    np.testing.assert_allclose(coords[5], [ua.norm().item(), 0.0], atol=1e-12)
    residual = ub - (ub @ ua) / (ua @ ua) * ua
    np.testing.assert_allclose(coords[2], [(ub @ ua / ua.norm()).item(), residual.norm().item()], atol=1e-12)
    assert dist[5] == pytest.approx(0.0, abs=1e-12) and dist[2] == pytest.approx(0.0, abs=1e-12)
    # other clients: least-squares projection onto span(y_a - x, y_b - x), computed with numpy
    basis = np.stack([ua.numpy(), ub.numpy()], axis=1)
    for i in (9, 4):
        delta = (ys[i] - x).numpy()
        coef, *_ = np.linalg.lstsq(basis, delta, rcond=None)
        assert dist[i] == pytest.approx(np.linalg.norm(delta - basis @ coef), rel=1e-10)
        projected = x + coords[i][0] * d1 + coords[i][1] * d2
        np.testing.assert_allclose(projected.numpy() - x.numpy(), basis @ coef, atol=1e-10)
    assert plane.ids.tolist() == [2, 4, 5, 9] and plane.clients == (5, 2)


def test_client_plane_refuses_degenerate_input():
    x = torch.zeros(5)
    y = torch.arange(5.0)
    with pytest.raises(LandscapeError, match="equals x"):
        client_plane(x, x.clone(), y, {})
    # FedAvg of two clients: x is their mean, so y_a - x = -(y_b - x)
    y_a, y_b = torch.randn(5), torch.randn(5)
    mean = (y_a + y_b) / 2
    with pytest.raises(LandscapeError, match="collinear"):
        client_plane(mean, y_a, y_b, {})


def test_interpolation_direction_lands_on_the_target():
    x, target = torch.randn(7), torch.randn(7)
    d = interpolation_direction(x, target)
    torch.testing.assert_close(x + d, target)
    with pytest.raises(LandscapeError, match="between models of 7 and 3 parameters"):
        interpolation_direction(x, torch.zeros(3))


# -- planes that compare across models (issue 19, item 3) --------------------------------------------------


def _gaussian_weights_only(flat, seed):
    """The documented draw rebuilt here: N(0, 1) float32 from a CPU generator, dim <= 1 tensors zeroed."""
    g = torch.randn(flat.dim, generator=torch.Generator().manual_seed(seed), dtype=torch.float32).double()
    return torch.cat([t if len(s) > 1 else torch.zeros_like(t) for t, s in zip(g.split(flat.numels), flat.shapes)])


def test_euclidean_directions_have_the_stated_length_and_are_one_vector_for_every_model(cnn):
    flat, w = cnn
    torch.manual_seed(1)
    other = FlatModel(build_model("cnn", (1, 8, 8), 10, {"width": 4, "hidden": 16})).vector()
    assert not torch.equal(w, other)
    a = random_plane(flat, w, 4, normalization="euclidean", length=2.5)
    b = random_plane(flat, 1.66 * other, 4, normalization="euclidean", length=2.5)
    assert torch.equal(a.d1, b.d1) and torch.equal(a.d2, b.d2)  # the weights play no part
    assert a.normalization == "euclidean" and a.length == 2.5
    for d, seed in ((a.d1, a.seeds[0]), (a.d2, a.seeds[1])):
        assert d.double().norm().item() == pytest.approx(2.5, rel=1e-6)
        g = _gaussian_weights_only(flat, seed)
        np.testing.assert_allclose(d.double().numpy(), (2.5 * g / g.norm()).numpy(), rtol=1e-6, atol=1e-12)
    ortho = random_plane(flat, w, 4, normalization="euclidean", length=2.5, orthogonalize=True)
    assert abs(float(ortho.d1.double() @ ortho.d2.double())) < 1e-5
    assert ortho.d2.double().norm().item() == pytest.approx(2.5, rel=1e-6)


def test_filter_planes_grow_with_the_weights_and_comparable_planes_do_not(cnn):
    """The artefact: a model whose weights are c times another's gets a filter-normalised plane c times as
    long (one axis unit reaches c times as far), so a plane's 'width' carries the weight norm. Euclidean
    directions, or filter directions normalised to one reference model, are the same vector for both."""
    flat, w = cnn
    c = 1.66
    small, large = random_plane(flat, w, 0), random_plane(flat, c * w, 0)
    np.testing.assert_allclose(large.d1.double().numpy(), c * small.d1.double().numpy(), rtol=1e-5, atol=1e-9)
    assert large.d1.double().norm() / small.d1.double().norm() == pytest.approx(c, rel=1e-6)
    for kwargs in ({"normalization": "euclidean", "length": 3.0},
                   {"normalization": "filter-reference", "reference": w}):
        p, q = random_plane(flat, w, 0, **kwargs), random_plane(flat, c * w, 0, **kwargs)
        assert torch.equal(p.d1, q.d1) and torch.equal(p.d2, q.d2), kwargs
    to_reference = random_plane(flat, c * w, 0, normalization="filter-reference", reference=w)
    assert torch.equal(to_reference.d1, small.d1)  # normalised to w: w's own filter-normalised plane


@pytest.mark.parametrize("kwargs, message", [
    ({"normalization": "layer"}, "unknown normalization 'layer'; choose from: filter, euclidean"),
    ({"normalization": "euclidean", "length": 0.0}, "length must be a finite number > 0"),
    ({"normalization": "euclidean", "length": float("nan")}, "length must be a finite number > 0"),
    ({"normalization": "filter-reference"}, "needs the reference model"),
    ({"normalization": "filter-reference", "reference": torch.zeros(3)}, "reference model must be a flat"),
])
def test_bad_normalizations_are_refused(cnn, kwargs, message):
    flat, w = cnn
    with pytest.raises(LandscapeError, match=message):
        random_plane(flat, w, 0, **kwargs)
