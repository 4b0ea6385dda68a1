"""The surface pass (``analyze/surface.py``): random, PCA, client-plane and interpolation surfaces of a
run, resumed from partial grids, its options refused in one line, and planes that compare across models.
"""

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from support.helpers import tiny_recipe
from torch import nn

import landscape.analyze.surface.compute as surface_module
from landscape.analyze.catalog import pass_options
from landscape.analyze.context import CheckpointContext
from landscape.analyze.passes import RESULT_NAMES
from landscape.analyze.scheduler import run_analysis
from landscape.analyze.settings import AnalysisSettings
from landscape.analyze.source import find_sources
from landscape.config import setup
from landscape.core.errors import LandscapeError
from landscape.core.flat import FlatModel
from landscape.measure.analysis_data import AnalysisData
from landscape.measure.directions import direction_seed, filter_normalized_direction, random_plane
from landscape.measure.objective import Objective
from landscape.measure.surface.evaluation import evaluate_surface
from landscape.measure.surface.grid import SurfaceGrid, make_axis
from landscape.store.checkpoints import load_checkpoint
from landscape.store.results.names import settings_record
from landscape.train import loop

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
    name = RESULT_NAMES.result_name("surface", settings_record(SETTINGS, pass_options("surface", options)))
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


class Interrupted(Exception):
    pass


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
    ({"directions": "hessian"}, r"surface.directions must be one of random, pca, clients, interpolate "
                                r"\(got 'hessian'\)"),
    ({"span": "auto"}, "span 'auto' is for pca and clients directions"),
    ({"data": "client:x"}, "surface.data must be global, test or client:<i>"),
    ({"directions": "clients", "clients": "3"}, "two different client ids like '3,7'"),
    ({"directions": "interpolate", "grid": "5x3"}, "a 1D surface takes one number of points"),
    ({"directions": "interpolate", "grid": "6"}, "do not put grid points at alpha = 0 and 1"),
    ({"cells_per_batch": 0}, r"surface.cells_per_batch must be >= 1 \(got 0\)"),
    ({"save_every": 2.5}, r"surface.save_every must be an integer \(got 2.5\)"),
    ({"directions": "clients", "clients": "3,3"}, "two different client ids like '3,7'"),
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

    assert "client 9 does not exist (the run has 4 clients)" in attempt(
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
    from landscape.figures.rundata import load_runs

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
    assert RESULT_NAMES.result_name("surface", defaults) == "surface"
    written_before = {"analysis": defaults["analysis"],
                      "pass": {k: v for k, v in defaults["pass"].items()
                               if k not in ("normalization", "length", "reference")}}
    assert RESULT_NAMES.same_settings("surface", written_before, defaults)
    assert pass_options("surface", {"normalization": "euclidean", "length": 10}).length == 10.0


@pytest.mark.parametrize("options, message", [
    ({"normalization": "unit"}, "surface.normalization must be one of filter, euclidean, filter-reference"),
    ({"length": 5.0}, "surface length is the norm of euclidean directions"),
    ({"normalization": "euclidean", "length": -1}, r"surface.length must be > 0 \(got -1\)"),
    ({"normalization": "euclidean", "length": "10"}, r"surface.length must be a number \(got '10'\)"),
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
