"""The self-contained HTML report (landscape.figures.report.build): one plotly.js copy, every plot, no addresses."""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import plotly.offline
import pytest
import torch
from markupsafe import escape
from support.helpers import result_file, shared_folder, tiny_recipe

from landscape.analyze.catalog import pass_options
from landscape.analyze.scheduler import run_analysis
from landscape.analyze.settings import AnalysisSettings
from landscape.figures.report import build as report
from landscape.figures.report import surfaces as report_surfaces
from landscape.train import loop

FAST = {"hessian": {"top_k": 2, "tol": 0.01, "clients": 2, "trace_hvps": 6, "density_steps": 4, "density_runs": 1},
        "sharpness": {"clients": 2, "steps": 2}, "incompatibility": {"clients": 2, "batches": 2},
        "alignment": {"clients": 2, "batches": 2}, "loss": {}}
ANALYSIS_PLOTS = {"global_sharpness", "spectral_density", "incompatibility", "gradient_cosine"}
CURVE_PLOTS = {"accuracy", "train_loss", "flatness_distance"}


def _analysed_run(folder: Path) -> None:
    """A tiny FedAvg run, ``folder/run``, analysed at rounds 2 and 3 by every pass the report shows."""
    path = folder / "run"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: one thread is several times faster on a busy machine
    try:
        loop.start_run(tiny_recipe(train__keep_clients=True, train__rounds=3, model__name="mlp", model__hidden=[16]),
                       path, progress=False)
        options = {name: pass_options(name, values) for name, values in FAST.items()}
        options["flatness"] = None
        run_analysis(path, rounds="2,3", passes=[*FAST, "flatness"], options=options,
                     settings=AnalysisSettings(device="cpu", analysis_samples=100), progress=False)
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """The analysed FedAvg run (``_analysed_run``), made once per test session for this file and the browser
    test's; read-only (a test that writes copies it)."""
    return shared_folder(tmp_path_factory, "report-run", _analysed_run) / "run"


@pytest.fixture(scope="module")
def page(run, tmp_path_factory) -> str:
    out = report.write_report([run], tmp_path_factory.mktemp("html") / "report.html")
    return out.read_text()


