"""A round's clients trained together: one vmapped gradient per local step for all of them (``train.vectorize``).

Why threads and not a rewrite of the rules: the 14 client rules are plain Python loops calling
``problem.loss_and_grad(w, batch)`` (SAM's two calls per step, FedSMOO's dual step, ...). Each client's
``client_update`` runs unchanged in its own thread; its oracle hands (w, batch) to the round's ``Lockstep`` and
waits. Once every client still working has asked, the main thread computes all their minibatch losses and
gradients in one ``torch.func.vmap`` of ``grad_and_value`` of a ``functional_call`` loss over the stacked
w's and batches (grouped by batch shape: the last batch of an epoch is shorter; a request alone in its group
goes through ``FlatModel.loss_and_grad`` as in the sequential loop) and hands each its answer. A client that
has finished leaves the group, so clients of different sizes simply stop asking. What a rule computes is
therefore the same as one after another, but for the rounding of a batched matrix product: the results equal
the sequential loop's to float tolerance, not bit for bit (tests/test_vectorised_clients.py: 1e-9 relative
in float64), so ``train.vectorize`` is a place key like ``train.threads``.

Kept as in the sequential loop: results in client order; each client's minibatch order and augmentation from
its own generator (no rule touches the global RNG); under torchrun each rank trains its block in lockstep;
bf16 autocast wraps the vmapped pass as it wraps a client's; an exception in a client's rule (or in the
vmapped pass) stops the others at their next request and is raised as it is, after every thread has ended.
Not vectorised (one after another, said once when ``"on"`` asked for it): models with BatchNorm running
statistics (each client updates its own copy in place, which one vmapped pass cannot do simply) or dropout
(its masks come from the global RNG). The vmapped pass runs the model's plain forward, never a
``train.compile`` one.

``"auto"`` vectorises on a CUDA device (where one vmapped pass keeps the device busy that one small client
cannot) and stays sequential on the CPU: one core computes the stacked batches at best as fast as one after
another (a batched product does the same arithmetic), and the lockstep's thread switches only add to it. The
rule reads the device alone, never a timing (an earlier release timed both ways at start-up, so that a run's
numbers depended on the machine's load; issue 43); benchmarks/gpu_check.py measures both ways.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import grad_and_value, vmap

from landscape.config.sections import TrainSettings
from landscape.core import parallel
from landscape.core.flat import FlatModel
from landscape.store.lifecycle import print_warning
from landscape.train.algorithms import Algorithm, ClientResult, LocalProblem
from landscape.train.state import TrainerState


class Trainer(Protocol):
    """What the clients' strategy reads of the trainer that holds it (``landscape.train.trainer.Trainer``)."""

    train_cfg: TrainSettings
    flat: FlatModel
    device: torch.device
    algorithm: Algorithm
    per_round: int

    def local_problem(self, client: int, round: int, lr: float, buffers: dict[str, Tensor]) -> LocalProblem: ...

    def mixed_precision(self) -> contextlib.AbstractContextManager: ...

T = TypeVar("T")
Answer = tuple[Tensor, Tensor]  # (minibatch loss, gradient) of one request


@dataclass(frozen=True)
class Vectorisation:
    """What ``train.vectorize`` chose for a run, and why (recorded in every checkpoint as ``vectorized``)."""

    used: bool
    reason: str

    def record(self) -> dict[str, Any]:
        return {"used": self.used, "reason": self.reason}


def stateful_layers(module: nn.Module) -> str | None:
    """Why the model's clients cannot share one vmapped pass (None when they can): BatchNorm running
    statistics are updated in place per client, dropout draws its masks from the global RNG."""
    for name, layer in module.named_modules():
        if isinstance(layer, nn.modules.batchnorm._NormBase) and layer.track_running_stats:
            return f"the model has running statistics ({type(layer).__name__} {name or 'at the top'})"
        if isinstance(layer, nn.modules.dropout._DropoutNd) and layer.p > 0:
            return f"the model has dropout ({type(layer).__name__} {name or 'at the top'})"
    return None


