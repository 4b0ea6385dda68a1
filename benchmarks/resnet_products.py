"""Benchmark: one Hessian-vector product against one gradient on ResNet-18 with GroupNorm (CIFAR-shaped data).

The papers' model at CPU scale: ``resnet18`` (GroupNorm with 2 groups, 11,173,962 parameters for 10 classes)
at its seeded initial weights, ``--samples`` random 3x32x32 inputs with random labels in batches of
``--batch-size`` (eval mode, float32, one thread). Timed, interleaved, minimum over ``--calls`` calls after
one warm-up each: the gradient of F (``Objective.loss_and_grad``), a product through the kept gradient graphs
(double-backward), a product with the graph rebuilt every time (double-backward, ``keep_graph=False``), a
forward-over-reverse product (``torch.func.jvp`` of ``torch.func.grad``) and the ``auto`` backend where the
graphs do not fit (``memory_budget=0``: its one-off timing picks one of the last two; where they fit, auto is
the kept-graph row). Beside each the memory it holds: the peak of the bytes allocated during one call above
what was allocated before it (the profiler's record of CPU allocations), plus, for kept graphs, the bytes they
hold (as the operator measures them for its memory rule); and the products' agreement. Usage:

    .venv/bin/python benchmarks/resnet_products.py [--samples 64] [--batch-size 32] [--calls 3]
"""

from __future__ import annotations

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

from landscape.analyze.analysis_data import AnalysisData
from landscape.analyze.objective import Objective
from landscape.analyze.operator import HessianOperator
from landscape.core.flat import FlatModel
from landscape.models import build_model

from hessian_vs_pyhessian import min_seconds  # benchmarks/ is on the path of a script run from it


def peak_bytes(fn) -> int:
    """The peak, during ``fn()``, of the bytes allocated since it started (allocations and frees in time order)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    running = peak = 0
    for _, change in sorted((e.time_range.start, e.self_cpu_memory_usage) for e in prof.events()):
        running += change
        peak = max(peak, running)
    return peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--calls", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    module = build_model("resnet18", (3, 32, 32), 10, {"norm": "gn"}).eval()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(args.samples, 3, 32, 32, generator=g)
    y = torch.randint(0, 10, (args.samples,), generator=g)
    flat = FlatModel(module)
    w = flat.vector()
    objective = Objective(flat, flat.buffers(), AnalysisData(x, y, args.batch_size), "eval")
    v = torch.randn(flat.dim, generator=g)
    kept = HessianOperator(objective, w, keep_graph=True)
    rebuilt = HessianOperator(objective, w, keep_graph=False)
    forward = HessianOperator(objective, w, "forward-over-reverse")
    auto = HessianOperator(objective, w, "auto", memory_budget=0)
    reference = rebuilt @ v
    auto @ v  # the first product times the two backends and picks one
    names = {"gradient of F": "gradient", "HVP, double-backward through the kept graphs": "kept",
             "HVP, double-backward, graph rebuilt every product": "rebuilt",
             "HVP, forward-over-reverse (jvp of grad)": "forward",
             f"HVP, auto where the graphs do not fit: {auto.backend_used}": "auto"}
    paths = {"gradient": lambda: objective.loss_and_grad(w), "kept": lambda: kept @ v,
             "rebuilt": lambda: rebuilt @ v, "forward": lambda: forward @ v, "auto": lambda: auto @ v}
    best = min_seconds(paths, args.calls)
    held = {key: peak_bytes(fn) for key, fn in paths.items()}  # after the timing: the profiler slows calls down
    held["kept"] += kept.graph_bytes
    agreement = {key: float(torch.linalg.vector_norm(op @ v - reference) / torch.linalg.vector_norm(reference))
                 for key, op in (("kept", kept), ("forward", forward), ("auto", auto))}
    print(f"ResNet-18-GN: {flat.dim:,} parameters, {args.samples} samples of 3x32x32 in batches of "
          f"{args.batch_size}, 1 thread; minimum of {args.calls} interleaved calls:\n")
    print("| path | seconds | x gradient | memory held (MiB) | rel. difference to the rebuilt-graph product |")
    print("|---|---|---|---|---|")
    for label, key in names.items():
        difference = f"{agreement[key]:.1e}" if key in agreement else "-"
        print(f"| {label} | {best[key]:.2f} | {best[key] / best['gradient']:.2f}x | {held[key] / 2**20:,.0f} | "
              f"{difference} |")
    seconds = ", ".join(f"{k} {s:.2f} s" for k, s in (auto.backend_seconds or {}).items())
    print(f"\nauto's one-off timing (one product on the first batch each): {seconds}.")
    print(f"\nThe kept gradient graphs hold {kept.graph_bytes / 2**20:,.0f} MiB for {args.samples} samples "
          f"({kept.graph_bytes / args.samples / 2**20:.1f} MiB per sample).")


if __name__ == "__main__":
    main()
