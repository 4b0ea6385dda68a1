"""Client work of a round gathered across ranks; averaged BatchNorm statistics.

``gather_client_work`` collects the clients' results and BatchNorm statistics of all torchrun ranks,
``average_buffers`` is the server average of those statistics.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor

from landscape.core import parallel
from landscape.train.algorithms import Algorithm, ClientResult, Tensors


def gather_client_work(
    results: list[ClientResult], buffers: list[dict[str, Tensor]], device: torch.device, algorithm: Algorithm
) -> tuple[list[ClientResult], list[dict[str, Tensor]]]:
    """Every rank's client results and BatchNorm statistics, on every rank, in the order of the ranks'
    blocks (``parallel.shard``): the round's client order. Tensors travel bit for bit (uploads and client
    states by the field names of ``algorithm``'s ``Upload`` and ``ClientState``); in a single process the
    lists come back as they are."""
    if parallel.world_size() == 1:
        return results, buffers
    described, tensors = [], []
    for r, b in zip(results, buffers):
        loss_is_tensor = isinstance(r.train_loss, Tensor)
        described.append({"client": r.client, "num_steps": r.num_steps, "state": r.state is not None,
                          "buffers": list(b), "train_loss": None if loss_is_tensor else float(r.train_loss)})
        kept = r.state.named() if r.state is not None else {}
        tensors += [r.model, *r.upload.named().values(), *kept.values(), *b.values()]
        if loss_is_tensor:
            tensors.append(r.train_loss)

    def take(kind: type[Tensors], stream: Iterator[Tensor]) -> Tensors:  # the next tensors, by kind's fields
        return kind.from_named({name: next(stream) for name in kind.names()})

    all_results, all_buffers = [], []
    for meta, received in zip(parallel.all_gather_objects(described),
                              parallel.all_gather_tensors(tensors, device)):
        stream = iter(received)
        for m in meta:
            model = next(stream)
            upload = take(algorithm.Upload, stream)
            state = take(algorithm.ClientState, stream) if m["state"] else None
            all_buffers.append({k: next(stream) for k in m["buffers"]})
            loss = next(stream) if m["train_loss"] is None else m["train_loss"]
            all_results.append(ClientResult(m["client"], model, upload, state, loss, m["num_steps"]))
    return all_results, all_buffers


def average_buffers(client_buffers: list[dict[str, Tensor]]) -> dict[str, Tensor]:
    """Server average of BatchNorm statistics (integer counters averaged and rounded)."""
    out = {}
    for name, ref in client_buffers[0].items():
        stacked = torch.stack([b[name] for b in client_buffers])
        out[name] = (stacked.double().mean(0).round().to(ref.dtype) if not ref.is_floating_point()
                     else stacked.mean(0))
    return out
