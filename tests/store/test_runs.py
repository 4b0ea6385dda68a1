import json
import math
import os
import pickle

import numpy as np
import pytest
import torch

from landscape.core.errors import LandscapeError
from landscape.store.checkpoints import CHECKPOINT_FORMAT, load_checkpoint, save_checkpoint
from landscape.store.directory import RunDir
from landscape.store.fileio import write_text
from landscape.store.run import PassRecord, Run


def test_checkpoint_round_trip_under_weights_only(tmp_path):
    payload = {
        "format": CHECKPOINT_FORMAT,
        "round": 7,
        "model": {"w": torch.randn(3, 4), "b": torch.arange(3)},
        "server_state": {"m": torch.randn(5, dtype=torch.float64)},
        "client_states": {"2": {"c": torch.ones(2)}},
        "rng": {"seed": 1, "scheme": "x"},
        "recipe": "seed = 1\n",
    }
    path = tmp_path / "checkpoints" / "round-0007.pt"
    save_checkpoint(path, payload)
    # the plain torch call with weights_only=True must load it: nothing but tensors and containers inside
    raw = torch.load(path, weights_only=True)
    back = load_checkpoint(path)
    for loaded in (raw, back):
        assert loaded["round"] == 7 and loaded["recipe"] == "seed = 1\n"
        assert torch.equal(loaded["model"]["w"], payload["model"]["w"])
        assert loaded["server_state"]["m"].dtype == torch.float64
        assert torch.equal(loaded["client_states"]["2"]["c"], torch.ones(2))
    assert sorted(p.name for p in path.parent.iterdir()) == ["round-0007.pt"]  # no temporary file left


class _Payload:
    def __reduce__(self):
        return (os.system, ("touch PWNED",))


def test_checkpoint_with_code_is_refused_and_does_not_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "evil.pt"
    with open(path, "wb") as f:
        pickle.dump({"format": CHECKPOINT_FORMAT, "model": _Payload()}, f)
    with pytest.raises(LandscapeError, match="cannot load checkpoint .*evil.pt"):
        load_checkpoint(path)
    assert not (tmp_path / "PWNED").exists()


def test_truncated_and_foreign_checkpoints(tmp_path):
    good = tmp_path / "round-0001.pt"
    save_checkpoint(good, {"format": CHECKPOINT_FORMAT, "round": 1, "model": {"w": torch.ones(1000)}})
    cut = tmp_path / "round-0002.pt"
    cut.write_bytes(good.read_bytes()[:200])
    with pytest.raises(LandscapeError, match="cannot load checkpoint .*round-0002.pt"):
        load_checkpoint(cut)
    foreign = tmp_path / "other.pt"
    torch.save({"state_dict": {}}, foreign)
    with pytest.raises(LandscapeError, match="is not a landscape checkpoint"):
        load_checkpoint(foreign)


def test_metrics_append_read_and_truncate(tmp_path):
    run = RunDir(tmp_path)
    for r in range(1, 5):
        run.append_metrics({"round": r, "train_loss": 1.0 / r})
    with open(run.metrics, "a") as f:
        f.write('{"round": 5, "train_lo')  # a line cut by a kill
    assert [row["round"] for row in run.read_metrics()] == [1, 2, 3, 4]
    run.truncate_metrics(2)
    assert [row["round"] for row in run.read_metrics()] == [1, 2]


def test_rounds_lists_only_checkpoint_files(tmp_path):
    run = RunDir(tmp_path)
    for name in ["round-0010.pt", "round-0002.pt", "round-0010.clients.pt", ".round-0011.pt.abc.tmp", "x.pt"]:
        write_text(run.checkpoints / name, "")
    assert run.rounds() == [2, 10]


def _run_folder(tmp_path, imports=()):
    """A run directory by hand: its recipe, two round rows and an event row, two checkpoint names, a result of
    round 2 (with its NPZ), a partial grid and a stray surface NPZ."""
    from support.helpers import tiny_recipe

    from landscape.config.recipe import to_toml

    recipe = tiny_recipe(model__name="mlp").to_dict()
    recipe["imports"] = list(imports)
    run = RunDir(tmp_path / "run")
    write_text(run.recipe, to_toml(recipe))
    run.append_metrics({"round": 1, "train_loss": 2.0})
    run.append_event("diverged", 2, loss=float("nan"))
    run.append_metrics({"round": 2, "train_loss": 1.0, "flatness_distance": 0.5})  # written before _to_global
    for name in ("round-0001.pt", "round-0002.pt"):
        write_text(run.checkpoints / name, "")
    folder = run.path / "analysis" / "round-0002"
    write_text(folder / "loss.json", json.dumps({"pass": "loss", "round": 2, "result": {"loss": "nan"},
                                                 "arrays": ["curve"]}))
    np.savez(folder / "loss.npz", curve=np.arange(20.0))
    np.savez(folder / "surface.partial.npz", loss=np.zeros(3))
    np.savez(folder / "surface-old.npz", loss=np.zeros(3))
    return run


