import dataclasses
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from support.helpers import drop_recorded_recipes, tiny_recipe

import landscape
from landscape.config.sections import TrainSettings
from landscape.core.errors import LandscapeError
from landscape.store.checkpoints import load_checkpoint
from landscape.store.directory import RunDir
from landscape.train import gather, loop, schedule


def _trainer(tmp_path, recipe):
    return loop.Trainer(recipe, RunDir(tmp_path / "run"))


def test_fedavg_round_matches_the_equations_in_float64(tmp_path):
    # Linear softmax model (mlp with no hidden layer): parameters [W (10x64), b (10)].
    recipe = tiny_recipe(
        partition__clients=2, train__participation=1.0, train__local_steps=2, train__batch_size=4,
        train__weight_decay=0.01, train__server_lr=0.7, train__lr=0.3, train__dtype="float64",
        model__name="mlp", model__hidden=[],
    )
    trainer = _trainer(tmp_path, recipe)
    state = trainer.initial_state()
    new_state, results, row = trainer.run_round(state)

    x = state.x.clone()
    lr, wd = 0.3, 0.01
    finals = []
    for client in (0, 1):
        y = x.clone()
        batches = list(trainer.local_problem(client, 0, lr, {}).batches())
        assert len(batches) == 2 and all(len(b[1]) == 4 for b in batches)
        for xb, yb in batches:
            w = y.clone().requires_grad_(True)
            logits = xb.reshape(len(xb), -1) @ w[:640].view(10, 64).T + w[640:]
            (g,) = torch.autograd.grad(F.cross_entropy(logits, yb), w)
            y = y - lr * (g + wd * y)  # FedAvg client step
        finals.append(y)
    expected = x + 0.7 * (torch.stack(finals).mean(0) - x)  # FedAvg server step
    assert new_state.x.dtype == torch.float64
    torch.testing.assert_close(new_state.x, expected, rtol=1e-12, atol=1e-14)
    for r, y in zip(results, finals):
        torch.testing.assert_close(r.model, y, rtol=1e-12, atol=1e-14)
    y_bar = torch.stack(finals).mean(0)  # Delta_D around the clients' mean (the FedNSAM paper's)
    distance = np.mean([float(((y - y_bar) ** 2).sum()) for y in finals])
    assert row["flatness_distance"] == pytest.approx(distance, rel=1e-12)
    to_global = np.mean([float(((y - expected) ** 2).sum()) for y in finals])  # server_lr 0.7: another number
    assert row["flatness_distance_to_global"] == pytest.approx(to_global, rel=1e-12)
    assert to_global > distance * 1.01
    assert row["update_norm"] == pytest.approx(float((expected - x).norm()), rel=1e-12)
    assert row["uplink_floats"] == 650


@pytest.mark.parametrize("steps, epochs", [(0, 2), (5, 1)])
def test_local_batches_are_shuffled_epochs_of_the_client_data(tmp_path, steps, epochs):
    recipe = tiny_recipe(train__local_steps=steps, train__local_epochs=epochs, train__batch_size=16)
    trainer = _trainer(tmp_path, recipe)
    idx = trainer.client_idx[1]
    batches = trainer._batch_indices(1, torch.Generator().manual_seed(0))
    if steps:
        assert len(batches) == steps
    else:
        per_epoch = math.ceil(len(idx) / 16)
        assert len(batches) == epochs * per_epoch
        for e in range(epochs):
            epoch = torch.cat(batches[e * per_epoch : (e + 1) * per_epoch])
            assert sorted(epoch.tolist()) == sorted(idx.tolist())
    assert all(len(b) <= 16 for b in batches)


def test_client_sampling_is_uniform_without_replacement_and_seeded():
    draws = [schedule.sample_clients(0, t, 20, 5) for t in range(400)]
    assert all(len(set(d)) == 5 and all(0 <= i < 20 for i in d) for d in draws)
    assert draws == [schedule.sample_clients(0, t, 20, 5) for t in range(400)]
    assert draws != [schedule.sample_clients(1, t, 20, 5) for t in range(400)]
    counts = np.bincount(np.concatenate(draws), minlength=20)
    assert counts.min() > 60 and counts.max() < 140  # expectation 100 each


def test_learning_rate_schedules():
    train = TrainSettings(lr=0.1, lr_schedule="constant", lr_decay=0.998, lr_min=0.001, rounds=100, swa=False)
    assert schedule.learning_rate(train, 57) == 0.1
    train = dataclasses.replace(train, lr_schedule="exponential")
    assert schedule.learning_rate(train, 10) == pytest.approx(0.1 * 0.998**10)
    train = dataclasses.replace(train, lr_schedule="cosine")
    assert schedule.learning_rate(train, 0) == pytest.approx(0.1)
    assert schedule.learning_rate(train, 50) == pytest.approx(0.001 + 0.5 * 0.099)
    assert schedule.learning_rate(train, 100) == pytest.approx(0.001)


