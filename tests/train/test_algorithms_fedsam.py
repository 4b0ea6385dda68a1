"""FedSAM: one float64 round against its equations, and the reduction rho = 0 == FedAvg."""

import pytest
import torch
from support.algorithm_checks import (
    assert_close,
    client_batches,
    grad,
    linear_trainer,
    loss_and_grad,
    run_rounds,
)

from landscape.core.errors import LandscapeError
from landscape.train.algorithms import build_algorithm


def test_fedsam_rounds_match_the_equations(tmp_path):
    lr, wd, rho, server_lr = 0.3, 0.01, 0.05, 0.8
    trainer = linear_trainer(tmp_path, "fedsam", {"rho": rho}, lr=lr, weight_decay=wd, server_lr=server_lr)
    for t, (before, after, results) in enumerate(run_rounds(trainer, 2)):
        x = before.x
        finals = []
        for client, result in zip((0, 1), results):
            y = x.clone()
            losses = []
            for batch in client_batches(trainer, client, t):
                loss, g = loss_and_grad(y, batch)
                e = rho * g / g.norm()  # FedSAM: e = rho g / ||g||
                d = grad(y + e, batch)  # d = g(y + e), same batch
                y = y - lr * (d + wd * y)
                losses.append(loss)
            finals.append(y)
            assert_close(result.model, y)
            assert float(result.train_loss) == pytest.approx(float(torch.stack(losses).mean()), rel=1e-12)
            assert result.uplink_floats == x.numel()  # FedAvg-equal uplink
        assert_close(after.x, x + server_lr * (torch.stack(finals).mean(0) - x))


def test_fedsam_with_rho_zero_is_fedavg(tmp_path):
    # Same arithmetic: e = 0 exactly, so g(y + 0) = g(y) and the runs agree bit for bit.
    a = run_rounds(linear_trainer(tmp_path, "fedsam", {"rho": 0.0}, clients=3, participation=0.67), 3)[-1][1].x
    b = run_rounds(linear_trainer(tmp_path, "fedavg", clients=3, participation=0.67), 3)[-1][1].x
    assert torch.equal(a, b)


def test_fedsam_rejects_a_negative_radius():
    from support.helpers import tiny_recipe

    with pytest.raises(LandscapeError, match=r"algorithm.rho must be >= 0 \(got -0.1\)"):
        tiny_recipe(algorithm__name="fedsam", algorithm__rho=-0.1)
    assert build_algorithm(tiny_recipe(algorithm__name="fedsam"), None).options.rho == 0.1
