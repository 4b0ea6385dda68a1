"""The round schedule of a recipe: which clients a round samples, its learning rate, and server SWA's cycles.

Randomness is derived, never carried: client sampling from (seed, round), so that a run resumed from any
checkpoint, or a round's clients split across processes, samples the same clients as one uninterrupted run.
"""

from __future__ import annotations

import math

import numpy as np

from landscape.config.sections import TrainSettings
from landscape.core.rng import derived_seed

# Tags that keep the derived random streams of one seed apart.
STREAM_SAMPLING, STREAM_CLIENT = 1, 2


def sample_clients(seed: int, round: int, num_clients: int, per_round: int) -> list[int]:
    """S clients uniformly without replacement, fixed by (seed, round)."""
    rng = np.random.default_rng(derived_seed(seed, STREAM_SAMPLING, round))
    return sorted(int(i) for i in rng.choice(num_clients, size=per_round, replace=False))


def clients_per_round(train: TrainSettings, num_clients: int) -> int:
    return max(1, round(train.participation * num_clients))


def learning_rate(train: TrainSettings, round: int) -> float:
    """The client learning rate of round ``round`` (0-based) under the recipe's schedule (and SWA's cycles)."""
    lr, schedule = train.lr, train.lr_schedule
    if schedule == "exponential":  # lr * decay^t, decayed once per round
        lr = lr * train.lr_decay**round
    elif schedule == "cosine":  # cosine from lr to lr_min over the recipe's rounds
        progress = round / max(train.rounds, 1)
        lr = train.lr_min + 0.5 * (lr - train.lr_min) * (1 + math.cos(math.pi * progress))
    if swa_active(train, round):
        # Server SWA (Caldarola et al. 2022): cyclic client lr, t_c = ((t mod c) + 1) / c.
        t_c = (round % train.swa_cycle + 1) / train.swa_cycle
        lr = (1 - t_c) * lr + t_c * train.swa_lr
    return lr


def swa_start_round(train: TrainSettings) -> int:
    return int(train.swa_start * train.rounds)


def swa_active(train: TrainSettings, round: int) -> bool:
    return bool(train.swa) and round >= swa_start_round(train)


def swa_cycle_ends(train: TrainSettings, round: int) -> bool:
    """Whether round ``round`` (0-based) closes an SWA cycle: x_swa then absorbs x^{round+1}."""
    return swa_active(train, round) and (round % train.swa_cycle) + 1 == train.swa_cycle
