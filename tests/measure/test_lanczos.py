"""The top-k eigensolvers (``landscape.measure.lanczos``) against dense eigendecompositions; PyHessian on the
same data."""

import math

import numpy as np
import pytest
import torch
from support.spectral_checks import dense_hessian, digits_mlp_problem, hessian_op, progress_recorder

from landscape.core.errors import LandscapeError
from landscape.measure.lanczos import client_lambda_max, lanczos_topk, power_iteration
from landscape.measure.objective import Objective
from landscape.measure.operator import MatrixOperator
from landscape.measure.pyhessian_backend import pyhessian_lambda_max_and_trace

digits_mlp = pytest.fixture(scope="module", name="digits_mlp")(digits_mlp_problem)


def test_lanczos_top5_matches_the_dense_eigenvalues(digits_mlp):
    _, _, _, hessian, exact = digits_mlp
    top = exact.flip(0)[:5]
    op = hessian_op(digits_mlp)
    result = lanczos_topk(op, 5, keep_vectors=True, seed=0, verify=True)
    assert result.converged.all() and result.residual_source == "hvp"
    # the numbers are float64 numpy arrays on the host, the kept eigenvectors a tensor
    assert isinstance(result.values, np.ndarray) and result.values.dtype == np.float64
    assert result.residuals.dtype == result.relative_residuals.dtype == np.float64
    assert result.converged.dtype == np.bool_ and isinstance(result.vectors, torch.Tensor)
    values, residuals = torch.from_numpy(result.values), torch.from_numpy(result.residuals)
    assert ((values - top).abs() / top.abs()).max() <= 1e-4
    assert (residuals <= 1e-3 * values.abs()).all()
    # the reported residuals are the true ones: recompute them with the dense Hessian
    vectors = result.vectors
    dense_residuals = torch.linalg.vector_norm(hessian @ vectors - vectors * values, dim=0)
    torch.testing.assert_close(residuals, dense_residuals, rtol=1e-6, atol=1e-12)
    torch.testing.assert_close(vectors.T @ vectors, torch.eye(5, dtype=torch.float64), rtol=0, atol=1e-10)
    assert result.hvp_count == op.hvp_count == result.iterations + 5  # Krylov steps + one verifying matmat
    assert result.iterations >= 15  # Krylov size >= k + 10
    assert result.top_ratio == pytest.approx(float(top[0] / top[4]), rel=1e-4)


def test_lanczos_tight_tolerance_and_smallest_eigenvalues(digits_mlp):
    _, _, _, _, exact = digits_mlp
    op = hessian_op(digits_mlp, "forward-over-reverse")
    largest = lanczos_topk(op, 3, tol=1e-8, verify=False, seed=1)
    torch.testing.assert_close(torch.from_numpy(largest.values), exact.flip(0)[:3], rtol=1e-12, atol=0)
    assert largest.residual_source == "lanczos"
    smallest = lanczos_topk(op, 2, tol=1e-6, which="smallest-algebraic", seed=1)
    assert smallest.converged.all()
    torch.testing.assert_close(torch.from_numpy(smallest.values), exact[:2], rtol=1e-8, atol=0)


def test_power_iteration_agrees_and_needs_more_products_than_lanczos(digits_mlp):
    _, _, _, _, exact = digits_mlp
    power_top1 = power_iteration(hessian_op(digits_mlp), 1, seed=0)
    assert power_top1.values[0] == pytest.approx(float(exact[-1]), rel=2e-3)
    assert power_top1.converged.all()
    power = power_iteration(hessian_op(digits_mlp), 5, seed=0)
    lanczos = lanczos_topk(hessian_op(digits_mlp), 5, seed=0)
    assert power.hvp_count > lanczos.hvp_count
    assert power.hvp_count == power.iterations


def test_lanczos_on_invariant_subspaces():
    # rank 3: the Krylov space of any start vector is 4-dimensional; the rest is found by restarts
    basis, _ = torch.linalg.qr(torch.randn(50, 3, dtype=torch.float64,
                                           generator=torch.Generator().manual_seed(0)))
    low_rank = basis @ torch.diag(torch.tensor([3.0, 2.0, 1.0], dtype=torch.float64)) @ basis.T
    result = lanczos_topk(MatrixOperator(low_rank), 5)
    torch.testing.assert_close(torch.from_numpy(result.values), torch.tensor([3.0, 2.0, 1.0, 0.0, 0.0], dtype=torch.float64),
                               rtol=0, atol=1e-12)
    assert (result.residuals <= 1e-12).all()
    # a multiple of the identity: every vector is an eigenvector (beta = 0 at the first step)
    result = lanczos_topk(MatrixOperator(2 * torch.eye(30, dtype=torch.float64)), 5)
    torch.testing.assert_close(torch.from_numpy(result.values), torch.full((5,), 2.0, dtype=torch.float64), rtol=0, atol=1e-12)
    assert result.converged.all()
    # a space smaller than the Krylov size: the whole spectrum, exactly
    small = torch.diag(torch.arange(1.0, 7.0, dtype=torch.float64))
    result = lanczos_topk(MatrixOperator(small), 6, verify=False)
    torch.testing.assert_close(torch.from_numpy(result.values), torch.arange(6.0, 0.0, -1.0, dtype=torch.float64), rtol=0,
                               atol=1e-12)
    assert result.iterations == 6


