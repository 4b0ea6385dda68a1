"""The trainer's state and its checkpoint form: save, restore, checks.

``TrainerState`` is what a round changes; writing it to a checkpoint and reading it back, the checks a
training checkpoint must pass, and what diverged after a round live here.

``TrainerCheckpoints`` holds the methods of ``landscape.train.loop.Trainer`` that make, save and restore its
state, and stop it when a round diverged; ``check_training_state`` and ``divergence`` are their checks.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from landscape.config import recipe as recipes
from landscape.config.recipe import Recipe
from landscape.config.recipe_sections import TrainSettings
from landscape.core import parallel
from landscape.core.errors import LandscapeError
from landscape.core.flat import FlatModel
from landscape.core.memory_format import MemoryFormatChoice, choose_memory_format, recorded_choice
from landscape.store import lifecycle
from landscape.store.checkpoints import CHECKPOINT_FORMAT, Checkpoint
from landscape.store.run_writer import write_round_files
from landscape.store.runs import RunDir
from landscape.train.algorithms import Algorithm, ClientResult, Tensors
from landscape.train.vectorised import vectorisation


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


class TrainerCheckpoints:
    """The state half of ``landscape.train.loop.Trainer``, which sets the attributes named here."""

    recipe: Recipe
    train_cfg: TrainSettings
    run_dir: RunDir
    flat: FlatModel
    algorithm: Algorithm
    device: torch.device
    dtype: torch.dtype
    num_clients: int
    recipe_text: str
    threads: int
    train_x: Tensor
    train_y: Tensor
    memory_format: MemoryFormatChoice | None  # None until the run's state begins (settle_memory_format)

    # -- state ------------------------------------------------------------------------------------------
    def initial_state(self) -> TrainerState:
        self.settle_memory_format()
        x = self.flat.vector()
        return TrainerState(0, x, self.flat.buffers(), self.algorithm.init_server_state(x), {})

    def checkpoint_payload(self, state: TrainerState) -> dict:
        def cpu(state: Tensors) -> dict[str, Tensor]:  # a checkpoint's table: the tensors by field name
            return {k: v.detach().cpu() for k, v in state.named().items()}

        payload = {
            "format": CHECKPOINT_FORMAT,
            "round": state.round,
            "model": self.flat.state_dict(state.x, state.buffers),
            "server_state": cpu(state.server_state),
            "client_states": {str(i): cpu(s) for i, s in sorted(state.client_states.items())},
            "rng": {"seed": self.recipe.seed, "scheme": "SeedSequence(seed, stream, round[, client])"},
            "recipe": self.recipe_text,
            "threads": self.threads,
            "memory_format": self.settle_memory_format().record(),  # train.memory_format's layout and why
            "vectorized": vectorisation(self).record(),  # train.vectorize's choice and why (equal to tolerance)
        }
        if state.swa_model is not None:
            payload["swa_model"] = self.flat.state_dict(state.swa_model, state.buffers)
            payload["swa_count"] = state.swa_count
        return payload

    def state_from_checkpoint(self, ckpt: dict, path: Path) -> TrainerState:
        """The training state in a checkpoint, after checking that it belongs to this recipe and model."""
        checkpoint = Checkpoint(path, ckpt)
        if checkpoint.recipe_text is not None:
            difference = recipes.difference(checkpoint.recipe_text, self.recipe, lifecycle.RESUME_FREE_KEYS)
            if difference:
                raise LandscapeError(f"{path} was written by another recipe ({difference}); it cannot "
                                     "continue this run")
        checkpoint.check_model(self.flat.state_dict(self.flat.vector(), self.flat.buffers()),
                               self.recipe.model.name, self.dtype)
        check_training_state(ckpt, path, self.num_clients)
        self.settle_memory_format(ckpt, path)
        try:
            x, buffers = self.flat.from_state_dict(ckpt["model"])
            swa_model = self.flat.from_state_dict(ckpt["swa_model"])[0] if "swa_model" in ckpt else None
            return TrainerState(
                int(ckpt["round"]),
                x,
                buffers,
                self.algorithm.ServerState.from_named(ckpt["server_state"]).to(self.device),
                {int(i): self.algorithm.ClientState.from_named(s) for i, s in ckpt["client_states"].items()},
                swa_model,
                int(ckpt.get("swa_count", 0)),
            )
        except (KeyError, TypeError, ValueError, AttributeError, RuntimeError) as e:
            what = (f"no '{e.args[0]}'" if isinstance(e, KeyError) and e.args
                    else str(e).strip().splitlines()[0])
            raise LandscapeError(f"{path} is not a complete training checkpoint ({what})") from None

    def settle_memory_format(self, checkpoint: dict | None = None, path: Path | None = None) -> MemoryFormatChoice:
        """``train.memory_format``'s layout for this run, decided once, when its state begins, and set on the
        training model: the layout the recipe names; for "auto", the choice a checkpoint recorded when the
        state comes from one (a resume keeps the run's layout; a checkpoint from before the setting:
        contiguous), else ``choose_memory_format``'s rule, from the model and the device alone."""
        if self.memory_format is not None:
            return self.memory_format
        setting = self.train_cfg.memory_format
        if setting == "auto" and checkpoint is not None:
            choice = recorded_choice(checkpoint.get("memory_format"), str(path))
        else:
            choice = choose_memory_format(setting, self.flat, self.device)
        self.memory_format = choice
        self.flat.channels_last = choice.channels_last
        return choice

    def save(self, state: TrainerState, results: list[ClientResult] | None) -> None:
        """The round's files, written as every recorded run's are (``run_writer.write_round_files``): with
        --keep-clients the clients' final models and the point they started from, s^t (run format 2)."""
        kept = None
        if self.train_cfg.keep_clients and results:
            kept = {"start": self.flat.state_dict(*state.round_start),
                    "clients": {str(r.client): self.flat.state_dict(r.model, state.buffers) for r in results}}
        payload = self.checkpoint_payload(state)
        write_round_files(self.run_dir, state.round, {k: v for k, v in payload.items()
                                                      if k not in ("format", "round")}, kept)

    def stop_diverged(self, state: TrainerState, row: dict, problems: list[str]) -> None:
        """Record the divergence in metrics.jsonl and stop: the diverged state is never checkpointed."""
        algorithm = self.recipe.algorithm.name

        def record() -> str:
            rounds = self.run_dir.rounds()
            last = self.run_dir.checkpoint(rounds[-1]).relative_to(self.run_dir.path) if rounds else None
            self.run_dir.append_event(
                "diverged", state.round, algorithm=algorithm, lr=row["lr"], train_loss=row["train_loss"],
                update_norm=row["update_norm"], problems=problems,
                last_checkpoint=str(last) if last else None,
            )
            return f"the last good checkpoint {last} is kept" if last else "no checkpoint was written"

        kept = parallel.on_main(record)
        raise LandscapeError(
            f"training diverged in round {state.round} ({algorithm}, lr {row['lr']:g}): "
            f"{', '.join(problems)}; stopped without saving that state, {kept}, the event is in "
            "metrics.jsonl (a smaller train.lr or "
            "train.clip_norm may help)"
        )


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
