"""The trainer: one resolved recipe's rounds run into one run directory (sample -> local train -> aggregate -> log
-> checkpoint), and its state's checkpoint form. No algorithm names here.

Randomness is derived, never carried: client sampling from (seed, round), each client's minibatch order
and augmentation from (seed, round, client), model initialisation from seed. So a run resumed from any
checkpoint, or a round's clients split across processes, gives the same numbers as one uninterrupted run.

The entry points that start and resume a run are ``landscape.train.loop``; the round schedule
``landscape.train.schedule``; the state and its checks ``landscape.train.state``; how a round's clients are
trained (one after another, or together) ``landscape.train.vectorised``; data and model set-up
``landscape.config.setup``.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import Tensor

from landscape.config import recipe as recipes
from landscape.config.recipe import Recipe
from landscape.config.sections import TrainSettings
from landscape.config.setup import (
    DataSetup,
    build_module,
    derived_seed,
    prepare_data,
    resolve_device,
    thread_count,
    torch_dtype,
    using_threads,
)
from landscape.core import parallel
from landscape.core.distances import round_distances
from landscape.core.errors import LandscapeError
from landscape.core.flat import FlatModel
from landscape.core.memory_format import MemoryFormatChoice, choose_memory_format, recorded_choice
from landscape.store import tracking
from landscape.store.checkpoints import CHECKPOINT_FORMAT, Checkpoint
from landscape.store.directory import RunDir
from landscape.store.writer import write_round_files
from landscape.train.algorithms import (
    ClientResult,
    LocalProblem,
    ParamLayout,
    ServerRound,
    Tensors,
    build_algorithm,
)
from landscape.train.gather import average_buffers, gather_client_work
from landscape.train.schedule import (
    STREAM_CLIENT,
    clients_per_round,
    learning_rate,
    sample_clients,
    swa_cycle_ends,
)
from landscape.train.state import TrainerState, check_training_state, divergence, divergence_advice
from landscape.train.vectorised import ClientTraining


def check_local_work(train: TrainSettings) -> None:
    if train.local_steps == 0 and train.local_epochs == 0:
        raise LandscapeError("train.local_epochs and train.local_steps are both 0: clients would not train")


class Trainer:
    """Runs the rounds of one resolved recipe into one run directory: its set-up, one client's problem, one round,
    the loop of rounds, and its state's checkpoint form (make, save, restore; stop when a round diverged). The
    round's clients are trained by the strategy it holds, ``clients`` (``landscape.train.vectorised``)."""

    def __init__(self, recipe: Recipe, run_dir: RunDir, setup: DataSetup | None = None) -> None:
        self.recipe = recipe
        self.train_cfg = recipe.train
        check_local_work(self.train_cfg)
        tracking.check_installed(self.train_cfg.log)  # train.log's trackers, before anything is built
        self.run_dir = run_dir
        self.setup = setup or prepare_data(recipe)
        self.device = resolve_device(self.train_cfg.device)
        self.dtype = torch_dtype(self.train_cfg.dtype)
        module = build_module(recipe, self.setup.bundle).to(self.device, self.dtype)
        self.flat = FlatModel(module)
        if self.train_cfg.compile:
            self.flat.compile()  # the training model only: analysis builds its own, never compiled
        # Mixed precision: bfloat16 autocast around the local forward/backward passes only (evaluation,
        # aggregation and every analysis stay in the recipe's dtype).
        self.autocast_dtype = torch.bfloat16 if self.train_cfg.precision == "bf16" else None
        self.algorithm = build_algorithm(recipe, ParamLayout(tuple(self.flat.names), tuple(map(tuple, self.flat.shapes))))
        bundle = self.setup.bundle
        # Small data sets live on the device for the whole run.
        self.train_x = bundle.train.x.to(self.device, self.dtype)
        self.train_y = bundle.train.y.to(self.device)
        self.test_x = bundle.test.x.to(self.device, self.dtype)
        self.test_y = bundle.test.y.to(self.device)
        self.client_idx = [torch.as_tensor(ix, dtype=torch.long) for ix in self.setup.client_indices]
        self.num_clients = len(self.client_idx)
        self.per_round = clients_per_round(self.train_cfg, self.num_clients)
        self.recipe_text = recipes.to_toml(recipe)
        self.threads = thread_count(self.train_cfg.threads)  # recorded in every checkpoint
        # train.memory_format's layout (landscape.core.memory_format), decided when the run's state begins,
        # since a resume takes its checkpoint's: initial_state / state_from_checkpoint (settle_memory_format)
        self.memory_format: MemoryFormatChoice | None = None
        self.clients = ClientTraining(self)  # one after another, or together (train.vectorize)

    # -- its state and checkpoints ------------------------------------------------------------------------------------------
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
            "vectorized": self.clients.choice.record(),  # train.vectorize's choice and why (equal to tolerance)
        }
        if state.swa_model is not None:
            payload["swa_model"] = self.flat.state_dict(state.swa_model, state.buffers)
            payload["swa_count"] = state.swa_count
        return payload

    def state_from_checkpoint(self, ckpt: dict, path: Path) -> TrainerState:
        """The training state in a checkpoint, after checking that it belongs to this recipe and model."""
        checkpoint = Checkpoint(path, ckpt)
        if checkpoint.recipe_text is not None:
            difference = recipes.difference(checkpoint.recipe_text, self.recipe, recipes.RESUME_FREE_KEYS)
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
        """The round's files, written as every recorded run's are (``store.writer.write_round_files``): with
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
            f"metrics.jsonl ({divergence_advice(self.train_x, self.recipe.dataset)})"
        )

    # -- one client -------------------------------------------------------------------------------------
    def mixed_precision(self) -> contextlib.AbstractContextManager:
        """bfloat16 autocast when ``train.precision = "bf16"`` (local forward/backward only), else nothing."""
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def _batch_indices(self, client: int, generator: torch.Generator) -> list[Tensor]:
        """Minibatch index tensors of one client's round: shuffled epochs, last batch of an epoch shorter."""
        idx = self.client_idx[client]
        bs, steps, epochs = self.train_cfg.batch_size, self.train_cfg.local_steps, self.train_cfg.local_epochs
        batches: list[Tensor] = []
        while True:
            perm = idx[torch.randperm(len(idx), generator=generator)]
            for chunk in perm.split(bs):
                batches.append(chunk)
                if steps and len(batches) == steps:
                    return batches
            if not steps and len(batches) == epochs * math.ceil(len(idx) / bs):
                return batches

    def local_problem(self, client: int, round: int, lr: float, buffers: dict[str, Tensor]) -> LocalProblem:
        generator = torch.Generator().manual_seed(derived_seed(self.recipe.seed, STREAM_CLIENT, round, client))
        batch_idx = self._batch_indices(client, generator)
        # The round's minibatch indices reach the device in one copy, not one per step.
        batch_idx = list(torch.cat(batch_idx).to(self.device).split([len(b) for b in batch_idx]))
        augment = self.setup.bundle.augmentation

        def stream() -> Iterator[tuple[Tensor, Tensor]]:
            for b in batch_idx:
                xb = self.train_x[b]
                if augment is not None:
                    xb = augment(xb, generator)
                yield xb, self.train_y[b]

        def oracle(w: Tensor, batch: tuple[Tensor, Tensor], update_stats: bool) -> tuple[Tensor, Tensor]:
            stats = buffers if update_stats else {k: v.clone() for k, v in buffers.items()}
            with self.mixed_precision():
                return self.flat.loss_and_grad(w, batch[0], batch[1], stats)

        return LocalProblem(
            client=client,
            round=round,
            lr=lr,
            weight_decay=self.train_cfg.weight_decay,
            clip_norm=self.train_cfg.clip_norm,
            num_steps=len(batch_idx),
            batch_stream=stream,
            oracle=oracle,
        )

    # -- one round --------------------------------------------------------------------------------------
    def run_round(self, state: TrainerState) -> tuple[TrainerState, list[ClientResult], dict]:
        """One round. Under torchrun each rank trains its block of the round's clients (a client's work is
        seeded by (seed, round, client), so it does not depend on the rank), the results are gathered in
        client order, and every rank runs the same server step on them: all ranks keep the whole server and
        client state. Rank 0's aggregate is then broadcast, so the ranks can never drift apart."""
        t = state.round
        started = time.perf_counter()
        lr = learning_rate(self.train_cfg, t)
        clients = sample_clients(self.recipe.seed, t, self.num_clients, self.per_round)
        message = self.algorithm.broadcast(state.x, state.server_state, t)
        self.flat.module.train()
        # this rank's block, one after another or together (train.vectorize: landscape.train.vectorised)
        local, local_buffers = self.clients.train(state, message, clients, lr)
        results, client_buffers = gather_client_work(local, local_buffers, self.device, self.algorithm)
        client_states = dict(state.client_states)
        for result in results:
            if result.state is not None:
                client_states[result.client] = result.state.to("cpu")
        server_round = ServerRound(t, lr, tuple(r.num_steps for r in results))
        uploads = [r.upload for r in results]
        x_new, server_state = self.algorithm.aggregate(state.x, state.server_state, uploads, server_round)
        new_buffers = average_buffers(client_buffers) if client_buffers and state.buffers else state.buffers
        new_buffers.update({n: state.buffers[n] for n in self.flat.frozen_names})  # constants: never averaged
        swa_model, swa_count = state.swa_model, state.swa_count
        if swa_cycle_ends(self.train_cfg, t):  # x_swa = (n * x_swa + x^{t+1}) / (n + 1)
            swa_model = x_new.clone() if swa_model is None else (swa_count * swa_model + x_new) / (swa_count + 1)
            swa_count += 1
        server_tensors = [x_new, *server_state.named().values(), *new_buffers.values()]
        parallel.broadcast_tensors(server_tensors + ([swa_model] if swa_model is not None else []))
        new_state = TrainerState(t + 1, x_new, new_buffers, server_state, client_states, swa_model, swa_count,
                                 (self.algorithm.start_point(message), state.buffers))

        # Flatness distance (docs/metrics.md), the FedNSAM paper's: Delta_D = mean_S ||y_{i,K} - ybar||^2 around the
        # clients' mean ybar, beside its scale-free companion Delta_D / mean_S ||y_{i,K} - s^t||^2; the distance to
        # the new global model x^{t+1} under its own name (landscape.core.distances).
        distances = round_distances(torch.stack([r.model for r in results]), x_new, new_state.round_start[0])
        row = {
            "round": t + 1,
            "lr": lr,
            "clients": clients,
            "train_loss": torch.stack([torch.as_tensor(r.train_loss, dtype=torch.float64) for r in results])
            .mean()
            .item(),
            **distances,
            "update_norm": (x_new - state.x).norm().item(),
            "uplink_floats": sum(r.uplink_floats for r in results) / len(results),
        }
        if self.train_cfg.swa:
            row["swa_models"] = swa_count
        evaluate = (t + 1) % self.train_cfg.eval_every == 0 or t + 1 == self.train_cfg.rounds
        if evaluate and parallel.is_main():  # only rank 0 logs
            row["test_loss"], row["test_acc"] = self.evaluate(new_state)
        row["seconds"] = time.perf_counter() - started
        return new_state, results, row

    def evaluate(self, state: TrainerState) -> tuple[float, float]:
        return self.flat.evaluate(state.model, state.buffers, self.test_x, self.test_y)

    def train(self, state: TrainerState, progress: bool = True) -> TrainerState:
        """Run rounds from ``state.round`` to the recipe's rounds, logging and checkpointing (rank 0 only:
        the other ranks of a torchrun job compute their clients and keep the same state)."""
        from landscape.core.progress import progress_bar

        main = parallel.is_main()
        total = self.train_cfg.rounds
        if main and state.round == 0 and not self.run_dir.checkpoint(0).exists():
            self.save(state, None)  # round 0: the initial model (trajectory start, resumable from scratch)
        bar = progress_bar(total=total, initial=state.round, desc=self.run_dir.path.name, unit="round",
                           disable=not (progress and main), dynamic_ncols=True, leave=True)
        try:
            # the recipe's threads, never the machine's; train.log's trackers on rank 0
            with using_threads(self.train_cfg.threads), tracking.for_training(self.run_dir, self.recipe,
                                                                              main) as tracked:
                while state.round < total:
                    state, results, row = self.run_round(state)
                    problems = divergence(state, row)
                    if problems:
                        self.stop_diverged(state, row, problems)
                    if main:
                        self.run_dir.append_metrics(row)
                        tracked.log_row(row)  # train.log: TensorBoard, Weights & Biases (none: nothing)
                        if state.round % self.train_cfg.checkpoint_every == 0 or state.round == total:
                            self.save(state, results)
                    postfix = {"loss": f"{row['train_loss']:.3f}"}
                    if "test_acc" in row:
                        postfix["acc"] = f"{row['test_acc']:.3f}"
                    bar.set_postfix(postfix)
                    bar.update(1)
        finally:
            bar.close()
        parallel.barrier()  # the other ranks return once rank 0 has written the last files
        return state
