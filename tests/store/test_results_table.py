"""The notebook's results table holds quantities only, each concept once (issue 45): every pass declares the numbers
of its results it measures and those that are bookkeeping (``PassSpec.measures``, ``PassSpec.bookkeeping``), and
``landscape.open_run(...).results()`` / ``landscape.results`` hold exactly the declared quantities, under the one name
each declares. A pass that records a new number without declaring it fails here."""

from __future__ import annotations

import json
import math
import shutil

import pytest

from landscape.store.run import PassRecord, Run

# Values two different quantities of one result may share on the fixture's run, each by coincidence of the data
# and not by definition: no friendly pair (a rate and its standard error of 0), a 3 x 3 grid whose centre is its
# lowest point, and PyHessian's stopping rule that ran every probe (its trace is then the full one).
COINCIDENT = [{"friendly_rate", "friendly_rate_se"}, {"surface_centre_loss", "min_loss"},
              {"pyhessian_trace", "pyhessian.rule_trace"}]


@pytest.fixture(scope="module")
def analysed(six_round_run, tmp_path_factory):
    """A copy of the six-round run with round 6 analysed by every declared pass, cheaply, in each of the forms whose
    results hold other numbers: the hessian pass with XTrace, Hutch++ and the PyHessian cross-check, the surface
    pass on a random plane (filter-normalised, to a reference, euclidean), on the PCA plane and on a line."""
    from landscape.analyze.catalog import pass_options
    from landscape.analyze.scheduler import run_analysis
    from landscape.analyze.settings import AnalysisSettings

    run_dir = tmp_path_factory.mktemp("results-table") / "run"
    shutil.copytree(six_round_run, run_dir)
    hessian = {"top_k": 2, "trace_hvps": 6, "density_runs": 2, "density_steps": 3}
    cheap = {"loss": {}, "flatness": {}, "hessian": hessian, "incompatibility": {"batches": 2},
             "sharpness": {"rhos": [0.02, 0.05], "steps": 2, "starts": 2}, "alignment": {"batches": 2},
             "surface": {"grid": "3"}}
    more = [("surface", {"directions": "interpolate", "grid": "5"}, {}),
            ("surface", {"directions": "pca", "grid": "3"}, {}),
            ("surface", {"grid": "3", "normalization": "filter-reference", "reference": "round:0"}, {}),
            ("surface", {"grid": "3", "normalization": "euclidean", "length": 2.0}, {}),
            ("hessian", {**hessian, "trace_method": "hutch++", "clients": -1}, {}),
            ("hessian", hessian, {"backend": "pyhessian"})]
    for passes, settings in [(cheap, {})] + [({name: options}, settings) for name, options, settings in more]:
        run_analysis(run_dir, rounds="6", passes=list(passes),
                     options={name: pass_options(name, options) for name, options in passes.items()},
                     settings=AnalysisSettings(device="cpu", analysis_samples=100, **settings), progress=False)
    return run_dir


def _numbers(node, key=""):
    """(dotted key, value) of every number of a JSON result ("nan" and "inf" are how JSON holds those)."""
    if isinstance(node, dict):
        for name, value in node.items():
            yield from _numbers(value, f"{key}.{name}" if key else name)
    elif isinstance(node, (int, float)) and not isinstance(node, bool) or node in ("nan", "inf", "-inf"):
        yield key, float(node)


def _bookkeeping(key: str, declared: frozenset[str]) -> bool:
    return any(key == entry or key.startswith(entry + ".") for entry in declared)


def _records(run_dir):
    return [json.loads(path.read_text()) for path in sorted((run_dir / "analysis" / "round-0006").glob("*.json"))]


def test_every_number_of_every_pass_is_declared_a_quantity_or_bookkeeping(analysed):
    from landscape.analyze.passes import PASSES

    records = _records(analysed)
    assert {r["pass"] for r in records} == {entry.name for entry in PASSES.entries()}  # every pass is run here
    seen: dict[str, set[str]] = {}
    for record in records:
        spec = PASSES.get(record["pass"])
        assert spec.measures is not None, f"the {spec.name} pass declares no measures"
        for key, _ in _numbers(record["result"]):
            # one or the other, never both: a new number of a result needs its word in the pass's declaration
            assert (key in spec.measures) != _bookkeeping(key, spec.bookkeeping), (spec.name, key)
        seen.setdefault(spec.name, set()).update({key for key, _ in _numbers(record["result"])}, record["summary"])
    assert len(set(PASSES.entries())) == len(PASSES.entries())  # a spec hashes (its measures dict is not hashed)
    for spec in PASSES.entries():  # and no declaration names a number that no longer is
        assert [key for key in spec.measures if key not in seen[spec.name]] == [], spec.name
        assert [key for key in spec.bookkeeping if not any(_bookkeeping(k, {key}) for k in seen[spec.name])] == []


