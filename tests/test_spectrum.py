"""Spectral solvers against dense eigendecompositions and exact traces; PyHessian on the same data."""

import math

import pytest
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch.func import functional_call

from landscape.analyze import spectrum
from landscape.analyze.objective import AnalysisData, Objective
from landscape.analyze.operator import HessianOperator, MatrixOperator
from landscape.analyze.pyhessian_backend import pyhessian_lambda_max_and_trace
from landscape.errors import LandscapeError
from landscape.flat import FlatModel
from landscape.models import build_model


def _dense_hessian(flat: FlatModel, data: AnalysisData, w: torch.Tensor) -> torch.Tensor:
    """grad^2 of the mean CE over the whole of ``data`` in one piece (no batches): independent of the operator."""

    def loss(u):
        return F.cross_entropy(functional_call(flat.module, flat.params(u), (data.x,)), data.y)

    return torch.autograd.functional.hessian(loss, w, vectorize=True)


@pytest.fixture(scope="module")
def digits_mlp():
    """A 1,210-parameter MLP on 200 digits (float64), its objective in batches of 50, and its dense Hessian."""
    torch.manual_seed(0)
    module = build_model("mlp", (1, 8, 8), 10, {"hidden": [16]}).double()
    digits = load_digits()
    x = torch.tensor(digits.data[:200] / 16.0).reshape(-1, 1, 8, 8)
    y = torch.tensor(digits.target[:200])
    flat = FlatModel(module)
    data = AnalysisData(x, y, 50)
    w = flat.vector()
    hessian = _dense_hessian(flat, data, w)
    return flat, data, w, hessian, torch.linalg.eigvalsh(hessian)


def _op(digits_mlp, backend="double-backward"):
    flat, data, w, _, _ = digits_mlp
    return HessianOperator(Objective(flat, flat.buffers(), data), w, backend)


def test_lanczos_top5_matches_the_dense_eigenvalues(digits_mlp):
    _, _, _, hessian, exact = digits_mlp
    top = exact.flip(0)[:5]
    op = _op(digits_mlp)
    result = spectrum.lanczos_topk(op, 5, keep_vectors=True, seed=0, verify=True)
    assert result.converged.all() and result.residual_source == "hvp"
    assert ((result.values - top).abs() / top.abs()).max() <= 1e-4
    assert (result.residuals <= 1e-3 * result.values.abs()).all()
    # the reported residuals are the true ones: recompute them with the dense Hessian
    vectors = result.vectors
    dense_residuals = torch.linalg.vector_norm(hessian @ vectors - vectors * result.values, dim=0)
    torch.testing.assert_close(result.residuals, dense_residuals, rtol=1e-6, atol=1e-12)
    torch.testing.assert_close(vectors.T @ vectors, torch.eye(5, dtype=torch.float64), rtol=0, atol=1e-10)
    assert result.hvp_count == op.hvp_count == result.iterations + 5  # Krylov steps + one verifying matmat
    assert result.iterations >= 15  # Krylov size >= k + 10
    assert result.top_ratio == pytest.approx(float(top[0] / top[4]), rel=1e-4)


def test_lanczos_tight_tolerance_and_smallest_eigenvalues(digits_mlp):
    _, _, _, _, exact = digits_mlp
    op = _op(digits_mlp, "forward-over-reverse")
    largest = spectrum.lanczos_topk(op, 3, tol=1e-8, verify=False, seed=1)
    torch.testing.assert_close(largest.values, exact.flip(0)[:3], rtol=1e-12, atol=0)
    assert largest.residual_source == "lanczos"
    smallest = spectrum.lanczos_topk(op, 2, tol=1e-6, which="smallest-algebraic", seed=1)
    assert smallest.converged.all()
    torch.testing.assert_close(smallest.values, exact[:2], rtol=1e-8, atol=0)


