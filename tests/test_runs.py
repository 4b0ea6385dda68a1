import os
import pickle

import pytest
import torch

from landscape.core.errors import LandscapeError
from landscape.store.checkpoints import CHECKPOINT_FORMAT, load_checkpoint, save_checkpoint
from landscape.store.fileio import write_text
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