def test_results_holds_the_declared_quantities_each_concept_once(analysed):
    import landscape
    from landscape.analyze.passes import PASSES
    from landscape.store.results.records import settings_columns

    table = landscape.open_run(analysed).results()
    settings = [c for c in table.columns if c not in ("run", "round", "pass", "quantity", "value")]
    assert {"backend", "hessian.trace_method", "surface.directions"} <= set(settings)  # the results told apart
    assert not table.duplicated([c for c in table.columns if c != "value"]).any()
    records = {path.name: PassRecord(path, json.loads(path.read_text()))
               for path in (analysed / "analysis" / "round-0006").glob("*.json")}
    for name, record in records.items():
        spec = PASSES.get(record.name)
        cells = settings_columns(record.name, record.settings)
        rows = table[table["pass"] == record.name]  # its rows: those with its settings (one it lacks: empty)
        for column in settings:
            rows = rows[rows[column] == cells[column]] if column in cells else rows[rows[column].isna()]
        got = dict(zip(rows["quantity"], rows["value"]))
        numbers = dict(_numbers(record.result))
        summary = {k: float(v) for k, v in record.summary.items() if not isinstance(v, list)}
        expected = {spec.measures.get(k, k): v for k, v in summary.items()}
        for key, value in numbers.items():
            if key in spec.measures:
                expected.setdefault(spec.measures[key], value)
        for each in spec.indexed:  # the arrays tabulated, an entry each (the adaptive S_rho per radius)
            for where, value in zip(record.value(each.at), record.value(each.values)):
                expected.setdefault(each.name.format(where), float(value))
        assert got.keys() == expected.keys(), name
        assert all(got[k] == expected[k] or math.isnan(got[k]) and math.isnan(expected[k]) for k in got), name
        # bookkeeping is no quantity, under its key or its last name (hvp_count, seed, samples, dim)
        assert not {k for k in got if _bookkeeping(k, spec.bookkeeping)}, name
        assert not {k for k in got if k.split(".")[-1] in {"seed", "hvp_count", "samples", "dim", "tol", "steps"}}
        # one name per value: two quantities of a result with one value only by the coincidences listed
        shared = {}
        for quantity, value in got.items():
            if math.isfinite(value):
                shared.setdefault(value, set()).add(quantity)
        assert [names for names in shared.values() if len(names) > 1 and names not in COINCIDENT] == [], name
    # the concepts that two names gave before: each under the paper's (docs/metrics.md) name alone
    for name, other in [("accuracy", "acc"), ("Delta_D", "distance"), ("trace", "trace.estimate"),
                        ("mean_grad_cos", "gradients.mean_off_diagonal"), ("Delta_FI", "incompatibility"),
                        ("local_gap", "local.gap"), ("client_lambda_max_mean", "clients.mean_lambda_max"),
                        ("surface_centre_loss", "centre_loss")]:
        assert name in set(table["quantity"]) and other not in set(table["quantity"]), name
    # and a concept one pass measures is not repeated by another (F(w), ||grad F||: the loss pass's)
    passes_of = table.groupby("quantity")["pass"].unique()
    assert [q for q, passes in passes_of.items() if len(passes) > 1] == []
    assert landscape.results(analysed).equals(table)


