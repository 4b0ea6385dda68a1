"""benchmarks/train_overhead.py times landscape's training path against a plain channels-last PyTorch loop that
does the same arithmetic: here, on two local steps, the two agree (to float32 rounding) for FedAvg and FedSAM,
the weights moved, and a plain loop that computes something else is refused."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from support.helpers import load_script

train_overhead = load_script("benchmarks/train_overhead.py")


@pytest.fixture(scope="module")
def cases(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("train-overhead")
    return {algorithm: train_overhead.build_case(algorithm, [("train.local_steps", 2)], run_dir=folder / algorithm)
            for algorithm in train_overhead.ALGORITHMS}


@pytest.mark.parametrize("algorithm", ["fedavg", "fedsam"])
def test_the_plain_loop_and_landscape_agree_on_two_steps(cases, algorithm):
    case = cases[algorithm]
    assert case.steps == 2
    difference = train_overhead.agreement(case)  # exits above float32 rounding, or when nothing moved
    assert difference <= 1e-6
    ours, theirs = case.landscape(), case.plain()
    assert torch.allclose(ours, theirs, rtol=0, atol=1e-6)
    assert (ours - case.start).abs().max() > 1e-3  # two steps of lr 0.1 moved the weights: a real comparison
    assert torch.equal(case.plain(), theirs)  # each call starts again from the round's start


def test_a_plain_loop_that_computes_something_else_is_refused(cases):
    case = cases["fedavg"]
    other = dataclasses.replace(case, plain=lambda: case.plain() + 1e-3)
    with pytest.raises(SystemExit, match="differ from landscape's"):
        train_overhead.agreement(other)
    idle = dataclasses.replace(case, start=case.landscape())
    with pytest.raises(SystemExit, match="did not move"):
        train_overhead.agreement(idle)


def test_fedsam_takes_a_second_gradient_at_the_perturbed_point(cases):
    """FedSAM's plain loop is not FedAvg's: the two final weights differ by far more than rounding."""
    assert (cases["fedsam"].plain() - cases["fedavg"].plain()).abs().max() > 1e-4
