"""The Lanczos process's basis (``landscape.measure.krylov``): Gram-Schmidt with a second pass only where
needed."""

import torch

from landscape.measure.krylov import KrylovBasis
from landscape.measure.operator import MatrixOperator


def test_reorthogonalisation_makes_a_second_pass_only_when_the_first_cancels():
    op = MatrixOperator(torch.eye(50, dtype=torch.float64))
    basis = KrylovBasis(op, 4)
    q, _ = torch.linalg.qr(torch.randn(50, 3, dtype=torch.float64,
                                       generator=torch.Generator().manual_seed(0)))
    for j in range(3):
        basis.append(q[:, j])
    passes = []
    project_out = basis._project_out
    basis._project_out = lambda z: passes.append(1) or project_out(z)
    fresh = torch.randn(50, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    basis.orthogonalise(fresh)  # mostly outside the span: one pass
    assert len(passes) == 1
    passes.clear()
    nearly_inside = q @ torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64) + 1e-6 * fresh
    z, coefficients, norm = basis.orthogonalise(nearly_inside)
    assert len(passes) == 2
    assert float((q.T @ z).abs().max()) <= 1e-15 * norm
    torch.testing.assert_close(coefficients, torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64), rtol=0,
                               atol=1e-5)
