"""The tests' fixtures and hooks: one torch thread per pytest-xdist worker, the ``tiny`` recipe maker, and one
six-round run trained once per session for all workers (its copy for a test that writes). The helpers they use,
and the tests import, are in tests/support/."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch
from support.helpers import recipe6, shared_folder, tiny_recipe


def pytest_configure(config) -> None:
    """Under pytest-xdist (``make test`` runs a worker per core) each worker computes with one torch thread, and
    so do the processes it starts: two workers of two threads each on two cores run slower than one."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


@pytest.fixture
def tiny():
    return tiny_recipe


@pytest.fixture(scope="session")
def six_round_run(tmp_path_factory) -> Path:
    """The uninterrupted run of :func:`recipe6` (checkpoints of rounds 0, 2, 4, 6), trained once per session.
    Read-only: a test that writes into a run uses ``six_round_copy``."""
    from landscape.train import loop

    return shared_folder(tmp_path_factory, "six-rounds",
                         lambda folder: loop.start_run(recipe6(), folder / "run", progress=False)) / "run"


@pytest.fixture
def six_round_copy(six_round_run, tmp_path) -> Path:
    """A copy of ``six_round_run`` of the test's own, at ``tmp_path / "run"``."""
    shutil.copytree(six_round_run, tmp_path / "run")
    return tmp_path / "run"


@pytest.fixture(scope="session")
def one_round_run(tmp_path_factory) -> Path:
    """A 1-round run of the tiny recipe in a folder whose path holds spaces (``.../one round/my run``), trained once
    per session. Read-only: tests copy it, or only read and dry-run it."""
    from landscape.train import loop

    return shared_folder(tmp_path_factory, "one round",
                         lambda folder: loop.start_run(tiny_recipe(train__rounds=1), folder / "my run",
                                                       progress=False)) / "my run"