class ClientTraining:
    """How the trainer trains a round's clients, the strategy it holds (``Trainer.clients``): one after another,
    or in lockstep with one vmapped pass per step where ``train.vectorize`` says so (``choice``)."""

    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer
        self._choice: Vectorisation | None = None

    @property
    def choice(self) -> Vectorisation:
        """``train.vectorize``'s choice for this trainer, made on first use and kept.

        Each rank decides for its own block (no collective call: rank 0 also asks while saving round 0 alone);
        the checkpoints record rank 0's choice."""
        if self._choice is None:
            self._choice = _choose(self.trainer)
            if self.trainer.train_cfg.vectorize == "on" and not self._choice.used and parallel.is_main():
                print_warning(f"train.vectorize = \"on\": {self._choice.reason}")
        return self._choice

    def train(self, state: TrainerState, message: dict[str, Tensor], clients: list[int],
              lr: float) -> tuple[list[ClientResult], list[dict[str, Tensor]]]:
        """This rank's block of the round's clients trained (in lockstep where ``choice`` says so): their
        results (``num_steps`` filled in) and buffers, in client order."""
        trainer = self.trainer
        block = parallel.shard(clients)  # every client in a single process
        update = trainer.algorithm.client_update
        prepared = [client_problem(trainer, state, client, lr) for client in block]
        problems = [problem for problem, _, _ in prepared]
        buffers = [own_buffers for _, own_buffers, _ in prepared]
        if len(block) > 1 and self.choice.used:
            lockstep = Lockstep(_answerer(trainer), trainer.device)
            for slot, (problem, own_buffers, _) in enumerate(prepared):
                problem.oracle = lockstep.oracle(slot, own_buffers)
            results = lockstep.run([_job(update, message, own_state, problem)
                                    for problem, _, own_state in prepared])
        else:
            results = [update(message, own_state, problem) for problem, _, own_state in prepared]
        for result, problem in zip(results, problems):
            result.num_steps = problem.num_steps
        return results, buffers


def block_size(trainer: Trainer) -> int:
    """The most clients one rank trains in a round (its block of the sampled clients)."""
    start, stop = parallel.shard_bounds(trainer.per_round, index=0)
    return stop - start


def _choose(trainer: Trainer) -> Vectorisation:
    asked = trainer.train_cfg.vectorize
    if asked == "off":
        return Vectorisation(False, "train.vectorize = \"off\"")
    why_not = stateful_layers(trainer.flat.module)
    if why_not is not None:
        return Vectorisation(False, f"{why_not}: the clients train one after another")
    clients = block_size(trainer)
    if clients < 2:
        return Vectorisation(False, "one client per round and rank: nothing to train together")
    if asked == "on":
        return Vectorisation(True, "train.vectorize = \"on\"")
    if trainer.device.type != "cuda":
        return Vectorisation(False, f"train.vectorize = \"auto\" on {trainer.device.type}: one after another")
    return Vectorisation(True, f"train.vectorize = \"auto\" on cuda: {clients} clients in one vmapped pass")


# ----------------------------------------------------------------------------------------------------------
# the vmapped oracle


class StackedOracle:
    """Minibatch cross-entropy f_i(w_i; B_i) and its gradient for k clients at once: ``vmap`` over stacked
    w (k, d), inputs (k, b, ...) and labels (k, b) of ``grad_and_value`` of the model's ``functional_call``
    loss, with the model's constants (buffers, frozen parameters) shared. The same loss as
    ``FlatModel.loss_and_grad``; each answer is its own tensor (no view of the stacked result, which a
    client's state would keep alive and a checkpoint would save whole)."""

    def __init__(self, flat: FlatModel) -> None:
        def loss(w: Tensor, x: Tensor, y: Tensor, constants: dict[str, Tensor]) -> Tensor:
            return F.cross_entropy(flat.call({**flat.params(w), **constants}, x), y)

        self._step = vmap(grad_and_value(loss), in_dims=(0, 0, 0, None))

    def __call__(self, w: Tensor, x: Tensor, y: Tensor, constants: dict[str, Tensor]) -> list[Answer]:
        grads, losses = self._step(w, x, y, constants)
        return [(loss.clone(), g.clone()) for loss, g in zip(losses, grads)]


@dataclass
class Request:
    """One client's call of its oracle: the point, its minibatch and the client's constants."""

    w: Tensor
    x: Tensor
    y: Tensor
    buffers: dict[str, Tensor]
    answer: Answer | None = None


def answer_requests(flat: FlatModel, stacked: StackedOracle, requests: dict[int, Request]) -> dict[int, Answer]:
    """The answers to one lockstep's requests: one vmapped pass per group of equal shapes (a request alone in
    its group: ``FlatModel.loss_and_grad``, as the sequential loop computes it)."""
    groups: dict[tuple, list[int]] = {}
    for slot, r in requests.items():
        groups.setdefault((r.w.shape, r.x.shape, r.x.dtype, r.y.shape), []).append(slot)
    answers: dict[int, Answer] = {}
    for slots in groups.values():
        first = requests[slots[0]]
        if len(slots) == 1:
            answers[slots[0]] = flat.loss_and_grad(first.w, first.x, first.y, first.buffers)
            continue
        stack = [requests[s] for s in slots]
        found = stacked(torch.stack([r.w for r in stack]), torch.stack([r.x for r in stack]),
                        torch.stack([r.y for r in stack]), first.buffers)
        answers.update(zip(slots, found))
    return answers


