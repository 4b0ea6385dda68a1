"""Surface evaluation (``analyze/surface_evaluation.py``): the [ix, iy] layout, the exact centre cell,
batched cells equal to cells one at a time, BatchNorm modes, and interrupted surfaces resumed to the same
bits."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from landscape.analyze.surface.partial import load_partial, save_partial
from landscape.core.errors import LandscapeError
from landscape.core.flat import FlatModel
from landscape.measure.analysis_data import AnalysisData
from landscape.measure.directions import filter_normalized_direction, random_plane
from landscape.measure.objective import Objective
from landscape.measure.surface.evaluation import evaluate_surface
from landscape.measure.surface.grid import make_axis, make_line
from landscape.models import build_model


class KnownSurface:
    """Duck-typed objective: loss(w) = w0^2 + 3 w1 - w0 w1 (a known f(a, b) along e0, e1), counting calls."""

    def __init__(self):
        self.loss_calls = 0

    def loss(self, w):
        self.loss_calls += 1
        return w[0] ** 2 + 3 * w[1] - w[0] * w[1]

    def accuracy(self, w):
        return float(w[0] - 2 * w[1])


def known(a, b):
    return a**2 + 3 * b - a * b


def test_non_square_grid_keeps_ix_along_d1_and_iy_along_d2():
    w = torch.zeros(3, dtype=torch.float64)
    d1, d2 = torch.tensor([1.0, 0, 0], dtype=torch.float64), torch.tensor([0, 1.0, 0], dtype=torch.float64)
    xs, ys = make_axis(7, -1.5, 1.5), make_axis(3, -0.5, 0.5)
    objective = KnownSurface()
    grid = evaluate_surface(objective, w, d1, d2, xs, ys, cells_per_batch=4)
    assert grid.loss.shape == (7, 3) and grid.axes == ("ix", "iy") and grid.complete
    for ix, a in enumerate(xs):
        for iy, b in enumerate(ys):
            assert grid.loss[ix, iy] == known(a, b)
            assert grid.accuracy[ix, iy] == a - 2 * b
    assert objective.loss_calls == 21 and grid.cells_evaluated == 21


def test_one_dimensional_line():
    w = torch.zeros(3, dtype=torch.float64)
    d1 = torch.tensor([1.0, 0, 0], dtype=torch.float64)
    alphas = make_line(9, -1, 1)
    grid = evaluate_surface(KnownSurface(), w, d1, None, alphas, None)
    assert grid.loss.shape == (9,) and grid.axes == ("ix",)
    np.testing.assert_array_equal(grid.loss, alphas**2)
    with pytest.raises(LandscapeError, match="needs both d2 and y_coords"):
        evaluate_surface(KnownSurface(), w, d1, d1, alphas, None)


def _softmax_regression(seed=0, n=70, features=5, classes=3):
    torch.manual_seed(seed)
    flat = FlatModel(nn.Linear(features, classes))
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(n, features, generator=g)
    y = torch.randint(0, classes, (n,), generator=g)
    return flat, Objective(flat, {}, AnalysisData(x, y, batch_size=16))


def test_centre_cell_equals_the_checkpoint_loss_exactly():
    flat, objective = _softmax_regression()
    w = flat.vector()
    plane = random_plane(flat, w, 0, ignore_1d=False)
    for vectorize in (True, False):
        grid = evaluate_surface(objective, w, plane.d1, plane.d2, make_axis(5, -1, 1), make_axis(3, -1, 1),
                                vectorize=vectorize)
        assert grid.loss[2, 1] == objective.loss(w).item()  # bitwise
        assert grid.accuracy[2, 1] == objective.accuracy(w)


def test_real_objective_loss_changes_only_along_d1_when_d2_shifts_every_logit_equally():
    """Softmax is invariant to adding one constant to every logit: d2 = +1 on all biases leaves F unchanged,
    so loss[ix, iy] must be constant in iy and vary in ix (and equal an independent float64 computation)."""
    flat, objective = _softmax_regression()
    w = flat.vector()
    d1 = filter_normalized_direction(flat, w, 3)
    d2 = torch.cat([torch.zeros(15), torch.ones(3)])  # weight [3, 5] then bias [3]
    xs, ys = make_axis(7, -2, 2), make_axis(5, -3, 3)
    grid = evaluate_surface(objective, w, d1, d2, xs, ys, cells_per_batch=6)
    np.testing.assert_allclose(grid.loss, np.repeat(grid.loss[:, :1], 5, axis=1), rtol=1e-6)
    assert np.all(np.abs(np.diff(grid.loss[:, 0])) > 1e-3)
    x, y = objective.data.x.double(), objective.data.y
    for ix, a in enumerate(xs):
        for iy, b in enumerate(ys):
            u = (w.double() + a * d1.double() + b * d2.double())
            weight, bias = u[:15].view(3, 5), u[15:]
            expected = F.cross_entropy(x @ weight.T + bias, y).item()
            assert grid.loss[ix, iy] == pytest.approx(expected, rel=1e-5)


def _small_cnn(seed=0, batchnorm=False):
    torch.manual_seed(seed)
    if batchnorm:
        module = nn.Sequential(nn.Conv2d(1, 3, 3, padding=1), nn.BatchNorm2d(3), nn.ReLU(), nn.Flatten(),
                               nn.Linear(3 * 8 * 8, 4))
    else:
        module = build_model("cnn", (1, 8, 8), 4, {"width": 3, "hidden": 8})
    g = torch.Generator().manual_seed(seed + 1)
    x, y = torch.randn(40, 1, 8, 8, generator=g), torch.randint(0, 4, (40,), generator=g)
    flat = FlatModel(module)
    if batchnorm:
        with torch.no_grad():
            module.train()
            for _ in range(3):
                module(x)
            module.eval()
    return flat, flat.buffers(), AnalysisData(x, y, batch_size=16)


@pytest.mark.parametrize("channels_last", [False, True])
def test_batched_cells_equal_cells_one_at_a_time_on_a_cnn(channels_last):
    """Also with the analysis's evaluations in channels-last layout (analyze.memory_format): the vmapped cells
    copy their weights into that layout under vmap."""
    flat, buffers, data = _small_cnn()
    flat.channels_last = channels_last
    objective = Objective(flat, buffers, data)
    w = flat.vector()
    plane = random_plane(flat, w, 2)
    axes = make_axis(5, -1, 1), make_axis(5, -1, 1)
    batched = evaluate_surface(objective, w, plane.d1, plane.d2, *axes, cells_per_batch=8, cells_per_pass=8)
    single = evaluate_surface(objective, w, plane.d1, plane.d2, *axes, vectorize=False)
    np.testing.assert_allclose(batched.loss, single.loss, rtol=1e-6)
    np.testing.assert_array_equal(batched.accuracy, single.accuracy)
    # and each equals the objective's own F at w + a d1 + b d2
    for ix, iy in ((0, 0), (4, 1), (1, 3)):
        u = w + axes[0][ix] * plane.d1 + axes[1][iy] * plane.d2
        assert batched.loss[ix, iy] == pytest.approx(objective.loss(u).item(), rel=1e-6)


@pytest.mark.parametrize("bn_mode", ["eval", "train-batch-stats", "recompute"])
def test_batchnorm_modes_follow_the_objective(bn_mode):
    flat, buffers, data = _small_cnn(batchnorm=True)
    objective = Objective(flat, buffers, data, bn_mode)
    w = flat.vector()
    before = {k: v.clone() for k, v in flat.module.state_dict().items()}
    plane = random_plane(flat, w, 1)
    grid = evaluate_surface(objective, w, plane.d1, plane.d2, make_axis(3, -1, 1), make_axis(3, -1, 1))
    assert grid.loss[1, 1] == objective.loss(w).item()
    for ix, iy in ((0, 0), (2, 1)):
        u = w + grid.x_coords[ix] * plane.d1 + grid.y_coords[iy] * plane.d2
        assert grid.loss[ix, iy] == pytest.approx(objective.loss(u).item(), rel=1e-6)
        assert grid.accuracy[ix, iy] == objective.accuracy(u)
    assert all(torch.equal(before[k], v) for k, v in flat.module.state_dict().items())  # module untouched
    assert not flat.module.training


class Interrupted(Exception):
    pass


def _interrupt_after(calls, path, key):
    state = {"calls": 0}

    def on_checkpoint(grid):
        save_partial(path, grid, key)
        state["calls"] += 1
        if state["calls"] == calls:
            raise Interrupted

    return on_checkpoint


def test_an_interrupted_surface_recomputes_only_the_missing_cells(tmp_path):
    w = torch.zeros(3, dtype=torch.float64)
    d1, d2 = torch.tensor([1.0, 0, 0], dtype=torch.float64), torch.tensor([0, 1.0, 0], dtype=torch.float64)
    xs, ys = make_axis(9, -1, 1), make_axis(5, -1, 1)
    path, key = tmp_path / "surface.partial.npz", {"settings": 1, "checkpoint": "abc"}
    objective = KnownSurface()
    with pytest.raises(Interrupted):
        evaluate_surface(objective, w, d1, d2, xs, ys, cells_per_batch=4, save_every=8,
                         on_checkpoint=_interrupt_after(2, path, key))
    partial = load_partial(path, key, xs, ys)
    done = 45 - partial.missing
    assert done == 16  # two saves of 8 cells
    assert load_partial(path, {"settings": 2, "checkpoint": "abc"}, xs, ys) is None  # other settings
    assert load_partial(path, key, make_axis(9, -2, 2), ys) is None  # other grid
    resumed_objective = KnownSurface()
    resumed = evaluate_surface(resumed_objective, w, d1, d2, xs, ys, loss=partial.loss,
                               accuracy=partial.accuracy, cells_per_batch=4, save_every=8)
    assert resumed_objective.loss_calls == 45 - done and resumed.cells_evaluated == 45 - done
    whole = evaluate_surface(KnownSurface(), w, d1, d2, xs, ys)
    np.testing.assert_array_equal(resumed.loss, whole.loss)
    np.testing.assert_array_equal(resumed.accuracy, whole.accuracy)


def test_an_interrupted_batched_surface_resumes_to_the_same_bits(tmp_path):
    flat, buffers, data = _small_cnn()
    objective = Objective(flat, buffers, data)
    w = flat.vector()
    plane = random_plane(flat, w, 0)
    xs, ys = make_axis(7, -1, 1), make_axis(5, -1, 1)
    path, key = tmp_path / "p.npz", {"k": 1}
    with pytest.raises(Interrupted):
        evaluate_surface(objective, w, plane.d1, plane.d2, xs, ys, cells_per_batch=4, save_every=8,
                         on_checkpoint=_interrupt_after(1, path, key))
    partial = load_partial(path, key, xs, ys)
    assert partial.missing == 35 - 8
    resumed = evaluate_surface(objective, w, plane.d1, plane.d2, xs, ys, loss=partial.loss,
                               accuracy=partial.accuracy, cells_per_batch=4)
    assert resumed.cells_evaluated == 27
    whole = evaluate_surface(objective, w, plane.d1, plane.d2, xs, ys, cells_per_batch=4)
    np.testing.assert_array_equal(resumed.loss, whole.loss)
    np.testing.assert_array_equal(resumed.accuracy, whole.accuracy)