def test_power_iteration_agrees_and_needs_more_products_than_lanczos(digits_mlp):
    _, _, _, _, exact = digits_mlp
    power_top1 = spectrum.power_iteration(_op(digits_mlp), 1, seed=0)
    assert power_top1.values[0] == pytest.approx(float(exact[-1]), rel=2e-3)
    assert power_top1.converged.all()
    power = spectrum.power_iteration(_op(digits_mlp), 5, seed=0)
    lanczos = spectrum.lanczos_topk(_op(digits_mlp), 5, seed=0)
    assert power.hvp_count > lanczos.hvp_count
    assert power.hvp_count == power.iterations


def test_lanczos_on_invariant_subspaces():
    # rank 3: the Krylov space of any start vector is 4-dimensional; the rest is found by restarts
    basis, _ = torch.linalg.qr(torch.randn(50, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0)))
    low_rank = basis @ torch.diag(torch.tensor([3.0, 2.0, 1.0], dtype=torch.float64)) @ basis.T
    result = spectrum.lanczos_topk(MatrixOperator(low_rank), 5)
    torch.testing.assert_close(result.values, torch.tensor([3.0, 2.0, 1.0, 0.0, 0.0], dtype=torch.float64),
                               rtol=0, atol=1e-12)
    assert (result.residuals <= 1e-12).all()
    # a multiple of the identity: every vector is an eigenvector (beta = 0 at the first step)
    result = spectrum.lanczos_topk(MatrixOperator(2 * torch.eye(30, dtype=torch.float64)), 5)
    torch.testing.assert_close(result.values, torch.full((5,), 2.0, dtype=torch.float64), rtol=0, atol=1e-12)
    assert result.converged.all()
    # a space smaller than the Krylov size: the whole spectrum, exactly
    small = torch.diag(torch.arange(1.0, 7.0, dtype=torch.float64))
    result = spectrum.lanczos_topk(MatrixOperator(small), 6, verify=False)
    torch.testing.assert_close(result.values, torch.arange(6.0, 0.0, -1.0, dtype=torch.float64), rtol=0, atol=1e-12)
    assert result.iterations == 6


def test_bad_solver_arguments_are_named():
    op = MatrixOperator(torch.eye(4, dtype=torch.float64))
    with pytest.raises(LandscapeError, match="k must be between 1 and the dimension 4, got 5"):
        spectrum.lanczos_topk(op, 5)
    with pytest.raises(LandscapeError, match="unknown eigenvalue selection 'top'"):
        spectrum.lanczos_topk(op, 1, which="top")
    with pytest.raises(LandscapeError, match="Krylov size must exceed k=2"):
        spectrum.lanczos_topk(op, 2, krylov=2)
    with pytest.raises(LandscapeError, match="at least 2 samples"):
        spectrum.hutchinson_trace(op, samples=1)
    with pytest.raises(LandscapeError, match="at least 6"):
        spectrum.hutchpp_trace(op, hvps=5)


def test_trace_estimates_are_within_three_standard_errors(digits_mlp):
    _, _, _, hessian, _ = digits_mlp
    exact = float(torch.trace(hessian))
    hutchinson = spectrum.hutchinson_trace(_op(digits_mlp), samples=200, seed=0)
    assert hutchinson.hvp_count == hutchinson.samples == 200
    assert abs(hutchinson.estimate - exact) <= 3 * hutchinson.stderr
    hutchpp = spectrum.hutchpp_trace(_op(digits_mlp), hvps=150, seed=0)
    assert hutchpp.hvp_count == 150
    assert abs(hutchpp.estimate - exact) <= 3 * hutchpp.stderr
    # its sketch part tr(Q^T H Q) is the trace of H restricted to a 50-dimensional subspace
    assert abs(hutchpp.settings["low_rank_part"]) <= float(torch.linalg.eigvalsh(hessian).abs()[-50:].sum())


