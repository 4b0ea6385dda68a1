"""Curves and summary figures from run directories (landscape.figures.curves): files in, PNG/PDF out."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
from support.figure_runs import analysed_runs
from support.helpers import shared_folder

from landscape.core.errors import LandscapeError
from landscape.figures import curves, rundata
from landscape.figures.labels import caption_of

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """Two analysed runs (FedAvg, FedSAM) at rounds 2 and 3, and one run with no analysis."""
    return shared_folder(tmp_path_factory, "analysed-runs", analysed_runs)


@pytest.fixture(scope="module")
def runs(root):
    return rundata.load_runs(root / "analysed")


def assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and len(data) > 10_000, path


def test_accuracy_is_drawn_in_percent_on_the_eval_rounds(runs, root, tmp_path):
    fig = curves.accuracy_figure(runs)
    (ax,) = fig.axes
    for line, run in zip(ax.lines, runs):
        rows = [r for r in run.metrics if r.get("test_acc") is not None]
        np.testing.assert_array_equal(line.get_xdata(), [r["round"] for r in rows])
        np.testing.assert_allclose(line.get_ydata(), [100 * r["test_acc"] for r in rows])
        assert line.get_label() == run.label
    assert "%" in ax.get_ylabel()
    assert_png(curves.plot_accuracy(root / "analysed", tmp_path / "accuracy.png"))


@pytest.mark.parametrize("key", ["flatness_distance", "train_loss", "update_norm"])
def test_metric_over_rounds(runs, tmp_path, key):
    out = curves.plot_metric_over_rounds(runs, key, tmp_path / f"{key}.png")
    assert_png(out)
    fig = curves.metric_figure(runs, key, "my label")
    assert fig.axes[0].get_ylabel() == "my label"
    np.testing.assert_allclose(fig.axes[0].lines[1].get_ydata(), runs[1].series(key)[1])


def test_a_missing_metric_is_named(runs, tmp_path):
    with pytest.raises(LandscapeError, match="has no 'no_such_key' in metrics.jsonl"):
        curves.plot_metric_over_rounds(runs, "no_such_key", tmp_path / "x.png")


def test_flatness_and_sharpness_reads_the_passes(runs, tmp_path):
    fig = curves.flatness_and_sharpness_figure(runs)
    ax_d, ax_s, ax_l = fig.axes
    assert "0.05" in ax_s.get_title()
    # the settings shown (off the defaults) are the caption's, not the title's
    assert "[" not in ax_s.get_title() and "analysis_samples" not in ax_s.get_title()
    assert "sharpness read with analysis_samples=100, clients=2, steps=2" in caption_of(fig)
    for k, run in enumerate(runs):
        np.testing.assert_allclose(ax_d.lines[k].get_ydata(), run.series("flatness_distance")[1])
        expected_s = [json.loads((run.path / f"analysis/round-{r:04d}/sharpness@analysis_samples-100_clients-2_"
                                             "steps-2.json").read_text())["result"]["global"]["sharpness"][1]
                      for r in (2, 3)]  # rhos (0.01, 0.05, 0.1)
        np.testing.assert_allclose(ax_s.lines[k].get_ydata(), expected_s)
        np.testing.assert_array_equal(ax_s.lines[k].get_xdata(), [2, 3])
        expected_l = [run.analyses[r]["hessian"].summary["lambda_max"] for r in (2, 3)]
        np.testing.assert_allclose(ax_l.lines[k].get_ydata(), expected_l)
    assert "0.1" in curves.flatness_and_sharpness_figure(runs, rho=0.1).axes[1].get_title()
    with pytest.raises(LandscapeError, match=r"rho=0.3 .*0.01, 0.05, 0.1"):
        curves.plot_flatness_and_sharpness(runs, tmp_path / "x.png", rho=0.3)
    assert_png(curves.plot_flatness_and_sharpness(runs, tmp_path / "fig2.png"))
    caption = (tmp_path / "fig2.caption.txt").read_text()  # beside the figure
    assert "Runs: FedAvg alpha=0.5 (fedavg); FedSAM alpha=0.5 (fedsam)." in caption
    assert "(a) rounds 1-3; (b) rounds 2, 3; (c) rounds 2, 3." in caption
    assert "sharpness read with analysis_samples=100, clients=2, steps=2" in caption


def test_hessian_summary(runs, tmp_path):
    fig = curves.hessian_figure(runs)
    ax_max, ax_ratio, ax_density = fig.axes
    heights = [p.get_height() for p in ax_max.patches]
    assert heights == pytest.approx([run.pass_record("hessian").summary["lambda_max"] for run in runs])
    ratios = [p.get_height() for p in ax_ratio.patches]
    assert ratios == pytest.approx([run.pass_record("hessian").summary["lambda_ratio"] for run in runs])
    assert ax_density.get_yscale() == "log" and len(ax_density.lines) == 2
    assert_png(curves.plot_hessian_summary(runs, tmp_path / "hessian.png"))
    pdf = curves.plot_hessian_summary(runs, tmp_path / "hessian.pdf", round=2)
    assert pdf.read_bytes()[:5] == b"%PDF-"


def test_incompatibility(runs, tmp_path):
    fig = curves.incompatibility_figure(runs)
    ax = fig.axes[0]
    rec = runs[0].pass_record("incompatibility", 3)
    # errorbar containers: Delta_FI, heterogeneity, batch part, 2 x cross
    delta_fi, _, _, cross = ax.containers
    assert delta_fi.lines[0].get_ydata()[-1] == pytest.approx(rec.value("incompatibility"))
    assert cross.lines[0].get_ydata()[-1] == pytest.approx(2 * rec.value("cross"))
    assert delta_fi.has_yerr
    assert_png(curves.plot_incompatibility(runs, tmp_path / "incompatibility.png"))


def test_alignment_heatmaps_share_one_colour_scale(runs, tmp_path):
    fig = curves.alignment_figure(runs)
    images = [im for ax in fig.axes for im in ax.images]
    assert len(images) == 2
    assert {im.get_clim() for im in images} == {(-1.0, 1.0)}
    assert images[0].norm is images[1].norm
    assert len(fig.axes) == 3  # two heatmaps and one colour bar
    clients = runs[0].pass_record("alignment").value("gradients.clients")
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == [str(c) for c in clients]
    np.testing.assert_allclose(images[0].get_array(), runs[0].pass_record("alignment").value("gradients.cosine_matrix"))
    assert_png(curves.plot_alignment_heatmaps(runs, tmp_path / "alignment.png"))


@pytest.mark.parametrize("plot, passes", [
    (curves.plot_hessian_summary, "hessian"),
    (curves.plot_incompatibility, "incompatibility"),
    (curves.plot_alignment_heatmaps, "alignment"),
    (curves.plot_flatness_and_sharpness, "sharpness,hessian"),
])
def test_missing_analysis_names_the_run_and_the_command(root, tmp_path, plot, passes):
    bare = root / "bare" / "fedavg"
    with pytest.raises(LandscapeError) as err:
        plot([root / "analysed" / "fedsam", bare], tmp_path / "x.png")
    message = str(err.value)
    assert f"run fedavg has no {passes.replace(',', ', ')} analysis" in message
    assert f"`landscape analyze {bare} --passes {passes}`" in message
    assert "fedsam" not in message


def test_bad_inputs(root, runs, tmp_path):
    with pytest.raises(LandscapeError, match="does not exist"):
        rundata.load_runs(tmp_path / "nowhere")
    with pytest.raises(LandscapeError, match="not a run directory"):
        rundata.load_runs(tmp_path)
    with pytest.raises(LandscapeError, match=r"must end in \.png, \.pdf or \.svg"):
        curves.plot_accuracy(runs, tmp_path / "accuracy.jpg")
    with pytest.raises(LandscapeError, match="no alignment analysis at round 1 .*analysed rounds: 2, 3"):
        curves.plot_alignment_heatmaps(runs, tmp_path / "x.png", round=1)


# -- readable: no label under a dot, no tick label on another ----------------------------------------------


def _drawn(fig):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    fig.canvas.draw()
    return fig.canvas.get_renderer()


def overlapping_x_ticks(fig) -> list[tuple[str, str]]:
    """Pairs of drawn x tick labels of one axes whose boxes meet."""
    renderer = _drawn(fig)
    pairs = []
    for ax in fig.axes:
        labels = [t for t in ax.get_xticklabels() if t.get_visible() and t.get_text()]
        boxes = [t.get_window_extent(renderer) for t in labels]
        pairs += [(labels[i].get_text(), labels[j].get_text()) for i in range(len(boxes))
                  for j in range(i + 1, len(boxes)) if boxes[i].overlaps(boxes[j])]
    return pairs


def long_labelled(runs):
    """Copies of the runs with labels as long as the demo's and longer ('FedNSAM dirichlet-client ...')."""
    import copy

    names = ["FedAvg dirichlet-client alpha=0.1 seed=0", "FedNSAM dirichlet-client alpha=0.1 seed=0"]
    copies = [copy.copy(run) for run in runs]
    for run, name in zip(copies, names):
        run.label = name
    return copies


