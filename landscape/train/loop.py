"""The round loop: sample -> local train -> aggregate -> log -> checkpoint. No algorithm names here.

Randomness is derived, never carried: client sampling from (seed, round), each client's minibatch order
and augmentation from (seed, round, client), model initialisation from seed. So a run resumed from any
checkpoint, or a round's clients split across processes, gives the same numbers as one uninterrupted run.

``start_run`` and ``resume_run`` are the entry points; the run directory's life (creating it safely, what a
sweep does with it, where a resume starts) is ``landscape.store.lifecycle``, the round schedule
``landscape.train.schedule``, the trainer's state and checkpoints ``landscape.train.state``, data and model
set-up ``landscape.config.setup``.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from torch import Tensor

from landscape.config import recipe as recipes
from landscape.config.recipe import Recipe
from landscape.config.recipe_sections import TrainSettings
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
from landscape.store import lifecycle, tracking
from landscape.store.checkpoints import load_checkpoint
from landscape.store.fileio import RunLock, os_reason, write_text
from landscape.store.lifecycle import ResumePoint
from landscape.store.runs import RunDir
from landscape.train import vectorised
from landscape.train.algorithms import ClientResult, LocalProblem, ParamLayout, ServerRound, build_algorithm
from landscape.train.gather import average_buffers, gather_client_work
from landscape.train.repair import repair_metrics, repair_partition, set_aside_damaged
from landscape.train.schedule import (
    STREAM_CLIENT,
    clients_per_round,
    learning_rate,
    sample_clients,
    swa_cycle_ends,
)
from landscape.train.state import TrainerCheckpoints, TrainerState, divergence


def check_local_work(train: TrainSettings) -> None:
    if train.local_steps == 0 and train.local_epochs == 0:
        raise LandscapeError("train.local_epochs and train.local_steps are both 0: clients would not train")


# ----------------------------------------------------------------------------------------------------------
# the trainer


class Trainer(TrainerCheckpoints):
    """Runs the rounds of one resolved recipe into one run directory."""

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
        self.memory_format = None

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
        local, local_buffers = vectorised.train_clients(self, state, message, clients, lr)
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
        from tqdm.auto import tqdm

        main = parallel.is_main()
        total = self.train_cfg.rounds
        if main and state.round == 0 and not self.run_dir.checkpoint(0).exists():
            self.save(state, None)  # round 0: the initial model (trajectory start, resumable from scratch)
        bar = tqdm(total=total, initial=state.round, desc=self.run_dir.path.name, unit="round",
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


# ----------------------------------------------------------------------------------------------------------
# entry points used by the CLI


def start_run(recipe: Recipe, out: Path, *, overwrite: bool = False, progress: bool = True) -> TrainerState:
    """Validate everything, then create the run directory and train. Nothing is written on bad input.

    The run directory is locked (``RunLock``) while the run trains: a second process is refused. Under
    torchrun rank 0 alone checks, locks and writes the directory; every rank trains."""
    run_dir = RunDir(out)
    parallel.on_main(lambda: lifecycle.check_out_dir(run_dir, overwrite))
    lifecycle.check_recipe_writable(recipe)
    setup = prepare_data(recipe)
    trainer = Trainer(recipe, run_dir, setup)
    with contextlib.ExitStack() as held:

        def open_run_dir() -> None:
            try:
                run_dir.path.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise LandscapeError(f"cannot create {run_dir.path}: {os_reason(e)}") from None
            held.enter_context(RunLock(run_dir))
            lifecycle.check_out_dir(run_dir, overwrite)  # again, locked: another process may have filled it meanwhile
            if overwrite:
                lifecycle.clear_run_dir(run_dir)
            run_dir.remove_stale_temp_files()
            run_dir.mark()  # before recipe.toml: a folder this tool made, whatever happens next
            lifecycle.write_run_files(run_dir, recipe, setup)

        parallel.on_main(open_run_dir)
        return trainer.train(trainer.initial_state(), progress=progress)


def resume_run(path: Path, rounds: int | None = None, progress: bool = True,
               warn: Callable[[str], None] | None = None, threads: int | None = None) -> TrainerState:
    """Continue a run from its last good checkpoint, to the recipe's rounds or to ``rounds`` (with ``threads``
    CPU threads from now on, when given: recorded in recipe.toml).

    Everything is checked before the directory changes (recipe, checkpoint, model shapes, ``rounds``). Then,
    with the run locked: a damaged newest checkpoint is renamed ``round-NNNN.pt.damaged`` (never deleted)
    and ``warn`` (default: a line on stderr) says which checkpoint the run resumes from; temporary files of
    a killed process are removed; metrics rows after the resumed round are dropped (they are recomputed).
    metrics.jsonl keeps every intact row: a damaged line goes to ``metrics.jsonl.damaged``, and the rows of
    rounds up to the checkpoint that have none are recomputed from an earlier checkpoint (the checkpoints
    are not touched); a partition.json that is not the recipe's partition is renamed
    ``partition.json.damaged`` and written again; a thread count other than the checkpoint's is named.
    Each of these says so through ``warn``. Under torchrun rank 0 alone locks, chooses the checkpoint and
    changes the directory; the other ranks load the checkpoint it chose (the run directory must be on a
    file system every machine sees).
    """
    warn = warn or lifecycle.print_warning
    run_dir = RunDir(path)
    with contextlib.ExitStack() as held:
        found: dict[str, ResumePoint] = {}

        def locate() -> tuple[Recipe, Path | None, lifecycle.MetricsRepair, int, bool]:
            if not run_dir.path.is_dir() or not run_dir.is_run():
                raise LandscapeError(f"{path} is not a run directory (no recipe.toml); nothing to resume")
            recorded = recipes.read_recipe(run_dir.recipe)
            changed = {"train.rounds": rounds, "train.threads": threads}
            recipe = recorded.with_values({k: v for k, v in changed.items() if v is not None})
            held.enter_context(RunLock(run_dir))
            point = found["point"] = lifecycle.find_resume_point(run_dir)
            if rounds is not None and rounds < point.round:
                raise LandscapeError(f"--rounds {rounds} is below the last checkpoint's round {point.round}")
            repair = lifecycle.plan_metrics_repair(run_dir, point.round)
            return recipe, point.path, repair, recorded.train.rounds, recipe != recorded

        recipe, checkpoint_path, repair, recorded_rounds, changed = parallel.on_main(locate)
        point = found.get("point")
        if point is None:  # a rank other than 0: the checkpoint rank 0 chose
            checkpoint = load_checkpoint(checkpoint_path) if checkpoint_path is not None else None
            point = ResumePoint(0 if checkpoint is None else int(checkpoint["round"]), checkpoint, checkpoint_path)
        trainer = Trainer(recipe, run_dir)
        if point.checkpoint is not None:
            state = trainer.state_from_checkpoint(point.checkpoint, point.path)
            target = f"resuming from {point.path.name}"
        else:
            state = trainer.initial_state()
            target = "starting again from the initial model (round 0)"
        recomputed = replay_rows(trainer, repair, point.round, recorded_rounds) if repair.missing else []
        trained_with = point.checkpoint.get("threads") if point.checkpoint is not None else None

        def prepare() -> None:
            # Every check has passed: from here on the directory changes.
            set_aside_damaged(run_dir, point, target, warn)
            if type(trained_with) is int and trained_with != trainer.threads:
                warn(f"{point.path.name} was trained with {trained_with} CPU thread{'s' if trained_with > 1 else ''}, "
                     f"this resume uses {trainer.threads} (train.threads): its rounds may differ in the last bits "
                     "from a run that kept one count")
            run_dir.remove_stale_temp_files()
            repair_partition(run_dir, recipe, trainer.setup, warn)
            repair_metrics(run_dir, repair, state.round, recomputed, warn)
            if changed:  # --rounds, --threads
                write_text(run_dir.recipe, trainer.recipe_text)

        parallel.on_main(prepare)
        return trainer.train(state, progress=progress)


def replay_rows(trainer: Trainer, repair: lifecycle.MetricsRepair, until: int, final: int) -> list[dict]:
    """The metrics rows of ``repair.missing``, recomputed by running the rounds again from ``repair.start``
    (or the initial model) up to round ``until``; nothing is written. The test set is evaluated where the run
    evaluated it (every eval_every rounds and at its last round, ``final``)."""
    checkpoint = load_checkpoint(repair.start) if repair.start is not None else None
    state = trainer.state_from_checkpoint(checkpoint, repair.start) if checkpoint else trainer.initial_state()
    rows = []
    with using_threads(trainer.train_cfg.threads):
        while state.round < until:
            state, _, row = trainer.run_round(state)
            if state.round not in repair.missing:
                continue
            if state.round == final and "test_acc" not in row and parallel.is_main():
                row["test_loss"], row["test_acc"] = trainer.evaluate(state)
                row["seconds"] = row.pop("seconds")
            rows.append(row)
    return rows