def test_hutchinson_and_hutchpp_against_exact_matrix_identities():
    generator = torch.Generator().manual_seed(2)
    # Rademacher probes have z_i^2 = 1: a diagonal matrix's quadratic forms are its trace exactly
    diagonal = torch.diag(torch.randn(40, dtype=torch.float64, generator=generator))
    result = spectrum.hutchinson_trace(MatrixOperator(diagonal), samples=5)
    assert result.estimate == pytest.approx(float(torch.trace(diagonal)), rel=1e-12)
    assert result.stderr <= 1e-12
    # rank <= sketch size: Q spans the range, the deflated remainder is 0, Hutch++ is exact
    factor = torch.randn(60, 4, dtype=torch.float64, generator=generator)
    low_rank = factor @ factor.T
    result = spectrum.hutchpp_trace(MatrixOperator(low_rank), hvps=30)
    assert result.estimate == pytest.approx(float(torch.trace(low_rank)), rel=1e-10)
    assert result.settings["sketch"] == 10


def test_slq_density_integrates_to_one_and_its_mean_is_the_trace(digits_mlp):
    _, _, _, hessian, exact = digits_mlp
    op = _op(digits_mlp)
    density = spectrum.slq_density(op, runs=12, steps=40, seed=0)
    assert density.hvp_count == 12 * 40
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
    density = spectrum.slq_density(MatrixOperator(diagonal), runs=2, steps=10, seed=3)
    for run in range(2):
        kept = density.weights[run] > 1e-12
        torch.testing.assert_close(density.nodes[run][kept], torch.tensor([1.0, 2.0, 5.0], dtype=torch.float64))
        torch.testing.assert_close(density.weights[run][kept] * 2, torch.tensor([1 / 6, 2 / 6, 3 / 6],
                                                                                   dtype=torch.float64))
    assert density.hvp_count <= 2 * 4  # each run stops once its Krylov space is invariant
    assert density.trace == pytest.approx(float(torch.trace(diagonal)), rel=1e-12)
    assert density.runs == 2 and density.trace_stderr_dof == 1
    single = spectrum.slq_density(MatrixOperator(diagonal), runs=1, steps=10, seed=3)
    assert single.trace_stderr_dof == 0 and single.trace_stderr == math.inf  # no spread to measure, not 0


def test_slq_default_runs_give_the_trace_stderr_three_degrees_of_freedom():
    from landscape.analyze.passes import HessianOptions

    assert HessianOptions().density_runs == 4
    density = spectrum.slq_density(MatrixOperator(torch.diag(torch.arange(1.0, 21.0, dtype=torch.float64))),
                                   runs=HessianOptions().density_runs, steps=5, seed=0)
    assert density.runs == 4 and density.trace_stderr_dof == 3


def test_client_lambda_max_is_each_clients_dense_top_eigenvalue(digits_mlp):
    flat, data, w, _, _ = digits_mlp
    parts = {0: torch.arange(0, 60), 3: torch.arange(60, 130), 7: torch.arange(130, 200)}
    objectives = {client: Objective(flat, flat.buffers(), data.subset(index)) for client, index in parts.items()}
    results = spectrum.client_lambda_max(objectives, w, tol=1e-6, seed=0)
    assert list(results) == [0, 3, 7]
    for client, index in parts.items():
        exact = torch.linalg.eigvalsh(_dense_hessian(flat, data.subset(index), w))[-1]
        assert float(results[client].values[0]) == pytest.approx(float(exact), rel=1e-6)
        assert results[client].converged.all()


def test_pyhessian_backend_agrees_and_leaves_the_module_untouched(digits_mlp):
    flat, data, w, hessian, exact = digits_mlp
    module = flat.module
    module.train()
    before = {k: v.clone() for k, v in module.state_dict().items()}
    rng_state = torch.get_rng_state()
    native = spectrum.lanczos_topk(_op(digits_mlp), 1, seed=0)
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


# ----------------------------------------------------------------------------------------------------------
# XTrace, trace_estimate, residuals from the recorded products, progress


