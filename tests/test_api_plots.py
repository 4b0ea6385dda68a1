"""The figures of the notebook API's results (landscape.plot_surface, plot_spectrum, plot_sharpness): each on a
tiny model's result writes its file, labels its axes and draws the result's own numbers; a wrong type is a
one-line TypeError naming what the function takes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from matplotlib.collections import PathCollection
from matplotlib.figure import Figure

import landscape
from landscape.api.plots import surface_data
from landscape.core.errors import LandscapeError
from landscape.figures.surface.draw import contour_figure

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def problem():
    """A tiny classifier and 64 samples."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.Tanh(), torch.nn.Linear(6, 3))
    x = torch.randn(64, 8, generator=torch.Generator().manual_seed(1))
    y = torch.randint(0, 3, (64,), generator=torch.Generator().manual_seed(2))
    return model, (x, y)


def assert_png(path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and len(data) > 10_000, path


def scatter_points(ax) -> np.ndarray:
    return np.concatenate([c.get_offsets() for c in ax.collections if isinstance(c, PathCollection)])


def test_plot_surface_draws_the_grids_loss_as_a_contour_map(problem, tmp_path):
    result = landscape.surface(*problem, grid=7)
    fig = landscape.plot_surface(result, tmp_path / "surface.png")
    assert isinstance(fig, Figure)
    assert_png(tmp_path / "surface.png")
    ax, bar = fig.axes
    assert ax.get_xlabel() == "d1 (filter-normalised random)" and ax.get_ylabel().startswith("d2")
    assert bar.get_ylabel() == "loss" and "seed 0" in ax.get_title()
    contours = ax.collections[0]
    # the levels run from the grid's lowest loss to its highest
    assert contours.levels[0] == pytest.approx(result.loss.min(), rel=1e-12)
    assert contours.levels[-1] == pytest.approx(result.loss.max(), rel=1e-12)
    # the picture's arrays are the result's: Z[iy, ix] = loss[ix, iy] over its coordinates
    _, panel = contour_figure(surface_data(result))
    np.testing.assert_array_equal(panel.Z, result.loss.T)
    np.testing.assert_array_equal(panel.X[0], result.x_coords)
    np.testing.assert_array_equal(panel.Y[:, 0], result.y_coords)
    np.testing.assert_array_equal(ax.lines[0].get_xydata(), [[0.0, 0.0]])  # the model x, marked
    assert ax.lines[0].get_label() == "x (the model)"


def test_plot_surface_3d_and_accuracy_and_pdf(problem, tmp_path):
    result = landscape.surface(*problem, grid=5)
    fig = landscape.plot_surface(result, tmp_path / "surface.pdf", kind="3d")
    assert (tmp_path / "surface.pdf").read_bytes()[:5] == b"%PDF-"
    ax = fig.axes[0]
    assert ax.get_zlabel() == "loss" and ax.get_xlabel().startswith("d1")
    centre = result.loss[2, 2]  # the model x: the grid's middle point
    star = [c for c in ax.collections if isinstance(c, PathCollection)][0]
    assert np.asarray(star._offsets3d[2]).tolist() == [centre]
    low, high = ax.get_zlim()
    assert low <= result.loss.min() and result.loss.max() <= high
    accuracy = landscape.plot_surface(result, quantity="accuracy")
    assert accuracy.axes[1].get_ylabel() == "accuracy"
    assert accuracy.axes[0].collections[0].levels[-1] == pytest.approx(np.nanmax(result.accuracy))


def test_plot_surface_draws_a_line_as_its_loss_and_accuracy(problem, tmp_path):
    result = landscape.surface(*problem, grid=9, dims=1)
    fig = landscape.plot_surface(result, tmp_path / "line.png")
    assert_png(tmp_path / "line.png")
    ax, twin = fig.axes
    loss, accuracy = ax.lines[0], twin.lines[0]
    np.testing.assert_array_equal(loss.get_xdata(), result.x_coords)
    np.testing.assert_array_equal(loss.get_ydata(), result.loss)
    np.testing.assert_array_equal(accuracy.get_ydata(), result.accuracy)
    assert ax.get_xlabel() == "d1 (filter-normalised random)" and ax.get_ylabel() == "loss"
    assert twin.get_ylabel() == "accuracy"
    # the model is marked at 0, and nothing at 1 (a random line has no target)
    assert [t.get_text() for t in ax.texts] == ["x"]
    with pytest.raises(LandscapeError, match="a 1D surface is drawn as its loss"):
        landscape.plot_surface(result, kind="3d")


def test_a_regression_surface_has_no_accuracy_axis(problem):
    model = torch.nn.Sequential(torch.nn.Linear(8, 1))
    x = problem[1][0]
    result = landscape.surface(model, (x, x[:, :1] ** 2), grid=5, dims=1, loss="mse",
                               directions=(torch.ones(9, dtype=torch.float32),))
    fig = landscape.plot_surface(result)
    assert len(fig.axes) == 1 and fig.axes[0].get_xlabel() == "d1"  # given directions: no random plane named
    assert "the given directions" in fig.axes[0].get_title()
    with pytest.raises(LandscapeError, match="has no 'accuracy' values"):
        landscape.plot_surface(landscape.surface(model, (x, x[:, :1] ** 2), grid=3, loss="mse"),
                               quantity="accuracy")


def test_plot_spectrum_draws_the_top_eigenvalues_and_the_density(problem, tmp_path):
    eigs = landscape.hessian_eigs(*problem, k=4)
    dens = landscape.density(*problem, runs=2, steps=10)
    fig = landscape.plot_spectrum([eigs, dens], tmp_path / "spectrum.png")
    assert_png(tmp_path / "spectrum.png")
    ax_top, ax_density = fig.axes
    np.testing.assert_array_equal(scatter_points(ax_top), np.column_stack([np.arange(1, 5), eigs.values]))
    assert [t.get_text() for t in ax_top.texts] == [f"{v:.4g}" for v in eigs.values]
    assert ax_top.get_xlabel() == "j" and "lambda_j" in ax_top.get_ylabel()
    density_line, *eigen_lines = ax_density.lines
    np.testing.assert_array_equal(density_line.get_xdata(), dens.grid)
    floor = 1e-7 * dens.density.max()
    np.testing.assert_array_equal(density_line.get_ydata(), np.maximum(dens.density, floor))
    assert [line.get_xdata()[0] for line in eigen_lines] == eigs.values.tolist()
    assert ax_density.get_yscale() == "log" and ax_density.get_xlabel() == r"eigenvalue $\lambda$"
    assert ax_density.get_ylabel() == "density (log scale)"
    # either alone: one panel
    assert len(landscape.plot_spectrum(eigs).axes) == 1
    only = landscape.plot_spectrum(dens)
    assert len(only.axes) == 1 and len(only.axes[0].lines) == 1


def test_plot_sharpness_draws_s_rho_over_rho(problem, tmp_path):
    profile = landscape.sharpness(*problem, rho=[0.05, 0.01, 0.1], steps=3, starts=2)
    fig = landscape.plot_sharpness(profile, tmp_path / "sharpness.png")
    assert_png(tmp_path / "sharpness.png")
    (ax,) = fig.axes
    line = ax.lines[0]
    order = np.argsort(profile.rhos)
    np.testing.assert_array_equal(line.get_xdata(), profile.rhos[order])
    np.testing.assert_array_equal(line.get_ydata(), profile.sharpness[order])
    assert [t.get_text() for t in ax.texts] == [f"{s:.3g}" for s in profile.sharpness]
    assert ax.get_xscale() == "log" and "rho" in ax.get_xlabel() and "S_" in ax.get_ylabel()
    assert [t.get_text() for t in ax.get_xticklabels()] == ["0.05", "0.01", "0.1"]


def test_a_wrong_result_type_is_a_one_line_type_error(problem, tmp_path):
    profile = landscape.sharpness(*problem, rho=0.05, steps=1, starts=1)
    cases = [(landscape.plot_surface, "plot_surface takes the result of landscape.surface"),
             (landscape.plot_spectrum, "plot_spectrum takes the results of landscape.hessian_eigs"),
             (landscape.plot_sharpness, "plot_sharpness takes the result of landscape.sharpness")]
    for function, message in cases:
        wrong = profile if function is not landscape.plot_sharpness else {"rhos": [0.05]}
        with pytest.raises(TypeError, match=message) as caught:
            function(wrong, tmp_path / "x.png")
        assert "\n" not in str(caught.value) and str(caught.value).endswith(f"not {type(wrong).__name__}")
    with pytest.raises(TypeError, match="not SharpnessProfile"):
        landscape.plot_spectrum([landscape.density(*problem, runs=1, steps=3), profile])
    assert not (tmp_path / "x.png").exists()
    # the run figures' renderers name the function that draws an API result
    with pytest.raises(TypeError, match="a result of landscape.surface is drawn by landscape.plot_surface"):
        contour_figure(landscape.surface(*problem, grid=3))
    with pytest.raises(LandscapeError, match="kind must be one of contour, 3d"):
        landscape.plot_surface(landscape.surface(*problem, grid=3), kind="surface")
    with pytest.raises(LandscapeError, match="must end in .png, .pdf or .svg"):
        landscape.plot_sharpness(profile, tmp_path / "x.jpg")