class Tags(HTMLParser):
    """Every start tag with its attributes; the text of each <script>."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.scripts: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if tag == "script":
            self._in_script = True
            self.scripts.append("")

    def handle_endtag(self, tag):
        if tag == "script":
            self._in_script = False

    def handle_data(self, data):
        if self._in_script:
            self.scripts[-1] += data


def parse(text: str) -> Tags:
    tags = Tags()
    tags.feed(text)
    return tags


def plot_divs(text: str) -> dict[str, str]:
    """data-name -> id of every plot div."""
    return {a["data-name"]: a["id"] for tag, a in parse(text).tags if tag == "div" and "plot" in a.get("class", "")}


def plot_spec(text: str, name: str) -> dict:
    match = re.search(rf'Plotly\.newPlot\("plot-{name}", spec\.data', text)
    assert match, name
    start = text.rindex("var spec = ", 0, match.start()) + len("var spec = ")
    return json.loads(text[start:match.start()].rstrip().rstrip(";"))


def decode(values) -> np.ndarray:
    """A plotly JSON array: a plain list, or a typed array {"dtype", "bdata"} (base64)."""
    if isinstance(values, dict):
        flat = np.frombuffer(base64.b64decode(values["bdata"]), dtype=np.dtype(values["dtype"]))
        return flat.reshape([int(n) for n in values["shape"].split(",")]) if "shape" in values else flat
    return np.asarray(values)


def test_plotly_js_is_inline_exactly_once(page):
    library = plotly.offline.get_plotlyjs()
    assert page.count(library) == 1
    assert page.count(library[:200]) == 1
    assert page.index(library) < page.index('class="plot"')  # loaded before the first newPlot call


def test_every_expected_plot_has_a_div_and_a_newplot_call(page):
    divs = plot_divs(page)
    assert set(divs) == CURVE_PLOTS | ANALYSIS_PLOTS
    for name, div_id in divs.items():
        assert div_id == f"plot-{name}"
        assert page.count(f'Plotly.newPlot("{div_id}"') == 1
    ids = [a["id"] for _, a in parse(page).tags if "id" in a]
    assert len(ids) == len(set(ids))


def test_nothing_points_outside_the_page(page):
    tags = parse(page).tags
    addresses = [a[k] for _, a in tags for k in ("src", "href", "data", "action") if a.get(k)]
    assert addresses and all(v.startswith("#") for v in addresses), addresses
    assert not [t for t, a in tags if t in ("link", "iframe", "img", "object", "embed")]
    assert all("src" not in a for t, a in tags if t == "script")
    for tag, attrs in tags:
        for key, value in attrs.items():
            assert "http://" not in (value or "") and "https://" not in (value or ""), (tag, key, value)


def test_the_recipe_and_the_analysis_numbers_are_shown(page, run):
    assert '<table class="recipe">' in page
    assert "[algorithm]" in page and "[train]" in page
    assert re.search(r"<th class=\"text\">local_steps</th><td class=\"text\">2</td>", page)
    assert '<th class="text">name</th><td class="text">&#34;fedavg&#34;</td>' in page  # autoescaped by jinja2
    hessian = json.loads(result_file(run / "analysis/round-0003", "hessian").read_text())
    assert f"<td>{hessian['summary']['lambda_max']:.4g}</td>" in page
    alignment = json.loads(result_file(run / "analysis/round-0003", "alignment").read_text())
    assert f"<td>{alignment['summary']['mean_grad_cos']:.4g}</td>" in page
    incompatibility = json.loads(result_file(run / "analysis/round-0003", "incompatibility").read_text())
    assert f"<td>{incompatibility['summary']['Delta_FI']:.4g} <span class=\"v\">&plusmn;" in page
    last = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()][-1]
    assert f"<td>{100 * last['test_acc']:.4g}</td>" in page
    assert 'class="comparison"' in page and 'class="analysis"' in page


def test_plot_data_are_the_files_numbers(page, run):
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    (trace,) = plot_spec(page, "accuracy")["data"]
    np.testing.assert_array_equal(decode(trace["x"]), [r["round"] for r in rows])
    np.testing.assert_allclose(decode(trace["y"]), [100 * r["test_acc"] for r in rows])
    heatmap = plot_spec(page, "gradient_cosine")
    cosines = json.loads(result_file(run / "analysis/round-0003", "alignment").read_text())["result"]["gradients"]
    np.testing.assert_allclose(decode(heatmap["data"][0]["z"]), cosines["cosine_matrix"])
    assert heatmap["layout"]["coloraxis"]["cmin"] == -1 and heatmap["layout"]["coloraxis"]["cmax"] == 1
    sharp = plot_spec(page, "global_sharpness")["data"]
    np.testing.assert_array_equal(decode(sharp[0]["x"]), [2, 3])


def test_no_mathjax_markup(page):
    """plotly hands '$...$' to MathJax, which the page does not (and must not) load."""
    for tag_script in parse(page).scripts:
        if "Plotly.newPlot" in tag_script and len(tag_script) < 1_000_000:
            assert "$" not in tag_script


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_the_plot_scripts_run(page, tmp_path):
    """Each page script runs against a stand-in Plotly and calls newPlot on an existing div."""
    scripts = [s for s in parse(page).scripts if "Plotly.newPlot" in s and len(s) < 1_000_000]
    harness = ("const calls = []; globalThis.Plotly = {newPlot: (id, data, layout, config) => "
               "calls.push({id, traces: data.length, layout: typeof layout})};\n" + "\n".join(scripts)
               + "\nconsole.log(JSON.stringify(calls));\n")
    (tmp_path / "harness.js").write_text(harness)
    done = subprocess.run(["node", str(tmp_path / "harness.js")], check=False, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    calls = json.loads(done.stdout)
    assert {c["id"] for c in calls} == set(plot_divs(page).values())
    assert all(c["traces"] > 0 and c["layout"] == "object" for c in calls)


def test_surfaces_are_embedded_when_their_files_exist(run, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    folder = copy / "analysis" / "round-0003"
    x, y = np.linspace(-1, 1, 5), np.linspace(-1, 1, 4)
    np.savez(folder / "surface.npz", x_coords=x, y_coords=y, loss=np.add.outer(x**2, 2 * y**2) + 1.0)
    np.savez(folder / "surface-interpolate.npz", x_coords=x, loss=x**2 + 1.0)
    text = report.write_report(copy, tmp_path / "report.html").read_text()
    divs = plot_divs(text)
    assert "surface-run-round-3-surface-interpolate" in divs  # 1D: drawn here as a line
    line = plot_spec(text, "surface-run-round-3-surface-interpolate")["data"][0]
    np.testing.assert_allclose(decode(line["y"]), x**2 + 1.0)
    if report_surfaces.surface_renderer() is not None:
        assert "surface-run-round-3-surface" in divs
        assert plot_spec(text, "surface-run-round-3-surface")["data"][0]["type"] == "surface"
    else:
        assert "no surface renderer available" in text
    assert text.count(plotly.offline.get_plotlyjs()[:200]) == 1
    assert '<a href="#surfaces">' in text


def test_a_script_in_a_run_name_a_recipe_or_the_title_is_escaped(run, tmp_path):
    """Every value reaches the page autoescaped (the templates) or with each '<' escaped (plotly's JSON): a
    run directory named ``<script>...``, a recipe value that closes the script element and a title open no
    element."""
    named = tmp_path / "<script>alert(1)"  # a directory name holds no '/', so no closing tag
    shutil.copytree(run, named)
    closing = "</script><script>alert(2)</script>"
    recipe = (named / "recipe.toml").read_text()
    assert recipe.startswith('name = ""\n')
    (named / "recipe.toml").write_text(f'name = "{closing}"\n' + recipe.split("\n", 1)[1])
    text = report.write_report([run, named], tmp_path / "report.html", title="<script>alert(3)</script>").read_text()
    parsed = parse(text)
    assert [tag for tag, _ in parsed.tags].count("script") == 1 + len(plot_divs(text))  # plotly.js, one per plot
    assert all("Plotly.newPlot" in script for script in parsed.scripts[1:])
    assert "<script>alert" not in text and "</script><script>" not in text
    assert f"<title>{escape('<script>alert(3)</script>')}</title>" in text
    assert f'<td class="text">{escape(repr(closing))}</td>' in text  # the recipe table
    assert f"<br><small>{escape(named.name)}</small>" in text  # the directory in the comparison table
    assert f"<small>({escape(str(named))})</small></h3>" in text
    label = "FedAvg alpha=0.5 (<script>alert(1))"  # the directory name tells the two runs apart
    assert f"</span>{escape(label)}<br>" in text  # its swatch in the comparison table
    assert label in [trace["name"] for trace in plot_spec(text, "accuracy")["data"]]  # plotly's JSON ...
    assert "(\\u003cscript" in text  # ... where '<' is written \u003c inside <script>


def test_a_run_without_analysis_still_reports(run, tmp_path):
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("recipe.toml", "metrics.jsonl"):
        shutil.copy(run / name, bare / name)
    text = report.write_report([run, bare], tmp_path / "report.html").read_text()
    assert set(plot_divs(text)) == CURVE_PLOTS | ANALYSIS_PLOTS
    assert f"no analysis yet; run `landscape analyze {bare}`" in text
    assert "FedAvg alpha=0.5 (run)" in text and "FedAvg alpha=0.5 (bare)" in text
    only_bare = report.write_report(bare, tmp_path / "bare.html").read_text()
    assert set(plot_divs(only_bare)) == CURVE_PLOTS


# -- a page a reader can use: one-round panels, titles without settings, captions without file names -----------

FILE_NAME = re.compile(r"[\w@~+-]+\.(?:npz|json|jsonl|pt|png|pdf|html|toml|csv)\b|/")


def captions(text: str) -> list[str]:
    """The visible text of every figure caption on the page."""
    return [re.sub(r"<[^>]*>", " ", found) for found in re.findall(r"<figcaption>(.*?)</figcaption>", text, re.S)]


def titles(spec: dict) -> list[str]:
    """A plot's title and its subplot titles."""
    layout = spec["layout"]
    return [layout["title"]["text"]] + [a["text"] for a in layout.get("annotations", ()) if a.get("yanchor") == "bottom"]


def test_titles_carry_no_settings_the_line_below_the_figure_does(page):
    """The fixture's passes ran with options other than the defaults (FAST): the settings are said once, in the
    settings line under each analysis figure, and no title carries them."""
    settings = re.findall(r'<span class="settings">([^<]*)</span>', page)
    assert len(settings) == len(ANALYSIS_PLOTS)
    assert any("top_k=2" in line for line in settings) and any("batches=2" in line for line in settings)
    items = {item for line in settings for item in re.findall(r"\w+=[\w.:-]+", line)}
    assert {"analysis_samples=100", "top_k=2", "clients=2"} <= items
    for name in CURVE_PLOTS | ANALYSIS_PLOTS:
        for title in titles(plot_spec(page, name)):
            assert not [item for item in items if item in title] and "[" not in title, (name, title)


def test_captions_say_what_a_figure_shows_never_a_file_name(run, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    x = np.linspace(-1, 1, 5)
    np.savez(copy / "analysis" / "round-0003" / "surface.npz", x_coords=x, y_coords=x, loss=np.add.outer(x**2, x**2))
    text = report.write_report(copy, tmp_path / "report.html").read_text()
    found = captions(text)
    assert len(found) == len(plot_divs(text)) >= len(CURVE_PLOTS | ANALYSIS_PLOTS)
    assert all(caption.strip() and not FILE_NAME.search(caption) for caption in found), found


def test_one_round_panels_are_charts_by_run_at_that_round(run, tmp_path):
    """Runs analysed at one round: global sharpness and incompatibility are a dot / bars per run "at round 3",
    never a line of one point over rounds."""
    copies = []
    for name in ("a", "b"):
        shutil.copytree(run, tmp_path / name)
        shutil.rmtree(tmp_path / name / "analysis" / "round-0002")
        copies.append(tmp_path / name)
    text = report.write_report(copies, tmp_path / "report.html").read_text()
    labels = ["FedAvg alpha=0.5 (a)", "FedAvg alpha=0.5 (b)"]
    hessian = json.loads(result_file(run / "analysis/round-0003", "hessian").read_text())["summary"]["lambda_max"]
    sharp = plot_spec(text, "global_sharpness")
    assert all(sharp["layout"][axis]["type"] == "category" for axis in ("xaxis", "xaxis2"))
    assert [t.replace("<br>", " ") for t in titles(sharp)[1:]] == ["S<sub>ρ</sub>(x<sup>t</sup>), ρ = 0.05, at round 3",
                                                                   "λ<sub>1</sub>(x<sup>t</sup>), at round 3"]
    lam = [t for t in sharp["data"] if t.get("xaxis") == "x2"]
    assert [t["x"][0].replace("<br>", " ") for t in lam] == labels and all(t["mode"] == "markers" for t in sharp["data"])
    np.testing.assert_allclose([decode(t["y"])[0] for t in lam], [hessian, hessian], rtol=1e-6)
    assert "analysed rounds" not in sharp["layout"]["title"]["text"]
    fi = plot_spec(text, "incompatibility")
    assert [t["type"] for t in fi["data"]] == ["bar"] * 4 and fi["layout"]["barmode"] == "group"
    assert all([x.replace("<br>", " ") for x in t["x"]] == labels for t in fi["data"])
    assert fi["layout"]["xaxis"]["type"] == "category" and "at round 3" in fi["layout"]["title"]["text"]
    delta = json.loads(result_file(run / "analysis/round-0003", "incompatibility").read_text())["result"]
    np.testing.assert_allclose(decode(fi["data"][0]["y"]), [delta["incompatibility"]] * 2, rtol=1e-6)
    np.testing.assert_allclose(decode(fi["data"][0]["error_y"]["array"]), [delta["incompatibility_se"]] * 2,
                               rtol=1e-6)
    # the same runs with two analysed rounds: over rounds, as lines
    over = plot_spec(report.write_report([run], tmp_path / "two.html").read_text(), "global_sharpness")
    assert over["layout"]["xaxis"].get("type") != "category"
    assert all(t["mode"] == "lines+markers" for t in over["data"])


def test_a_value_without_a_number_says_why_and_a_zero_error_is_not_plus_minus_zero(run, tmp_path):
    """FedAvg applies no perturbation: its 'Delta_FI applied' is NaN in the result, shown as n/a with the pass's
    reason; a Monte-Carlo standard error of exactly 0 (every draw gave the value: a rate of 0 pairs) is said so,
    never '± 0'."""
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    path = result_file(copy / "analysis" / "round-0003", "incompatibility")
    record = json.loads(path.read_text())
    record["result"].update(friendly_rate=0.0, friendly_rate_se=0.0, applied_incompatibility=float("nan"),
                            applied_note="fedavg applies no perturbation")
    path.write_text(json.dumps(record))
    text = report.write_report(copy, tmp_path / "report.html").read_text()
    comparison = text[text.index('<table class="comparison">'):text.index("</table>")]
    assert 'n/a <small class="why">(fedavg applies no perturbation)</small>' in comparison
    assert re.search(r'<td>0 <small class="why" title="the Monte-Carlo standard error is 0[^"]*">\(every draw the '
                     r'same\)</small></td>', comparison)
    assert "nan" not in comparison.lower().replace("fednsam", "") and "&plusmn; 0<" not in text


@pytest.mark.parametrize("value, se, per_seed, shown", [
    (0.25, 0.0, [0.25], "0.25 (every draw the same)"),  # one run: the pass's Monte-Carlo error of 0
    (0.25, 0.0, [0.25, 0.25], "0.25 (every seed the same)"),  # a group: every seed gave it
    (float("nan"), None, [float("nan")], "n/a"),
    (0.25, 0.015, [0.25], "0.25 +- 0.015"),
])
def test_compare_prints_no_plus_minus_zero_and_no_nan(value, se, per_seed, shown):
    """`landscape compare`'s printed table says what the report says: NaN is n/a, an error of 0 what it means."""
    from landscape.figures.compare import _cell
    from landscape.figures.report.data import SeedStat

    assert SeedStat(value, se, len(per_seed), per_seed).text() == shown
    if len(per_seed) == 1:
        assert _cell(value, se) == shown