def test_swa_cyclic_learning_rate_and_cycle_ends():
    train = TrainSettings(lr=0.1, lr_schedule="constant", rounds=20, swa=True, swa_start=0.5, swa_cycle=4, swa_lr=0.01)
    assert [schedule.learning_rate(train, t) for t in range(9)] == [0.1] * 9  # before round 10
    for t in range(10, 20):
        t_c = (t % 4 + 1) / 4  # Caldarola et al.: t_c = ((t mod c) + 1) / c
        assert schedule.learning_rate(train, t) == pytest.approx((1 - t_c) * 0.1 + t_c * 0.01)
    assert [t for t in range(20) if schedule.swa_cycle_ends(train, t)] == [11, 15, 19]


def test_swa_average_and_the_model_analysis_uses(tmp_path):
    recipe = tiny_recipe(train__rounds=8, train__swa=True, train__swa_start=0.25, train__swa_cycle=2,
                         train__checkpoint_every=1)
    loop.start_run(recipe, tmp_path / "r", progress=False)
    run = landscape.open_run(tmp_path / "r")
    flat_of = {r: torch.cat([v.reshape(-1) for k, v in load_checkpoint(run.dir.checkpoint(r))["model"].items()])
               for r in run.rounds()}
    # rounds t = 2..7 are SWA rounds; cycles close at t = 3, 5, 7, i.e. after rounds 4, 6, 8
    expected = (flat_of[4] + flat_of[6] + flat_of[8]) / 3
    last = load_checkpoint(run.dir.checkpoint(8))
    assert last["swa_count"] == 3
    swa = torch.cat([v.reshape(-1) for v in last["swa_model"].values()])
    torch.testing.assert_close(swa, expected)
    assert "swa_model" not in load_checkpoint(run.dir.checkpoint(3))
    model = run.model(8)
    torch.testing.assert_close(torch.cat([p.detach().reshape(-1) for p in model.parameters()]), expected)
    assert [row["swa_models"] for row in run.metrics()] == [0, 0, 0, 1, 1, 2, 2, 3]