def _leave_one_out_xtrace(matrix: torch.Tensor, omega: torch.Tensor, normalise: bool) -> torch.Tensor:
    """Each XTrace sample T_i computed the long way: an explicit basis of H Omega without column i, the
    explicit residual probe (scaled onto the complement's sphere with ``normalise``), dense products."""
    dim, probes = omega.shape
    y = matrix @ omega
    samples = []
    for i in range(probes):
        others = torch.cat([y[:, :i], y[:, i + 1 :]], dim=1)
        basis, _ = torch.linalg.qr(others)
        projector = basis @ basis.T
        u = omega[:, i] - projector @ omega[:, i]
        scale = (dim - probes + 1) / float(u @ u) if normalise else 1.0
        samples.append(torch.trace(basis.T @ matrix @ basis) + scale * (u @ matrix @ u))
    return torch.stack(samples)


@pytest.mark.parametrize("probes", ["rademacher", "gaussian"])
def test_xtrace_equals_its_leave_one_out_definition(probes):
    generator = torch.Generator().manual_seed(5)
    factor = torch.randn(40, 40, dtype=torch.float64, generator=generator)
    matrix = factor @ torch.diag(torch.linspace(-1, 3, 40, dtype=torch.float64) ** 3) @ factor.T / 40
    op = MatrixOperator(matrix)
    result = spectrum.xtrace(op, hvps=16, seed=7, block=3, probes=probes)
    generator = torch.Generator().manual_seed(7)  # its probes
    if probes == "gaussian":
        omega = torch.randn(40, 8, generator=generator, dtype=torch.float64)
    else:
        omega = (2 * torch.randint(0, 2, (40, 8), generator=generator, dtype=torch.int8) - 1).double()
    samples = _leave_one_out_xtrace(matrix, omega, normalise=probes == "gaussian")
    assert result.estimate == pytest.approx(float(samples.mean()), rel=1e-10)
    assert result.settings["paper_stderr"] == pytest.approx(float(samples.std() / math.sqrt(8)), rel=1e-8)
    # the reported stderr: the delete-one jackknife, each t_(i) a whole XTrace of the 7 other probes, the long way
    left_out = torch.stack([_leave_one_out_xtrace(matrix, torch.cat([omega[:, :i], omega[:, i + 1 :]], dim=1),
                                                  normalise=probes == "gaussian").mean() for i in range(8)])
    jackknife = math.sqrt(7 / 8 * float(((left_out - left_out.mean()) ** 2).sum()))
    assert result.stderr == pytest.approx(jackknife, rel=1e-8)
    assert result.stderr_method == "jackknife" and result.stderr_dof == 7
    assert result.hvp_count == op.hvp_count == 16 and result.samples == 8
    assert not result.settings["rank_deficient"] and result.settings["probes"] == probes


def test_xtrace_is_unbiased_over_many_seeds():
    generator = torch.Generator().manual_seed(3)
    basis, _ = torch.linalg.qr(torch.randn(60, 60, dtype=torch.float64, generator=generator))
    matrix = basis @ torch.diag(torch.cat([torch.tensor([9.0, 5.0, -3.0], dtype=torch.float64),
                                           torch.randn(57, dtype=torch.float64, generator=generator)])) @ basis.T
    exact = float(torch.trace(matrix))
    for probes in ("rademacher", "gaussian"):
        results = [spectrum.xtrace(MatrixOperator(matrix), hvps=12, seed=seed, probes=probes) for seed in range(400)]
        estimates = torch.tensor([r.estimate for r in results], dtype=torch.float64)
        mean_stderr = float(estimates.std() / math.sqrt(len(results)))
        assert abs(float(estimates.mean()) - exact) <= 4 * mean_stderr, probes