def test_bad_solver_arguments_are_named():
    op = MatrixOperator(torch.eye(4, dtype=torch.float64))
    with pytest.raises(LandscapeError, match="k must be between 1 and the dimension 4, got 5"):
        lanczos_topk(op, 5)
    with pytest.raises(LandscapeError, match="unknown eigenvalue selection 'top'"):
        lanczos_topk(op, 1, which="top")
    with pytest.raises(LandscapeError, match="Krylov size must exceed k=2"):
        lanczos_topk(op, 2, krylov=2)


def test_client_lambda_max_is_each_clients_dense_top_eigenvalue(digits_mlp):
    flat, data, w, _, _ = digits_mlp
    parts = {0: torch.arange(0, 60), 3: torch.arange(60, 130), 7: torch.arange(130, 200)}
    objectives = {client: Objective(flat, flat.buffers(), data.subset(index))
                  for client, index in parts.items()}
    results = client_lambda_max(objectives, w, tol=1e-6, seed=0)
    assert list(results) == [0, 3, 7]
    for client, index in parts.items():
        exact = torch.linalg.eigvalsh(dense_hessian(flat, data.subset(index), w))[-1]
        assert float(results[client].values[0]) == pytest.approx(float(exact), rel=1e-6)
        assert results[client].converged.all()


def test_pyhessian_backend_agrees_and_leaves_the_module_untouched(digits_mlp):
    flat, data, w, hessian, exact = digits_mlp
    module = flat.module
    module.train()
    before = {k: v.clone() for k, v in module.state_dict().items()}
    rng_state = torch.get_rng_state()
    native = lanczos_topk(hessian_op(digits_mlp), 1, seed=0)
    result = pyhessian_lambda_max_and_trace(module, data, w, top_n=1, trace_iters=60, seed=0)
    assert result.lambda_max == pytest.approx(float(native.values[0]), rel=1e-2)
    assert result.lambda_max == pytest.approx(float(exact[-1]), rel=1e-2)
    assert abs(result.trace - float(torch.trace(hessian))) <= 3 * result.trace_stderr
    assert result.trace_samples == result.trace_hvp_count == 60
    assert 2 <= result.eigen_hvp_count <= 100
    assert 1 <= result.rule_samples <= 60
    assert math.isfinite(result.seconds)
    assert module.training
    assert all(p.grad is None for p in module.parameters())
    assert all(torch.equal(before[k], v) for k, v in module.state_dict().items())
    assert torch.equal(torch.get_rng_state(), rng_state)


def test_unverified_lanczos_residuals_are_the_true_residuals(digits_mlp):
    _, _, _, hessian, _ = digits_mlp
    result = lanczos_topk(hessian_op(digits_mlp), 5, keep_vectors=True, seed=0)  # the default: verify=False
    # no verifying products
    assert result.hvp_count == result.iterations and result.residual_source == "lanczos"
    vectors, residuals = result.vectors, torch.from_numpy(result.residuals)
    dense = torch.linalg.vector_norm(hessian @ vectors - vectors * torch.from_numpy(result.values), dim=0)
    torch.testing.assert_close(residuals, dense, rtol=1e-6, atol=1e-12)
    torch.testing.assert_close(residuals, torch.tensor(result.settings["lanczos_residuals"],
                                                              dtype=torch.float64), rtol=1e-6, atol=1e-12)


def test_solvers_report_progress(digits_mlp):
    calls, progress = progress_recorder()
    result = lanczos_topk(hessian_op(digits_mlp), 2, seed=0, progress=progress, verify=True)
    assert [done for done, _ in calls] == list(range(1, result.iterations + 1)) + [result.hvp_count]
    calls, progress = progress_recorder()
    result = lanczos_topk(hessian_op(digits_mlp), 2, seed=0, progress=progress)  # no verifying products
    assert ([done for done, _ in calls] == list(range(1, result.iterations + 1))
            == list(range(1, result.hvp_count + 1)))
    assert {total for _, total in calls} == {None}
    calls, progress = progress_recorder()
    power_iteration(hessian_op(digits_mlp), 1, max_iter=4, progress=progress)
    assert calls == [(i, None) for i in range(1, len(calls) + 1)] and 2 <= len(calls) <= 4
    flat, data, w, _, _ = digits_mlp
    objectives = {c: Objective(flat, flat.buffers(), data.subset(torch.arange(c * 50, c * 50 + 50)))
                  for c in range(3)}
    calls, progress = progress_recorder()
    products, on_product = progress_recorder()
    results = client_lambda_max(objectives, w, progress=progress, products=on_product)
    assert calls == [(1, 3), (2, 3), (3, 3)]
    # every product of every client's operator, each client's count from 1
    starts = [i for i, (done, total) in enumerate(products) if done == 1]
    assert len(starts) == 3 and all(total is None for _, total in products)
    assert len(products) == sum(r.hvp_count for r in results.values())