def test_no_x_tick_labels_overlap_in_the_demo_figures(runs):
    long = long_labelled(runs)
    for figure in (curves.accuracy_figure(long), curves.flatness_and_sharpness_figure(long),
                   curves.hessian_figure(long), curves.alignment_figure(long), curves.incompatibility_figure(long)):
        assert overlapping_x_ticks(figure) == []
    ax_max = curves.hessian_figure(long).axes[0]
    assert [t.get_text() for t in ax_max.get_xticklabels()] == [  # wrapped at spaces, never inside a word
        "FedAvg dirichlet-client\nalpha=0.1 seed=0", "FedNSAM dirichlet-client\nalpha=0.1 seed=0"]


def test_the_hessian_bar_labels_are_clear_of_the_clients_dots(runs):
    fig = curves.hessian_figure(long_labelled(runs))
    renderer = _drawn(fig)
    ax_max = fig.axes[0]
    dots = [c for c in ax_max.collections if len(c.get_offsets())]  # one scatter per run
    offsets = np.concatenate([c.get_offsets() for c in dots])
    assert len(offsets) == sum(len(np.atleast_1d(run.pass_record("hessian").value("clients.lambda_max")))
                               for run in runs)
    points = ax_max.transData.transform(offsets)
    radius = np.sqrt(dots[0].get_sizes()[0]) / 2 * fig.dpi / 72  # the dot's radius in pixels
    labels = [t for t in ax_max.texts if t.get_text()]
    assert [t.get_text() for t in labels] == [f"{run.pass_record('hessian').summary['lambda_max']:.3g}" for run in runs]
    for label in labels:
        box = label.get_window_extent(renderer)
        inside = ((points[:, 0] > box.x0 - radius) & (points[:, 0] < box.x1 + radius)
                  & (points[:, 1] > box.y0 - radius) & (points[:, 1] < box.y1 + radius))
        assert not inside.any(), (label.get_text(), points[inside])
    # each bar is beside its clients' strip, not under it
    for bar, x in zip(ax_max.patches, range(len(runs))):
        strip = offsets[:, 0]
        assert bar.get_x() + bar.get_width() < strip[(strip > x - 0.5) & (strip < x + 0.5)].min()


