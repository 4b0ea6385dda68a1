"""Figure polish: readable colour-bar and z-axis ticks, the report's 3D surfaces on one colour scale, and the
`landscape analyze` summary table within 120 columns, naming the accuracy it shows."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from support.helpers import tiny_recipe

from landscape.analyze.settings import AnalysisSettings
from landscape.analyze.summary import SUMMARY_WIDTH, AnalysisReport, analysis_data, format_summary
from landscape.config.recipe import to_toml
from landscape.core.errors import LandscapeError
from landscape.figures.report import build as report
from landscape.figures.report import surfaces as report_surfaces
from landscape.figures.surface import data as surface_data
from landscape.figures.surface import draw as surfaces
from landscape.figures.surface import scale as surface_scale

# -- ticks ------------------------------------------------------------------------------------------------


def _surface(low: float, high: float, *, log: bool = False) -> surface_data.SurfaceData:
    """A bowl whose values run from ``low`` (centre) to ``high`` (a corner), geometrically when ``log``."""
    x = np.linspace(-1.0, 1.0, 11)
    bowl = np.add.outer(x**2, 0.5 * x**2)
    t = bowl / bowl.max()
    values = low * (high / low) ** t if log else low + (high - low) * t
    return surface_data.SurfaceData.from_arrays(x, values, x, accuracy=0.9 - 0.5 * t, run="bowl")


def _number(text: str) -> tuple[float, str]:
    """(value, mantissa digits) of a tick label as matplotlib draws it: 0.002, $\\mathdefault{2.5}$, 10^{-4},
    3\\times10^{-5}, or an offset text such as \\times10^{-3} (value 1e-3) or \\times10^{-3}+10^{2}."""
    text = text.replace("$", "").replace("\\mathdefault", "").replace("{", "").replace("}", "")
    text = text.replace("\u2212", "-").strip()
    if not text:
        return 1.0, ""
    mantissa, _, power = text.partition("\\times")
    if not power and mantissa.startswith("10^"):
        mantissa, power = "1", mantissa
    power = power.partition("+")[0]
    value = float(mantissa or 1) * (10.0 ** float(power.removeprefix("10^")) if power else 1.0)
    return value, mantissa


def _significant(mantissa: str) -> int:
    digits = mantissa.lstrip("-").replace(".", "").lstrip("0")
    return len(digits.rstrip("0")) if "." not in mantissa else len(digits)


def _bar_labels(fig) -> tuple[list[str], np.ndarray, str]:
    """The colour bar's drawn tick labels, their positions and its offset (x10^k) text."""
    FigureCanvasAgg(fig)
    fig.canvas.draw()
    (bar,) = [ax for ax in fig.axes if ax.get_label() == "<colorbar>"]
    low, high = sorted(bar.yaxis.get_view_interval())
    drawn = [(t.get_position()[1], t.get_text()) for t in bar.yaxis.get_ticklabels()]
    drawn = [(loc, text) for loc, text in drawn if text and low <= loc <= high]
    return [text for _, text in drawn], np.array([loc for loc, _ in drawn]), bar.yaxis.get_offset_text().get_text()


@pytest.mark.parametrize(("low", "high", "log"), [(0.0012, 0.0097, False), (0.3, 9.7, False), (1e-4, 1e2, True),
                                                  (0.31, 0.93, True), (2.3e5, 9.1e5, False)])
@pytest.mark.parametrize("kind", ["contour", "3d"])
def test_colour_bar_ticks_are_few_round_distinct_and_say_their_values(low, high, log, kind):
    fig, _ = surfaces.panels_figure([_surface(low, high, log=log)], kind=kind, log_levels=log)
    labels, locs, offset = _bar_labels(fig)
    assert 3 <= len(labels) <= 7, labels
    assert len(set(labels)) == len(labels)
    assert np.all((locs >= low * (1 - 1e-9)) & (locs <= high * (1 + 1e-9)))
    scale, _ = _number(offset.partition("+")[0])
    shift = _number("10^" + offset.partition("+10^")[2])[0] if "+10^" in offset else 0.0
    for label, loc in zip(labels, locs):
        value, mantissa = _number(label)
        assert _significant(mantissa) <= 2, (label, labels)
        # the label says the value the tick sits at
        assert value * scale + shift == pytest.approx(loc, rel=1e-9), (label, offset, loc)
    if log:
        assert not offset
    if (low, high) == (1e-4, 1e2):  # every other power of ten
        assert [_number(label)[0] for label in labels] == pytest.approx([1e-4, 1e-2, 1.0, 1e2])


