"""Stochastic Lanczos quadrature (``landscape.measure.density``): the density's mass, nodes and weights, and
the trace it implies, against dense spectra."""

import math

import numpy as np
import pytest
import torch
from support.spectral_checks import digits_mlp_problem, hessian_op, progress_recorder

from landscape.measure.density import slq_density
from landscape.measure.operator import MatrixOperator

digits_mlp = pytest.fixture(scope="module", name="digits_mlp")(digits_mlp_problem)


def test_slq_density_integrates_to_one_and_its_mean_is_the_trace(digits_mlp):
    _, _, _, hessian, exact = digits_mlp
    op = hessian_op(digits_mlp)
    density = slq_density(op, runs=12, steps=40, seed=0)
    assert density.hvp_count == 12 * 40
    assert all(isinstance(a, np.ndarray) and a.dtype == np.float64
               for a in (density.nodes, density.weights, density.grid, density.density))
    spacing = float(density.grid[1] - density.grid[0])
    assert float(density.density.sum()) * spacing == pytest.approx(1.0, abs=1e-3)
    assert density.mass == pytest.approx(1.0, abs=1e-3)
    assert float(density.weights.sum()) == pytest.approx(1.0, abs=1e-12)
    dim = hessian.shape[0]
    assert density.trace == pytest.approx(density.mean * dim, rel=1e-12)
    assert abs(density.trace - float(torch.trace(hessian))) <= 3 * density.trace_stderr
    assert density.trace_stderr_dof == 11 and density.summary()["trace_stderr_dof"] == 11
    # Gauss quadrature: the nodes lie inside the spectrum, the extreme ones approach its ends
    slack = 1e-12
    assert float(exact[0]) - slack <= float(density.nodes.min()) < 0.0 < float(density.nodes.max())
    assert float(density.nodes.max()) <= float(exact[-1]) + slack
    assert float(density.nodes.max()) == pytest.approx(float(exact[-1]), rel=1e-3)


def test_slq_recovers_a_spectrum_with_few_distinct_eigenvalues():
    # Rademacher z on a diagonal matrix: the weight of eigenvalue lambda is (its multiplicity) / dim, exactly
    diagonal = torch.diag(torch.tensor([1.0] * 10 + [2.0] * 20 + [5.0] * 30, dtype=torch.float64))
    density = slq_density(MatrixOperator(diagonal), runs=2, steps=10, seed=3)
    for run in range(2):
        kept = density.weights[run] > 1e-12
        torch.testing.assert_close(torch.from_numpy(density.nodes[run][kept]),
                                   torch.tensor([1.0, 2.0, 5.0], dtype=torch.float64))
        torch.testing.assert_close(torch.from_numpy(density.weights[run][kept] * 2),
                                   torch.tensor([1 / 6, 2 / 6, 3 / 6], dtype=torch.float64))
    assert density.hvp_count <= 2 * 4  # each run stops once its Krylov space is invariant
    assert density.trace == pytest.approx(float(torch.trace(diagonal)), rel=1e-12)
    assert density.runs == 2 and density.trace_stderr_dof == 1
    single = slq_density(MatrixOperator(diagonal), runs=1, steps=10, seed=3)
    assert single.trace_stderr_dof == 0 and single.trace_stderr == math.inf  # no spread to measure, not 0


def test_slq_default_runs_give_the_trace_stderr_three_degrees_of_freedom():
    from landscape.analyze.passes.hessian import HessianOptions

    assert HessianOptions().density_runs == 4
    density = slq_density(MatrixOperator(torch.diag(torch.arange(1.0, 21.0, dtype=torch.float64))),
                                   runs=HessianOptions().density_runs, steps=5, seed=0)
    assert density.runs == 4 and density.trace_stderr_dof == 3


def test_slq_reports_progress(digits_mlp):
    calls, progress = progress_recorder()
    slq_density(hessian_op(digits_mlp), runs=2, steps=5, progress=progress)
    assert calls == [(i, 10) for i in range(1, 11)]
