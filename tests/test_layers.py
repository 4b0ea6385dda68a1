"""The layers of the package (docs/architecture.md): the import-linter contracts of pyproject.toml hold, the
document's module list is current, the module graph has no import cycles, analysing a run loads nothing of
training, and drawing figures from stored results loads no pass function, model or data set: of the analysis
only the result files and the passes' declarations."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from support.helpers import analyze_args, invoke, load_script, tiny_recipe

ROOT = Path(__file__).resolve().parents[1]


def test_the_import_contracts_hold(capsys):
    from importlinter.cli import lint_imports

    code = lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_cache=True, no_logo=True)
    assert code == 0, capsys.readouterr().out[-4000:]


def test_the_module_list_of_the_architecture_document_is_current():
    tool = load_script("tools/module_list.py")
    assert tool.documented() == tool.module_list(), "run: python tools/module_list.py --write"


def _import_graph() -> dict[str, set[str]]:
    package = ROOT / "landscape"
    modules = {}
    for path in package.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):  # function-level imports count too
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("landscape"):
                for alias in node.names:
                    target = f"{node.module}.{alias.name}"
                    graph[name].add(target if target in modules else node.module)
            elif isinstance(node, ast.Import):
                graph[name].update(a.name for a in node.names if a.name in modules)
        graph[name].discard(name)
    return graph


def test_no_import_cycles():
    graph = _import_graph()
    seen: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:  # depth-first; a grey node met again is a cycle
        seen[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if seen.get(nxt) == 1 and nxt != "landscape":
                raise AssertionError(f"import cycle: {' -> '.join(path[path.index(nxt):] + [nxt])}")
            if nxt not in seen:
                visit(nxt, path + [nxt])
        seen[node] = 2

    for start in sorted(graph):
        if start not in seen:
            visit(start, [start])


def _loaded_modules(code: str) -> list[str]:
    """The modules of the package (and torch) that a fresh interpreter holds after running ``code``."""
    code = textwrap.dedent(code) + textwrap.dedent('''
        import json, os, sys
        print(json.dumps(sorted(m for m in sys.modules if m.startswith("landscape") or m == "torch")), flush=True)
        os._exit(0)  # printed: the interpreter's teardown (a second with torch loaded) tells nothing
    ''')
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT,
                          check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_analysing_a_run_loads_no_training_module(tmp_path):
    from landscape.train import loop

    loop.start_run(tiny_recipe(model__name="mlp", train__rounds=1), tmp_path / "run", progress=False)
    loaded = _loaded_modules(f'''
        from pathlib import Path
        from landscape.analyze.catalog import pass_options
        from landscape.analyze.settings import AnalysisSettings
        from landscape.analyze.scheduler import run_analysis
        import landscape
        run_analysis(Path({str(tmp_path / "run")!r}), passes=["loss"],
                     settings=AnalysisSettings(device="cpu"), options={{"loss": pass_options("loss", {{}})}},
                     progress=False)
        landscape.open_run({str(tmp_path / "run")!r}).model()
    ''')
    assert [m for m in loaded if m.startswith("landscape.train")] == []


@pytest.fixture(scope="module")
def analysed_runs(tmp_path_factory) -> Path:
    """A folder of two two-round runs (seeds 0 and 1) with the loss, (cheap) sharpness and hessian results of
    every checkpoint, on the test split."""
    from landscape.train import loop

    folder = tmp_path_factory.mktemp("layers") / "runs"
    for seed in (0, 1):
        out = folder / f"seed{seed}"
        loop.start_run(tiny_recipe(model__name="mlp", train__rounds=2, seed=seed), out, progress=False)
        result = invoke(*analyze_args(out, "--checkpoints", "all", "--passes", "loss,sharpness,hessian",
                                      "--split", "test", "--set", "sharpness.rhos=[0.05]",
                                      "--set", "sharpness.steps=2", "--set", "sharpness.starts=1",
                                      "--set", "sharpness.adaptive=false", "--set", "hessian.top_k=1",
                                      "--set", "hessian.trace_hvps=6", "--set", "hessian.density_runs=1",
                                      "--set", "hessian.density_steps=2", "--set", "hessian.clients=-1"))
        assert result.exit_code == 0, result.output
    return folder


# What reading stored results may load of the analysis: the passes' registry and the analysis settings (the
# names and defaults results are named against; the result files themselves are landscape.store.results, and
# torch comes with landscape.store.run, the read model of a run, and store.results.serial; neither builds a
# model or reads a data set), and the pass modules, for the names their results are labelled by (each pass's
# options, needs and summary quantities; the surface options check their grid with the grid's parsers, numpy
# only). A pass imports its computation inside its function, so none of that is loaded.
RESULT_FILES = {"landscape.analyze", "landscape.analyze.registry", "landscape.analyze.settings"}
PASS_MODULES = "landscape.analyze.passes"
GRID_PARSERS = "landscape.measure.surface.grid"
GRID_PACKAGES = {"landscape.measure", "landscape.measure.surface"}  # docstrings only: the grid parsers' parents


def _heavy(modules: list[str]) -> set[str]:
    """The analysis and measurement (beyond the result files, the pass modules and the grid parsers), model, data
    set and training modules among ``modules``."""
    light = RESULT_FILES | {GRID_PARSERS} | GRID_PACKAGES
    return {m for m in modules if (m.startswith(("landscape.analyze", "landscape.measure")) and m not in light
                                   and not (m == PASS_MODULES or m.startswith(PASS_MODULES + ".")))
            or m.startswith(("landscape.models", "landscape.data", "landscape.train"))}


def _pass_modules() -> set[str]:
    """The module of every pass (its options, declaration and function)."""
    from landscape.analyze.catalog import load_passes

    return {entry.factory.__module__ for entry in load_passes().entries()}


@pytest.mark.parametrize("what", ["figure", "report", "compare"])
def test_figures_from_stored_results_load_no_computation_model_or_data_set(analysed_runs, tmp_path, what):
    runs, out = str(analysed_runs), str(tmp_path / "out")
    code = {
        "figure": f'''
            from landscape.figures import curves, rundata
            from landscape.analyze.passes import RESULT_NAMES
            from landscape.store.results.selection import Selection
            runs = rundata.load_runs({runs!r}, Selection.parse(RESULT_NAMES, ["split=test"]))
            assert "split=test" in runs[0].chosen["hessian"].shown, runs[0].chosen
            curves.plot_hessian_summary(runs, {out + ".png"!r})
        ''',
        "report": f'''
            from landscape.cli import cli
            cli(["report", {runs!r}, "-o", {out + ".html"!r}, "--settings", "split=test"],
                standalone_mode=False)
        ''',
        "compare": f'''
            from landscape.cli import cli
            cli(["compare", {runs!r}, "-o", {out!r}, "--settings", "split=test"], standalone_mode=False)
        ''',
    }[what]
    loaded = _loaded_modules(code)
    assert list(Path(tmp_path).glob("out*")), f"{what} wrote nothing"
    assert {"landscape.store.results.names"} | _pass_modules() <= set(loaded)  # what it reads: the passes' specs
    assert "landscape.analyze.catalog" not in loaded
    assert [m for m in loaded if m.startswith(("landscape.models", "landscape.data", "landscape.train"))
            or m == "landscape.config.setup"] == []
    assert sorted(_heavy(loaded)) == []


def test_every_code_name_of_the_architecture_document_exists():
    """A dotted name in backticks that starts with a subpackage (``store.results``,
    ``store.run.Run``) names a module or an attribute that exists: a move or a rename updates the document."""
    import importlib

    text = (ROOT / "docs" / "architecture.md").read_text()
    packages = {p.name for p in (ROOT / "landscape").iterdir() if (p / "__init__.py").exists()}
    settings = {"train.keep_clients"}  # a recipe key, not code
    missing = []
    for name in sorted(set(re.findall(r"`([a-z_]+(?:\.[A-Za-z_0-9]+)+)`", text)) - settings):
        parts = name.split(".")
        if parts[0] not in packages or name.endswith(".md"):
            continue
        for i in range(len(parts), 0, -1):  # the longest importable module, then attributes
            try:
                obj = importlib.import_module("landscape." + ".".join(parts[:i]))
                break
            except ModuleNotFoundError:
                continue
        try:
            for attribute in parts[i:]:
                obj = getattr(obj, attribute)
        except AttributeError:
            missing.append(name)
    assert missing == [], f"docs/architecture.md names what does not exist: {missing}"
