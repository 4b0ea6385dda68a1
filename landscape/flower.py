"""Record a Flower (flwr) federated run in landscape's run format, so that ``landscape analyze`` reads it.

Wrap the strategy the ServerApp runs; every round it hands the writer the model its clients received (what
``configure_train`` / ``configure_fit`` sent), each client's returned model and the new global model (what
``aggregate_train`` / ``aggregate_fit`` made of them):

```python
from landscape.flower import record

writer = landscape.RunWriter("runs/flower", model="mylab.nets:make_net", data="mylab.data:train_set",
                             partition={0: [...], 1: [...], ...}, algorithm="fedavg")
strategy = record(FedAvg(...), writer)            # any Flower strategy, message API or Parameters/FitRes API
result = strategy.start(grid=grid, initial_arrays=ArrayRecord(net.state_dict()), num_rounds=10)
writer.close()
```

A run format client is a partition (its samples), while Flower names nodes by random ids: each ClientApp
says which partition it trained on in its reply, under ``partition-id`` (``CLIENT_KEY``, another key with
``client_key=``): in the MetricRecord of its train reply (or in a ConfigRecord beside it), or in the metrics
of its ``FitRes`` (a NumPyClient's ``fit`` returns them). In the simulation engine that is
``context.node_config["partition-id"]``, and the writer's partition must give that client the same samples.
Where the nodes are fixed, ``node_clients={node_id: client}`` names them instead.

The model: with the message API an ``ArrayRecord(net.state_dict())`` carries the state_dict's names; Flower's
``Parameters`` (and an ArrayRecord made from a list of arrays) are arrays in the order of
``net.state_dict().values()``, as Flower's PyTorch examples send them: give ``model=`` (the ``nn.Module``, a
zero-argument factory, ``"package.module:factory"`` or a state_dict) to name them.

Round 0 is the initial model (the global model the strategy is given in its first round). Each round also gives
the writer the aggregated train metrics (finite numbers, for metrics.jsonl) and, in
its metadata, the strategy's class and each client's Flower node id (a string: Flower's are uint64). A round
whose clients all failed is not recorded. The wrapper runs the base class's ``start`` loop (Flower's own),
calling the wrapped strategy's methods; a strategy that replaces ``start`` with a loop of its own is not
supported.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from landscape.core.errors import LandscapeError, shown

try:
    from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
    from flwr.common import FitIns, FitRes, Parameters, parameters_to_ndarrays
    from flwr.server.strategy import Strategy as FitStrategy
    from flwr.serverapp.strategy import Strategy as MessageStrategy
except ImportError as e:  # Flower is an optional dependency (the extra `flower`)
    missing = isinstance(e, ModuleNotFoundError) and (e.name or "").split(".")[0] == "flwr"
    reason = "is not installed" if missing else f"cannot be imported ({shown(str(e), 120)})"
    raise LandscapeError(f"landscape.flower needs Flower (flwr >= 1.21), which {reason}: "
                         "pip install 'fedlandscape[flower]'") from None

CLIENT_KEY = "partition-id"  # the reply entry naming the client (the partition) that trained
_log = logging.getLogger(__name__)


# -- models ------------------------------------------------------------------------------------------------
def _template(model: Any) -> dict[str, torch.Tensor] | None:
    """The state_dict that names Flower's arrays, from ``model`` (module, factory, spec or state_dict)."""
    if model is None:
        return None
    if isinstance(model, str):
        from landscape.core.imports import call_factory

        model = call_factory(model, "model factory")
    elif callable(model) and not isinstance(model, torch.nn.Module):
        model = model()
    if isinstance(model, torch.nn.Module):
        model = model.state_dict()
    if not isinstance(model, Mapping) or not model:
        raise LandscapeError(f"landscape.flower: model= must be an nn.Module, its factory or a state_dict "
                             f"(got {type(model).__name__})")
    return dict(model)


