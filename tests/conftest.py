"""Shared helpers: tiny, fast recipes on the bundled digits data."""

from __future__ import annotations

import pytest

from landscape import recipe as recipes

TINY = {
    "partition.clients": 4,
    "partition.alpha": 0.5,
    "train.rounds": 3,
    "train.participation": 0.5,
    "train.local_steps": 2,
    "train.batch_size": 16,
    "train.checkpoint_every": 1,
    "train.device": "cpu",
}


def tiny_recipe(**changes) -> dict:
    """A resolved recipe of a few-second digits run; keys as 'section__key' or top-level names."""
    overrides = dict(TINY)
    for key, value in changes.items():
        overrides[key.replace("__", ".")] = value
    return recipes.build(None, list(overrides.items()))


@pytest.fixture
def tiny():
    return tiny_recipe


def result_file(folder, pass_name: str):
    """The JSON of the one result of ``pass_name`` in an ``analysis/round-NNNN`` folder (result files are named
    by their settings: ``hessian``, ``hessian@top_k-2_...``)."""
    from landscape.analyze.results import stored_results

    (path,) = [p for p, record in stored_results(folder) if record.get("pass") == pass_name]
    return path


def one_line_error(result) -> str:
    """The CLI's answer to bad input: exit 1, one line on stderr, no traceback."""
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]