def test_accuracy_colour_bar_and_z_axis_ticks():
    fig, _ = surfaces.panels_figure([_surface(0.5, 2.0)], kind="3d", quantity="accuracy")
    labels, locs, offset = _bar_labels(fig)
    assert offset == "" and [_number(label)[0] for label in labels] == pytest.approx(locs)
    assert all(_significant(_number(label)[1]) == 1 for label in labels)  # 0.5, 0.6, ... or 0.4, 0.6, 0.8
    ax = next(ax for ax in fig.axes if hasattr(ax, "zaxis"))
    zlabels = [t.get_text() for t in ax.zaxis.get_ticklabels() if t.get_text()]
    assert zlabels and all(_significant(_number(z)[1]) <= 2 for z in zlabels)
    assert len(set(zlabels)) == len(zlabels)


def test_nice_ticks_on_log_scales_and_bad_ranges():
    assert surface_scale.nice_ticks(1e-9, 1e9, log=True).tolist() == pytest.approx(
        [1e-8, 1e-4, 1.0, 1e4, 1e8])
    assert surface_scale.nice_ticks(0.5, 20, log=True).tolist() == pytest.approx([0.5, 1, 2, 5, 10, 20])
    labels = surface_scale._log_labels(surface_scale.nice_ticks(2e3, 9e4, log=True))
    assert all("times10" in label or "10^" in label for label in labels)  # not 2000 beside 1 x 10^4
    with pytest.raises(LandscapeError, match="cannot place ticks"):
        surface_scale.nice_ticks(0.0, 1.0, log=True)
    with pytest.raises(LandscapeError, match="cannot place ticks"):
        surface_scale.nice_ticks(1.0, 1.0)


# -- the report's surfaces ----------------------------------------------------------------------------------


def _run_dir(path, seed: int):
    path.mkdir(parents=True)
    (path / "recipe.toml").write_text(to_toml(tiny_recipe(seed=seed)))
    (path / "metrics.jsonl").write_text(json.dumps({"round": 3, "test_acc": 0.5, "train_loss": 1.0}) + "\n")
    (path / "checkpoints").mkdir()
    (path / "checkpoints" / "round-0003.pt").write_bytes(b"")  # results are read only where their checkpoint is
    folder = path / "analysis" / "round-0003"
    folder.mkdir(parents=True)
    return folder


def _spec(text: str, name: str) -> dict:
    match = re.search(rf'Plotly\.newPlot\("plot-{re.escape(name)}"', text)
    assert match, name
    start = text.rindex("var spec = ", 0, match.start()) + len("var spec = ")
    return json.loads(text[start:text.rindex(";", start, match.start())])


def test_report_surfaces_of_two_runs_share_one_colour_scale_and_z_range(tmp_path):
    x = np.linspace(-1.0, 1.0, 5)
    bowl = np.add.outer(x**2, 2 * x**2)
    for name, seed, offset in (("a", 0, 1.0), ("b", 1, 3.0)):
        folder = _run_dir(tmp_path / name, seed)
        np.savez(folder / "surface.npz", x_coords=x, y_coords=x, loss=bowl + offset)
    folder = tmp_path / "b" / "analysis" / "round-0003"
    np.savez(folder / "surface-clients.npz", x_coords=x, y_coords=x, loss=10 * bowl + 20)
    record = {"pass": "surface", "round": 3, "settings": {}, "run": "b",
              "result": {"directions": "clients", "clients": [1, 2], "quantity": "training loss of client 3 (F_3)"}}
    (folder / "surface-clients.json").write_text(json.dumps(record))
    np.savez(folder / "surface-interpolate.npz", x_coords=x, loss=x**2)
    if report_surfaces.surface_renderer() is None:
        pytest.skip("no surface renderer")
    text = report.build_report([tmp_path / "a", tmp_path / "b"])
    a, b = _spec(text, "surface-a-round-3-surface"), _spec(text, "surface-b-round-3-surface")
    low, high = 1.0, float((bowl + 3.0).max())
    for spec in (a, b):
        axis = spec["layout"]["coloraxis"]
        assert (axis["cmin"], axis["cmax"]) == pytest.approx((low, high))
        assert spec["layout"]["scene"]["zaxis"]["range"] == pytest.approx([low, high])
        assert spec["data"][0]["type"] == "surface" and spec["data"][0]["coloraxis"] == "coloraxis"
    other = _spec(text, "surface-b-round-3-surface-clients")["layout"]
    own = (20.0, float((10 * bowl + 20).max()))
    assert (other["coloraxis"]["cmin"], other["coloraxis"]["cmax"]) == pytest.approx(own)
    assert "on its own scale: the only surface of training loss of client 3 (F_3)" in text
    assert "surfaces of different quantities are on separate scales" in text
    assert "a 1D line, drawn as a curve on its own axis" in text


