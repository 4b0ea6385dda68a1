"""Flower runs recorded in the run format (landscape.flower): a real Flower FedAvg, 4 clients and 2 rounds of a
small MLP on scikit-learn's digits, through Flower's simulation engine (the message API, ClientApps in Ray
workers) and through Flower's own server loop in this process (the Parameters/FitRes API); each recorded
round holds exactly what Flower sent its clients, what each client returned and what FedAvg made of them, and
`landscape analyze` reads the run. Then the one-line refusals, and the one line when Flower is not installed.

The ClientApps save what they received and returned (``OUT`` names the folder, through the environment, which
the simulation's workers inherit); the functions below are importable as ``test_flower`` (tests/ is on the
path, and on the workers' PYTHONPATH), as the run's model and data factories must be."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import landscape
from landscape.core.errors import LandscapeError

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
CLIENTS, ROUNDS, SAMPLES = 4, 2, 1797  # load_digits: 1797 samples of 8x8 pixels
OUT = "LANDSCAPE_FLOWER_TEST_OUT"


# -- the model, the data and the clients' training (run by Flower) ------------------------------------------
def digits_mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 10))


def digits_data() -> tuple[torch.Tensor, torch.Tensor]:
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    return torch.tensor(x / 16.0, dtype=torch.float32), torch.tensor(y, dtype=torch.int64)


def partition() -> dict[int, list[int]]:
    return {c: list(range(c, SAMPLES, CLIENTS)) for c in range(CLIENTS)}


def local_training(state: dict, client: int, t: int) -> tuple[dict, int]:
    """One epoch of SGD on the client's samples from ``state``; the model and its number of samples."""
    x, y = digits_data()
    samples = torch.tensor(partition()[client])
    net = digits_mlp()
    net.load_state_dict(state)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    order = torch.randperm(len(samples), generator=torch.Generator().manual_seed(100 * t + client))
    for batch in samples[order].split(32):
        opt.zero_grad()
        nn.functional.cross_entropy(net(x[batch]), y[batch]).backward()
        opt.step()
    return {k: v.detach().clone() for k, v in net.state_dict().items()}, len(samples)


def keep(run: str, kind: str, t: int, client: int, state: dict) -> None:
    """What a client received ("in") or returned ("out") in round t of a run, saved for the test to compare."""
    torch.save({k: v.clone() for k, v in state.items()}, Path(os.environ[OUT]) / f"{run}-{kind}-{t}-{client}.pt")


def train(message, context):
    """The ClientApp's train function (the message API): the partition it trained on goes back in its
    MetricRecord under "partition-id" (landscape.flower.CLIENT_KEY), beside "num-examples"."""
    from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict

    config = message.content["config"]
    client, t, run = int(context.node_config["partition-id"]), int(config["server-round"]), str(config["run"])
    received = message.content["arrays"].to_torch_state_dict()
    keep(run, "in", t, client, received)
    state, n = local_training(received, client, t)
    keep(run, "out", t, client, state)
    metrics = MetricRecord({"num-examples": n, "partition-id": client, "train-samples": float(n)})
    return Message(RecordDict({"arrays": ArrayRecord(state), "metrics": metrics}), reply_to=message)


def numpy_client(client: int, run: str, report: bool = True):
    """A NumPyClient (the Parameters/FitRes API): arrays in the order of state_dict().values(), as Flower's
    PyTorch examples send them; the partition in its FitRes metrics."""
    from flwr.client import NumPyClient

    class Digits(NumPyClient):
        def fit(self, parameters, config):
            received = dict(zip(digits_mlp().state_dict(), map(torch.from_numpy, parameters)))
            t = int(config["server-round"])
            keep(run, "in", t, client, received)
            state, n = local_training(received, client, t)
            keep(run, "out", t, client, state)
            return [v.numpy() for v in state.values()], n, ({"partition-id": client} if report else {})

    return Digits().to_client()


# -- checks ---------------------------------------------------------------------------------------------------
def same(a: dict, b: dict) -> bool:
    return list(a) == list(b) and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)


