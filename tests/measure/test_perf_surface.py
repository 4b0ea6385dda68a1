"""Surface speed paths give the same values: cells per forward pass by device, channels-last cells on the CPU,
the vmapped pass when asked for, and the progress callback."""

import numpy as np
import pytest
import torch
from torch import nn

import landscape.measure.surface.evaluation as surface_module
from landscape.core.errors import LandscapeError
from landscape.core.flat import FlatModel
from landscape.measure.analysis_data import AnalysisData
from landscape.measure.directions import random_plane
from landscape.measure.objective import Objective
from landscape.measure.surface.evaluation import default_cells_per_pass, evaluate_surface
from landscape.measure.surface.grid import make_axis
from landscape.models import build_model


def _cnn(channels=1, batchnorm=False, seed=0):
    torch.manual_seed(seed)
    if batchnorm:
        module = nn.Sequential(nn.Conv2d(channels, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2),
                               nn.Flatten(), nn.Linear(4 * 4 * 4, 5))
        module.eval()
    else:
        module = build_model("cnn", (channels, 8, 8), 5, {"width": 4, "hidden": 8})
    g = torch.Generator().manual_seed(seed + 1)
    data = AnalysisData(torch.randn(30, channels, 8, 8, generator=g), torch.randint(0, 5, (30,), generator=g), 12)
    flat = FlatModel(module)
    return flat, Objective(flat, flat.buffers(), data)


def test_cells_per_pass_is_one_on_the_cpu_and_the_chunk_elsewhere():
    assert default_cells_per_pass(torch.device("cpu"), 16) == 1
    assert default_cells_per_pass(torch.device("cuda"), 16) == 16
    assert default_cells_per_pass("cuda:1", 8) == 8


@pytest.mark.parametrize("channels", [1, 3])
def test_cpu_cells_equal_the_objective_and_the_vmapped_pass(channels, monkeypatch):
    flat, objective = _cnn(channels)
    w = flat.vector()
    plane = random_plane(flat, w, 3)
    axes = make_axis(5, -1, 1), make_axis(3, -1, 1)
    passes = []
    vmapped = surface_module._cells_vmapped
    monkeypatch.setattr(surface_module, "_cells_vmapped", lambda o, ws: passes.append(len(ws)) or vmapped(o, ws))
    by_cell = evaluate_surface(objective, w, plane.d1, plane.d2, *axes, cells_per_batch=8)
    assert passes == []  # the CPU default: one cell per pass
    batched = evaluate_surface(objective, w, plane.d1, plane.d2, *axes, cells_per_batch=8, cells_per_pass=3)
    assert passes and max(passes) == 3 and sum(passes) == 14  # every cell but the centre, 3 at a time
    np.testing.assert_allclose(by_cell.loss, batched.loss, rtol=1e-6)
    np.testing.assert_array_equal(by_cell.accuracy, batched.accuracy)
    for ix, iy in ((0, 0), (4, 2), (1, 1), (2, 1)):
        u = w + axes[0][ix] * plane.d1 + axes[1][iy] * plane.d2
        assert by_cell.loss[ix, iy] == pytest.approx(objective.loss(u).item(), rel=1e-6)
        assert by_cell.accuracy[ix, iy] == objective.accuracy(u)


def test_channels_last_cells_keep_the_batchnorm_modes_and_leave_the_module_alone():
    flat, objective = _cnn(3, batchnorm=True)
    w = flat.vector()
    before = {k: v.clone() for k, v in flat.module.state_dict().items()}
    plane = random_plane(flat, w, 4)
    for mode in ("eval", "train-batch-stats", "recompute"):
        obj = Objective(flat, flat.buffers(), objective.data, mode)
        grid = evaluate_surface(obj, w, plane.d1, plane.d2, make_axis(3, -1, 1), make_axis(3, -1, 1))
        u = w + grid.x_coords[0] * plane.d1 + grid.y_coords[2] * plane.d2
        assert grid.loss[0, 2] == pytest.approx(obj.loss(u).item(), rel=1e-6)
    assert all(torch.equal(before[k], v) for k, v in flat.module.state_dict().items())
    assert all(p.is_contiguous() for p in flat.module.parameters())  # the module's own layout is untouched
    assert not flat.module.training


def test_progress_callback_counts_the_cells_this_call_computes():
    flat, objective = _cnn()
    w = flat.vector()
    plane = random_plane(flat, w, 0)
    xs, ys = make_axis(5, -1, 1), make_axis(3, -1, 1)
    calls = []
    whole = evaluate_surface(objective, w, plane.d1, plane.d2, xs, ys, cells_per_batch=4,
                             progress=lambda done, total: calls.append((done, total)))
    assert calls == [(4, 15), (8, 15), (12, 15), (15, 15)]
    loss, accuracy = whole.loss.copy(), whole.accuracy.copy()
    loss[3:, :], accuracy[3:, :] = np.nan, np.nan  # 6 cells left to compute
    calls.clear()
    evaluate_surface(objective, w, plane.d1, plane.d2, xs, ys, loss=loss, accuracy=accuracy, cells_per_batch=4,
                     progress=lambda done, total: calls.append((done, total)))
    assert calls[-1] == (6, 6) and all(total == 6 for _, total in calls)


def test_cells_per_pass_must_be_positive():
    flat, objective = _cnn()
    w = flat.vector()
    plane = random_plane(flat, w, 0)
    with pytest.raises(LandscapeError, match="cells_per_batch, cells_per_pass and save_every must be at least 1"):
        evaluate_surface(objective, w, plane.d1, plane.d2, make_axis(3, -1, 1), make_axis(3, -1, 1),
                         cells_per_pass=0)
