"""Benchmark: where Lanczos spends its time outside the Hessian-vector products, on a 657,910-parameter MLP.

A digits MLP with hidden [774, 774] (657,910 parameters), FedAvg for 10 rounds through the API unless --run
names a run directory; the whole training set (1,437 samples, batches of 512, eval mode, float32). For each
setting ``lanczos_topk`` (k = 5, tol 1e-3) runs ``--repeat`` times; the time inside the operator's products is
measured by wrapping its ``matmat``; everything else (Gram-Schmidt passes on the contiguous row basis,
appending vectors, the tridiagonal eigenproblems of the stopping test, the Ritz vectors) is the overhead.
Also counts how many steps needed the second Gram-Schmidt pass. Usage:

    .venv/bin/python benchmarks/lanczos_overhead.py [--threads 1] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np
import torch

import landscape
from landscape.config import overrides as recipe_overrides
from landscape.core.flat import FlatModel
from landscape.measure.analysis_data import AnalysisData
from landscape.measure.krylov import KrylovBasis
from landscape.measure.lanczos import lanczos_topk
from landscape.measure.objective import Objective
from landscape.measure.operator import HessianOperator
from landscape.train import loop


def train(out: Path) -> Path:
    if (out / "recipe.toml").is_file() and any((out / "checkpoints").glob("round-*.pt")):
        return out  # trained by an earlier call
    recipe = recipe_overrides.build(None, [("model.name", "mlp"), ("model.hidden", [774, 774]),
                                           ("train.rounds", 10), ("train.device", "cpu")])
    loop.start_run(recipe, out, overwrite=True, progress=False)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=Path("runs/bench-lanczos/mlp774"))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    run = landscape.open_run(args.run or train(args.out))
    module = run.model()
    train_set, _ = run.data()
    flat = FlatModel(module)
    w = flat.vector()
    objective = Objective(flat, flat.buffers(), AnalysisData(train_set.x, train_set.y, 512))
    HessianOperator(objective, w) @ torch.ones_like(w)  # warm-up

    calls, passes = [0], {"second": 0}
    orthogonalise = KrylovBasis.orthogonalise
    project_out = KrylovBasis._project_out

    def counting_project_out(self, z):
        calls[0] += 1
        return project_out(self, z)

    def counting_orthogonalise(self, z):
        before = calls[0]
        result = orthogonalise(self, z)
        passes["second"] += calls[0] - before == 2
        return result

    KrylovBasis.orthogonalise = counting_orthogonalise
    KrylovBasis._project_out = counting_project_out
    load = os.getloadavg()
    print(f"MLP hidden [774, 774]: {flat.dim:,} parameters, {len(objective.data)} samples, torch threads "
          f"{torch.get_num_threads()} of {os.cpu_count()} cores, load average {load[0]:.2f}\n")
    print("| setting | HVPs | steps | steps with a second pass | seconds | in products | outside | outside share |")
    print("|---|---|---|---|---|---|---|---|")
    for keep, verify in ((None, False), (None, True), (False, False)):
        rows = []
        for _ in range(args.repeat):
            op = HessianOperator(objective, w, keep_graph=keep)
            inner, spent = op.matmat, [0.0]

            def timed_matmat(vectors, inner=inner, spent=spent):
                started = time.perf_counter()
                out = inner(vectors)
                spent[0] += time.perf_counter() - started
                return out

            op.matmat = timed_matmat
            passes["second"] = 0
            started = time.perf_counter()
            result = lanczos_topk(op, 5, seed=0, verify=verify)
            total = time.perf_counter() - started
            rows.append((total, spent[0], result.hvp_count, result.iterations, passes["second"]))
        total, inside, hvps, steps, second = (float(np.median([r[i] for r in rows])) for i in range(5))
        name = (f"{'kept graphs' if keep is None else 'graph rebuilt per product'}, "
                f"{'residuals checked by k more products' if verify else 'residuals from the recorded products (default)'}")
        print(f"| {name} | {hvps:.0f} | {steps:.0f} | {second:.0f} | {total:.2f} | {inside:.2f} | {total - inside:.3f} | "
              f"{(total - inside) / total:.1%} |", flush=True)
    print(f"\nload average at the end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
