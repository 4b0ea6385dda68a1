"""Properties of the measurements that hold for every input, checked by hypothesis on random ones: Delta_D is
invariant to a common shift and to the clients' order, scales with the square of a common scaling, is zero
when the clients agree (and only then), and its relative form Delta_D / U is scale-free; cosines lie in [-1, 1] and
the cosine matrix is symmetric with a unit diagonal; Lanczos' top eigenvalues equal the dense ones of random
symmetric matrices."""

from __future__ import annotations

import math

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from support.helpers import FUZZ

from landscape.measure.alignment import cosine_matrix, cosines_to
from landscape.measure.flatness import flatness_distance
from landscape.measure.lanczos import lanczos_topk
from landscape.measure.operator import MatrixOperator

SHAPES = st.tuples(st.integers(2, 6), st.integers(1, 12))  # (clients, dimension)
SEEDS = st.integers(0, 2**31 - 1)


def clients_of(seed: int, n: int, d: int, scale: float = 1.0) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(d, generator=g, dtype=torch.float64)
    return x, {i: x + scale * torch.randn(d, generator=g, dtype=torch.float64) for i in range(n)}


@FUZZ
@given(SHAPES, SEEDS, st.floats(-50, 50), st.floats(0.01, 100))
def test_delta_d_is_shift_invariant_order_free_and_quadratic_in_scale(shape, seed, shift, scale):
    n, d = shape
    x, ys = clients_of(seed, n, d)
    base = flatness_distance(x, ys, start=x)
    assert base.distance >= 0
    shifted = flatness_distance(x + shift, {i: y + shift for i, y in ys.items()})
    assert math.isclose(shifted.distance, base.distance, rel_tol=1e-9, abs_tol=1e-9 * (1 + shift**2))
    reordered = flatness_distance(x, {n - 1 - i: y for i, y in ys.items()})
    assert math.isclose(reordered.distance, base.distance, rel_tol=1e-12)
    scaled = flatness_distance(scale * x, {i: scale * y for i, y in ys.items()}, start=scale * x)
    assert math.isclose(scaled.distance, scale**2 * base.distance, rel_tol=1e-9)
    assert math.isclose(scaled.distance_relative, base.distance_relative, rel_tol=1e-9)  # scale-free
    assert base.distance <= base.update_sq * (1 + 1e-12)  # the spread around the mean <= around any point


@FUZZ
@given(SHAPES, SEEDS)
def test_delta_d_vanishes_when_the_clients_agree_and_only_then(shape, seed):
    n, d = shape
    x, ys = clients_of(seed, n, d)
    same = flatness_distance(x, {i: ys[0].clone() for i in range(n)})
    assert same.distance <= 1e-28 * same.mean_norm_sq  # the mean of equal vectors, rounded
    assert flatness_distance(x, ys).distance > 1e-6


@FUZZ
@given(st.integers(1, 6), st.integers(1, 30), SEEDS, st.floats(1e-6, 1e6))
def test_cosines_lie_in_the_unit_interval_and_the_matrix_is_symmetric(n, d, seed, scale):
    g = torch.Generator().manual_seed(seed)
    vectors = scale * torch.randn(n, d, generator=g, dtype=torch.float64)
    c = cosine_matrix(vectors)
    assert np.all(np.abs(c) <= 1 + 1e-12) and np.allclose(c, c.T) and np.allclose(np.diag(c), 1)
    to = cosines_to(vectors, vectors.sum(dim=0))
    assert np.all(np.abs(to) <= 1 + 1e-12)
    assert np.allclose(cosines_to(vectors, vectors[0]), c[0])


@settings(FUZZ, max_examples=min(FUZZ.max_examples, 30))
@given(st.integers(8, 40), st.integers(1, 4), SEEDS)
def test_lanczos_top_eigenvalues_equal_the_dense_ones(dim, k, seed):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(dim, dim, generator=g, dtype=torch.float64)
    spectrum = torch.linspace(-1.0, 10.0, dim, dtype=torch.float64)  # distinct, well separated at the top
    q, _ = torch.linalg.qr(a)
    matrix = q @ torch.diag(spectrum) @ q.T
    result = lanczos_topk(MatrixOperator((matrix + matrix.T) / 2), k, tol=1e-10, seed=seed)
    dense = torch.linalg.eigvalsh(matrix).flip(0)[:k]
    np.testing.assert_allclose(np.asarray(result.values, dtype=float), dense.numpy(), rtol=1e-8, atol=1e-8)
