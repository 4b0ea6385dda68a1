"""Derived seeds: every random thing (a model's initialisation, a client's minibatches, a probe vector, a
subset) draws from a seed derived from integers that name it (the recipe's seed, the round, the client, ...),
never from a generator carried along, so a resumed or reordered computation draws the same numbers."""

from __future__ import annotations

import numpy as np


def derived_seed(*key: int) -> int:
    """A 63-bit seed from integers (numpy SeedSequence: well mixed, stable across versions)."""
    return int(np.random.SeedSequence(list(key)).generate_state(2, np.uint64)[0] >> np.uint64(1))
