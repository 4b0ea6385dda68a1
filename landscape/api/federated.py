"""The federated analyses as plain functions: flatness incompatibility and gradient, minibatch and update
alignment of one model over its clients' data, with no run directory (``landscape.incompatibility``,
``landscape.alignment``; the ``incompatibility`` and ``alignment`` passes compute the same from a checkpoint).

```
fi = landscape.incompatibility(model, [data_0, data_1], rho=0.05)   # .incompatibility (Delta_FI), ...
al = landscape.alignment(model, [data_0, data_1], start=x_prev, client_models=[y_0, y_1])
```

``clients_data``: a list, one entry per client (entry i is client i), or a ``{client number: data}`` mapping;
each entry is data as the other functions take it (``(inputs, targets)`` tensors, a map-style ``Dataset`` or a
``DataLoader``). F, the global objective: ``incompatibility``'s is the given clients' plain average
(1/N) sum_i F_i by default (the paper's; ``global_objective="client-mean"``), size-weighted over the union of
their data with ``global_objective="size-weighted"``, or over ``data`` when it is given; ``alignment``'s is over
``data`` when given, else over the union of the clients' data: the passes' F (the analysis split "train", the
union of every client's training data) when every client of a run is given. Each client's minibatches are
``batches`` draws of ``minibatch_size`` of its samples (the training batch size: the passes' option of that
name), seeded by (``seed``, client number) as the passes draw them, so a client's number and the seed fix its
draws. ``batch_size`` is the chunk F and each F_i are
evaluated in, as for the other functions (None: a DataLoader's own, else 512). ``loss``,
``bn_mode``, ``device``, ``dtype`` and ``threads`` as for the other functions; the model is never modified.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from landscape.analyze.context import registered_algorithm
from landscape.api import checks
from landscape.api.checks import DEFAULT_THREADS
from landscape.core.errors import LandscapeError, shown
from landscape.core.flat import FlatModel
from landscape.measure.alignment import (
    GradientAlignmentResult,
    MinibatchAlignmentResult,
    UpdateAlignmentResult,
    gradient_alignment,
    minibatch_alignment,
    update_alignment,
)
from landscape.measure.analysis_data import AnalysisData, as_data
from landscape.measure.flatness import flatness_incompatibility
from landscape.measure.functions import checked_vector
from landscape.measure.gradient_cache import GradientCache
from landscape.measure.incompatibility import (
    GLOBAL_OBJECTIVES,
    AppliedPerturbation,
    ClientMean,
    IncompatibilityResult,
    algorithm_perturbation,
)
from landscape.measure.objective import LossFn, Objective

DEFAULT_EVAL_BATCH = 512  # as_data's default chunk, for the union of the clients' data too


def incompatibility(model: nn.Module, clients_data: Any, *, data: Any = None, global_objective: str | None = None,
                    rho: float = 0.05, batches: int = 8, minibatch_size: int = 32, seed: int = 0,
                    loss_level: bool = True, loss_level_pairs: int = 0, algorithm: str | None = None,
                    algorithm_options: Any = None,
                    server_state: Any = None, client_states: Any = None, loss: str | LossFn | None = None,
                    bn_mode: str = "eval", batch_size: int | None = None, device: str | torch.device | None = None,
                    dtype: torch.dtype | str | None = None, threads: int = DEFAULT_THREADS) -> IncompatibilityResult:
    """The flatness incompatibility Delta_FI = mean_i E_B ||e_i^B - e*||^2 at ``model`` (docs/metrics.md),
    e* = rho grad F / ||grad F|| (F: module docstring), e_i^B the SAM perturbation of one of client i's
    minibatches; with its heterogeneity / minibatch split, the gradient-level split, the loss-level gap
    (``loss_level``: N (M + 1) more evaluations of F; ``loss_level_pairs`` = K > 0: F at a seeded sample of K of
    the N M (client, draw) pairs where there are more, with its standard error, as the pass's option of that name
    (default there 64, here 0: every pair); docs/metrics.md) and the friendly-adversary rate: the result of the
    incompatibility pass (``IncompatibilityResult``, the same fields). ``batches`` >= 2 draws of
    ``minibatch_size`` samples per client (pairs of draws are compared). ``algorithm`` (a registered name, with
    its ``algorithm_options``): the applied_* figures, with the perturbation it applies at the start of a round
    from the state its server holds (``server_state``, {field: tensor}; None: its initial state) and its
    clients' (``client_states``, {client number: {field: tensor}}; a client absent: its first participation),
    as a checkpoint holds them; None: plain SAM perturbations only (applied_* NaN)."""
    rho, loss_level = checks.finite("rho", rho), checks.flag("loss_level", loss_level)
    batches, minibatch_size, seed = _draws(batches, minibatch_size, seed)
    kind = _global_objective(global_objective, data)
    with checks.threads(threads):
        glob, clients, w = _objectives(model, clients_data, data, loss=loss, bn_mode=bn_mode,
                                       eval_batch_size=batch_size, device=device, dtype=dtype,
                                       union=kind != "client-mean")
        glob = ClientMean(clients) if glob is None else glob  # (1/N) sum_i F_i
        applied = None if algorithm is None else _applied(
            algorithm, algorithm_options, server_state, client_states, clients[min(clients)].flat, len(clients), w)
        return flatness_incompatibility(glob, clients, w, rho, batch_size=minibatch_size, batches=batches, seed=seed,
                                        loss_level=loss_level, loss_level_pairs=loss_level_pairs, applied=applied)


def _global_objective(kind: Any, data: Any) -> str:
    if kind is None:
        return "client-mean" if data is None else "data"
    if kind not in GLOBAL_OBJECTIVES:
        raise LandscapeError(f"global_objective must be one of {', '.join(map(repr, GLOBAL_OBJECTIVES))} "
                             f"(got {shown(repr(kind))})")
    if data is not None:
        raise LandscapeError("data is F's data itself: give global_objective or data, not both")
    return kind


def _applied(name: Any, options: Any, server_state: Any, client_states: Any, flat: FlatModel, num_clients: int,
             w: Tensor) -> AppliedPerturbation:
    """The perturbation the registered algorithm ``name`` applies, from the states given (``incompatibility``)."""
    if not isinstance(name, str):
        raise LandscapeError(f"algorithm must be the name of a registered algorithm, not {type(name).__name__}")
    if options is not None and not isinstance(options, Mapping):
        raise LandscapeError(f"algorithm_options must be a mapping of its options, not {type(options).__name__}")
    rules: Any = registered_algorithm(name, dict(options or {}), flat, num_clients)
    server = _table(server_state, "server_state") if server_state is not None else \
        rules.init_server_state(w).named()
    states = {} if client_states is None else {
        i: _table(s, f"client_states[{i}]") for i, s in _entries(client_states, "client_states", "client states")}
    return algorithm_perturbation(rules, w, server, states, 0)


def _table(value: Any, what: str) -> dict[str, Tensor]:
    if not isinstance(value, Mapping) or not all(isinstance(k, str) and isinstance(v, Tensor)
                                                 for k, v in value.items()):
        raise LandscapeError(f"{what} must be a table of named tensors ({{field: tensor}}), as a checkpoint holds it")
    return dict(value)


@dataclass(frozen=True)
class Alignment:
    """The alignment pass's three results at one model: ``gradients`` (cosines of the clients' full gradients,
    client x client and with grad F), ``minibatch`` (within each client, cosines of the gradients of distinct
    minibatch draws) and ``updates`` (cosines of the client updates y_i - start; None without ``start`` and
    ``client_models``)."""

    gradients: GradientAlignmentResult
    minibatch: MinibatchAlignmentResult
    updates: UpdateAlignmentResult | None


def alignment(model: nn.Module, clients_data: Any, *, data: Any = None,
              start: nn.Module | Tensor | Mapping[str, Tensor] | None = None, client_models: Any = None,
              new_global: nn.Module | Tensor | Mapping[str, Tensor] | None = None,
              previous_global: nn.Module | Tensor | Mapping[str, Tensor] | None = None, batches: int = 8,
              minibatch_size: int = 32, seed: int = 0, loss: str | LossFn | None = None, bn_mode: str = "eval",
              batch_size: int | None = None, device: str | torch.device | None = None,
              dtype: torch.dtype | str | None = None, threads: int = DEFAULT_THREADS) -> Alignment:
    """Gradient and minibatch cosines at ``model`` over ``clients_data`` (module docstring), and, given ``start``
    (the model the clients started their local steps from) and ``client_models`` (their final models y_i: a
    list, entry i client i's, or a {client number: model} mapping), the cosines of their updates
    Delta_i = y_i - start (``update_alignment``, in float64): with one another, with their mean and, given
    ``new_global`` x^t, with the server's step x^t - ``previous_global`` (None: the clients started from the
    previous global model, so it is ``start``; give it where the start was a look-ahead). The models are
    nn.Modules, flat vectors of the trainable parameters or state_dicts (read against ``model``)."""
    batches, minibatch_size, seed = _draws(batches, minibatch_size, seed)
    with checks.threads(threads):
        reference = FlatModel(_module(model))
        where = checks.analysis_device(device, next(iter(model.parameters())).device)
        updates = _updates(reference, where, start, client_models, new_global, previous_global)
        glob, clients, w = _objectives(model, clients_data, data, loss=loss, bn_mode=bn_mode,
                                       eval_batch_size=batch_size, device=device, dtype=dtype)
        cache = GradientCache(w)
        gradients = gradient_alignment(glob, clients, w, gradients=cache)
        minibatch = minibatch_alignment(clients, w, batch_size=minibatch_size, batches=batches, seed=seed,
                                        gradients=cache)
        return Alignment(gradients, minibatch, updates)


def _draws(batches: Any, batch_size: Any, seed: Any) -> tuple[int, int, int]:
    return checks.whole("batches", batches, low=2), checks.whole("minibatch_size", batch_size), checks.seed(seed)


def _module(model: Any) -> nn.Module:
    if not isinstance(model, nn.Module):
        raise LandscapeError(f"model must be a torch nn.Module, not {type(model).__name__}")
    return model


def _entries(value: Any, name: str, what: str) -> list[tuple[int, Any]]:
    """(client number, entry) of a list (entry i: client i) or of a {client number: entry} mapping, by number."""
    if isinstance(value, Mapping):
        items = [(checks.whole(f"{name} keys (client numbers)", k, low=0), v) for k, v in value.items()]
    elif isinstance(value, (list, tuple)):
        items = list(enumerate(value))
    else:
        raise LandscapeError(f"{name} must be a list of {what}, one per client, or a {{client number: ...}} "
                             f"mapping, not {type(value).__name__}")
    if not items:
        raise LandscapeError(f"{name} is empty: give {what} of at least one client")
    return sorted(items, key=lambda item: item[0])


def _client_data(clients_data: Any, eval_batch_size: Any) -> dict[int, AnalysisData]:
    pair = isinstance(clients_data, (list, tuple)) and len(clients_data) == 2 and all(
        isinstance(t, Tensor) for t in clients_data)
    if pair:
        raise LandscapeError("clients_data is one (inputs, targets) pair of tensors: give a list with one entry "
                             "per client ([(x, y)] for one client)")
    items = _entries(clients_data, "clients_data", "the clients' data")
    return {i: as_data(d, eval_batch_size, name=f"clients_data[{i}]") for i, d in items}


def _union(parts: dict[int, AnalysisData], eval_batch_size: int | None) -> AnalysisData:
    """The clients' samples one after the other (by client number): F's data when no ``data`` is given."""
    (first, a), *rest = parts.items()
    for i, b in rest:
        if b.x.shape[1:] != a.x.shape[1:] or b.y.shape[1:] != a.y.shape[1:] or b.y.dtype != a.y.dtype:
            raise LandscapeError(
                f"clients_data[{i}] holds inputs [{', '.join(map(str, b.x.shape[1:]))}] and {b.y.dtype} targets "
                f"[{', '.join(map(str, b.y.shape[1:]))}], clients_data[{first}] inputs "
                f"[{', '.join(map(str, a.x.shape[1:]))}] and {a.y.dtype} targets "
                f"[{', '.join(map(str, a.y.shape[1:]))}] (per sample): they have no union to be F's data; give it "
                "as data=")
    x, y = torch.cat([p.x for p in parts.values()]), torch.cat([p.y for p in parts.values()])
    return AnalysisData(x, y, eval_batch_size or DEFAULT_EVAL_BATCH, name="the union of clients_data")


def _objectives(model: Any, clients_data: Any, data: Any, *, loss: Any, bn_mode: str, eval_batch_size: Any,
                device: Any, dtype: Any, union: bool = True) -> tuple[Objective | None, dict[int, Objective], Tensor]:
    """F (over ``data`` or the clients' union; None when ``union`` is False and no ``data`` is given) and every
    F_i, on one copy of the model on the analysis device and in its dtype, and w, the model's trainable
    parameters."""
    device, dtype = checks.placement(_module(model), device, dtype)
    if eval_batch_size is not None:
        eval_batch_size = checks.whole("batch_size", eval_batch_size)
    parts = _client_data(clients_data, eval_batch_size)
    if data is not None:
        f_data = as_data(data, eval_batch_size, name="data")
    else:
        f_data = _union(parts, eval_batch_size) if union else None
    flat = checks.analysis_model(model, device, dtype, bn_mode)  # a copy, laid out as `landscape analyze`'s
    buffers = flat.buffers()
    # the clients' first: a sample that does not fit the model is named by its client, not as one of the union's
    clients = {i: Objective(flat, buffers, d.place(device, dtype), bn_mode, loss=loss) for i, d in parts.items()}
    glob = None if f_data is None else Objective(flat, buffers, f_data.place(device, dtype), bn_mode, loss=loss)
    return glob, clients, flat.vector()


def _updates(reference: FlatModel, device: torch.device, start: Any, client_models: Any, new_global: Any,
             previous_global: Any) -> UpdateAlignmentResult | None:
    if start is None and client_models is None:
        if new_global is not None or previous_global is not None:
            raise LandscapeError("new_global and previous_global are for the update cosines: give start and "
                                 "client_models with them")
        return None
    if start is None or client_models is None:
        missing = "start (the model the clients started from)" if start is None else \
            "client_models (the clients' final models)"
        raise LandscapeError(f"the update cosines need start and client_models: give {missing} too")

    def vector(value: Any, what: str) -> Tensor:
        return _vector(value, reference, what).to(device, torch.float64)

    ys = {i: vector(m, f"client_models[{i}]") for i, m in _entries(client_models, "client_models",
                                                                    "the clients' models")}
    new, previous = (None if v is None else vector(v, what) for v, what in ((new_global, "new_global"),
                                                                            (previous_global, "previous_global")))
    return update_alignment(vector(start, "start"), ys, new, previous)


def _vector(value: Any, reference: FlatModel, what: str) -> Tensor:
    """The trainable parameters of ``value`` (an nn.Module, a flat vector or a state_dict), checked finite and of
    the reference model's shapes."""
    if isinstance(value, Tensor):
        vector = value.detach().reshape(-1)
    elif isinstance(value, nn.Module):
        trainable = [p for p in value.parameters() if p.requires_grad]
        if [p.shape for p in trainable] != reference.shapes:
            raise LandscapeError(f"{what} is a module of other trainable parameters than the model's")
        vector = torch.cat([p.detach().reshape(-1) for p in trainable])
    elif isinstance(value, Mapping):
        vector = _state_vector(value, reference, what)
    else:
        raise LandscapeError(f"{what} must be an nn.Module, a flat parameter tensor or a state_dict, not "
                             f"{type(value).__name__}")
    if vector.numel() != reference.dim:
        raise LandscapeError(f"{what} has {vector.numel()} parameters, the model {reference.dim} (its trainable "
                             "ones)")
    return checked_vector(vector, what)


def _state_vector(state: Mapping, reference: FlatModel, what: str) -> Tensor:
    for name, shape in zip(reference.names, reference.shapes):
        value = state.get(name)
        if not isinstance(value, Tensor) or value.shape != shape:
            got = "no tensor" if not isinstance(value, Tensor) else f"shape {list(value.shape)}"
            raise LandscapeError(f"{what}: the state_dict has {got} for the model's parameter "
                                 f"{shown(repr(name))} (shape {list(shape)})")
    where = state[reference.names[0]].device
    return torch.cat([state[n].detach().reshape(-1).to(where) for n in reference.names])