def test_xtrace_is_within_three_standard_errors_and_exact_on_low_rank(digits_mlp):
    _, _, _, hessian, _ = digits_mlp
    exact = float(torch.trace(hessian))
    result = spectrum.xtrace(_op(digits_mlp), hvps=60, seed=0)
    assert result.hvp_count == 60
    assert abs(result.estimate - exact) <= 3 * result.stderr
    factor = torch.randn(60, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    low_rank = factor @ factor.T
    result = spectrum.xtrace(MatrixOperator(low_rank), hvps=21)  # an odd budget uses 2 * 10 products
    assert result.hvp_count == 20 and result.settings["rank_deficient"]
    assert result.estimate == pytest.approx(float(torch.trace(low_rank)), rel=1e-10) and result.stderr == 0.0
    assert result.stderr_method == "exact" and result.stderr_dof == 0


def test_xtrace_jackknife_on_an_ill_conditioned_sketch():
    # rank 9 + 1e-10 I with 10 probes: R is nearly singular and the pairwise O(s^3) formula gives nan; the
    # QR-per-probe path must give the dense leave-one-out jackknife
    generator = torch.Generator().manual_seed(0)
    factor = torch.randn(40, 9, dtype=torch.float64, generator=generator)
    matrix = factor @ factor.T + 1e-10 * torch.diag(torch.rand(40, dtype=torch.float64, generator=generator))
    result = spectrum.xtrace(MatrixOperator(matrix), hvps=20, seed=1)
    omega = torch.randn(40, 10, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    left_out = torch.stack([_leave_one_out_xtrace(matrix, torch.cat([omega[:, :i], omega[:, i + 1 :]], dim=1),
                                                  normalise=True).mean() for i in range(10)])
    assert not result.settings["rank_deficient"]
    assert result.stderr == pytest.approx(math.sqrt(0.9 * float(((left_out - left_out.mean()) ** 2).sum())),
                                          rel=1e-8)


def test_trace_standard_errors_are_calibrated_over_seeds():
    # a fixed 100 x 100 matrix with a decaying spectrum 10 / k and its last 20 eigenvalues negative
    basis, _ = torch.linalg.qr(torch.randn(100, 100, dtype=torch.float64, generator=torch.Generator().manual_seed(0)))
    eigenvalues = 10 / torch.arange(1, 101, dtype=torch.float64)
    eigenvalues[-20:] *= -0.3
    matrix = basis @ torch.diag(eigenvalues) @ basis.T
    exact = float(torch.trace(matrix))
    kinds = {"xtrace": ("jackknife", 14), "hutch++": ("conditional", 9), "hutchinson": ("sample", 29)}
    for method, (kind, dof) in kinds.items():
        results = [spectrum.trace_estimate(MatrixOperator(matrix), hvps=30, method=method, seed=seed)
                   for seed in range(200)]
        assert {(r.stderr_method, r.stderr_dof) for r in results} == {(kind, dof)}, method
        z = torch.tensor([(r.estimate - exact) / r.stderr for r in results], dtype=torch.float64)
        # 0.3% of a normal z lies beyond 3 (0.6% of a Student t with 9 degrees of freedom)
        assert float((z.abs() < 3).double().mean()) >= 0.98, method
        assert 0.5 <= float(z.std()) <= 1.25, method  # measured: 0.70 (jackknife), 0.95, 1.07
        if method == "xtrace":  # the paper's error estimate treats the T_i as independent: too small
            paper = torch.tensor([(r.estimate - exact) / r.settings["paper_stderr"] for r in results])
            assert float((paper.abs() < 3).double().mean()) < 0.96 and float(paper.std()) > 1.3  # 0.935, 1.54


def test_trace_estimate_runs_the_named_estimator():
    matrix = torch.diag(torch.arange(1.0, 31.0, dtype=torch.float64))
    for method in spectrum.TRACE_METHODS:
        result = spectrum.trace_estimate(MatrixOperator(matrix), hvps=12, method=method, seed=1)
        assert result.method == method and result.hvp_count == 12
    assert spectrum.trace_estimate(MatrixOperator(matrix), hvps=12).method == spectrum.DEFAULT_TRACE_METHOD
    with pytest.raises(LandscapeError, match="unknown trace estimator 'exact'; choose from: xtrace, hutch"):
        spectrum.trace_estimate(MatrixOperator(matrix), method="exact")
    with pytest.raises(LandscapeError, match="XTrace needs at least 4"):
        spectrum.xtrace(MatrixOperator(matrix), hvps=3)
    with pytest.raises(LandscapeError, match="XTrace probes must be rademacher or gaussian, got 'sphere'"):
        spectrum.xtrace(MatrixOperator(matrix), probes="sphere")


def test_unverified_lanczos_residuals_are_the_true_residuals(digits_mlp):
    _, _, _, hessian, _ = digits_mlp
    result = spectrum.lanczos_topk(_op(digits_mlp), 5, keep_vectors=True, seed=0)  # the default: verify=False
    assert result.hvp_count == result.iterations and result.residual_source == "lanczos"  # no verifying products
    vectors = result.vectors
    dense = torch.linalg.vector_norm(hessian @ vectors - vectors * result.values, dim=0)
    torch.testing.assert_close(result.residuals, dense, rtol=1e-6, atol=1e-12)
    torch.testing.assert_close(result.residuals, torch.tensor(result.settings["lanczos_residuals"],
                                                              dtype=torch.float64), rtol=1e-6, atol=1e-12)


def test_reorthogonalisation_makes_a_second_pass_only_when_the_first_cancels():
    op = MatrixOperator(torch.eye(50, dtype=torch.float64))
    basis = spectrum._Basis(op, 4)
    q, _ = torch.linalg.qr(torch.randn(50, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0)))
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


def test_solvers_report_progress(digits_mlp):
    def recorder():
        calls = []
        return calls, lambda done, total: calls.append((done, total))

    calls, progress = recorder()
    result = spectrum.lanczos_topk(_op(digits_mlp), 2, seed=0, progress=progress, verify=True)
    assert [done for done, _ in calls] == list(range(1, result.iterations + 1)) + [result.hvp_count]
    calls, progress = recorder()
    result = spectrum.lanczos_topk(_op(digits_mlp), 2, seed=0, progress=progress)  # no verifying products
    assert [done for done, _ in calls] == list(range(1, result.iterations + 1)) == list(range(1, result.hvp_count + 1))
    assert {total for _, total in calls} == {None}
    for name, call in (("hutchinson", lambda p: spectrum.hutchinson_trace(_op(digits_mlp), samples=25, progress=p)),
                       ("hutch++", lambda p: spectrum.hutchpp_trace(_op(digits_mlp), hvps=24, block=4, progress=p)),
                       ("xtrace", lambda p: spectrum.xtrace(_op(digits_mlp), hvps=24, block=5, progress=p))):
        calls, progress = recorder()
        call(progress)
        done = [d for d, _ in calls]
        assert done == sorted(done) and done[-1] == 24 + (name == "hutchinson"), name
        assert {total for _, total in calls} == {24 + (name == "hutchinson")}, name
    calls, progress = recorder()
    spectrum.slq_density(_op(digits_mlp), runs=2, steps=5, progress=progress)
    assert calls == [(i, 10) for i in range(1, 11)]
    calls, progress = recorder()
    spectrum.power_iteration(_op(digits_mlp), 1, max_iter=4, progress=progress)
    assert calls == [(i, None) for i in range(1, len(calls) + 1)] and 2 <= len(calls) <= 4
    flat, data, w, _, _ = digits_mlp
    objectives = {c: Objective(flat, flat.buffers(), data.subset(torch.arange(c * 50, c * 50 + 50)))
                  for c in range(3)}
    calls, progress = recorder()
    spectrum.client_lambda_max(objectives, w, progress=progress)
    assert calls == [(1, 3), (2, 3), (3, 3)]