@pytest.mark.parametrize("value, scale", [(0.0, "linear"), (0.5, "log")])
def test_a_log_axis_only_where_a_value_is_positive(root, tmp_path, value, scale):
    folder = tmp_path / "runs"
    for run in sorted(p for p in (root / "analysed").iterdir() if p.is_dir()):
        copy = folder / run.name
        copy.mkdir(parents=True)
        (copy / "recipe.toml").write_text((run / "recipe.toml").read_text())
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        (copy / "metrics.jsonl").write_text("".join(json.dumps({**r, "gap": value}) + "\n" for r in rows))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # matplotlib warns when a log axis has no positive value
        (ax,) = curves.metric_figure(rundata.load_runs(folder), "gap", "gap", log=True).axes
    assert ax.get_yscale() == scale
    assert ("no positive value" in ax.get_ylabel()) == (scale == "linear")


# -- paper-ready: plain titles (settings in the caption), legends outside the data ----------------------------


def every_figure(runs):
    return {"accuracy": curves.accuracy_figure(runs), "metric": curves.metric_figure(runs, "train_loss"),
            "flatness-sharpness": curves.flatness_and_sharpness_figure(runs), "hessian": curves.hessian_figure(runs),
            "incompatibility": curves.incompatibility_figure(runs), "alignment": curves.alignment_figure(runs)}


def test_titles_carry_no_settings_and_the_caption_names_runs_rounds_and_settings(runs):
    for name, fig in every_figure(runs).items():
        titles = [ax.get_title() for ax in fig.axes] + [fig.get_suptitle()]
        assert not [t for t in titles if "[" in t or "=2," in t or "analysis_samples" in t], (name, titles)
        caption = caption_of(fig)
        assert "Runs: FedAvg alpha=0.5 (fedavg); FedSAM alpha=0.5 (fedsam)." in caption, name
        assert "round" in caption.lower() and "$" not in caption, name  # plain text, no mathtext
    figures = every_figure(runs)
    for name in ("hessian", "incompatibility", "alignment"):  # read with settings off the defaults: named
        assert f"{name} read with analysis_samples=100" in caption_of(figures[name]), name


def test_legends_sit_outside_every_axes(runs):
    for name, fig in every_figure(runs).items():
        renderer = _drawn(fig)
        assert all(ax.get_legend() is None for ax in fig.axes), name  # no legend inside a plot
        for legend in fig.legends:
            box = legend.get_window_extent(renderer)
            for ax in fig.axes:
                assert not box.overlaps(ax.get_window_extent(renderer)), (name, ax.get_title())
    assert len(every_figure(runs)["accuracy"].legends) == 1  # the runs are still named
