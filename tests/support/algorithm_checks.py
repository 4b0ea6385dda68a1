"""Helpers for algorithm tests: float64 rounds of a linear softmax model on digits, with its minibatch
gradient written out by hand (not through autograd), so a test can evaluate an algorithm's equations directly.
"""

from __future__ import annotations

import torch
from torch import Tensor

from landscape.store.directory import RunDir
from landscape.train import loop
from landscape.train.state import TrainerState
from support.helpers import tiny_recipe

FEATURES, CLASSES = 64, 10  # digits: 8x8 images, 10 classes; w = [W (10 x 64) row-major, b (10)]
DIM = CLASSES * FEATURES + CLASSES


def linear_trainer(tmp_path, algorithm: str, options: dict | None = None, *, clients: int = 2, steps: int = 2,
                   batch: int = 4, lr: float = 0.3, weight_decay: float = 0.01, server_lr: float = 1.0,
                   participation: float = 1.0, partition: str = "dirichlet-client-reuse", **train) -> loop.Trainer:
    """A Trainer of a float64 linear softmax model (mlp without hidden layers) on `clients` digits clients
    (``partition``: "dirichlet" gives clients of unequal sizes)."""
    changes = {
        "partition__name": partition,
        "algorithm__name": algorithm, "partition__clients": clients, "train__participation": participation,
        "train__local_steps": steps, "train__batch_size": batch, "train__lr": lr,
        "train__weight_decay": weight_decay, "train__server_lr": server_lr, "train__dtype": "float64",
        "model__name": "mlp", "model__hidden": [],
    }
    changes.update({f"algorithm__{k}": v for k, v in (options or {}).items()})
    changes.update({f"train__{k}": v for k, v in train.items()})
    return loop.Trainer(tiny_recipe(**changes), RunDir(tmp_path / f"run-{algorithm}"))


def client_batches(trainer: loop.Trainer, client: int, round: int) -> list[tuple[Tensor, Tensor]]:
    """The minibatches client `client` uses in round `round` (0-based), in order."""
    return list(trainer.local_problem(client, round, 0.0, {}).batches())


def loss_and_grad(w: Tensor, batch: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
    """Mean cross-entropy of the linear softmax model and its gradient, by the closed form
    dL/dW = (softmax(Xw) - onehot(y))^T X / B, dL/db = mean(softmax - onehot)."""
    x, y = batch
    x = x.reshape(len(x), -1)
    weight, bias = w[: CLASSES * FEATURES].view(CLASSES, FEATURES), w[CLASSES * FEATURES :]
    logits = x @ weight.T + bias
    log_p = logits - torch.logsumexp(logits, dim=1, keepdim=True)
    loss = -log_p[torch.arange(len(y)), y].mean()
    residual = log_p.exp()
    residual[torch.arange(len(y)), y] -= 1.0
    residual /= len(y)
    return loss, torch.cat([(residual.T @ x).reshape(-1), residual.sum(0)])


def grad(w: Tensor, batch: tuple[Tensor, Tensor]) -> Tensor:
    return loss_and_grad(w, batch)[1]


def run_rounds(trainer: loop.Trainer, rounds: int) -> list[tuple[TrainerState, TrainerState, list]]:
    """Run `rounds` rounds from the initial state; per round (state before, state after, client results)."""
    state = trainer.initial_state()
    history = []
    for _ in range(rounds):
        new_state, results, _ = trainer.run_round(state)
        history.append((state, new_state, results))
        state = new_state
    return history


def assert_close(actual: Tensor, expected: Tensor, rel: float = 1e-10) -> None:
    """Relative agreement in the global L2 norm (the reductions' 1e-10 criterion)."""
    scale = max(expected.norm().item(), 1e-300)
    assert (actual - expected).norm().item() <= rel * scale, (actual - expected).norm().item() / scale