def test_surface_limits_must_be_an_ordered_finite_pair():
    with pytest.raises(LandscapeError, match="low < high"):
        surfaces.surface_figure([_surface(1.0, 2.0)], limits=(2.0, 1.0))


# -- the analyze summary -----------------------------------------------------------------------------------


def _parse_blocks(text: str) -> dict[tuple[str, str], dict[str, str]]:
    """{(run cell, round): {column: cell}} read back from every block of the table."""
    table = text.split("\n\n")
    cells: dict[tuple[str, str], dict[str, str]] = {}
    for block in table:
        lines = block.splitlines()
        if len(lines) < 3 or not lines[0].startswith("run "):
            continue
        header = re.split(r"\s{2,}", lines[0])
        for line in lines[2:]:
            values = re.split(r"\s{2,}", line)
            assert len(values) == len(header), line
            cells.setdefault((values[0], values[1]), {}).update(zip(header[2:], values[2:]))
    return cells


def test_summary_fits_in_120_columns_with_many_passes_and_long_names():
    names = ["cifar100-fednsam-dir0.1-resnet18-gn-c100-s0-rounds1000-lr0.1-local5", "digits-fedsam-s1"]
    keys = ["lambda_max", "lambda_ratio", "trace", "client_lambda_max_mean", "S_rho(0.01)", "S_rho(0.05)",
            "S_rho(0.1)", "S_rho(0.2)", "local_gap", "Delta_D", "Delta_FI", "heterogeneity_share",
            "mean_grad_cos", "mean_minibatch_cos", "loss", "acc", "surface_centre_loss", "surface_max_loss",
            "a_much_longer_summary_key_than_usual_for_a_column"]
    rows = [{"run": name, "round": r, **{k: (-1.234567e-5 * (i + 1) * (r + 1)) for i, k in enumerate(keys)}}
            for name in names for r in (10, 200)]
    rows[1]["trace"] = None
    settings = {f"surface@analysis_samples-1000_data-client~{k}_grid-51_span-auto": "analysis_samples=1000, "
                f"data=client:{k}, grid=51, span=auto, and a long tail of further settings to wrap" for k in range(3)}
    out = format_summary(AnalysisReport(rows=rows, settings=settings, data=analysis_data(
        AnalysisSettings(split="test", analysis_samples=1000))))
    widest = max(len(line) for line in out.splitlines())
    assert widest <= SUMMARY_WIDTH, out
    cells = _parse_blocks(out)
    assert len(cells) == 4
    for k, name in enumerate(names):  # numbered, and written out in full under the table
        assert f"[{k + 1}] {name}" in out.splitlines()
        for r in (10, 200):
            row = next(row for row in rows if row["run"] == name and row["round"] == r)
            expected = {key: "-" if row[key] is None else f"{row[key]:.4g}" for key in keys}
            assert cells[(f"[{k + 1}]", str(r))] == expected
    text = " ".join(out.split())
    assert "acc: accuracy of the checkpoint x on the test set, a seeded subset of 1000 samples, from the loss pass" \
        in text
    assert "not the test accuracy training logged (metrics.jsonl 'test_acc')" in text
    for name, value in settings.items():
        assert f"{name}: {value}" in text


def test_summary_with_short_names_keeps_them_in_one_block():
    rows = [{"run": "run", "round": 3, "loss": 1.956, "acc": 0.45}]
    out = format_summary(AnalysisReport(rows=rows))
    lines = out.splitlines()
    assert lines[0].split() == ["run", "round", "loss", "acc"] and lines[2].split() == ["run", "3", "1.956", "0.45"]
    assert "acc: accuracy of the checkpoint x on the analysis data" in " ".join(out.split())
    assert format_summary(AnalysisReport()) == "nothing analysed"
