"""The report and the demo's figures read as drawn: whole plot titles that fit their plot, one tick for one
round, tables that scroll inside their box, each recipe value printed once, loss contours on log-spaced
levels, surface panels whose tick labels do not meet."""

from __future__ import annotations

import html
import json
import re

import numpy as np
import pytest
from test_figures_curves import overlapping_x_ticks
from test_figures_surfaces import _fake_run

from landscape.figures.labels import wrap_title
from landscape.figures.report import build as report
from landscape.figures.report import plots as report_plotly
from landscape.figures.report.parts import Page
from landscape.figures.report.surfaces import surfaces_section
from landscape.figures.rundata import load_runs
from landscape.figures.surface import draw as surfaces

EUCLID = {"normalization": "euclidean", "length": 2.0}


def visible(text: str) -> str:
    return html.unescape(re.sub(r"<[^>]*>", "", text))


def specs(text: str) -> list[dict]:
    """Every plot's plotly JSON on a page (or a part of one)."""
    return [json.loads(found) for found in re.findall(r"var spec = (.*?); Plotly\.newPlot", text)]


@pytest.fixture
def sam_runs(tmp_path):
    """FedSAM and FedNSAM, both alpha=0.1 (labels alike but for one letter), each with a euclidean surface."""
    d = np.arange(6.0)
    return [_fake_run(tmp_path, "fedsam", "fedsam", 10.0, [(EUCLID, d)]),
            _fake_run(tmp_path, "fednsam", "fednsam", 16.6, [(EUCLID, d)])]


def test_wrap_title_breaks_long_lines_at_spaces_and_counts_what_shows():
    title = "S<sub>ρ</sub>(x<sup>t</sup>) of a run with a rather long name, round 30<br>[grid=21, span=-1:1]"
    wrapped = wrap_title(title, 30)
    lines = wrapped.split("<br>")
    assert all(len(visible(line)) <= 30 for line in lines), lines
    assert visible(" ".join(lines)).split() == visible(title.replace("<br>", " ")).split()  # nothing lost
    assert wrap_title("short<br>lines", 30) == "short<br>lines"


def test_the_reports_3d_surface_titles_are_whole_distinct_and_fit_their_plot(sam_runs):
    text = str(surfaces_section(load_runs(sam_runs), Page()))
    found = [spec for spec in specs(text) if spec["data"][0]["type"] == "surface"]
    assert len(found) == 2
    heads = []
    for spec in found:
        layout = spec["layout"]
        (title,) = [a["text"] for a in layout["annotations"] if a.get("yanchor") == "bottom"]
        lines = title.split("<br>")
        chars = int((layout["width"] - 130) / 8.5)  # the plot area's width, ~8.5 px a character
        assert all(len(visible(line)) <= chars for line in lines), lines
        assert layout["margin"]["t"] >= 16 + 22 * len(lines)  # room above the scene for every line
        # what the plane is in the title; its settings in the line below the plot, never in the title
        assert "euclidean random plane" in visible(title) and "normalization" not in visible(title)
        heads.append(lines[0])
        scene = layout["scene"]
        assert len(scene["xaxis"]["title"]["text"]) <= surfaces.SCENE_TITLE_CHARS
        assert len(scene["yaxis"]["title"]["text"]) <= surfaces.SCENE_TITLE_CHARS
    assert sorted(heads) == ["FedNSAM alpha=0.1, round 10", "FedSAM alpha=0.1, round 10"]
    # the heading above each plot: the same words on one line
    assert "<h3>FedSAM alpha=0.1, round 10, euclidean random plane" in html.unescape(text)
    settings = re.findall(r'<span class="settings">([^<]*)</span>', text)
    assert len(settings) == 2 and all("normalization=euclidean" in line for line in settings), settings


def test_one_round_is_one_tick_and_subplot_titles_leave_the_title_room():
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=3, subplot_titles=["S<sub>ρ</sub><br>[starts=1]", "λ<sub>1</sub>", "a few"])
    fig.add_trace(go.Scatter(x=[10, 20, 30], y=[1, 2, 3]), row=1, col=1)
    fig.add_trace(go.Scatter(x=[30], y=[4]), row=1, col=2)
    fig.add_trace(go.Scatter(x=[2, 3, 5], y=[4, 5, 6]), row=1, col=3)
    layout = report_plotly.figure_layout(fig, "Global sharpness at the analysed rounds").layout
    assert list(layout.xaxis2.tickvals) == [30] and list(layout.xaxis2.range) == [29, 31]
    assert layout.xaxis.tickformat == "d" and layout.xaxis.dtick is None and layout.xaxis.tickvals is None
    assert layout.xaxis3.tickformat == "d" and layout.xaxis3.dtick == 1
    assert layout.title.yref == "container" and layout.title.yanchor == "top"
    assert layout.margin.t >= 16 + 22 * (1 + 2)  # the title's line and the subplot titles' two

    single = report_plotly.figure_layout(go.Figure(go.Scatter(x=[7, 7], y=[1, 2])), "one round").layout
    assert list(single.xaxis.tickvals) == [7]


def test_every_table_scrolls_inside_its_box_and_each_recipe_value_is_printed_once(sam_runs):
    text = report.build_report(sam_runs)
    tables = re.findall(r"(.{0,40})<table", text)
    assert tables and all(before.endswith('<div class="scroll">') for before in tables), tables
    assert re.search(r"\.scroll \{ overflow-x: auto; max-width: 100%;", text)
    # the partition both recipes share: once, in the shared table; each run's own table its algorithm alone
    assert text.count("[partition]") == 1 and text.count('<h3 id="recipe-shared">') == 1
    assert text.count('<table class="recipe">') == 3 and text.count("[algorithm]") == 2
    shared = text[text.index('<h3 id="recipe-shared">'):text.index('<h3 id="run-')]
    assert "&#34;dirichlet&#34;" in shared and "fedsam" not in shared
    own = text[text.index('<h3 id="run-fedsam">'):]
    assert '<td class="text">&#34;fedsam&#34;</td>' in own and "[partition]" not in own


def test_compare_draws_loss_contours_on_log_spaced_levels_and_readable_ticks(sam_runs, tmp_path, monkeypatch):
    from landscape.figures.compare import compare

    drawn = []
    panels_figure = surfaces.panels_figure

    def spy(*args, **kwargs):
        fig, panels = panels_figure(*args, **kwargs)
        drawn.append((kwargs["kind"], fig, panels))
        return fig, panels

    monkeypatch.setattr(surfaces, "panels_figure", spy)
    monkeypatch.setattr(surfaces, "save_figure", lambda fig, out: out)
    compare(sam_runs, tmp_path / "cmp")
    kinds = {kind: (fig, panels) for kind, fig, panels in drawn}
    fig, panels = kinds["contour"]
    levels = panels[0].levels
    assert np.allclose(levels[1:] / levels[:-1], levels[1] / levels[0])  # geometric: equal ratios
    (bar,) = [ax for ax in fig.axes if ax.get_label() == "<colorbar>"]
    assert bar.get_yscale() == "log"  # the colour bar of a LogNorm
    assert overlapping_x_ticks(fig) == []
    assert all(len(ax.get_xticks()) <= 7 for ax in fig.axes if ax.get_label() != "<colorbar>")
    _, panels3d = kinds["3d"]  # the 3D panels keep a linear z and colour scale (as figures/fednsam-fig1)
    steps = np.diff(panels3d[0].levels)
    assert np.allclose(steps, steps[0])
