"""Benchmark: top-5 Hessian eigenvalues by our Lanczos vs PyHessian's deflated power iteration.

One trained model, one data set (the run's whole training set, eval mode, batches of 512), both methods at
their default tolerance 1e-3. Trains a FedAvg model on digits first through the API (30 rounds; default the
4,810-parameter MLP with hidden [64], or any model via --model/--hidden) unless --run names an existing run
directory. Reference eigenvalues: the dense float64 Hessian (torch.func.jacrev of the gradient, in chunks)
when the model has at most --dense-limit parameters, otherwise ARPACK (scipy.sparse.linalg.eigsh, tol 1e-10)
driven by our float64 Hessian-vector product (scipy comes with scikit-learn). Prints a Markdown table: HVPs,
seconds, max relative error of lambda_1..5, and the PyHessian / Lanczos ratios. Usage:

    .venv/bin/python benchmarks/hessian_vs_pyhessian.py [--model mlp --hidden 64] [--run DIR] [--device cpu]
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.func import functional_call

import landscape
from landscape import recipe as recipes
from landscape.analyze import spectrum
from landscape.analyze.objective import AnalysisData, Objective
from landscape.analyze.operator import HessianOperator
from landscape.analyze.pyhessian_backend import pyhessian_lambda_max_and_trace
from landscape.flat import FlatModel
from landscape.train import loop

TOP = 5


def train(model: str, hidden: int, out: Path) -> Path:
    if (out / "recipe.toml").is_file() and any((out / "checkpoints").glob("round-*.pt")):
        return out  # trained by an earlier call
    overrides = [("model.name", model), ("train.rounds", 30), ("train.device", "cpu")]
    if model == "mlp":
        overrides.append(("model.hidden", [hidden]))
    loop.start_run(recipes.build(None, overrides), out, overwrite=True, progress=False)
    return out


def dense_reference(flat: FlatModel, data: AnalysisData, w: torch.Tensor) -> np.ndarray:
    """Top eigenvalues of the dense float64 Hessian of the whole-set mean CE."""

    def loss(u):
        total = 0.0
        for xb, yb in data.batches():
            total = total + F.cross_entropy(functional_call(flat.module, flat.params(u), (xb,)), yb, reduction="sum")
        return total / len(data)

    hessian = torch.func.jacrev(torch.func.grad(loss), chunk_size=128)(w)
    hessian = (hessian + hessian.T) / 2
    return torch.linalg.eigvalsh(hessian).flip(0)[:TOP].numpy()


def arpack_reference(op: HessianOperator) -> np.ndarray:
    from scipy.sparse.linalg import LinearOperator, eigsh

    def matvec(v: np.ndarray) -> np.ndarray:
        return op.matvec(torch.from_numpy(np.ascontiguousarray(v).reshape(-1))).cpu().numpy()

    linear = LinearOperator((op.dim, op.dim), matvec=matvec, dtype=np.float64)
    values = eigsh(linear, k=TOP, which="LA", tol=1e-10, return_eigenvectors=False)
    return np.sort(values)[::-1]


def max_relative_error(values, reference: np.ndarray) -> float:
    values = np.asarray(values, dtype=np.float64)[: len(reference)]
    return float(np.max(np.abs(values - reference) / np.abs(reference)))


def timed(fn, repeat: int):
    """(result of the last call, median seconds over ``repeat`` calls); every call is seeded identically.

    ``fn`` returns (values, hvps, converged, own seconds or None); its own timer, where given, wins."""
    seconds = []
    for _ in range(repeat):
        started = time.perf_counter()
        *result, own = fn()
        seconds.append(time.perf_counter() - started if own is None else own)
    return result, float(np.median(seconds))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", help="an existing run directory (default: train one)")
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--hidden", type=int, default=64, help="mlp hidden width")
    parser.add_argument("--out", default="runs/bench-hessian")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dense-limit", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--repeat", type=int, default=3, help="timed calls per method (median reported)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)

    run_dir = Path(args.run) if args.run else train(args.model, args.hidden, Path(args.out) / args.model)
    run = landscape.open_run(run_dir)
    module = run.model().to(device)
    train_set, _ = run.data()
    flat = FlatModel(module)
    w = flat.vector()
    data = AnalysisData(train_set.x.to(device), train_set.y.to(device), 512)
    objective = Objective(flat, flat.buffers(), data, "eval")

    # reference (float64)
    module64 = run.model().double().to(device)
    flat64 = FlatModel(module64)
    data64 = data.to(device, torch.float64)
    started = time.perf_counter()
    if flat.dim <= args.dense_limit:
        reference, how = dense_reference(flat64, data64, flat64.vector()), "dense float64 Hessian"
    else:
        op64 = HessianOperator(Objective(flat64, flat64.buffers(), data64), flat64.vector())
        reference, how = arpack_reference(op64), "ARPACK eigsh (tol 1e-10) on float64 HVPs"
    reference_seconds = time.perf_counter() - started

    HessianOperator(objective, w).matvec(torch.ones_like(w))  # warm-up: first-call allocations

    def lanczos(backend: str, tol: float, verify: bool):
        op = HessianOperator(objective, w, backend)
        result = spectrum.lanczos_topk(op, TOP, tol=tol, seed=args.seed, verify=verify)
        return result.values.numpy(), result.hvp_count, bool(result.converged.all()), None

    def power(tol: float):
        result = spectrum.power_iteration(HessianOperator(objective, w), TOP, tol=tol, seed=args.seed)
        return result.values.numpy(), result.hvp_count, bool(result.converged.all()), None

    def pyhessian(tol: float):
        result = pyhessian_lambda_max_and_trace(module, data, w, top_n=TOP, trace_iters=0, tol=tol, device=device,
                                                seed=args.seed)
        # its own timer: the eigenvalue loop only (not the model copy)
        return np.array(result.eigenvalues), result.eigen_hvp_count, None, result.eigen_seconds

    methods = [
        ("Lanczos, tol 1e-3 (default: residuals verified by 5 HVPs)", "ours", lambda: lanczos("double-backward", 1e-3, True)),
        ("Lanczos forward-over-reverse, tol 1e-3, verified", "ours", lambda: lanczos("forward-over-reverse", 1e-3, True)),
        ("Lanczos, tol 1e-3, Lanczos-relation residuals", "ours", lambda: lanczos("double-backward", 1e-3, False)),
        ("Lanczos, tol 1e-2, Lanczos-relation residuals", "ours", lambda: lanczos("double-backward", 1e-2, False)),
        ("power iteration (ours, PyHessian's rule), tol 1e-3", "power", lambda: power(1e-3)),
        ("PyHessian eigenvalues(top_n=5), tol 1e-3 (its default)", "pyhessian", lambda: pyhessian(1e-3)),
        ("PyHessian eigenvalues(top_n=5), tol 1e-4", "pyhessian", lambda: pyhessian(1e-4)),
        ("PyHessian eigenvalues(top_n=5), tol 1e-5", "pyhessian", lambda: pyhessian(1e-5)),
        ("PyHessian eigenvalues(top_n=5), tol 1e-6", "pyhessian", lambda: pyhessian(1e-6)),
        ("PyHessian eigenvalues(top_n=5), tol 1e-7", "pyhessian", lambda: pyhessian(1e-7)),
    ]
    rows = []
    for name, kind, method in methods:
        (values, hvps, converged), seconds = timed(method, args.repeat)
        rows.append((name, kind, hvps, seconds, max_relative_error(values, reference), converged))

    print(f"model: {run.recipe['model']['name']} ({flat.dim:,} parameters, {w.dtype}), data: {len(data)} "
          f"training samples in batches of {data.batch_size}, device {device}, torch threads "
          f"{torch.get_num_threads()} of {os.cpu_count()} cores")
    print(f"reference: {how} ({reference_seconds:.1f} s): lambda_1..5 = "
          + ", ".join(f"{v:.6g}" for v in reference))
    print()
    print(f"| method | HVPs | seconds (median of {args.repeat}) | max rel. error lambda_1..5 | all converged |")
    print("|---|---|---|---|---|")
    for name, _, hvps, seconds, error, converged in rows:
        flag = "-" if converged is None else ("yes" if converged else "no")
        print(f"| {name} | {hvps} | {seconds:.2f} | {error:.2e} | {flag} |")
    print()
    ours, baseline = rows[0], rows[5]
    print(f"PyHessian default / Lanczos default: HVPs {baseline[2] / ours[2]:.1f}x, time {baseline[3] / ours[3]:.1f}x "
          f"(errors {baseline[4]:.1e} vs {ours[4]:.1e})")
    cheapest = min((r for r in rows if r[1] == "ours" and r[4] <= baseline[4]), key=lambda r: r[2])
    print(f"at PyHessian's default accuracy ({baseline[4]:.1e}), cheapest Lanczos row '{cheapest[0]}': "
          f"HVPs {baseline[2] / cheapest[2]:.1f}x, time {baseline[3] / cheapest[3]:.1f}x fewer")
    matching = [r for r in rows if r[1] == "pyhessian" and r[4] <= ours[4]]
    if matching:
        best = min(matching, key=lambda r: r[2])
        print(f"at the default Lanczos accuracy ({ours[4]:.1e}): PyHessian '{best[0]}' needs "
              f"{best[2] / ours[2]:.1f}x the HVPs and {best[3] / ours[3]:.1f}x the time")
    else:
        print(f"at the default Lanczos accuracy ({ours[4]:.1e}): no PyHessian row gets there "
              f"(its best: {min(r[4] for r in rows if r[1] == 'pyhessian'):.1e})")


if __name__ == "__main__":
    main()