# ----------------------------------------------------------------------------------------------------------
# the lockstep


class Aborted(BaseException):
    """Raised in a client's thread at its next request once the round is abandoned (another client failed).
    A BaseException, so that a rule's own ``except Exception`` cannot swallow it."""


class Lockstep:
    """Client rules run in threads, their oracle requests answered together by the calling thread.

    ``run(jobs)`` starts one thread per job (a client's ``client_update``), then serves: whenever every job
    still running waits on a request, ``compute(requests)`` answers them all. Returns the jobs' results in
    their order; the first exception a job raised (or ``compute`` raised) is raised once every thread ended.
    """

    POLL_SECONDS = 1.0  # a wait wakes this often to look again (a lost wake-up cannot hang a round)

    def __init__(self, compute: Callable[[dict[int, Request]], dict[int, Answer]],
                 device: torch.device | None = None) -> None:
        self._compute = compute
        self._device = device
        self._cond = threading.Condition()
        self._pending: dict[int, Request] = {}
        self._running: set[int] = set()
        self._errors: list[BaseException] = []
        self._abort = False

    def oracle(self, slot: int, buffers: dict[str, Tensor]) -> Callable[[Tensor, tuple[Tensor, Tensor], bool],
                                                                         Answer]:
        """The oracle of job ``slot`` (a ``LocalProblem.oracle``): posts its request and waits for the answer.
        ``update_stats`` does not matter here: a model with running statistics is never vectorised."""

        def ask(w: Tensor, batch: tuple[Tensor, Tensor], update_stats: bool) -> Answer:
            request = Request(w.detach(), batch[0], batch[1], buffers)
            with self._cond:
                if self._abort:
                    raise Aborted
                self._pending[slot] = request
                self._cond.notify_all()
                while request.answer is None:
                    self._cond.wait(self.POLL_SECONDS)
                    if self._abort:
                        raise Aborted
            return request.answer

        return ask

    def run(self, jobs: list[Callable[[], T]]) -> list[T]:
        results: list[Any] = [None] * len(jobs)
        self._running = set(range(len(jobs)))
        threads = [threading.Thread(target=self._work, args=(slot, job, results), daemon=True,
                                    name=f"landscape-client-{slot}") for slot, job in enumerate(jobs)]
        for thread in threads:
            thread.start()
        try:
            self._serve()
        finally:  # also on KeyboardInterrupt: every waiting client is released before the round is left
            with self._cond:
                self._abort = True
                self._cond.notify_all()
            for thread in threads:
                thread.join()
        if self._errors:
            raise self._errors[0]
        return results

    def _serve(self) -> None:
        while True:
            with self._cond:
                while not self._abort and self._running and not self._running <= self._pending.keys():
                    self._cond.wait(self.POLL_SECONDS)
                if self._abort or not self._running:
                    return
                requests = dict(sorted(self._pending.items()))
                self._pending.clear()
            answers = self._compute(requests)
            with self._cond:
                for slot, answer in answers.items():
                    requests[slot].answer = answer
                self._cond.notify_all()

    def _work(self, slot: int, job: Callable[[], Any], results: list[Any]) -> None:
        try:
            if self._device is not None and self._device.type == "cuda":
                torch.cuda.set_device(self._device)  # the current device is per thread
            results[slot] = job()
        except Aborted:
            pass
        except BaseException as error:  # handed to the calling thread, raised there
            with self._cond:
                self._errors.append(error)
                self._abort = True
        finally:
            with self._cond:
                self._running.discard(slot)
                self._pending.pop(slot, None)
                self._cond.notify_all()


# ----------------------------------------------------------------------------------------------------------
# the round's local work


def client_problem(trainer: Trainer, state: TrainerState, client: int, lr: float
                   ) -> tuple[LocalProblem, dict[str, Tensor], Any]:
    """Client ``client``'s problem of the round, its own copy of the buffers (BN statistics move during local
    work) and its state on the device (None before its first participation)."""
    buffers = {k: v.clone() for k, v in state.buffers.items()}
    problem = trainer.local_problem(client, state.round, lr, buffers)
    own_state = state.client_states.get(client)
    return problem, buffers, own_state.to(trainer.device) if own_state is not None else None


def _job(update: Callable, message: dict[str, Tensor], own_state: Any, problem: LocalProblem
         ) -> Callable[[], ClientResult]:
    return lambda: update(message, own_state, problem)


def _answerer(trainer: Trainer) -> Callable[[dict[int, Request]], dict[int, Answer]]:
    stacked = StackedOracle(trainer.flat)

    def compute(requests: dict[int, Request]) -> dict[int, Answer]:
        with trainer.mixed_precision():
            return answer_requests(trainer.flat, stacked, requests)

    return compute
