"""The trainer's state (``TrainerState``: what a round changes) and its checks: what a training checkpoint must
hold (``check_training_state``), what diverged after a round (``divergence``) and what to try then, the data's
scale or the step size (``divergence_advice``). The trainer
(``landscape.train.trainer.Trainer``) writes the state to checkpoints and reads it back."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from landscape.config.sections import DatasetSettings
from landscape.core.errors import LandscapeError
from landscape.data.datasets import dataset_option_defaults
from landscape.train.algorithms import Tensors

# Inputs models train on are of unit scale (standardised features, images in [0, 1], signals): training inputs
# beyond this magnitude make the divergence the data's, not the step size's.
INPUT_SCALE = 1e4


@dataclass
class TrainerState:
    round: int  # rounds completed; the global model is x^round
    x: Tensor
    buffers: dict[str, Tensor]
    server_state: Tensors  # the algorithm's ServerState
    # the ClientState of each client that has one; on the CPU between rounds
    client_states: dict[int, Tensors]
    swa_model: Tensor | None = None  # server SWA average x_swa, once a cycle has closed
    swa_count: int = 0
    # (s^round, its buffers): the model the last round's clients started from (recorded beside their models);
    # None before a round has run in this process
    round_start: tuple[Tensor, dict[str, Tensor]] | None = None

    @property
    def model(self) -> Tensor:
        """The model that evaluation and analysis use: x_swa once it exists, else x."""
        return self.swa_model if self.swa_model is not None else self.x


def check_training_state(ckpt: dict, path: Path, num_clients: int) -> None:
    """The parts of a checkpoint that only training reads: its round (the one in its file name), the server
    state and the clients' states (named tensors each); else a one-line error naming the file."""
    def problem() -> str | None:
        found = re.match(r"^round-(\d+)\.pt$", Path(path).name)
        round_ = ckpt.get("round")
        if type(round_) is not int:
            return f"its round is {round_!r}, not a whole number"
        if found and int(found.group(1)) != round_:
            return f"it holds round {round_}, its name says round {int(found.group(1))}"
        server = ckpt.get("server_state")
        if not isinstance(server, dict) or not all(isinstance(k, str) and isinstance(v, Tensor)
                                                   for k, v in server.items()):
            return "its server state is not a table of named tensors"
        clients = ckpt.get("client_states")
        if not isinstance(clients, dict):
            return "its client states are not a table"
        for key, state in clients.items():
            if not (isinstance(key, str) and key.isdigit() and int(key) < num_clients):
                return f"it holds the state of a client {key!r} this run does not have"
            if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, Tensor)
                                                       for k, v in state.items()):
                return f"the state of client {key} is not a table of named tensors"
        return None

    why = problem()
    if why is not None:
        raise LandscapeError(f"{path} is not a complete training checkpoint ({why})")


def divergence(state: TrainerState, row: dict) -> list[str]:
    """What is not finite after a round: the loss, the update, the parameters (BatchNorm statistics and the
    SWA average included), the server state and the states of the round's clients (``row["clients"]``: the
    others did not change). Empty when the round is sound; so every checkpoint training saves is finite."""
    problems = [f"{key}={row[key]}" for key in ("train_loss", "update_norm") if not math.isfinite(row[key])]
    tensors = {"parameters": state.x, "SWA average": state.swa_model}
    tensors.update({f"buffer {k}": v for k, v in state.buffers.items() if v.is_floating_point()})
    server = state.server_state.named()
    tensors.update({f"server state {k}": v for k, v in server.items() if v.is_floating_point()})
    for client in row.get("clients", ()):
        client_state = state.client_states.get(client)
        named = client_state.named() if client_state is not None else {}
        tensors.update({f"state {k} of client {client}": v
                        for k, v in named.items() if v.is_floating_point()})
    for what, tensor in tensors.items():
        if tensor is not None:
            bad = int((~torch.isfinite(tensor)).sum())
            if bad:
                problems.append(f"{bad} non-finite {what}" if what == "parameters" else f"non-finite {what}")
    return problems


def divergence_advice(train_x: Tensor, dataset: DatasetSettings) -> str:
    """What to try after a divergence: where the training inputs reach beyond ``INPUT_SCALE`` in magnitude the
    data is the cause (named with the data set and its options that scale it: the non-default numbers, e.g.
    dataset.beta), else a smaller step (train.lr, train.clip_norm)."""
    step = "a smaller train.lr or train.clip_norm may help"
    largest = float(train_x.detach().abs().max()) if train_x.numel() and train_x.is_floating_point() else 0.0
    if not largest > INPUT_SCALE:
        return step
    try:
        defaults = dataset_option_defaults(dataset.name)
    except LandscapeError:  # a data set this process does not know (a factory): no options to name
        defaults = {}
    changed = [k for k, v in dict(dataset.options).items()
               if isinstance(v, float) and k in defaults and defaults[k] != v]
    setting = ", ".join(f"dataset.{k}={dataset.options[k]:g}" for k in changed)
    return (f"the training inputs reach |x| = {largest:.3g} (data set {dataset.name}"
            + (f" with {setting}" if setting else "") + "), far beyond the unit scale models train on: the data is "
            "the likely cause, whatever train.lr is: "
            + (f"choose smaller values of {', '.join(f'dataset.{k}' for k in changed)}" if changed
               else "standardise the inputs"))