def _named(arrays: list[tuple[str, torch.Tensor]], template: dict | None, what: str) -> dict[str, torch.Tensor]:
    """Flower's arrays as a state_dict: under their own names when they are the model's (or no model was
    given), else the model's names in order (Flower's PyTorch examples send ``state_dict().values()``)."""
    names = [name for name, _ in arrays]
    if template is None or names == list(template):
        return dict(arrays)
    if len(arrays) != len(template):
        raise LandscapeError(f"landscape.flower: {what} has {len(arrays)} arrays, the model's state_dict "
                             f"{len(template)} tensors")
    out = {}
    for (name, reference), (_, tensor) in zip(template.items(), arrays):
        if tuple(tensor.shape) != tuple(reference.shape):
            raise LandscapeError(f"landscape.flower: {what}: array {len(out)} has shape {tuple(tensor.shape)}, "
                                 f"the model's '{name}' {tuple(reference.shape)} (arrays must come in the "
                                 "order of state_dict())")
        out[name] = tensor
    return out


def _from_arrays(record: ArrayRecord, template: dict | None, what: str) -> dict[str, torch.Tensor]:
    return _named([(k, torch.from_numpy(v.numpy().copy())) for k, v in record.items()], template, what)


def _from_parameters(parameters: Parameters, template: dict | None, what: str) -> dict[str, torch.Tensor]:
    if template is None:
        raise LandscapeError("landscape.flower: Flower's Parameters are arrays without names: give model= (the "
                             "nn.Module, its factory or 'package.module:factory') to name them")
    arrays = [torch.from_numpy(a.copy()) for a in parameters_to_ndarrays(parameters)]
    return _named([(str(i), a) for i, a in enumerate(arrays)], template, what)


# -- what a round carries ----------------------------------------------------------------------------------
def _whole(value: Any) -> int | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return int(number) if number.is_integer() and number >= 0 else None


def _plain_metrics(metrics: Mapping | None, drop: str) -> dict:
    """Aggregated metrics the writer can keep: finite numbers (and lists of them), the client key left out."""
    out = {}
    for key, value in dict(metrics or {}).items():
        values = value if isinstance(value, list) else [value]
        if key != drop and isinstance(key, str) and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values):
            out[key] = value
    return out


class _Recorder:
    """What both wrappers share: the writer, the names of the model's tensors, the clients' ids."""

    def __init__(self, strategy: Any, writer: Any, model: Any, client_key: str,
                 node_clients: Mapping[int, int] | None) -> None:
        if not callable(getattr(writer, "round", None)):
            raise LandscapeError("landscape.flower: writer must be a landscape.RunWriter (it has no round())")
        self.strategy, self.writer, self.client_key = strategy, writer, client_key
        self.template = _template(model)
        self.node_clients = dict(node_clients or {})
        self.sent: dict[int, dict[str, torch.Tensor]] = {}

    def client(self, t: int, node_id: Any, entries: Iterable[Mapping]) -> int:
        """The client (partition) a reply is of: ``node_clients[node_id]``, else its ``client_key`` entry."""
        if node_id in self.node_clients:
            return int(self.node_clients[node_id])
        for record in entries:
            if self.client_key in record:
                client = _whole(record[self.client_key])
                if client is None:
                    raise LandscapeError(f"landscape.flower: round {t}: node {node_id} gave {self.client_key}="
                                         f"{record[self.client_key]!r:.40}, not a client number (0..N-1)")
                return client
        raise LandscapeError(f"landscape.flower: round {t}: the reply of node {node_id} does not say which "
                             f"client it is: return '{self.client_key}' in its metrics (in the simulation "
                             f"context.node_config['partition-id']), or give node_clients=")

    def write(self, t: int, clients: dict[int, tuple[Any, dict]], end: dict | None, metrics: Mapping | None) -> None:
        start = self.sent.pop(t, None)
        if start is None or not clients:
            _log.warning("landscape.flower: round %s not recorded: %s", t,
                         "no client returned a model" if start is not None else "nothing was sent")
            return
        nodes = {str(c): str(node) for c, (node, _) in sorted(clients.items())}  # uint64: past int64 and JSON's
        metadata = {"flower": {"strategy": type(self.strategy).__name__, "nodes": nodes}}
        self.writer.round(t, start=start, clients={c: state for c, (_, state) in clients.items()},
                          end=start if end is None else end, metrics=_plain_metrics(metrics, self.client_key),
                          metadata=metadata)

    def add(self, t: int, clients: dict, client: int, node_id: int, state: dict) -> None:
        if client in clients:
            raise LandscapeError(f"landscape.flower: round {t}: nodes {clients[client][0]} and {node_id} both "
                                 f"say they are client {client}")
        clients[client] = (node_id, state)

    def initial(self, t: int, model: Callable[[], dict[str, torch.Tensor]]) -> None:
        """Round 0, the initial model: the global model the strategy is given in its first round (``model()``)."""
        if t == 1:
            self.writer.round(0, end=model())

    def sent_once(self, t: int, payloads: list, start: Callable[[], dict[str, torch.Tensor]]) -> None:
        """The round's start (``start()``, the first message's model): one model for every client, as
        ``payloads`` (each message's bytes) show; the run format keeps one start model a round."""
        if any(p != payloads[0] for p in payloads[1:]):
            raise LandscapeError(f"landscape.flower: round {t}: the strategy sent its clients different models; "
                                 "the run format keeps one start model a round")
        self.sent[t] = start()


