"""Benchmark: Hessian-vector products and the top-5 eigenvalues, ours against PyHessian, curvlinops and
hessian-eigenthings, side by side in one process.

One trained model and one data set: a FedAvg model trained on digits through the API (30 rounds; default the
53,002-parameter CNN, ``--model mlp --hidden 64`` for the 4,810-parameter MLP) unless ``--run`` names a run
directory; its whole training set (1,437 samples) in 3 equal batches of 479, eval mode, float32. Equal batches,
because hessian-eigenthings averages its batches' Hessians with equal weights: with equal sizes every package
computes the same Hessian (checked: the first table's last column). Three tables:

1. the cost of one product against one gradient of F (min over ``--calls`` interleaved calls): ours with the
   gradient graphs kept (the default where they fit) and rebuilt every product, the one-off graph build, and the
   peers' products;
2. lambda_1..5 by each method at its defaults (and PyHessian at tighter tolerances): HVPs, seconds (median of
   ``--repeat``), max relative error against a float64 reference (the dense Hessian up to ``--dense-limit``
   parameters, else ARPACK ``eigsh`` at tol 1e-10 on float64 products);
3. ours against PyHessian, default against default, over ``--seeds`` start vectors.

Peers: PyHessian's ``hessian.eigenvalues`` (deflated power iteration, through
``landscape.measure.pyhessian_backend``); curvlinops' ``HessianLinearOperator`` with SciPy's ``eigsh`` (ARPACK,
which curvlinops' documentation uses for eigenvalues) at eigsh's default tolerance (machine precision) and at
1e-3; hessian-eigenthings' v1 ``lanczos`` and ``deflated_power_iteration`` at their defaults (k = 5). A peer
that is not installed (``pip install -e .[bench]``) or fails is named in the output instead of a row. Usage:

    .venv/bin/python benchmarks/hessian_vs_pyhessian.py [--model cnn] [--threads 1] [--repeat 3] [--seeds 5]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.func import functional_call

import landscape
from landscape.config import overrides as recipe_overrides
from landscape.core.flat import FlatModel
from landscape.measure.analysis_data import AnalysisData
from landscape.measure.lanczos import lanczos_topk, power_iteration
from landscape.measure.objective import Objective
from landscape.measure.operator import HessianOperator
from landscape.measure.pyhessian_backend import pyhessian_lambda_max_and_trace
from landscape.train import loop

TOP = 5


def model_name(recipe) -> str:
    """The recipe's model name (a recipe object or, in older versions, a dict)."""
    return recipe.model.name if hasattr(recipe, "model") else recipe["model"]["name"]


def train(model: str, hidden: int, out: Path) -> Path:
    if (out / "recipe.toml").is_file() and any((out / "checkpoints").glob("round-*.pt")):
        return out  # trained by an earlier call
    overrides = [("model.name", model), ("train.rounds", 30), ("train.device", "cpu")]
    if model == "mlp":
        overrides.append(("model.hidden", [hidden]))
    loop.start_run(recipe_overrides.build(None, overrides), out, overwrite=True, progress=False)
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
    values = np.sort(np.asarray(values, dtype=np.float64))[::-1][: len(reference)]
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


# -- peers ------------------------------------------------------------------------------------------------


class Counted:
    """A function of v [dim] or V [dim, k] that counts its products."""

    def __init__(self, fn) -> None:
        self.fn, self.count = fn, 0

    def __call__(self, v):
        self.count += 1 if v.dim() == 1 else v.shape[1]
        return self.fn(v)


def curvlinops_operator(module, data: AnalysisData):
    from curvlinops import HessianLinearOperator

    model = copy.deepcopy(module)
    params = [p for p in model.parameters() if p.requires_grad]
    return HessianLinearOperator(model, torch.nn.CrossEntropyLoss(), params, list(data.batches()),
                                 check_deterministic=False)


def curvlinops_eigsh(module, data: AnalysisData, tol: float, seed: int):
    """curvlinops' Hessian through SciPy's ARPACK eigsh (k = 5 largest algebraic)."""
    from scipy.sparse.linalg import LinearOperator, eigsh

    operator = curvlinops_operator(module, data)
    count = Counted(lambda v: operator @ v)
    dim = sum(p.numel() for p in module.parameters())
    start = np.random.default_rng(seed).standard_normal(dim)

    def matvec(v: np.ndarray) -> np.ndarray:
        return count(torch.from_numpy(np.ascontiguousarray(v, dtype=np.float32).reshape(-1))).numpy()

    started = time.perf_counter()
    values = eigsh(LinearOperator((dim, dim), matvec=matvec, dtype=np.float32), k=TOP, which="LA", tol=tol,
                   v0=start, return_eigenvectors=False)
    return np.sort(values)[::-1], count.count, None, time.perf_counter() - started


