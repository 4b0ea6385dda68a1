import json
import math
import os
import pickle

import numpy as np
import pytest
import torch

from landscape.core.errors import LandscapeError
from landscape.store.checkpoints import CHECKPOINT_FORMAT, load_checkpoint, save_checkpoint
from landscape.store.fileio import write_text
from landscape.store.run import PassRecord, Run
from landscape.store.runs import RunDir


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
    from conftest import tiny_recipe

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
    (rec,) = run.results()[2]
    assert isinstance(rec, PassRecord) and rec.name == "loss" and rec.round == 2 and math.isnan(rec.value("loss"))
    np.testing.assert_array_equal(rec.value("curve"), np.arange(20.0))
    assert [(r, p.name) for r, p in run.loose_arrays()] == [(2, "surface-old.npz"), (2, "surface.partial.npz")]
    # read once: what is written afterwards is seen by a Run opened afterwards
    run_dir.append_metrics({"round": 3, "train_loss": 0.5})
    write_text(run_dir.checkpoints / "round-0003.pt", "")
    write_text(run_dir.path / "analysis" / "round-0003" / "loss.json", json.dumps({"pass": "loss", "round": 3}))
    assert len(run.metrics()) == 2 and run.rounds() == [1, 2] and sorted(run.results()) == [2]
    again = Run(run_dir.path)
    assert len(again.metrics()) == 3 and again.rounds() == [1, 2, 3] and sorted(again.results()) == [2, 3]
    with pytest.raises(LandscapeError, match=r"^\S+ is not a run directory \(no recipe.toml\)$"):
        Run(tmp_path)


def test_reading_a_run_never_imports_its_imports(tmp_path, monkeypatch):
    (tmp_path / "mod").mkdir()
    (tmp_path / "mod" / "lab_registry_x.py").write_text("import pathlib\npathlib.Path('IMPORTED').write_text('')\n")
    monkeypatch.syspath_prepend(str(tmp_path / "mod"))
    monkeypatch.chdir(tmp_path)
    run = Run(_run_folder(tmp_path, imports=["lab_registry_x"]).path)
    assert run.recipe_table()["imports"] == ["lab_registry_x"] and run.recipe.unimported == ("lab_registry_x",)
    assert run.metrics() and run.results() and run.rounds() == [1, 2]
    assert not (tmp_path / "IMPORTED").exists()