def test_a_run_is_read_once_by_its_one_read_model(tmp_path):
    run_dir = _run_folder(tmp_path)
    run = Run(run_dir.path)
    assert run.metrics() == run_dir.read_metrics() == [
        {"round": 1, "train_loss": 2.0}, {"round": 2, "train_loss": 1.0, "flatness_distance_to_global": 0.5}]
    assert [e["event"] for e in run.events()] == ["diverged"] and run.rounds() == [1, 2]
    assert run.recipe_table()["model"]["name"] == "mlp" and run.recipe.model.name == "mlp"
    (rec,) = run.records()[2]
    assert isinstance(rec, PassRecord) and rec.name == "loss" and rec.round == 2 and math.isnan(rec.value("loss"))
    np.testing.assert_array_equal(rec.value("curve"), np.arange(20.0))
    assert [(r, p.name) for r, p in run.loose_arrays()] == [(2, "surface-old.npz"), (2, "surface.partial.npz")]
    # read once: what is written afterwards is seen by a Run opened afterwards
    run_dir.append_metrics({"round": 3, "train_loss": 0.5})
    write_text(run_dir.checkpoints / "round-0003.pt", "")
    write_text(run_dir.path / "analysis" / "round-0003" / "loss.json", json.dumps({"pass": "loss", "round": 3}))
    assert len(run.metrics()) == 2 and run.rounds() == [1, 2] and sorted(run.records()) == [2]
    again = Run(run_dir.path)
    assert len(again.metrics()) == 3 and again.rounds() == [1, 2, 3] and sorted(again.records()) == [2, 3]
    with pytest.raises(LandscapeError, match=r"^\S+ is not a run directory \(no recipe.toml\)$"):
        Run(tmp_path)


def test_reading_a_run_never_imports_its_imports(tmp_path, monkeypatch):
    (tmp_path / "mod").mkdir()
    (tmp_path / "mod" / "lab_registry_x.py").write_text("import pathlib\npathlib.Path('IMPORTED').write_text('')\n")
    monkeypatch.syspath_prepend(str(tmp_path / "mod"))
    monkeypatch.chdir(tmp_path)
    run = Run(_run_folder(tmp_path, imports=["lab_registry_x"]).path)
    assert run.recipe_table()["imports"] == ["lab_registry_x"] and run.recipe.unimported == ("lab_registry_x",)
    assert run.metrics() and run.records() and run.rounds() == [1, 2]
    assert not (tmp_path / "IMPORTED").exists()


# -- open_run of a folder of runs, and the results table ----------------------------------------------------


def test_open_run_of_a_folder_gives_its_runs_sorted_by_name(tmp_path):
    import landscape
    from landscape.store.run import Runs

    folder = tmp_path / "runs"
    folder.mkdir()
    for name in ("b-run", "a-run"):
        _run_folder(tmp_path / name).path.rename(folder / name)
    (folder / "notes.txt").write_text("x")  # a file beside the runs is no run, and no obstacle
    (folder / "empty").mkdir()  # nor a folder that is no run
    runs = landscape.open_run(folder)
    assert isinstance(runs, Runs) and isinstance(runs, list) and runs.names == ["a-run", "b-run"]
    assert all(isinstance(run, Run) for run in runs) and runs["b-run"] is runs[1]
    assert [run.path for run in runs] == [folder / "a-run", folder / "b-run"]
    assert all(run.recipe.model.name == "mlp" for run in runs)  # each opened as open_run opens one
    with pytest.raises(AttributeError, match=r"is a folder of 2 runs \(a-run, b-run\), not one run: take one first, "
                                             r"e.g. runs\[0\].recipe"):
        runs.recipe  # noqa: B018
    with pytest.raises(KeyError, match="has no run 'c-run'; its runs: a-run, b-run"):
        runs["c-run"]
    assert isinstance(landscape.open_run(folder / "a-run"), Run)  # a run directory is one Run, as before


def test_open_run_of_a_folder_holding_neither_says_what_it_holds(tmp_path):
    import landscape

    (tmp_path / "empty").mkdir()
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("x")
    (tmp_path / "other" / "figures").mkdir()
    _run_folder(tmp_path / "nested" / "demo")  # nested/demo/run: nested is a folder of folders of runs
    for path, message in [
        (tmp_path / "empty", f"open_run: {tmp_path / 'empty'} is an empty folder, not a run directory (no "
                             "recipe.toml) or a folder of runs"),
        (tmp_path / "other", f"open_run: {tmp_path / 'other'} is neither a run directory (no recipe.toml) nor a "
                             "folder of runs (no sub-folder has one); it holds figures/, notes.txt"),
        (tmp_path / "nested", f"open_run: {tmp_path / 'nested'} is a folder of folders of runs (demo): give one of "
                              f"them, e.g. {tmp_path / 'nested' / 'demo'}"),
    ]:
        with pytest.raises(LandscapeError) as raised:
            landscape.open_run(path)
        assert str(raised.value) == message