def recorded_round(run: Path, t: int) -> tuple[dict, dict, dict[int, dict], dict]:
    """Round t's start, end and client models and its metadata, read from its files (round-NNNN.pt: the end
    model; round-NNNN.clients.pt: the start and the clients' models)."""
    end = torch.load(run / "checkpoints" / f"round-{t:04d}.pt", weights_only=True)
    kept = torch.load(run / "checkpoints" / f"round-{t:04d}.clients.pt", weights_only=True)
    return kept["start"], end["model"], {int(c): s for c, s in kept["clients"].items()}, end.get("metadata", {})


def fedavg(clients: dict[int, dict], name: str) -> torch.Tensor:
    """FedAvg's aggregate: the clients' mean weighted by their samples."""
    sizes = [len(partition()[c]) for c in range(CLIENTS)]
    return sum(sizes[c] * clients[c][name].double() for c in range(CLIENTS)) / sum(sizes)


def fedmedian(clients: dict[int, dict], name: str) -> torch.Tensor:
    """FedMedian's aggregate: the element-wise median of the clients' models (of 4: the middle two's mean)."""
    return torch.from_numpy(np.median(np.stack([clients[c][name].double().numpy() for c in range(CLIENTS)]), 0))


def assert_recorded_as_flower_ran_it(run: Path, out: Path, final: dict | None = None, aggregate=fedavg) -> None:
    previous = digits_mlp().state_dict()
    initial = torch.load(run / "checkpoints" / "round-0000.pt", weights_only=True)["model"]
    assert same(initial, previous), "round 0 is the initial model"
    for t in range(1, ROUNDS + 1):
        start, end, clients, metadata = recorded_round(run, t)
        assert sorted(clients) == list(range(CLIENTS))
        assert same(start, previous), f"round {t}: the start is the previous round's global model"
        for c in range(CLIENTS):
            sent, returned = (torch.load(out / f"{run.name}-{kind}-{t}-{c}.pt") for kind in ("in", "out"))
            assert same(sent, start), f"round {t}: what client {c} received"
            assert same(returned, clients[c]), f"round {t}: what client {c} returned"
        for name, value in end.items():
            assert torch.allclose(value.double(), aggregate(clients, name), atol=1e-6), f"round {t}: {name}"
        nodes = metadata["flower"]["nodes"]
        assert sorted(map(int, nodes)) == list(range(CLIENTS)) and len(set(nodes.values())) == CLIENTS
        previous = end
    if final is not None:
        assert same(previous, final), "the last recorded global model is the strategy's result"


def writer(run: Path):
    return landscape.RunWriter(run, model="test_flower:digits_mlp", data="test_flower:digits_data",
                               partition=partition(), algorithm="fedavg", seed=0)


@pytest.fixture
def out(tmp_path, monkeypatch):
    folder = tmp_path / "sent-and-returned"
    folder.mkdir()
    monkeypatch.setenv(OUT, str(folder))
    monkeypatch.setenv("FLWR_TELEMETRY_ENABLED", "0")  # no network here
    return folder