# -- the message API (flwr.serverapp.strategy) -------------------------------------------------------------
def _arrays_of(content: Any, key: str | None, what: str) -> ArrayRecord:
    records = content.array_records
    if key in records:
        return records[key]
    if len(records) != 1:
        raise LandscapeError(f"landscape.flower: {what} carries {len(records)} ArrayRecords, not one model")
    return next(iter(records.values()))


def _bytes(record: ArrayRecord) -> list:
    return [(k, v.dtype, tuple(v.shape), v.data) for k, v in record.items()]


class RecordingStrategy(MessageStrategy):
    """A message-API strategy (``flwr.serverapp.strategy``: FedAvg, FedProx, FedAdam, ...) that records each
    round in ``writer`` and otherwise is ``strategy`` (its attributes are read through)."""

    def __init__(self, strategy: MessageStrategy, writer: Any, model: Any = None, *,
                 client_key: str = CLIENT_KEY, node_clients: Mapping[int, int] | None = None) -> None:
        self._recorder = _Recorder(strategy, writer, model, client_key, node_clients)
        self.strategy = strategy
        self._key = getattr(strategy, "arrayrecord_key", None)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name == "strategy":
            raise AttributeError(name)
        return getattr(self.strategy, name)

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Any) -> list:
        self._recorder.initial(server_round, lambda: _from_arrays(arrays, self._recorder.template,
                                                                  "the initial model (round 0)"))
        messages = list(self.strategy.configure_train(server_round, arrays, config, grid))
        if messages:
            where = f"round {server_round}'s train message"
            records = [_arrays_of(m.content, self._key, where) for m in messages]
            distinct = {id(r): r for r in records}.values()  # FedAvg's messages share one record
            self._recorder.sent_once(server_round, [_bytes(r) for r in distinct],
                                     lambda: _from_arrays(records[0], self._recorder.template, where))
        return messages

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> tuple:
        replies = list(replies)
        clients: dict = {}  # read before aggregating: FedMedian, FedTrimmedAvg and Bulyan pop the arrays
        for reply in replies:
            if reply.has_error() or not reply.has_content():
                continue
            node = int(reply.metadata.src_node_id)
            where = f"round {server_round}'s reply of node {node}"
            entries = [*reply.content.metric_records.values(), *reply.content.config_records.values()]
            state = _from_arrays(_arrays_of(reply.content, self._key, where), self._recorder.template, where)
            client = self._recorder.client(server_round, node, entries)
            self._recorder.add(server_round, clients, client, node, state)
        arrays, metrics = self.strategy.aggregate_train(server_round, replies)
        end = None if arrays is None else _from_arrays(arrays, self._recorder.template,
                                                       f"round {server_round}'s aggregate")
        self._recorder.write(server_round, clients, end, metrics)
        return arrays, metrics

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Any):
        return self.strategy.configure_evaluate(server_round, arrays, config, grid)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        return self.strategy.aggregate_evaluate(server_round, replies)

    def summary(self) -> None:
        self.strategy.summary()