def _analysed(run_dir):
    """``run_dir`` (the six-round run) analysed at round 6: loss, a cheap sharpness and hessian."""
    from landscape.analyze.catalog import pass_options
    from landscape.analyze.scheduler import run_analysis
    from landscape.analyze.settings import AnalysisSettings

    options = {"loss": pass_options("loss", {}),
               "sharpness": pass_options("sharpness", {"rhos": [0.02, 0.05], "steps": 2, "starts": 1}),
               **_hessian_options(2)}
    run_analysis(run_dir, rounds="6", passes=list(options), options=options,
                 settings=AnalysisSettings(device="cpu", analysis_samples=100), progress=False)
    return run_dir


def _numbers_of(node, key=""):
    """Every number (not a flag) of a JSON result by dotted path, as the table names it ("nan" and "inf" are
    how JSON holds those numbers)."""
    if isinstance(node, dict):
        for name, value in node.items():
            yield from _numbers_of(value, f"{key}.{name}" if key else name)
    elif isinstance(node, (int, float)) and not isinstance(node, bool) or node in ("nan", "inf", "-inf"):
        yield key, float(node)


def _in(result: dict, key: str):
    """The JSON result's value at a dotted key."""
    for part in key.split("."):
        result = result[part]
    return result


def _hessian_options(top_k: int) -> dict:
    from landscape.analyze.catalog import pass_options

    return {"hessian": pass_options("hessian", {"top_k": top_k, "trace_hvps": 6, "density_runs": 1,
                                                "density_steps": 2})}


def test_run_results_is_a_tidy_table_of_the_measured_numbers_of_every_result(six_round_copy):
    import pandas as pd

    import landscape
    from landscape.analyze.passes import PASSES

    run = landscape.open_run(_analysed(six_round_copy))
    table = run.results()
    assert isinstance(table, pd.DataFrame)
    # one setting for every result: no settings column, only what was measured
    assert table.columns.tolist() == ["run", "round", "pass", "quantity", "value"]
    assert table["value"].dtype == float and table["round"].dtype == "int64"
    assert set(table["run"]) == {"run"} and set(table["round"]) == {6}
    assert not table.duplicated(["run", "round", "pass", "quantity"]).any()  # each row told apart
    files = sorted((six_round_copy / "analysis" / "round-0006").glob("*.json"))
    assert sorted(table["pass"].unique()) == ["hessian", "loss", "sharpness"] == sorted(
        json.loads(f.read_text())["pass"] for f in files)
    for path in files:
        record = json.loads(path.read_text())
        measures = PASSES.get(record["pass"]).measures
        rows = table[table["pass"] == record["pass"]]
        got = dict(zip(rows["quantity"], rows["value"]))
        numbers = {measures[k]: v for k, v in _numbers_of(record["result"]) if k in measures}
        numbers.update({measures.get(k, k): v for k, v in record["summary"].items() if k != "lower_bounds"})
        for each in PASSES.get(record["pass"]).indexed:  # arrays of quantities (the adaptive S_rho per radius)
            numbers.update({each.name.format(at): value for at, value in zip(
                _in(record["result"], each.at), _in(record["result"], each.values))})
        # the quantities are the declared numbers of the result and its summary, with their values
        assert got.keys() == numbers.keys() and len(rows) == len(got)
        assert all(got[k] == numbers[k] or (math.isnan(got[k]) and math.isnan(numbers[k])) for k in got)
        # no number named like a setting the result records
        setting_names = set(record["settings"]["analysis"]) | set(record["settings"]["pass"])
        assert not {k for k in got if k.split(".")[-1] in setting_names}
    hessian = table[table["pass"] == "hessian"].set_index("quantity")["value"]
    record = json.loads(next(f for f in files if f.name.startswith("hessian")).read_text())
    assert hessian["lambda_max"] == record["result"]["top"]["values"][0]  # an array's headline: its summary
    assert hessian["trace.stderr"] == record["result"]["trace"]["stderr"]
    assert hessian["trace"] == record["result"]["trace"]["estimate"] and "trace.estimate" not in hessian.index
    assert hessian["density.sigma"] == record["result"]["density"]["sigma"]
    # echoed settings and bookkeeping are not quantities (the record still holds them)
    for key in ("top.values", "top.seed", "top.tol", "top.hvp_count", "top.iterations", "hvp_count", "dim",
                "top.settings.k", "trace.samples", "trace.stderr_dof", "density.seed"):
        assert key not in hessian.index, key
    assert record["result"]["top"]["seed"] == 0 and record["result"]["dim"] > 0
    sharp = table[table["pass"] == "sharpness"].set_index("quantity")["value"]
    assert {"S_rho(0.02)", "S_rho(0.05)", "local_gap"} <= set(sharp.index)
    assert not {"global.seed", "global.steps", "global.starts", "global.gradient_evaluations",
                "global.loss", "local.gap"} & set(sharp.index)
    loss = table[table["pass"] == "loss"].set_index("quantity")["value"]
    (loss_record,) = [r for r in run.records()[6] if r.name == "loss"]
    assert loss["accuracy"] == loss_record.summary["acc"] == loss_record.value("accuracy")
    assert "acc" not in loss.index and "samples" not in loss.index