def test_algorithm_plus_swa_before_swa_start_is_the_algorithm(tmp_path):
    loop.start_run(tiny_recipe(train__rounds=4), tmp_path / "a", progress=False)
    loop.start_run(tiny_recipe(train__rounds=8, train__swa=True, train__swa_start=0.5), tmp_path / "b", progress=False)
    a = load_checkpoint(RunDir(tmp_path / "a").checkpoint(3))["model"]
    b = load_checkpoint(RunDir(tmp_path / "b").checkpoint(3))["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


def _metrics_without_time(path):
    return [{k: v for k, v in row.items() if k != "seconds"} for row in RunDir(path).read_metrics()]


def test_same_recipe_and_seed_give_the_same_numbers(tmp_path):
    recipe = tiny_recipe()
    loop.start_run(recipe, tmp_path / "a", progress=False)
    loop.start_run(recipe, tmp_path / "b", progress=False)
    assert _metrics_without_time(tmp_path / "a") == _metrics_without_time(tmp_path / "b")
    a = load_checkpoint(RunDir(tmp_path / "a").checkpoint(3))["model"]
    b = load_checkpoint(RunDir(tmp_path / "b").checkpoint(3))["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    loop.start_run(tiny_recipe(seed=1), tmp_path / "c", progress=False)
    assert _metrics_without_time(tmp_path / "c") != _metrics_without_time(tmp_path / "a")


@pytest.mark.parametrize("killed_after", [1, 4])
def test_resume_after_a_kill_is_bit_identical(tmp_path, monkeypatch, killed_after):
    recipe = tiny_recipe(train__rounds=6, train__checkpoint_every=2, train__keep_clients=True)
    loop.start_run(recipe, tmp_path / "whole", progress=False)

    original = loop.Trainer.run_round

    def run_round_then_die(self, state):
        if state.round == killed_after:
            raise KeyboardInterrupt  # the process is killed while round killed_after + 1 runs
        return original(self, state)

    monkeypatch.setattr(loop.Trainer, "run_round", run_round_then_die)
    with pytest.raises(KeyboardInterrupt):
        loop.start_run(recipe, tmp_path / "cut", progress=False)
    monkeypatch.setattr(loop.Trainer, "run_round", original)
    assert RunDir(tmp_path / "cut").rounds()[-1] == killed_after // 2 * 2
    loop.resume_run(tmp_path / "cut", progress=False)

    whole, cut = RunDir(tmp_path / "whole"), RunDir(tmp_path / "cut")
    assert whole.rounds() == cut.rounds() == [0, 2, 4, 6]
    for r in whole.rounds():
        a, b = load_checkpoint(whole.checkpoint(r)), load_checkpoint(cut.checkpoint(r))
        assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert whole.clients_checkpoint(6).read_bytes() != b""
    assert _metrics_without_time(whole.path) == _metrics_without_time(cut.path)


def test_resume_extends_with_rounds(tmp_path):
    loop.start_run(tiny_recipe(train__rounds=2), tmp_path / "r", progress=False)
    state = loop.resume_run(tmp_path / "r", rounds=4, progress=False)
    assert state.round == 4
    assert [row["round"] for row in RunDir(tmp_path / "r").read_metrics()] == [1, 2, 3, 4]
    assert "rounds = 4" in (tmp_path / "r" / "recipe.toml").read_text()


def test_resume_errors(tmp_path):
    with pytest.raises(LandscapeError, match="is not a run directory"):
        loop.resume_run(tmp_path, progress=False)
    loop.start_run(tiny_recipe(train__rounds=2), tmp_path / "r", progress=False)
    with pytest.raises(LandscapeError, match="below the last checkpoint"):
        loop.resume_run(tmp_path / "r", rounds=1, progress=False)


def test_keep_clients_saves_that_rounds_client_models(tmp_path):
    loop.start_run(tiny_recipe(train__keep_clients=True), tmp_path / "r", progress=False)
    run = RunDir(tmp_path / "r")
    kept = torch.load(run.clients_checkpoint(3), weights_only=True)["clients"]
    sampled = run.read_metrics()[-1]["clients"]
    assert sorted(int(c) for c in kept) == sampled
    assert not run.clients_checkpoint(0).exists()


def test_open_run_gives_the_logged_model_and_data(tmp_path):
    loop.start_run(tiny_recipe(), tmp_path / "r", progress=False)
    run = landscape.open_run(tmp_path / "r")
    assert run.rounds() == [0, 1, 2, 3]
    assert run.recipe.partition.clients == 4
    rows = run.metrics()
    assert [r["round"] for r in rows] == [1, 2, 3]
    model = run.model()
    assert not model.training
    train, test = run.data()
    with torch.no_grad():
        logits = model(test.x)
    acc = (logits.argmax(1) == test.y).sum().item() / len(test)
    loss = F.cross_entropy(logits, test.y).item()
    assert acc == pytest.approx(rows[-1]["test_acc"], abs=1e-12)
    assert loss == pytest.approx(rows[-1]["test_loss"], rel=1e-5)
    parts = run.partition()
    assert sum(len(p) for p in parts) == len(train)
    client = run.client_data(2)
    assert torch.equal(client.y, train.y[torch.as_tensor(parts[2])])
    with pytest.raises(LandscapeError, match="client 9 does not exist"):
        run.client_data(9)
    with pytest.raises(LandscapeError, match="round 7 has no checkpoint"):
        run.model(7)


def test_model_mismatch_is_a_clear_error(tmp_path):
    loop.start_run(tiny_recipe(train__rounds=1), tmp_path / "r", progress=False)
    drop_recorded_recipes(tmp_path / "r")  # else the recipe the checkpoints record is used (test_edited_recipe.py)
    recipe_file = tmp_path / "r" / "recipe.toml"
    recipe_file.write_text(recipe_file.read_text().replace("width = 32", "width = 8"))
    with pytest.raises(LandscapeError, match="round-0001.pt does not match the model 'cnn': 'conv1.weight' has shape"):
        landscape.open_run(tmp_path / "r").model()


def test_average_buffers_of_batchnorm_statistics():
    a = {"bn.running_mean": torch.tensor([0.0, 2.0]), "bn.num_batches_tracked": torch.tensor(3)}
    b = {"bn.running_mean": torch.tensor([1.0, 4.0]), "bn.num_batches_tracked": torch.tensor(5)}
    out = gather.average_buffers([a, b])
    assert torch.equal(out["bn.running_mean"], torch.tensor([0.5, 3.0]))
    assert out["bn.num_batches_tracked"].item() == 4 and out["bn.num_batches_tracked"].dtype == torch.long


def test_no_local_work_is_refused(tmp_path):
    with pytest.raises(LandscapeError, match="both 0"):
        _trainer(tmp_path, tiny_recipe(train__local_steps=0, train__local_epochs=0))


def test_a_float64_run_trains_on_the_float64_inputs_of_the_data_set(tmp_path):
    # digits: pixels / 16 standardised by the train split's mean and std, computed here in float64
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    raw = load_digits()
    x_train, x_test = train_test_split((raw.data / 16.0).reshape(-1, 1, 8, 8), test_size=0.2,
                                       stratify=raw.target, random_state=0)[:2]
    mean, std = x_train.mean(), x_train.std()
    source_train, source_test = torch.from_numpy((x_train - mean) / std), torch.from_numpy((x_test - mean) / std)
    assert not torch.equal(source_train.float().double(), source_train)  # float32 would round them
    float64 = _trainer(tmp_path / "float64", tiny_recipe(seed=0, train__dtype="float64"))
    assert float64.train_x.dtype == torch.float64
    assert torch.equal(float64.train_x, source_train) and torch.equal(float64.test_x, source_test)
    float32 = _trainer(tmp_path / "float32", tiny_recipe(seed=0))  # a float32 run: the same values rounded once
    assert torch.equal(float32.train_x, torch.from_numpy(((x_train - mean) / std).astype(np.float32)))