# -- the simulation engine (message API) ----------------------------------------------------------------------
@pytest.mark.slow  # Flower's simulation engine (ray)
def test_a_flower_simulation_is_recorded_as_flower_ran_it(tmp_path, out, monkeypatch):
    """FedAvg, then FedMedian (which pops the clients' arrays out of their replies as it aggregates) in the
    same simulation (one start of Ray), each recorded in a run of its own."""
    pytest.importorskip("flwr")
    pytest.importorskip("ray")  # flwr[simulation]
    from flwr.app import ArrayRecord, ConfigRecord
    from flwr.clientapp import ClientApp
    from flwr.serverapp import ServerApp
    from flwr.serverapp.strategy import FedAvg, FedMedian
    from flwr.simulation import run_simulation

    from landscape.flower import RecordingStrategy, record

    # the Ray workers import this module: tests/ (and the package) on their path
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), str(ROOT), os.environ.get("PYTHONPATH", "")]))
    strategies = {"fedavg": FedAvg, "fedmedian": FedMedian}
    finals = {}
    client_app, server_app = ClientApp(), ServerApp()
    client_app.train()(train)

    @server_app.main()
    def main(grid, context):
        for name, kind in strategies.items():
            with writer(tmp_path / name) as w:
                strategy = record(kind(fraction_evaluate=0.0, min_train_nodes=CLIENTS, min_available_nodes=CLIENTS), w)
                assert isinstance(strategy, RecordingStrategy) and strategy.min_train_nodes == CLIENTS
                outcome = strategy.start(grid=grid, initial_arrays=ArrayRecord(digits_mlp().state_dict()),
                                         num_rounds=ROUNDS, train_config=ConfigRecord({"run": name}))
            finals[name] = outcome.arrays.to_torch_state_dict()

    run_simulation(server_app=server_app, client_app=client_app, num_supernodes=CLIENTS,
                   backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}})
    assert sorted(finals) == sorted(strategies), "the ServerApp ran to its end"
    assert_recorded_as_flower_ran_it(tmp_path / "fedavg", out, finals["fedavg"])
    assert_recorded_as_flower_ran_it(tmp_path / "fedmedian", out, finals["fedmedian"], aggregate=fedmedian)

    run = tmp_path / "fedavg"
    metrics = landscape.open_run(run).metrics()
    assert [row["round"] for row in metrics] == [1, 2]
    assert all(row["train-samples"] == pytest.approx(sum(len(p) ** 2 for p in partition().values()) / SAMPLES)
               for row in metrics), "the aggregated train metrics (weighted by num-examples) go to metrics.jsonl"
    assert all("partition-id" not in row for row in metrics)

    from support.helpers import invoke

    analysed = invoke("analyze", run, "--checkpoints", "all", "--passes", "flatness", "--quiet")
    assert analysed.exit_code == 0, analysed.output
    assert sorted(p.parent.name for p in (run / "analysis").glob("round-*/flatness*.json")) == [
        "round-0001", "round-0002"]
    # every pass on the recorded run, at small settings; the surfaces of every kind
    small = ["--analysis-samples", "200", "--set", "hessian.top_k=2", "--set", "hessian.trace_hvps=6", "--set",
             "hessian.density_runs=1", "--set", "hessian.density_steps=4", "--set", "hessian.clients=2", "--set",
             "sharpness.rhos=[0.05]", "--set", "sharpness.steps=2", "--set", "sharpness.starts=1", "--set",
             "sharpness.clients=2", "--set", "incompatibility.batches=2", "--set", "alignment.batches=2"]
    analysed = invoke("analyze", run, "--checkpoints", "2", "--quiet", *small)
    assert analysed.exit_code == 0, analysed.output
    for directions in ("random", "pca", "clients", "interpolate"):
        surface = invoke("analyze", run, "--checkpoints", "2", "--directions", directions, "--grid", "5",
                         "--analysis-samples", "100", "--quiet")
        assert surface.exit_code == 0, surface.output
    passes = {json.loads(p.read_text())["pass"] for p in (run / "analysis" / "round-0002").glob("*.json")}
    assert passes == {"loss", "hessian", "sharpness", "flatness", "incompatibility", "alignment", "surface"}
    updates = json.loads(next((run / "analysis" / "round-0002").glob("alignment*.json")).read_text())
    assert np.isfinite(updates["result"]["updates"]["cosine_matrix"]).all()


# -- Flower's server loop in this process (Parameters / FitRes API) -------------------------------------------
def flower_server(strategy, clients: dict):
    """Flower's legacy Server over in-process clients (node id -> Client): its real fit loop, FitIns and
    FitRes, without the simulation engine."""
    from flwr.common import DisconnectRes
    from flwr.server import Server, SimpleClientManager
    from flwr.server.client_proxy import ClientProxy

    class InProcess(ClientProxy):
        def __init__(self, node_id, client):
            super().__init__(str(node_id))
            self.node_id, self.client = node_id, client

        def get_properties(self, ins, timeout, group_id):
            return self.client.get_properties(ins)

        def get_parameters(self, ins, timeout, group_id):
            return self.client.get_parameters(ins)

        def fit(self, ins, timeout, group_id):
            return self.client.fit(ins)

        def evaluate(self, ins, timeout, group_id):
            return self.client.evaluate(ins)

        def reconnect(self, ins, timeout, group_id):
            return DisconnectRes(reason="")

    manager = SimpleClientManager()
    for node, client in clients.items():
        manager.register(InProcess(node, client))
    return Server(client_manager=manager, strategy=strategy)