def test_a_setting_that_differs_between_results_is_a_column_of_its_own(six_round_copy):
    import landscape
    from landscape.analyze.scheduler import run_analysis
    from landscape.analyze.settings import AnalysisSettings

    run_dir = _analysed(six_round_copy)
    run_analysis(run_dir, rounds="6", passes=["hessian"], options=_hessian_options(3),
                 settings=AnalysisSettings(device="cpu", analysis_samples=100), progress=False)
    table = landscape.open_run(run_dir).results()
    assert table.columns.tolist() == ["run", "round", "pass", "quantity", "value", "hessian.top_k"]
    hessian = table[table["pass"] == "hessian"]
    assert sorted(hessian["hessian.top_k"].unique()) == [2, 3]
    assert table[table["pass"] != "hessian"]["hessian.top_k"].isna().all()  # another pass's setting: empty
    assert not table.duplicated(["round", "pass", "quantity", "hessian.top_k"]).any()
    assert (hessian.groupby("hessian.top_k")["quantity"].apply(set).map(lambda q: "lambda_max" in q)).all()
    by_k = hessian.set_index(["hessian.top_k", "quantity"])["value"]
    records = [json.loads(f.read_text()) for f in (run_dir / "analysis" / "round-0006").glob("hessian*.json")]
    assert sorted(r["settings"]["pass"]["top_k"] for r in records) == [2, 3]
    for record in records:
        k = record["settings"]["pass"]["top_k"]
        assert len(record["result"]["top"]["values"]) == k
        assert by_k[(k, "lambda_max")] == record["result"]["top"]["values"][0]


def test_results_of_many_runs_is_one_table(six_round_copy, tmp_path):
    import shutil

    import landscape

    _analysed(six_round_copy)
    folder = tmp_path / "runs"
    for name in ("x", "y"):
        shutil.copytree(six_round_copy, folder / name)
    bare = RunDir(tmp_path / "bare")  # a run with no analysis adds no rows
    bare.path.mkdir()
    shutil.copy(six_round_copy / "recipe.toml", bare.recipe)
    one = landscape.open_run(six_round_copy).results()
    both = landscape.results([folder, bare.path, str(folder / "x")])  # x once, though given twice
    assert both["run"].tolist() == ["x"] * len(one) + ["y"] * len(one)
    assert both["value"].tolist() == one["value"].tolist() * 2
    assert landscape.open_run(folder).results().equals(both)
    assert Run(bare.path).results().empty and Run(bare.path).results().columns.tolist()[:5] == [
        "run", "round", "pass", "quantity", "value"]
    # a run analysed on other samples: the setting tells its rows apart, a column of its own
    from landscape.analyze.catalog import pass_options
    from landscape.analyze.scheduler import run_analysis
    from landscape.analyze.settings import AnalysisSettings

    shutil.copytree(six_round_copy, folder / "z", ignore=shutil.ignore_patterns("analysis"))
    run_analysis(folder / "z", rounds="6", passes=["loss"], options={"loss": pass_options("loss", {})},
                 settings=AnalysisSettings(device="cpu", analysis_samples=50), progress=False)
    three = landscape.results(folder)
    assert three.columns.tolist() == ["run", "round", "pass", "quantity", "value", "analysis_samples"]
    assert three.groupby("run")["analysis_samples"].unique().map(list).to_dict() == {
        "x": [100], "y": [100], "z": [50]}
    assert three[three["run"] != "z"].drop(columns="analysis_samples").reset_index(drop=True).equals(both)
    with pytest.raises(LandscapeError, match="results: .*nosuch does not exist"):
        landscape.results(tmp_path / "nosuch")
    with pytest.raises(LandscapeError, match="results takes run directories, folders of runs or Runs, not 3"):
        landscape.results([3])
