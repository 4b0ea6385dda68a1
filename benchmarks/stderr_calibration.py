"""Benchmark: are the trace estimators' standard errors calibrated? z = (estimate - tr H) / stderr over seeds.

For each matrix and budget of products, every seed 0..``--seeds``-1 runs ``landscape.measure.trace`` on the
exact matrix (``MatrixOperator``): XTrace (its default Gaussian probes) with its reported standard error (the
sample variance of its T_i / s plus their pairwise covariance, ``stderr_method="pairwise"``), and with the
paper's error estimate sd(T_i) / sqrt(s) and the delete-one jackknife over the probes (the same estimates;
``settings["paper_stderr"]``, ``settings["jackknife_stderr"]``), Hutch++ (the conditional error of its
Monte-Carlo part) and Hutchinson (sample sd / sqrt(n)). Reported per estimator: sd(z) (1 for a calibrated error, below 1 for a
conservative one) and the share of seeds with |z| > 3 (0.3% for a normal z).

Matrices: the fixed 100 x 100 matrix of ``tests/measure/test_trace.py::
test_trace_standard_errors_are_calibrated_over_seeds`` (a seeded orthogonal basis, eigenvalues 10 / k, the
last 20 times -0.3) and the same with 10 / k^p, p = 0.5 and 1.5; the dense float64 Hessian of the tests'
1,210-parameter digits MLP (``tests/support/spectral_checks.py::digits_mlp_problem``, built by that function). The
FedAvg digits MLP of ``benchmarks/trace_estimators.py`` is not repeated: that benchmark reports sd(z) and
|z| > 3 per budget. Usage:

    .venv/bin/python benchmarks/stderr_calibration.py [--seeds 1000]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

from landscape.measure.operator import MatrixOperator
from landscape.measure.trace import trace_estimate, xtrace

ROOT = Path(__file__).resolve().parents[1]
COLUMNS = ("XTrace, pairwise (reported)", "XTrace, the paper's error", "XTrace, jackknife", "Hutch++",
           "Hutchinson")
SYNTHETIC_BUDGETS = (30, 60)
DIGITS_BUDGETS = (12, 30, 60)


def synthetic(power: float) -> torch.Tensor:
    """The test's 100 x 100 matrix with eigenvalues 10 / k^power (k = 1..100), the last 20 times -0.3."""
    basis, _ = torch.linalg.qr(torch.randn(100, 100, dtype=torch.float64,
                                           generator=torch.Generator().manual_seed(0)))
    eigenvalues = 10 / torch.arange(1, 101, dtype=torch.float64) ** power
    eigenvalues[-20:] *= -0.3
    return basis @ torch.diag(eigenvalues) @ basis.T


def digits_mlp_hessian() -> torch.Tensor:
    """The dense Hessian of the tests' digits MLP, built by the tests' own helper."""
    sys.path.insert(0, str(ROOT / "tests"))
    from support.spectral_checks import digits_mlp_problem

    return digits_mlp_problem()[3]


def z_scores(matrix: torch.Tensor, budget: int, seeds: int) -> dict[str, np.ndarray]:
    """z over seeds 0..seeds-1 for each column of ``COLUMNS``."""
    exact = float(torch.trace(matrix))
    out: dict[str, list[float]] = {name: [] for name in COLUMNS}
    for seed in range(seeds):
        x = xtrace(MatrixOperator(matrix), hvps=budget, seed=seed)
        pairs = [(x.estimate, x.stderr), (x.estimate, x.settings["paper_stderr"]),
                 (x.estimate, x.settings["jackknife_stderr"])]
        for method in ("hutch++", "hutchinson"):
            r = trace_estimate(MatrixOperator(matrix), hvps=budget, method=method, seed=seed)
            pairs.append((r.estimate, r.stderr))
        for name, (estimate, stderr) in zip(COLUMNS, pairs):
            out[name].append((estimate - exact) / stderr if stderr > 0 else 0.0)  # 0: exact (rank-deficient)
    return {name: np.array(values) for name, values in out.items()}


def cell(z: np.ndarray) -> str:
    return f"{z.std(ddof=1):.2f}, {np.mean(np.abs(z) > 3):.1%}"


def cases() -> list[tuple[str, torch.Tensor, int]]:
    rows = []
    for power in (1.0, 0.5, 1.5):
        matrix = synthetic(power)
        for budget in SYNTHETIC_BUDGETS:
            exponent = "" if power == 1 else f"^{power:g}"
            label = f"100 x 100, lambda_k = 10/k{exponent}, last 20 x (-0.3)"
            if power == 1.0 and budget == 30:
                label += " (the test's)"
            rows.append((label, matrix, budget))
    hessian = digits_mlp_hessian()
    for budget in DIGITS_BUDGETS:
        rows.append((f"digits MLP Hessian ({hessian.shape[0]:,} parameters, the tests')", hessian, budget))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=1000,
                        help="seeds per matrix and budget (the test: the first 200, on its matrix)")
    args = parser.parse_args()
    started = time.perf_counter()
    print(f"z = (estimate - tr H) / stderr over seeds 0..{args.seeds - 1}; each cell: sd of z, share of seeds "
          "with |z| > 3 (a normal z: 1.00, 0.3%).\n")
    print("| matrix | products | " + " | ".join(COLUMNS) + " |")
    print("|---|---|" + "---|" * len(COLUMNS))
    few = None
    for label, matrix, budget in cases():
        z = z_scores(matrix, budget, args.seeds)
        print(f"| {label} | {budget} | " + " | ".join(cell(z[name]) for name in COLUMNS) + " |", flush=True)
        if label.startswith("digits") and budget == min(DIGITS_BUDGETS):
            few = z[COLUMNS[0]]
    print(f"With few probes the pairwise error has few degrees of freedom and heavy tails: digits MLP, "
          f"{min(DIGITS_BUDGETS)} products (s = {min(DIGITS_BUDGETS) // 2}): sd {few.std(ddof=1):.2f}, "
          f"{np.mean(np.abs(few) > 3):.1%} of seeds beyond 3.")
    print(f"\n({time.perf_counter() - started:.0f} s.)", file=sys.stderr)


if __name__ == "__main__":
    main()