def eigenthings_operator(module, data: AnalysisData):
    import hessian_eigenthings as he

    operator = he.HessianOperator(copy.deepcopy(module), list(data.batches()), he.supervised_loss(F.cross_entropy))
    operator.matvec = Counted(operator.matvec)
    return operator


def eigenthings(module, data: AnalysisData, solver: str, seed: int):
    """hessian-eigenthings v1 at its defaults for k = 5: ``lanczos`` or ``deflated_power_iteration``."""
    import hessian_eigenthings as he

    operator = eigenthings_operator(module, data)
    started = time.perf_counter()
    if solver == "lanczos":
        result = he.lanczos(operator, k=TOP, seed=seed)
    else:
        result = he.deflated_power_iteration(operator, k=TOP, seed=seed)
    seconds = time.perf_counter() - started
    values = np.asarray(torch.as_tensor(result.eigenvalues).detach().cpu().double())
    return np.sort(values)[::-1], operator.matvec.count, None, seconds


def pyhessian_product(module, data: AnalysisData):
    """One full-data product through PyHessian's own ``dataloader_hv_product`` (its graph rebuilt per batch)."""
    from pyhessian import hessian

    model = copy.deepcopy(module)
    instance = hessian(model, torch.nn.CrossEntropyLoss(), dataloader=list(data.batches()), cuda=False)
    shapes = [p.shape for p in instance.params]

    def product(v: torch.Tensor) -> torch.Tensor:
        parts = [t.view(s) for t, s in zip(v.split([int(np.prod(s)) for s in shapes]), shapes)]
        _, hv = instance.dataloader_hv_product(parts)  # (v^T H v, H v as a list of tensors)
        return torch.cat([t.reshape(-1) for t in hv])

    return product


# -- the tables ---------------------------------------------------------------------------------------------


def _add_peers(module, objective: Objective, v: torch.Tensor, paths: dict, agreement: dict) -> dict:
    """The peers' product paths added to ``paths`` (and their H v to ``agreement``); name -> why for those
    that do not install or run."""
    def curvlinops_product():
        operator = curvlinops_operator(module, objective.data)
        return lambda u: operator @ u

    def eigenthings_product():
        operator = eigenthings_operator(module, objective.data)
        return operator.matvec

    peers = {"PyHessian 0.1: dataloader_hv_product": lambda: pyhessian_product(module, objective.data),
             "curvlinops: HessianLinearOperator @ v": curvlinops_product,
             "hessian-eigenthings v1: HessianOperator.matvec": eigenthings_product}
    missing = {}
    for name, make in peers.items():
        try:
            product = make()
            agreement[name] = product(v).reshape(-1)
            paths[name] = lambda product=product: product(v)
        except Exception as error:  # noqa: BLE001 - a peer that does not install or run is reported, not faked
            missing[name] = f"{type(error).__name__}: {str(error)[:120]}"
    return missing


def min_seconds(paths: dict, calls: int) -> dict[str, float]:
    """Seconds of each path: one warm-up call each, then the minimum over ``calls`` interleaved calls."""
    best = {name: float("inf") for name in paths}
    for fn in paths.values():
        fn()  # warm-up
    for _ in range(calls):
        for name, fn in paths.items():
            started = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - started)
    return best


def product_costs(module, flat: FlatModel, objective: Objective, w: torch.Tensor, calls: int) -> list[tuple]:
    """Seconds of one gradient, one product by each path, the graph build: min over interleaved calls."""
    v = torch.randn(flat.dim, generator=torch.Generator().manual_seed(1))
    recomputed = HessianOperator(objective, w, keep_graph=False)
    kept = HessianOperator(objective, w, keep_graph=True)
    reference = recomputed @ v

    def build():
        HessianOperator(objective, w, keep_graph=True) @ v  # the first product builds and keeps the graphs

    paths = {
        "gradient of F (Objective.loss_and_grad)": lambda: objective.loss_and_grad(w),
        "ours: HVP through the kept graphs (default where they fit)": lambda: kept @ v,
        "ours: HVP with the gradient graph rebuilt (keep_graph=False)": lambda: recomputed @ v,
        "ours: first product of a fresh operator (graph build + 1 HVP, once per operator)": build,
    }
    agreement = {"ours: HVP through the kept graphs (default where they fit)": kept @ v}
    missing = _add_peers(module, objective, v, paths, agreement)
    best = min_seconds(paths, calls)
    gradient = best["gradient of F (Objective.loss_and_grad)"]
    rows = []
    for name, seconds in best.items():
        difference = None
        if name in agreement:
            difference = float(torch.linalg.vector_norm(agreement[name] - reference) / torch.linalg.vector_norm(reference))
        rows.append((name, seconds, seconds / gradient, difference))
    rows += [(name, None, None, reason) for name, reason in missing.items()]
    return rows


