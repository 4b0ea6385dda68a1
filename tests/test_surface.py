"""Loss surfaces: grids, [ix, iy] layout, exact centre, batched = per-cell, resume, and the surface pass."""

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_recipe
from torch import nn

import landscape.analyze.surface as surface_module
from landscape import setup
from landscape.analyze.catalog import pass_options
from landscape.analyze.context import AnalysisSettings, CheckpointContext, find_sources
from landscape.analyze.directions import direction_seed, filter_normalized_direction, random_plane
from landscape.analyze.objective import AnalysisData, Objective
from landscape.analyze.results import result_name, same_settings, settings_record
from landscape.analyze.scheduler import run_analysis
from landscape.analyze.surface import (
    SurfaceGrid,
    evaluate_surface,
    load_partial,
    make_axis,
    make_line,
    parse_grid,
    parse_span,
    save_partial,
)
from landscape.errors import LandscapeError
from landscape.flat import FlatModel
from landscape.models import build_model
from landscape.runs import load_checkpoint
from landscape.train import loop

# ----------------------------------------------------------------------------------------------------------
# grids


def test_axes_are_symmetric_with_the_checkpoint_exactly_at_the_centre():
    for n, hi in ((41, 1.0), (5, 0.3), (3, 2.5), (51, 0.7)):
        axis = make_axis(n, -hi, hi)
        assert len(axis) == n and axis[(n - 1) // 2] == 0.0
        assert axis[0] == -hi and axis[-1] == hi
        np.testing.assert_array_equal(axis, -axis[::-1])
        np.testing.assert_allclose(np.diff(axis), 2 * hi / (n - 1), rtol=1e-12)
    assert make_axis(1, -1, 1).tolist() == [0.0]
    with pytest.raises(LandscapeError, match="odd number of points so that the checkpoint is the centre "
                                             "cell, got 40"):
        make_axis(40, -1, 1)
    with pytest.raises(LandscapeError, match="symmetric around the checkpoint .LO = -HI., got -0.5:1"):
        make_axis(41, -0.5, 1)


def test_interpolation_lines_hit_alpha_0_and_1_exactly():
    line = make_line(41, -0.5, 1.5)
    assert line[10] == 0.0 and line[30] == 1.0 and line[0] == -0.5 and line[-1] == 1.5
    assert make_line(5, -0.5, 1.5).tolist() == [-0.5, 0.0, 0.5, 1.0, 1.5]
    line = make_line(50, 0, 1)  # step 1/49: 49 * (1/49) is not 1.0 in floating point, k / 49 is
    assert line[0] == 0.0 and line[-1] == 1.0
    with pytest.raises(LandscapeError, match=r"40 points over -0.5:1.5 do not put grid points at alpha = 0 "
                                             r"and 1.*e.g. 41 points"):
        make_line(40, -0.5, 1.5)
    with pytest.raises(LandscapeError, match="must include alpha = 0 and alpha = 1, got 0.2:1.5"):
        make_line(41, 0.2, 1.5)


def test_grid_and_span_specs():
    assert parse_grid("41") == (41, 41) and parse_grid("41x25") == (41, 25) and parse_grid("41", 1) == (41,)
    assert parse_span("-1:1") == (-1.0, 1.0) and parse_span(" -0.25:0.25 ") == (-0.25, 0.25)
    for bad, message in (("41x25x3", "grid must be 'N' or 'NXxNY'"), ("a", "with whole numbers"),
                         ("0x5", "grid sizes must be positive")):
        with pytest.raises(LandscapeError, match=message):
            parse_grid(bad)
    with pytest.raises(LandscapeError, match="a 1D surface takes one number of points"):
        parse_grid("41x25", 1)
    for bad, message in (("1", "span must be 'LO:HI'"), ("a:b", "with numbers"), ("1:-1", "finite LO < HI")):
        with pytest.raises(LandscapeError, match=message):
            parse_span(bad)


# ----------------------------------------------------------------------------------------------------------
# evaluation


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


def test_batched_cells_equal_cells_one_at_a_time_on_a_cnn():
    flat, buffers, data = _small_cnn()
    objective = Objective(flat, buffers, data)
    w = flat.vector()
    plane = random_plane(flat, w, 2)
    axes = make_axis(5, -1, 1), make_axis(5, -1, 1)
    batched = evaluate_surface(objective, w, plane.d1, plane.d2, *axes, cells_per_batch=8)
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


def test_partial_files_that_cannot_be_used_are_ignored(tmp_path):
    xs = make_axis(3, -1, 1)
    assert load_partial(tmp_path / "none.npz", {}, xs, xs) is None
    (tmp_path / "bad.npz").write_bytes(b"not a zip file")
    assert load_partial(tmp_path / "bad.npz", {}, xs, xs) is None
    save_partial(tmp_path / "line.npz", SurfaceGrid.empty(xs), {})
    assert load_partial(tmp_path / "line.npz", {}, xs, xs) is None  # saved 1D, asked 2D
    assert load_partial(tmp_path / "line.npz", {}, xs, None).shape == (3,)


# ----------------------------------------------------------------------------------------------------------
# the pass


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    path = tmp_path_factory.mktemp("surface") / "run"
    recipe = tiny_recipe(train__keep_clients=True, train__rounds=4, train__checkpoint_every=1,
                         train__participation=1.0, model__width=8, model__hidden=32)
    loop.start_run(recipe, path, progress=False)
    return path


SETTINGS = AnalysisSettings(device="cpu", analysis_samples=400)


def surface(run, **options):
    run_analysis(run, passes=["surface"], settings=SETTINGS, force=True, progress=False,
                 options={"surface": pass_options("surface", options)})
    out = run / "analysis" / "round-0004"
    # surface, surface-pca, ... and the settings off their defaults: surface@analysis_samples-400_grid-5
    name = result_name("surface", settings_record(SETTINGS, pass_options("surface", options)))
    with np.load(out / f"{name}.npz") as f:
        arrays = {k: f[k] for k in f.files}
    return json.loads((out / f"{name}.json").read_text()), arrays


@pytest.fixture(scope="module")
def context(run):
    sources, _ = find_sources(run)
    return CheckpointContext(sources[0], 4, SETTINGS)


def test_random_surface_pass(run, context):
    record, arrays = surface(run, grid="5x3")
    result = record["result"]
    assert arrays["loss"].shape == arrays["accuracy"].shape == (5, 3) and not np.isnan(arrays["loss"]).any()
    assert result["axes"] == ["ix", "iy"] and result["grid"] == [5, 3] and result["centre_index"] == [2, 1]
    assert result["centre_loss"] == context.objective.loss(context.w).item() == arrays["loss"][2, 1]
    assert result["direction_seed"] == 0 and result["bn_mode"] == "eval" and result["data"] == "global"
    assert result["quantity"] == "training loss (global F)"
    assert record["summary"]["surface_centre_loss"] == result["centre_loss"]
    plane = random_plane(context.flat, context.w, 0)
    np.testing.assert_array_equal(arrays["d1"], plane.d1.numpy())
    np.testing.assert_array_equal(arrays["d2"], plane.d2.numpy())
    # an off-centre cell against the run's model evaluated independently (plain module forward)
    module = setup.build_module(context.source.recipe, context.source.setup.bundle)
    ix, iy = 4, 0
    u = context.w + arrays["x_coords"][ix] * plane.d1 + arrays["y_coords"][iy] * plane.d2
    torch.nn.utils.vector_to_parameters(u, module.parameters())
    with torch.no_grad():
        logits = module.eval()(context.global_data.x)
    expected = F.cross_entropy(logits, context.global_data.y).item()
    assert arrays["loss"][ix, iy] == pytest.approx(expected, rel=1e-5)
    assert not list((run / "analysis" / "round-0004").glob("*.partial.npz"))


def test_pca_surface_pass(run):
    record, arrays = surface(run, directions="pca", grid="5x3")
    result = record["result"]
    assert result["trajectory_rounds"] == [0, 1, 2, 3, 4]
    ev = arrays["explained_variance"]
    assert 0 <= ev[1] <= ev[0] <= 1
    trajectory = arrays["trajectory"]
    assert trajectory.shape == (5, 2)
    np.testing.assert_allclose(trajectory[-1], 0, atol=1e-6)  # x^T itself
    d1, d2 = arrays["d1"].astype(np.float64), arrays["d2"].astype(np.float64)
    assert abs(d1 @ d2) < 1e-5 and np.linalg.norm(d1) == pytest.approx(1, abs=1e-6)
    # span "auto" covers the trajectory, symmetric per axis
    assert np.abs(trajectory[:, 0]).max() < arrays["x_coords"][-1] == -arrays["x_coords"][0]
    assert np.abs(trajectory[:, 1]).max() < arrays["y_coords"][-1] == -arrays["y_coords"][0]


def test_client_plane_surface_pass(run, context):
    record, arrays = surface(run, directions="clients", grid="5x3", clients="2,0")
    kept = context.kept_clients()
    assert record["result"]["clients"] == [2, 0] and sorted(kept) == arrays["client_ids"].tolist()
    coords = dict(zip(arrays["client_ids"].tolist(), arrays["client_coords"]))
    distances = dict(zip(arrays["client_ids"].tolist(), arrays["client_distances"]))
    assert coords[2][0] == pytest.approx((kept[2].double() - context.w.double()).norm().item(), rel=1e-12)
    assert coords[2][1] == pytest.approx(0, abs=1e-9)
    assert distances[2] == pytest.approx(0, abs=1e-6) and distances[0] == pytest.approx(0, abs=1e-6)
    assert distances[1] > 1e-4 and distances[3] > 1e-4  # the other clients are off the plane
    # the default pair is the first two kept clients
    record, _ = surface(run, directions="clients", grid="3")
    assert record["result"]["clients"] == [0, 1]


def test_interpolation_pass_to_a_client_and_to_another_checkpoint(run, context):
    record, arrays = surface(run, directions="interpolate", grid="5", target="client:3")
    assert arrays["loss"].shape == (5,) and "y_coords" not in arrays and "d2" not in arrays
    assert arrays["x_coords"].tolist() == [-0.5, 0.0, 0.5, 1.0, 1.5]
    assert record["result"]["axes"] == ["ix"] and record["result"]["target"] == "client:3"
    assert arrays["loss"][1] == context.objective.loss(context.w).item()
    target = context.kept_clients()[3]
    assert arrays["loss"][3] == pytest.approx(context.objective.loss(target).item(), rel=1e-6)
    other = run / "checkpoints" / "round-0002.pt"
    record, arrays = surface(run, directions="interpolate", grid="5", target=str(other))
    x2 = context.flat.from_state_dict(load_checkpoint(other)["model"])[0]
    assert record["result"]["target_loss"] == pytest.approx(context.objective.loss(x2).item(), rel=1e-6)


@pytest.mark.parametrize("data", ["client:1", "test"])
def test_local_and_test_landscapes(run, context, data):
    record, _ = surface(run, grid="3", data=data)
    if data == "test":
        test = context.source.setup.bundle.test
        expected = context.objective.with_data(AnalysisData(test.x, test.y, 512)).loss(context.w).item()
    else:
        expected = context.client_objective(1).loss(context.w).item()
    assert record["result"]["centre_loss"] == expected
    assert record["result"]["data_samples"] == (len(context.source.setup.bundle.test) if data == "test"
                                                else len(context.source.setup.client_indices[1]))


def test_the_pass_resumes_an_interrupted_surface(run, monkeypatch):
    whole_record, whole = surface(run, grid="7x5", cells_per_batch=4, save_every=8)
    real_save = surface_module.save_partial

    def save_then_die(path, grid, key):
        real_save(path, grid, key)
        raise Interrupted

    monkeypatch.setattr(surface_module, "save_partial", save_then_die)
    options = {"surface": pass_options("surface", {"grid": "7x5", "cells_per_batch": 4, "save_every": 8})}
    with pytest.raises(Interrupted):
        run_analysis(run, passes=["surface"], settings=SETTINGS, options=options, force=True, progress=False)
    partial = run / "analysis" / "round-0004" / "surface@analysis_samples-400_grid-7x5.partial.npz"  # as its result
    assert partial.is_file()
    monkeypatch.setattr(surface_module, "save_partial", real_save)
    record, arrays = surface(run, grid="7x5", cells_per_batch=4, save_every=8)
    assert record["result"]["cells_resumed"] == 8 and record["result"]["cells_evaluated"] == 27
    assert whole_record["result"]["cells_resumed"] == 0
    np.testing.assert_array_equal(arrays["loss"], whole["loss"])
    np.testing.assert_array_equal(arrays["accuracy"], whole["accuracy"])
    assert not partial.exists()


def test_a_partial_from_other_settings_is_not_reused(run):
    # a complete grid of zeros under another key: reusing it would leave zeros in the result
    surface_module.save_partial(run / "analysis" / "round-0004" / "surface@analysis_samples-400_grid-5.partial.npz",
                                SurfaceGrid(make_axis(5, -1, 1), make_axis(5, -1, 1), np.zeros((5, 5)),
                                            np.zeros((5, 5))), {"other": "settings"})
    record, arrays = surface(run, grid="5")
    assert record["result"]["cells_resumed"] == 0 and (arrays["loss"] > 0).all()


@pytest.mark.parametrize("options, message", [
    ({"grid": "4"}, "odd number of points"),
    ({"span": "-0.5:1"}, "must be symmetric around the checkpoint"),
    ({"directions": "hessian"}, "unknown surface directions 'hessian'; choose from: random, pca, clients"),
    ({"span": "auto"}, "span 'auto' is for pca and clients directions"),
    ({"data": "client:x"}, "surface data must be global, test or client:<i>"),
    ({"directions": "clients", "clients": "3"}, "two different client ids like '3,7'"),
    ({"directions": "interpolate", "grid": "5x3"}, "a 1D surface takes one number of points"),
    ({"directions": "interpolate", "grid": "6"}, "do not put grid points at alpha = 0 and 1"),
    ({"cells_per_batch": 0}, "surface cells_per_batch must be a whole number >= 1, got 0"),
    ({"save_every": 2.5}, "surface save_every must be a whole number >= 1, got 2.5"),
])
def test_bad_options_are_refused_before_any_work(options, message):
    with pytest.raises(LandscapeError, match=message):
        pass_options("surface", options)


def test_option_spellings_from_set_are_normalised():
    assert pass_options("surface", {"grid": 41}) == pass_options("surface", {"grid": "41"})
    assert pass_options("surface", {"clients": [3, 7], "directions": "clients"}).clients == "3,7"


def test_bad_targets_name_the_problem(run):
    def attempt(**options):
        with pytest.raises(LandscapeError) as info:
            surface(run, **options)
        return str(info.value)

    assert "client 9 has no kept model this round; kept clients: 0, 1, 2, 3" in attempt(
        directions="interpolate", grid="5", target="client:9")
    assert "is not a file" in attempt(directions="interpolate", grid="5", target=str(run / "nope.pt"))
    assert "client 7 does not exist (the run has 4 clients)" in attempt(grid="3", data="client:7")


def test_surfaces_of_other_directions_stand_side_by_side(run):
    random_record, random_arrays = surface(run, grid="5")
    pca_record, _ = surface(run, directions="pca", grid="5")
    out = run / "analysis" / "round-0004"
    names = {f"{kind}@analysis_samples-400_grid-5.{suffix}" for kind in ("surface", "surface-pca")
             for suffix in ("json", "npz")}
    assert names <= {p.name for p in out.iterdir()}
    assert random_record["pass"] == pca_record["pass"] == "surface"
    assert random_record["result"]["directions"] == "random" and pca_record["result"]["directions"] == "pca"
    with np.load(out / "surface@analysis_samples-400_grid-5.npz") as f:  # the PCA surface did not overwrite it
        np.testing.assert_array_equal(f["loss"], random_arrays["loss"])
    from landscape.figures.curves import load_runs

    loaded = load_runs(run)[0]
    assert loaded.analysed_rounds("surface") == loaded.analysed_rounds("surface-pca") == [4]


# ----------------------------------------------------------------------------------------------------------
# planes that compare across models (issue 19, item 3)


def test_a_euclidean_surface_cell_is_F_at_x_plus_a_d1_plus_b_d2_rebuilt_here(run, context):
    record, arrays = surface(run, grid="5x3", normalization="euclidean", length=3.0)
    result = record["result"]
    assert result["normalization"] == "euclidean" and result["length"] == 3.0 and result["reference"] is None
    assert result["weight_norm"] == pytest.approx(context.w.double().norm().item(), rel=1e-12)
    assert result["d1_norm"] == pytest.approx(3.0, rel=1e-6) and result["d2_norm"] == pytest.approx(3.0, rel=1e-6)
    # the directions rebuilt from the documented draw: N(0, 1) of direction_seed(0, k), dim <= 1 zeroed, norm 3
    flat = context.flat
    rebuilt = []
    for k in (0, 1):
        g = torch.randn(flat.dim, generator=torch.Generator().manual_seed(direction_seed(0, k))).double()
        g = torch.cat([t if len(s) > 1 else 0 * t for t, s in zip(g.split(flat.numels), flat.shapes)])
        rebuilt.append(3.0 * g / g.norm())
    np.testing.assert_allclose(arrays["d1"], rebuilt[0].numpy(), rtol=1e-5, atol=1e-7)
    module = setup.build_module(context.source.recipe, context.source.setup.bundle)
    ix, iy = 4, 0
    u = context.w.double() + arrays["x_coords"][ix] * rebuilt[0] + arrays["y_coords"][iy] * rebuilt[1]
    torch.nn.utils.vector_to_parameters(u.float(), module.parameters())
    with torch.no_grad():
        expected = F.cross_entropy(module.eval()(context.global_data.x), context.global_data.y).item()
    assert arrays["loss"][ix, iy] == pytest.approx(expected, rel=1e-5)
    assert arrays["loss"][ix, iy] != pytest.approx(result["centre_loss"], rel=1e-3)  # a real step away
    out = run / "analysis" / "round-0004"
    assert (out / "surface@analysis_samples-400_grid-5x3_length-3_normalization-euclidean.json").is_file()


def test_a_filter_reference_surface_is_normalised_to_the_named_checkpoint(run, context):
    record, arrays = surface(run, grid="3", normalization="filter-reference", reference="round:0")
    x0 = context.flat.from_state_dict(load_checkpoint(run / "checkpoints" / "round-0000.pt")["model"])[0]
    expected = filter_normalized_direction(context.flat, x0, direction_seed(0, 0))
    np.testing.assert_array_equal(arrays["d1"], expected.numpy())
    result = record["result"]
    assert result["normalization"] == "filter-reference" and result["reference"] == "round:0"
    assert result["reference_weight_norm"] == pytest.approx(x0.double().norm().item(), rel=1e-12)
    assert result["weight_norm"] == pytest.approx(context.w.double().norm().item(), rel=1e-12)
    with pytest.raises(LandscapeError, match="has no checkpoint of round 9"):
        surface(run, grid="3", normalization="filter-reference", reference="round:9")


def test_the_default_normalization_keeps_the_names_and_settings_of_existing_results():
    defaults = settings_record(AnalysisSettings(), pass_options("surface", {}))
    assert result_name("surface", defaults) == "surface"
    written_before = {"analysis": defaults["analysis"],
                      "pass": {k: v for k, v in defaults["pass"].items()
                               if k not in ("normalization", "length", "reference")}}
    assert same_settings("surface", written_before, defaults)
    assert pass_options("surface", {"normalization": "euclidean", "length": 10}).length == 10.0


@pytest.mark.parametrize("options, message", [
    ({"normalization": "unit"}, "unknown surface normalization 'unit'; choose from: filter, euclidean"),
    ({"length": 5.0}, "surface length is the norm of euclidean directions"),
    ({"normalization": "euclidean", "length": -1}, "surface length must be a finite number > 0"),
    ({"normalization": "euclidean", "length": "10"}, "surface length must be a finite number > 0"),
    ({"directions": "pca", "normalization": "euclidean"}, "is for random directions"),
    ({"normalization": "filter-reference"}, "needs reference = \"round:<r>\""),
    ({"normalization": "filter-reference", "reference": "round:x"}, "must be round:<r>"),
    ({"reference": "round:0"}, "set normalization = \"filter-reference\" with it"),
])
def test_bad_normalization_options_are_refused_in_one_line(options, message):
    with pytest.raises(LandscapeError, match=message):
        pass_options("surface", options)


def test_filter_normalised_surfaces_ignore_a_function_preserving_rescale_and_euclidean_ones_do_not():
    """Li et al.'s reason for filter normalisation: a ReLU net with layer 1 scaled by c and layer 2 by 1/c
    is the same function, and its filter-normalised surface is the same surface. Euclidean directions measure
    the Euclidean geometry that lambda_max and S_rho measure, in which the rescaled net is another point."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(5, 6), nn.ReLU(), nn.Linear(6, 3)).double()
    g = torch.Generator().manual_seed(1)
    data = AnalysisData(torch.randn(60, 5, generator=g, dtype=torch.float64),
                        torch.randint(0, 3, (60,), generator=g), batch_size=32)
    flat = FlatModel(net)
    w = flat.vector()
    c = 3.0
    w1, b1, w2, b2 = w.split(flat.numels)
    scaled = torch.cat([c * w1, c * b1, w2 / c, b2])
    objective = Objective(flat, {}, data)
    assert objective.loss(scaled).item() == pytest.approx(objective.loss(w).item(), rel=1e-12)
    axes = make_axis(5, -1, 1), make_axis(5, -1, 1)

    def grid(x, **kwargs):
        plane = random_plane(flat, x, 0, **kwargs)
        return evaluate_surface(objective, x, plane.d1, plane.d2, *axes).loss

    np.testing.assert_allclose(grid(scaled), grid(w), rtol=1e-9)
    euclidean = {"normalization": "euclidean", "length": 1.0}
    assert np.max(np.abs(grid(scaled, **euclidean) - grid(w, **euclidean))) > 1e-2
