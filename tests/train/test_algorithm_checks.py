"""The hand-written gradient of the test helpers agrees with autograd through the real model."""

import torch
from support.algorithm_checks import DIM, client_batches, linear_trainer, loss_and_grad


def test_closed_form_gradient_matches_the_model(tmp_path):
    trainer = linear_trainer(tmp_path, "fedavg")
    w = torch.randn(DIM, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * 0.1
    assert trainer.flat.dim == DIM
    for batch in client_batches(trainer, 0, 0):
        loss, g = loss_and_grad(w, batch)
        ref_loss, ref_g = trainer.flat.loss_and_grad(w, batch[0], batch[1], {})
        torch.testing.assert_close(loss, ref_loss, rtol=1e-13, atol=0)
        torch.testing.assert_close(g, ref_g, rtol=1e-12, atol=1e-15)