def test_a_results_quantities_are_those_its_pass_declares(tmp_path):
    from landscape.store.results.records import quantities

    record = {"pass": "newpass", "round": 1,
              "settings": {"analysis": {"seed": 0, "analysis_samples": 100}, "pass": {"width": 3}},
              "summary": {"headline": 1.5, "acc": 0.5, "lower_bounds": ["headline"]},
              "result": {"headline": 1.5, "spread": 0.25, "accuracy": 0.5, "inner": {"norm": 2.0, "seed": 0},
                         "method": {"estimate": 7.0, "name": "text", "flag": True, "values": [1.0, 2.0]},
                         "missing": "nan"}}
    rec = PassRecord(tmp_path / "newpass.json", record)
    declared = {"acc": "accuracy", "accuracy": "accuracy", "inner.norm": "norm", "missing": "missing"}
    got = quantities(rec, declared)
    # the summary's numbers (by the declared name), then the declared numbers of the result, each name once
    assert list(got) == ["headline", "accuracy", "norm", "missing"] and got["norm"] == 2.0
    assert math.isnan(got["missing"]) and got["accuracy"] == 0.5
    # a pass that declares nothing: its summary and every number of its result, by dotted key
    assert list(quantities(rec, None)) == ["headline", "acc", "spread", "accuracy", "inner.norm", "inner.seed",
                                           "method.estimate", "missing"]


def test_only_the_notebook_api_passes_the_declarations(analysed):
    """The store imports no analysis: a ``Run`` made without the declarations tabulates every number, the notebook's
    ``open_run`` the declared quantities (``landscape.api.runs``)."""
    import landscape
    from landscape.api.runs import DECLARED

    bare = Run(analysed).results()
    declared = landscape.open_run(analysed).results()
    assert len(declared) < len(bare) and "hvp_count" in set(bare["quantity"]) - set(declared["quantity"])
    assert Run(analysed, measures=DECLARED).results().equals(declared)
    runs = landscape.open_run(analysed.parent)  # a folder of runs: each opened with them
    assert runs.results().equals(declared) and landscape.results([Run(analysed)]).equals(declared)
    assert landscape.Run(analysed).results().equals(declared)  # the package's Run: the notebook's too


def test_the_adaptive_s_rho_is_a_quantity_per_radius_where_the_pass_computed_it(analysed, tmp_path):
    """The sharpness pass's adaptive (ASAM-ball) profile, held as arrays, is tabulated at each radius under the
    name claims give it; a result computed with ``adaptive = false`` has none."""
    import landscape
    from landscape.analyze.catalog import pass_options
    from landscape.analyze.scheduler import run_analysis
    from landscape.analyze.settings import AnalysisSettings

    table = landscape.open_run(analysed).results()
    (path,) = (analysed / "analysis" / "round-0006").glob("sharpness*.json")
    record = PassRecord(path, json.loads(path.read_text()))
    adaptive = table[table["quantity"].str.startswith("adaptive S_rho(")]
    assert dict(zip(adaptive["quantity"], adaptive["value"])) == {
        "adaptive S_rho(0.02)": record.value("adaptive.sharpness")[0],
        "adaptive S_rho(0.05)": record.value("adaptive.sharpness")[1]}
    run_dir = tmp_path / "run"
    shutil.copytree(analysed, run_dir)
    shutil.rmtree(run_dir / "analysis")
    options = {"rhos": [0.05], "steps": 2, "starts": 2, "adaptive": False}
    run_analysis(run_dir, rounds="6", passes=["sharpness"], options={"sharpness": pass_options("sharpness", options)},
                 settings=AnalysisSettings(device="cpu", analysis_samples=100), progress=False)
    quantities = set(landscape.open_run(run_dir).results()["quantity"])
    assert "S_rho(0.05)" in quantities and not any(q.startswith("adaptive") for q in quantities)


def test_the_notebook_guide_lists_the_quantities_of_every_pass(analysed):
    """docs/guides/notebook.md lists each pass's quantities as the table names them (every form the fixture
    analyses: S_rho one per radius, the PyHessian ones, a line's, a reference model's)."""
    import re
    from pathlib import Path

    import landscape

    guide = (Path(__file__).resolve().parents[2] / "docs" / "guides" / "notebook.md").read_text()
    listed = {match.group(1): re.findall(r"`([^`]+)`", match.group(2))
              for match in re.finditer(r"^\| `([a-z]+)` \| (`.*`) \|$", guide, re.MULTILINE)}
    table = landscape.open_run(analysed).results()
    names = {name: list(dict.fromkeys(re.sub(r"S_rho\(.*\)$", "S_rho(<rho>)", q) for q in rows["quantity"]))
             for name, rows in table.groupby("pass")}
    assert {name: sorted(q) for name, q in listed.items()} == {name: sorted(q) for name, q in names.items()}
