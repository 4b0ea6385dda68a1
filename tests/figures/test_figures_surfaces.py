"""Surface figures: files written, [ix, iy] -> picture orientation, one colour scale, self-contained HTML."""

import json
import re

import numpy as np
import pytest

from landscape.core.errors import LandscapeError
from landscape.figures.surface.data import SurfaceData, image_arrays, load_surface
from landscape.figures.surface.draw import (
    SCENE_TITLE_CHARS,
    panels_figure,
    plot_contour,
    plot_curve_1d,
    plot_panels,
    plot_surface_3d,
    surface_figure,
    surface_html,
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def write_surface(folder, values, x_coords, y_coords=None, result=None, run="run", extra=None):
    """Files as the surface pass writes them: surface.npz (arrays) + surface.json (record with 'result')."""
    folder.mkdir(parents=True, exist_ok=True)
    arrays = {"loss": values, "accuracy": np.clip(1 - values / (np.nanmax(values) + 1), 0, 1),
              "x_coords": x_coords, **(extra or {})}
    if y_coords is not None:
        arrays["y_coords"] = y_coords
    np.savez_compressed(folder / "surface.npz", **arrays)
    record = {"pass": "surface", "run": run, "round": 10,
              "result": {"directions": "random", "quantity": "training loss (global F)", **(result or {})}}
    (folder / "surface.json").write_text(json.dumps(record))
    return folder / "surface.npz"


def grid(nx=7, ny=5, span=1.0):
    xs = span * (np.arange(nx) - nx // 2) / (nx // 2)
    ys = span * (np.arange(ny) - ny // 2) / (ny // 2)
    return xs, ys


@pytest.fixture
def bowl(tmp_path):
    xs, ys = grid()
    values = 1.0 + xs[:, None] ** 2 + 0.5 * ys[None, :] ** 2
    return write_surface(tmp_path / "bowl", values, xs, ys)


def test_a_surface_that_grows_along_d1_grows_along_the_horizontal_axis(tmp_path):
    xs, ys = grid(9, 5)
    values = np.repeat((2.0 + xs)[:, None], len(ys), axis=1)  # loss = 2 + x-coordinate only, [ix, iy]
    path = write_surface(tmp_path / "x", values, xs, ys)
    x_grid, y_grid, z = image_arrays(load_surface(path))
    assert z.shape == (5, 9) and x_grid.shape == (5, 9)
    np.testing.assert_array_equal(x_grid[0], xs)
    np.testing.assert_array_equal(y_grid[:, 0], ys)
    assert np.all(np.diff(z, axis=1) > 0) and np.all(np.diff(z, axis=0) == 0)
    panel = plot_contour(path, tmp_path / "x.png", levels=6)
    np.testing.assert_array_equal(panel.Z, values.T)
    # matplotlib's own contour lines: each level of loss = 2 + x is the vertical line x = level - 2
    drawn = 0
    for level, segments in zip(panel.levels, panel.segments):
        for segment in (s for s in segments if len(s)):
            np.testing.assert_allclose(segment[:, 0], level - 2.0, atol=1e-9)
            assert np.ptp(segment[:, 1]) > 0
            drawn += 1
    assert drawn >= 4
    figure = surface_figure([path])
    np.testing.assert_array_equal(np.asarray(figure.data[0].z), values.T)
    np.testing.assert_array_equal(np.asarray(figure.data[0].x), xs)


def test_static_renderers_write_png_and_pdf(tmp_path, bowl):
    for out in (plot_contour(bowl, tmp_path / "c.png") and tmp_path / "c.png",
                plot_surface_3d(bowl, tmp_path / "s.png") and tmp_path / "s.png"):
        data = out.read_bytes()
        assert data.startswith(PNG_SIGNATURE) and len(data) > 5000
    plot_contour(bowl, tmp_path / "c.pdf", filled=False, log_levels=True)
    assert (tmp_path / "c.pdf").read_bytes().startswith(b"%PDF")
    with pytest.raises(LandscapeError, match="must end in .png, .pdf or .svg"):
        plot_contour(bowl, tmp_path / "c.jpg")


def test_log_levels_are_geometric(tmp_path, bowl):
    panel = plot_contour(bowl, tmp_path / "log.png", log_levels=True, levels=5)
    ratios = panel.levels[1:] / panel.levels[:-1]
    np.testing.assert_allclose(ratios, ratios[0])
    assert panel.vmin == pytest.approx(1.0) and panel.vmax == pytest.approx(2.5)


def test_panels_share_one_colour_scale(tmp_path):
    xs, ys = grid()
    flat = write_surface(tmp_path / "a", 1.0 + 0.1 * xs[:, None] ** 2 + 0 * ys[None, :], xs, ys, run="fedsam")
    sharp = write_surface(tmp_path / "b", 1.0 + 4.0 * xs[:, None] ** 2 + ys[None, :] ** 2, xs, ys,
                          run="fednsam")
    for kind in ("contour", "3d"):
        panels = plot_panels([flat, sharp], ["FedSAM", "FedNSAM"], tmp_path / f"panels-{kind}.png", kind=kind)
        assert len(panels) == 2
        # the loss's rise above each panel's x (1.0 in both): 0 .. 0.1 and 0 .. 5
        assert panels[0].vmin == panels[1].vmin == pytest.approx(0.0)
        assert panels[0].vmax == panels[1].vmax == pytest.approx(5.0)
        np.testing.assert_array_equal(panels[0].levels, panels[1].levels)
        assert (tmp_path / f"panels-{kind}.png").read_bytes().startswith(PNG_SIGNATURE)
    with pytest.raises(LandscapeError, match="1 titles for 2 surfaces"):
        plot_panels([flat, sharp], ["one"], tmp_path / "bad.png")


@pytest.mark.parametrize("log", [True, False])
def test_compared_loss_panels_draw_the_rise_so_the_least_rise_looks_flattest(tmp_path, log):
    from matplotlib.colors import LogNorm, Normalize

    xs, ys = grid(21, 21, span=2.0)
    bowl = 1 - np.exp(-(xs[:, None] ** 2 + 0.7 * ys[None, :] ** 2) / 2)
    # (loss at x, rise at the rim): the third reaches the lowest loss and rises least, as FedNSAM
    shapes = {"FedSAM, Dir(0.6)": (0.2, 3.0), "FedSAM, Dir(0.1)": (0.35, 4.0), "FedNSAM, Dir(0.1)": (0.01, 1.5)}
    values = [centre + rise * bowl for centre, rise in shapes.values()]
    paths = [write_surface(tmp_path / str(k), v, xs, ys, run=name) for k, (name, v) in enumerate(zip(shapes, values))]

    def colour_ranges(norm, arrays):  # the share of the colour bar each panel spans
        return [float(norm(np.nanmax(a)) - norm(np.nanmin(a))) for a in arrays]

    # the premise: one log scale of the loss itself gives the least rise the widest range (it looks sharpest)
    assert np.argmax(colour_ranges(LogNorm(min(map(np.min, values)), max(map(np.max, values))), values)) == 2
    fig, panels = panels_figure(paths, list(shapes), log_levels=log)
    rises = [v - v[10, 10] for v in values]  # each surface's own loss at x, the grid's centre
    top = max(float(r.max()) for r in rises)
    for panel, rise in zip(panels, rises):
        np.testing.assert_array_equal(panel.Z, (np.maximum(rise, top / 1000) if log else rise).T)
    norm = (LogNorm if log else Normalize)(panels[0].vmin, panels[0].vmax)
    assert (panels[0].vmin, panels[0].vmax) == pytest.approx((top / 1000 if log else 0.0, top))
    ranges = colour_ranges(norm, [p.Z for p in panels])
    assert np.argsort(ranges).tolist() == [2, 0, 1]  # least rise, least colour; as the rises are ordered
    # each panel from the bottom of the bar (its x) to its largest rise: r / top, or on 3 decades of log
    expected = [float(r.max()) / top for r in rises]
    assert ranges == pytest.approx([1 + np.log10(e) / 3 for e in expected] if log else expected, rel=1e-9)
    (bar,) = [ax for ax in fig.axes if ax.get_label() == "<colorbar>"]
    assert bar.get_ylabel().startswith("rise of the training loss (global F)\nabove each panel's x (nats)")
    assert ("log scale; rises under 0.0039 lowest" in bar.get_ylabel()) == log
    assert (bar.get_yscale() == "log") == log


def test_html_is_self_contained(tmp_path, bowl):
    out = surface_html([bowl, bowl], tmp_path / "s.html", ["left", "right"])
    html = out.read_text()
    assert len(html) > 1_000_000  # plotly.js itself is inline
    assert "Plotly.newPlot" in html and "plotly.js" in html
    assert not re.search(r"<script[^>]*\ssrc\s*=", html)  # no external scripts: opens with no network
    figure = surface_figure([bowl, bowl], ["left", "right"])
    surfaces = [t for t in figure.data if t.type == "surface"]
    assert len(surfaces) == 2 and figure.layout.coloraxis.cmin == pytest.approx(1.0)
    assert figure.layout.coloraxis.cmax == pytest.approx(2.5)


def test_overlays_and_labels(tmp_path):
    xs, ys = grid()
    values = 1.0 + xs[:, None] ** 2 + ys[None, :] ** 2
    trajectory = np.array([[-0.8, 0.5], [-0.4, 0.2], [0.0, 0.0]])
    pca = write_surface(tmp_path / "pca", values, xs, ys,
                        {"directions": "pca", "explained_variance": [0.71, 0.2]},
                        extra={"trajectory": trajectory, "trajectory_rounds": np.array([0, 5, 10])})
    assert load_surface(pca).axis_labels() == ("PC1 (71.0% var.)", "PC2 (20.0% var.)")
    plot_contour(pca, tmp_path / "pca.png")
    clients = write_surface(tmp_path / "cl", values, xs, ys, {"directions": "clients", "clients": [3, 7]},
                            extra={"client_ids": np.array([3, 5, 7]),
                                   "client_coords": np.array([[0.5, 0.0], [0.1, -0.3], [0.2, 0.4]])})
    assert load_surface(clients).axis_labels() == ("client 3 direction", "client 7 direction (Gram-Schmidt)")
    plot_contour(clients, tmp_path / "clients.png", overlay="clients")
    plain = write_surface(tmp_path / "plain", values, xs, ys)
    assert load_surface(plain).axis_labels()[0] == "d1 (filter-normalised random)"
    assert load_surface(plain).quantity_label("accuracy") == "training accuracy (global F)"
    with pytest.raises(LandscapeError, match="overlay 'trajectory' needs a PCA surface"):
        plot_contour(plain, tmp_path / "p.png", overlay="trajectory")


def test_interpolation_curves(tmp_path):
    alphas = np.array([-0.5, 0.0, 0.5, 1.0, 1.5])
    line = write_surface(tmp_path / "line", 1.0 + (alphas - 0.3) ** 2, alphas,
                         result={"directions": "interpolate", "target": "client:3"})
    assert load_surface(line).axis_labels()[0] == "alpha (x -> client:3)"
    other = SurfaceData.from_arrays(alphas, 1.2 + alphas**2, run="fedavg")
    curves = plot_curve_1d([line, other], tmp_path / "curve.png", labels=["ours", "theirs"])
    np.testing.assert_array_equal(curves[1], 1.2 + alphas**2)
    assert (tmp_path / "curve.png").read_bytes().startswith(PNG_SIGNATURE)
    xs, ys = grid()
    with pytest.raises(LandscapeError, match="plot_curve_1d draws 1D surfaces"):
        plot_curve_1d([write_surface(tmp_path / "2d", np.ones((7, 5)), xs, ys)], tmp_path / "x.png")
    with pytest.raises(LandscapeError, match="this surface is a 1D line; draw it with plot_curve_1d"):
        plot_contour(line, tmp_path / "x.png")


def test_bad_files_are_explained(tmp_path):
    with pytest.raises(LandscapeError, match="surface file not found"):
        load_surface(tmp_path / "missing.npz")
    np.savez(tmp_path / "other.npz", a=np.zeros(3))
    with pytest.raises(LandscapeError, match="is not a surface file"):
        load_surface(tmp_path / "other.npz")
    np.savez(tmp_path / "swapped.npz", loss=np.zeros((5, 7)), x_coords=np.zeros(7), y_coords=np.zeros(5))
    with pytest.raises(LandscapeError, match=r"shape \(5, 7\), but the coordinates give \(7, 5\)"):
        load_surface(tmp_path / "swapped.npz")


# -- surfaces of several models: one plane, or each model's own (issue 19, item 3) ----------------------------


def _planes(tmp_path, metas, same=True):
    xs, ys = grid(5, 5)
    rng = np.random.default_rng(0)
    d1, d2 = rng.normal(size=8), rng.normal(size=8)
    paths = []
    for k, meta in enumerate(metas):
        extra = {"d1": d1 if same else d1 + k, "d2": d2}
        values = 1.0 + (k + 1) * xs[:, None] ** 2 + ys[None, :] ** 2
        paths.append(write_surface(tmp_path / f"m{k}", values, xs, ys, result=meta, run=f"m{k}", extra=extra))
    return paths


def test_side_by_side_planes_say_whether_they_are_one_plane_and_print_each_weight_norm(tmp_path):
    from landscape.figures.surface.data import compare_planes

    per_model = _planes(tmp_path / "f", [{"weight_norm": 10.0}, {"normalization": "filter", "weight_norm": 16.6}])
    planes = compare_planes(per_model, ["FedSAM", "FedNSAM"])
    assert planes.normalizations == ("filter", "filter") and not planes.comparable
    assert planes.weight_norms == (10.0, 16.6)
    assert "per-model filter-normalised" in planes.text and "||x||: FedSAM = 10, FedNSAM = 16.6" in planes.text
    fig, _ = __import__("landscape.figures.surface.draw", fromlist=["panels_figure"]).panels_figure(
        per_model, ["FedSAM", "FedNSAM"])
    assert fig.get_suptitle() == planes.planes and planes.text.startswith(planes.planes + "; ||x||: ")
    assert [ax.get_title() for ax in fig.axes[:2]] == ["FedSAM\n||x|| = 10", "FedNSAM\n||x|| = 16.6"]
    html = surface_figure(per_model, ["FedSAM", "FedNSAM"])
    assert any("per-model filter-normalised" in a.text for a in html.layout.annotations)
    assert any("||x|| = 16.6" in a.text for a in html.layout.annotations)  # the subplot titles

    euclid = {"normalization": "euclidean", "length": 2.0}
    one = compare_planes(_planes(tmp_path / "e", [{**euclid, "weight_norm": 10.0}, {**euclid, "weight_norm": 16.6}]))
    assert one.comparable and one.same_plane
    assert one.text.startswith("euclidean directions of length 2: one plane for every model (identical d1, d2)")
    other = compare_planes(_planes(tmp_path / "o", [euclid, {**euclid, "length": 3.0}]))
    assert not other.comparable and "planes of different settings (euclidean length 2.0, euclidean length 3.0)" in other.text
    mixed = compare_planes(_planes(tmp_path / "x", [euclid, {}]))
    assert not mixed.comparable and "planes of different normalisations (euclidean, filter)" in mixed.text
    assert "||x|| not recorded" in mixed.text


def _fake_run(root, name, algorithm, norm, surfaces):
    """A run directory with only what compare reads: its recipe, surface results (as the pass writes, without the
    checkpoint's SHA-256, as an older version wrote them) and the file of the checkpoint they are of."""
    from landscape.analyze.catalog import pass_options
    from landscape.analyze.passes import RESULT_NAMES
    from landscape.analyze.settings import AnalysisSettings
    from landscape.store.results.names import settings_record

    run = root / name
    out = run / "analysis" / "round-0010"
    out.mkdir(parents=True)
    (run / "recipe.toml").write_text(f'seed = 0\n[algorithm]\nname = "{algorithm}"\n'
                                     '[partition]\nname = "dirichlet"\nalpha = 0.1\n')
    (run / "metrics.jsonl").write_text("")
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "round-0010.pt").write_bytes(b"")  # a result is read only where its checkpoint is
    xs, ys = grid(5, 5)
    for options, d1 in surfaces:
        opts = pass_options("surface", options)
        settings = settings_record(AnalysisSettings(), opts)
        stem = RESULT_NAMES.result_name("surface", settings)
        values = 1.0 + norm * xs[:, None] ** 2 + ys[None, :] ** 2
        arrays = {"loss": values, "accuracy": 0 * values + 0.5, "x_coords": xs, "y_coords": ys, "d1": d1, "d2": d1[::-1]}
        np.savez(out / f"{stem}.npz", **arrays)
        result = {"directions": "random", "normalization": opts.normalization,
                  "length": opts.length if opts.normalization == "euclidean" else None, "weight_norm": norm,
                  "quantity": "training loss (global F)"}
        (out / f"{stem}.json").write_text(json.dumps({"schema_version": 1, "pass": "surface", "run": name, "round": 10,
                                                      "settings": settings, "result": result,
                                                      "arrays": sorted(arrays)}))
    return run


def test_compare_draws_one_plane_for_every_run_where_every_run_has_it(tmp_path, monkeypatch):
    from landscape.figures.compare import compare
    from landscape.figures.surface import draw as surfaces

    monkeypatch.setattr(surfaces, "save_figure", lambda fig, out: out)  # the files are not what is tested

    d = np.arange(6.0)
    euclid = {"normalization": "euclidean", "length": 2.0}
    a = _fake_run(tmp_path, "a", "fedsam", 10.0, [({}, d), (euclid, d)])
    b = _fake_run(tmp_path, "b", "fednsam", 16.6, [({}, 1.66 * d), (euclid, d)])
    result = compare([a, b], tmp_path / "cmp")
    assert "surface read with length=2, normalization=euclidean" in result.settings
    line = next(text for text in result.settings if text.startswith("surfaces: "))
    assert "one plane for every model (identical d1, d2)" in line and "= 10, " in line and "= 16.6" in line
    assert not any("filter-normalised to each model" in m for m in result.missing)
    table_only = compare([a, b], tmp_path / "cmp-table", draw_surfaces=False)  # the demo: its recipe draws them
    assert table_only.written == [tmp_path / "cmp-table" / "compare.csv"]
    assert table_only.settings == result.settings and table_only.rows == result.rows

    (b / "analysis" / "round-0010" / "surface@length-2_normalization-euclidean.json").unlink()
    result = compare([a, b], tmp_path / "cmp2")
    line = next(text for text in result.settings if text.startswith("surfaces: "))
    assert "per-model filter-normalised" in line
    assert any("--set surface.normalization=filter-reference --set surface.reference=round:0" in m
               for m in result.missing)


def test_the_report_says_what_the_runs_planes_compare_and_prints_each_weight_norm(tmp_path):
    import html

    from landscape.figures.report.parts import Page
    from landscape.figures.report.surfaces import surfaces_section
    from landscape.figures.rundata import load_runs

    d = np.arange(6.0)
    a = _fake_run(tmp_path, "a", "fedsam", 10.0, [({}, d)])
    b = _fake_run(tmp_path, "b", "fednsam", 16.6, [({}, 1.66 * d)])
    text = html.unescape(surfaces_section(load_runs([a, b]), Page()))
    assert "Random planes of the runs: per-model filter-normalised planes (Li et al. 2018)" in text
    assert "||x|| = 16.6; filter-normalised to this model's own weights" in text
    assert "random plane filter-normalised to this model (Li et al. 2018)" in text  # the plot's title


# -- paper-ready: 3D axis labels clear of their ticks, legends below the maps, captions beside the files ------


def _boxes_meet(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


@pytest.mark.parametrize("meta", [{"normalization": "filter-reference", "reference": "round:0"},
                                  {"normalization": "euclidean", "length": 2.0}, {}])
def test_3d_axis_labels_do_not_touch_tick_labels(tmp_path, meta):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    paths = _planes(tmp_path, [{**meta, "weight_norm": 10.0}, {**meta, "weight_norm": 16.6}])
    for fig in (panels_figure(paths, ["FedSAM alpha=0.1, round 30", "FedNSAM alpha=0.1, round 30"], kind="3d")[0],
                __import__("landscape.figures.surface.draw", fromlist=["x"]).surface_3d_figure(paths[0])[0]):
        FigureCanvasAgg(fig)
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        for ax in (a for a in fig.axes if a.name == "3d"):
            for axis in (ax.xaxis, ax.yaxis, ax.zaxis):
                label = axis.label.get_window_extent(renderer)
                for tick in axis.get_ticklabels():
                    if tick.get_visible() and tick.get_text():
                        assert not _boxes_meet(label, tick.get_window_extent(renderer)), (
                            axis.label.get_text(), tick.get_text())
            # a long name by its short one (the caption has it in full)
            assert len(ax.xaxis.label.get_text()) <= SCENE_TITLE_CHARS and ax.xaxis.label.get_text().startswith("d1")
        assert "Axes: d1 (" in __import__("landscape.figures.labels", fromlist=["x"]).caption_of(fig)


def test_contour_legends_sit_below_the_maps_and_the_caption_is_written_beside(tmp_path, bowl):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from landscape.figures.surface.draw import contour_figure, save_figures

    xs, ys = grid()
    other = write_surface(tmp_path / "other", 1.0 + 2 * xs[:, None] ** 2 + ys[None, :] ** 2, xs, ys)
    for fig in (contour_figure(bowl)[0], panels_figure([bowl, other], ["a", "b"])[0]):
        FigureCanvasAgg(fig)
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        assert all(ax.get_legend() is None for ax in fig.axes)
        (legend,) = fig.legends
        assert [t.get_text() for t in legend.get_texts()] == ["x (round 10)"]
        box = legend.get_window_extent(renderer)
        assert not any(box.overlaps(ax.get_window_extent(renderer)) for ax in fig.axes)
        # nor over the figure's own lines (the planes' warning of these per-model planes)
        texts = [t for t in (fig._suptitle, fig._supxlabel) if t is not None and t.get_text()]
        assert not any(box.overlaps(t.get_window_extent(renderer)) for t in texts)
    assert "per-model filter-normalised planes" in fig.get_suptitle()
    written = save_figures(fig, tmp_path / "maps")
    assert [p.name for p in written] == ["maps.png", "maps.pdf", "maps.caption.txt"]
    caption = (tmp_path / "maps.caption.txt").read_text()
    assert "Planes: per-model filter-normalised planes" in caption and "Axes: d1 (filter-normalised random)" in caption