def fit_fedavg(arrays: list | None = None):
    from flwr.common import ndarrays_to_parameters
    from flwr.server.strategy import FedAvg

    arrays = [v.numpy() for v in digits_mlp().state_dict().values()] if arrays is None else arrays
    initial = ndarrays_to_parameters(arrays)
    return FedAvg(fraction_fit=1.0, fraction_evaluate=0.0, min_fit_clients=CLIENTS, min_available_clients=CLIENTS,
                  initial_parameters=initial, on_fit_config_fn=lambda t: {"server-round": t})


NODES = {18_000_000_000_000_000_000 + 17 * c: c for c in range(CLIENTS)}  # Flower's node ids: random uint64s


def test_flowers_parameters_api_is_recorded_as_flower_ran_it(tmp_path, out):
    pytest.importorskip("flwr")
    from landscape.flower import RecordingFitStrategy, record

    run = tmp_path / "fit"
    with writer(run) as w:
        strategy = record(fit_fedavg(), w, "test_flower:digits_mlp")
        assert isinstance(strategy, RecordingFitStrategy)
        server = flower_server(strategy, {node: numpy_client(c, "fit") for node, c in NODES.items()})
        server.fit(num_rounds=ROUNDS, timeout=None)
    assert_recorded_as_flower_ran_it(run, out)


# -- refusals -----------------------------------------------------------------------------------------------
def test_a_reply_that_does_not_name_its_client_is_refused_in_one_line(tmp_path, out):
    pytest.importorskip("flwr")
    from landscape.flower import record

    with writer(tmp_path / "run") as w:
        server = flower_server(record(fit_fedavg(), w, digits_mlp),
                               {node: numpy_client(c, "run", report=False) for node, c in NODES.items()})
        with pytest.raises(LandscapeError, match="does not say which client it is: return 'partition-id'") as e:
            server.fit(num_rounds=1, timeout=None)
    assert "\n" not in str(e.value)
    # the same replies, the nodes named by the caller
    with writer(tmp_path / "named") as w:
        server = flower_server(record(fit_fedavg(), w, digits_mlp, node_clients=NODES),
                               {node: numpy_client(c, "named", report=False) for node, c in NODES.items()})
        server.fit(num_rounds=ROUNDS, timeout=None)
    assert_recorded_as_flower_ran_it(tmp_path / "named", out)


def test_what_cannot_be_recorded_is_refused_in_one_line(tmp_path):
    pytest.importorskip("flwr")
    from landscape.flower import record

    with writer(tmp_path / "run") as w:
        with pytest.raises(LandscapeError, match="Parameters are arrays without names: give model="):
            record(fit_fedavg(), w)
        with pytest.raises(LandscapeError, match="is not a Flower strategy"):
            record(object(), w)
        server = flower_server(record(fit_fedavg([torch.zeros(2).numpy()] * 2), w, digits_mlp),
                               {node: numpy_client(c, "run") for node, c in NODES.items()})
        with pytest.raises(LandscapeError,
                           match=r"the initial model \(round 0\) has 2 arrays, the model's state_dict 4 tensors"):
            server.fit(num_rounds=1, timeout=None)
    with pytest.raises(LandscapeError, match="must be a landscape.RunWriter"):
        record(fit_fedavg(), object(), digits_mlp)


def test_without_flower_the_module_says_how_to_install_it_in_one_line():
    code = "import sys; sys.modules['flwr'] = None; import landscape.flower"  # as if flwr were not installed
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 1 and last.startswith("landscape.core.errors.LandscapeError: landscape.flower needs Flower")
    assert last.endswith("pip install 'fedlandscape[flower]'")