def _print_products(costs: list[tuple]) -> None:
    print("\nOne product against one gradient of F (min over interleaved calls):\n")
    print("| path | seconds | x gradient | rel. difference to our rebuilt-graph HVP |")
    print("|---|---|---|---|")
    for name, seconds, ratio, difference in costs:
        if seconds is None:
            print(f"| {name} | did not run: {difference} | | |")
        else:
            shown = "-" if difference is None else f"{difference:.1e}"
            print(f"| {name} | {seconds:.4f} | {ratio:.2f}x | {shown} |")


def _print_topk(rows: list[tuple], failed: list[tuple], seed: int, repeat: int) -> None:
    print(f"\nTop-{TOP} eigenvalues (seed {seed}, median of {repeat} timed calls):\n")
    print("| method | HVPs | seconds | max rel. error lambda_1..5 | all converged |")
    print("|---|---|---|---|---|")
    for name, _, hvps, seconds, error, converged in rows:
        flag = "-" if converged is None else ("yes" if converged else "no")
        print(f"| {name} | {hvps} | {seconds:.2f} | {error:.2e} | {flag} |")
    for name, reason in failed:
        print(f"| {name} | did not run: {reason} | | | |")


def _print_seeds(seed_rows: list[tuple]) -> None:
    print(f"\nDefault against default over {len(seed_rows)} start vectors (one timed call each):\n")
    print("| seed | ours HVPs | ours s | ours error | PyHessian HVPs | PyHessian s | PyHessian error | HVP ratio "
          "| time ratio |")
    print("|---|---|---|---|---|---|---|---|---|")
    for seed, oh, os_, oe, ph, ps, pe in seed_rows:
        print(f"| {seed} | {oh} | {os_:.2f} | {oe:.1e} | {ph} | {ps:.2f} | {pe:.1e} | {ph / oh:.2f}x | {ps / os_:.2f}x |")
    if seed_rows:
        table = np.array([r[1:] for r in seed_rows], dtype=float)
        print(f"| mean | {table[:, 0].mean():.1f} | {table[:, 1].mean():.2f} | {table[:, 2].mean():.1e} | "
              f"{table[:, 3].mean():.1f} | {table[:, 4].mean():.2f} | {table[:, 5].mean():.1e} | "
              f"{table[:, 3].sum() / table[:, 0].sum():.2f}x | {table[:, 4].sum() / table[:, 1].sum():.2f}x |")


def _reference(run, data: AnalysisData, device: torch.device, dim: int, dense_limit: int):
    """The float64 reference lambda_1..5: a dense Hessian up to ``dense_limit`` parameters, else ARPACK on float64
    products; with how it was computed and its seconds."""
    module64 = run.model().double().to(device)
    flat64 = FlatModel(module64)
    data64 = data.to(device, torch.float64)
    started = time.perf_counter()
    if dim <= dense_limit:
        reference, how = dense_reference(flat64, data64, flat64.vector()), "dense float64 Hessian"
    else:
        op64 = HessianOperator(Objective(flat64, flat64.buffers(), data64), flat64.vector())
        reference, how = arpack_reference(op64), "ARPACK eigsh (tol 1e-10) on float64 HVPs"
    return reference, how, time.perf_counter() - started


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", help="an existing run directory (default: train one)")
    parser.add_argument("--model", default="cnn")
    parser.add_argument("--hidden", type=int, default=64, help="mlp hidden width")
    parser.add_argument("--out", default="runs/bench-hessian")
    parser.add_argument("--json", type=Path, default=None, help="also write every number here")
    parser.add_argument("--dense-limit", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--seeds", type=int, default=5, help="start vectors in the default-vs-default table")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--repeat", type=int, default=3, help="timed calls per method (median reported)")
    parser.add_argument("--calls", type=int, default=10, help="interleaved calls per product path (min)")
    parser.add_argument("--batch-size", type=int, default=479, help="analysis batch (479: 3 equal batches)")
    parser.add_argument("--quick", action="store_true", help="PyHessian only at its default tolerance")
    return parser.parse_args()


