"""The per-round flatness distance of metrics.jsonl (landscape.core.distances): Delta_D, its scale-free companion
Delta_D / mean ||y_i - s^t||^2 and the distance to the new global model, by hand and against the trainer's logged
rows recomputed in float64 from the saved clients file (its recorded start s^t)."""

from __future__ import annotations

import pytest
import torch
from support.helpers import tiny_recipe

from landscape.config import setup
from landscape.core.distances import round_distances
from landscape.core.flat import FlatModel
from landscape.store.checkpoints import load_checkpoint
from landscape.store.directory import RunDir
from landscape.train import loop


def test_round_distances_by_hand():
    models = torch.tensor([[1.0, 0.0], [3.0, 2.0]], dtype=torch.float64)  # ybar = (2, 1)
    start = torch.tensor([1.0, 2.0], dtype=torch.float64)
    row = round_distances(models, torch.tensor([2.0, 2.0], dtype=torch.float64), start)
    assert row["flatness_distance"] == 2.0  # (1 + 1 + 1 + 1) / 2
    assert row["flatness_distance_normalized"] == 2.0 / 5.0
    assert row["flatness_distance_to_global"] == 3.0  # (5 + 1) / 2 = Delta_D + ||ybar - x||^2 = 2 + 1
    assert row["client_update_sq"] == 4.0  # ||(0, -2)||^2 and ||(2, 0)||^2
    assert row["flatness_distance_relative"] == 0.5


def test_identical_moves_and_no_start():
    start = torch.zeros(3, dtype=torch.float64)
    same = torch.ones(4, 3, dtype=torch.float64)  # every client at one point: Delta_D 0, relative 0
    row = round_distances(same, same[0], start)
    assert row["flatness_distance"] == 0.0 and row["flatness_distance_relative"] == 0.0
    assert row["client_update_sq"] == 3.0
    assert "flatness_distance_relative" not in round_distances(same, same[0], same[0])  # nobody moved
    assert {"client_update_sq", "flatness_distance_relative"}.isdisjoint(round_distances(same, same[0], None))


def test_logged_relative_distance_equals_a_float64_recomputation(tmp_path):
    recipe = tiny_recipe(train__keep_clients=True, train__dtype="float64", train__rounds=2)
    loop.start_run(recipe, tmp_path / "run", progress=False)
    run = RunDir(tmp_path / "run")
    flat = FlatModel(setup.build_module(recipe, setup.prepare_data(recipe).bundle).double())
    for row in run.read_metrics():
        kept = load_checkpoint(run.clients_checkpoint(row["round"]))
        start = flat.from_state_dict(kept["start"])[0]
        ys = torch.stack([flat.from_state_dict(s)[0] for s in kept["clients"].values()])
        deviation = ys - ys.mean(dim=0)
        update = ys - start
        expected_u = float(sum(float(u @ u) for u in update) / len(ys))
        expected_d = float(sum(float(d @ d) for d in deviation) / len(ys))
        assert row["client_update_sq"] == pytest.approx(expected_u, rel=1e-12)
        assert row["flatness_distance_relative"] == pytest.approx(expected_d / expected_u, rel=1e-12)
        assert 0.0 < row["flatness_distance_relative"] <= 1.0


def test_the_pass_and_the_api_give_the_logged_relative_distance(tmp_path):
    """The flatness pass (float64, from the clients file and its recorded start) and landscape.flatness_distance
    equal the trainer's logged companion; without a start the API's is NaN."""
    import json
    import math

    from support.helpers import analyze_args, invoke, result_file

    import landscape

    recipe = tiny_recipe(train__keep_clients=True, train__dtype="float64", train__rounds=2)
    loop.start_run(recipe, tmp_path / "run", progress=False)
    result = invoke(*analyze_args(tmp_path / "run", "--passes", "flatness"))
    assert result.exit_code == 0, result.output
    stored = json.loads(result_file(tmp_path / "run" / "analysis" / "round-0002", "flatness").read_text())
    row = RunDir(tmp_path / "run").read_metrics()[-1]
    assert stored["summary"]["Delta_D_relative"] == pytest.approx(row["flatness_distance_relative"], rel=1e-12)
    kept = load_checkpoint(RunDir(tmp_path / "run").clients_checkpoint(2))
    flat = FlatModel(setup.build_module(recipe, setup.prepare_data(recipe).bundle).double())
    start = flat.from_state_dict(kept["start"])[0]
    clients = [flat.from_state_dict(s)[0] for s in kept["clients"].values()]
    api = landscape.flatness_distance(start, clients, start=start)
    assert api.distance_relative == pytest.approx(row["flatness_distance_relative"], rel=1e-12)
    assert api.update_sq == pytest.approx(row["client_update_sq"], rel=1e-12)
    assert math.isnan(landscape.flatness_distance(start, clients).distance_relative)