# -- the Parameters / FitRes API (flwr.server.strategy) ----------------------------------------------------
class RecordingFitStrategy(FitStrategy):
    """A ``flwr.server.strategy`` strategy (Parameters and FitRes; a ``ServerApp(server_fn=...)``) that
    records each round in ``writer`` and otherwise is ``strategy``. Needs ``model=``: Parameters have no
    names."""

    def __init__(self, strategy: FitStrategy, writer: Any, model: Any = None, *,
                 client_key: str = CLIENT_KEY, node_clients: Mapping[int, int] | None = None) -> None:
        self._recorder = _Recorder(strategy, writer, model, client_key, node_clients)
        if self._recorder.template is None:
            _from_parameters(Parameters([], ""), None, "")  # the one-line refusal
        self.strategy = strategy

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name == "strategy":
            raise AttributeError(name)
        return getattr(self.strategy, name)

    def __repr__(self) -> str:
        return f"RecordingFitStrategy({self.strategy!r})"

    def initialize_parameters(self, client_manager: Any) -> Parameters | None:
        return self.strategy.initialize_parameters(client_manager)

    def configure_fit(self, server_round: int, parameters: Parameters, client_manager: Any) -> list:
        self._recorder.initial(server_round, lambda: _from_parameters(parameters, self._recorder.template,
                                                                      "the initial model (round 0)"))
        instructions = list(self.strategy.configure_fit(server_round, parameters, client_manager))
        if instructions:
            sent: list[FitIns] = [ins for _, ins in instructions]
            self._recorder.sent_once(server_round, [i.parameters.tensors for i in sent],
                                     lambda: _from_parameters(sent[0].parameters, self._recorder.template,
                                                              f"round {server_round}'s FitIns"))
        return instructions

    def aggregate_fit(self, server_round: int, results: list, failures: list) -> tuple:
        clients: dict = {}  # read before aggregating (as the message API's strategies may consume them)
        for proxy, res in results:
            res: FitRes
            node = getattr(proxy, "node_id", None)
            node = proxy.cid if node is None else int(node)
            where = f"round {server_round}'s FitRes of node {node}"
            state = _from_parameters(res.parameters, self._recorder.template, where)
            client = self._recorder.client(server_round, node, [res.metrics or {}])
            self._recorder.add(server_round, clients, client, node, state)
        parameters, metrics = self.strategy.aggregate_fit(server_round, results, failures)
        end = None if parameters is None else _from_parameters(parameters, self._recorder.template,
                                                               f"round {server_round}'s aggregate")
        self._recorder.write(server_round, clients, end, metrics)
        return parameters, metrics

    def configure_evaluate(self, server_round: int, parameters: Parameters, client_manager: Any) -> list:
        return self.strategy.configure_evaluate(server_round, parameters, client_manager)

    def aggregate_evaluate(self, server_round: int, results: list, failures: list) -> tuple:
        return self.strategy.aggregate_evaluate(server_round, results, failures)

    def evaluate(self, server_round: int, parameters: Parameters) -> tuple | None:
        return self.strategy.evaluate(server_round, parameters)


def record(strategy: Any, writer: Any, model: Any = None, *, client_key: str = CLIENT_KEY,
           node_clients: Mapping[int, int] | None = None) -> RecordingStrategy | RecordingFitStrategy:
    """``strategy`` recording every round in ``writer`` (a ``landscape.RunWriter``): a ``RecordingStrategy``
    for a message-API strategy, a ``RecordingFitStrategy`` for a Parameters/FitRes one; see the module's
    docstring for ``model``, ``client_key`` and ``node_clients``."""
    options = {"client_key": client_key, "node_clients": node_clients}
    if isinstance(strategy, MessageStrategy):
        return RecordingStrategy(strategy, writer, model, **options)
    if isinstance(strategy, FitStrategy):
        return RecordingFitStrategy(strategy, writer, model, **options)
    raise LandscapeError(f"landscape.flower: {type(strategy).__name__} is not a Flower strategy "
                         "(flwr.serverapp.strategy.Strategy or flwr.server.strategy.Strategy)")


__all__ = ["CLIENT_KEY", "RecordingFitStrategy", "RecordingStrategy", "record"]