def main() -> None:
    args = _arguments()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cpu")

    run_dir = Path(args.run) if args.run else train(args.model, args.hidden, Path(args.out) / args.model)
    run = landscape.open_run(run_dir)
    module = run.model().to(device)
    train_set, _ = run.data()
    flat = FlatModel(module)
    w = flat.vector()
    data = AnalysisData(train_set.x.to(device), train_set.y.to(device), args.batch_size)
    objective = Objective(flat, flat.buffers(), data, "eval")
    load = os.getloadavg()

    reference, how, reference_seconds = _reference(run, data, device, flat.dim, args.dense_limit)

    costs = product_costs(module, flat, objective, w, args.calls)

    def lanczos(keep: bool, verify: bool, backend: str = "double-backward", seed: int = args.seed):
        op = HessianOperator(objective, w, backend, keep_graph=keep if backend == "double-backward" else False)
        result = lanczos_topk(op, TOP, seed=seed, verify=verify)
        return result.values, result.hvp_count, bool(result.converged.all()), None

    def power():
        result = power_iteration(HessianOperator(objective, w), TOP, seed=args.seed)
        return result.values, result.hvp_count, bool(result.converged.all()), None

    def pyhessian(tol: float, seed: int = args.seed):
        result = pyhessian_lambda_max_and_trace(module, data, w, top_n=TOP, trace_iters=0, tol=tol, device=device,
                                                seed=seed)
        # its own timer: the eigenvalue loop only (not the model copy)
        return np.array(result.eigenvalues), result.eigen_hvp_count, None, result.eigen_seconds

    methods = [
        ("ours: Lanczos, tol 1e-3, kept graphs, true residuals from the recorded products (default)", "ours",
         lambda: lanczos(None, False)),
        ("ours: the same, residuals checked by 5 more HVPs (verify=True)", "ours", lambda: lanczos(None, True)),
        ("ours: the default with the graph rebuilt every product (keep_graph=False)", "ours",
         lambda: lanczos(False, False)),
        ("ours: forward-over-reverse products", "ours", lambda: lanczos(False, False, "forward-over-reverse")),
        ("ours: power iteration with deflation (PyHessian's rule), tol 1e-3", "power", power),
        ("PyHessian eigenvalues(top_n=5), tol 1e-3 (its default)", "pyhessian", lambda: pyhessian(1e-3)),
    ]
    if not args.quick:
        methods += [(f"PyHessian eigenvalues(top_n=5), tol {tol:.0e}", "pyhessian", lambda tol=tol: pyhessian(tol))
                    for tol in (1e-5, 1e-7)]
    peers = [
        ("curvlinops HessianLinearOperator + SciPy eigsh (ARPACK), its default tol (machine precision)", "curvlinops",
         lambda: curvlinops_eigsh(module, data, 0.0, args.seed)),
        ("curvlinops HessianLinearOperator + SciPy eigsh, tol 1e-3", "curvlinops",
         lambda: curvlinops_eigsh(module, data, 1e-3, args.seed)),
        ("hessian-eigenthings v1 lanczos(k=5), its defaults (10 steps, tol 1e-4)", "eigenthings",
         lambda: eigenthings(module, data, "lanczos", args.seed)),
        ("hessian-eigenthings v1 deflated_power_iteration(k=5), its defaults", "eigenthings",
         lambda: eigenthings(module, data, "power", args.seed)),
    ]
    rows, failed = [], []
    for name, kind, method in methods + peers:
        try:
            (values, hvps, converged), seconds = timed(method, args.repeat)
        except Exception as error:  # noqa: BLE001 - a peer that does not run is reported, not faked
            failed.append((name, f"{type(error).__name__}: {str(error)[:160]}"))
            continue
        rows.append((name, kind, hvps, seconds, max_relative_error(values, reference), converged))

    seed_rows = []
    for seed in range(args.seeds):
        (ours_values, ours_hvps, _), ours_seconds = timed(lambda seed=seed: lanczos(None, False, seed=seed), 1)
        (py_values, py_hvps, _), py_seconds = timed(lambda seed=seed: pyhessian(1e-3, seed), 1)
        seed_rows.append((seed, ours_hvps, ours_seconds, max_relative_error(ours_values, reference),
                          py_hvps, py_seconds, max_relative_error(py_values, reference)))
    load_after = os.getloadavg()

    print(f"model: {model_name(run.recipe)} ({flat.dim:,} parameters, {w.dtype}), data: {len(data)} training "
          f"samples in batches of {data.batch_size}, device {device}, torch threads {torch.get_num_threads()} of "
          f"{os.cpu_count()} cores; load average {load[0]:.2f} before, {load_after[0]:.2f} after")
    print(f"reference: {how} ({reference_seconds:.1f} s): lambda_1..5 = " + ", ".join(f"{v:.6g}" for v in reference))
    _print_products(costs)
    _print_topk(rows, failed, args.seed, args.repeat)
    ours = rows[0]
    baseline = next(r for r in rows if r[1] == "pyhessian")
    print(f"\nPyHessian default / ours default (seed {args.seed}): HVPs {baseline[2] / ours[2]:.2f}x, time "
          f"{baseline[3] / ours[3]:.2f}x, error {baseline[4] / ours[4]:.0f}x larger ({baseline[4]:.1e} vs {ours[4]:.1e})")
    _print_seeds(seed_rows)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "model": model_name(run.recipe), "parameters": flat.dim, "threads": torch.get_num_threads(),
            "load": [load[0], load_after[0]], "reference": reference.tolist(),
            "costs": costs, "rows": rows, "failed": failed, "seeds": seed_rows}, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()
