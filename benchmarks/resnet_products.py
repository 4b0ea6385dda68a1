"""Benchmark: one Hessian-vector product against one gradient on ResNet-18 with GroupNorm (CIFAR-shaped data).

The papers' model at CPU scale: ``resnet18`` (GroupNorm with 2 groups, 11,173,962 parameters for 10 classes)
at its seeded initial weights, ``--samples`` random 3x32x32 inputs with random labels in batches of
``--batch-size`` (eval mode, float32, one thread). Timed, interleaved, minimum over ``--calls`` calls after
one warm-up each: the gradient of F (``Objective.loss_and_grad``), a product through the kept gradient graphs
(double-backward), a product with the graph rebuilt every time (double-backward, ``keep_graph=False``) and a
forward-over-reverse product (``torch.func.jvp`` of ``torch.func.grad``). Beside them the bytes the kept graphs
hold (as the operator measures them for its memory rule) and the products' agreement. Usage:

    .venv/bin/python benchmarks/resnet_products.py [--samples 64] [--batch-size 32] [--calls 3]
"""

from __future__ import annotations

import argparse

import torch

from landscape.analyze.analysis_data import AnalysisData
from landscape.analyze.objective import Objective
from landscape.analyze.operator import HessianOperator
from landscape.core.flat import FlatModel
from landscape.models import build_model

from hessian_vs_pyhessian import min_seconds  # benchmarks/ is on the path of a script run from it


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
    reference = rebuilt @ v
    names = {"gradient of F": "gradient", "HVP, double-backward through the kept graphs": "kept",
             "HVP, double-backward, graph rebuilt every product": "rebuilt",
             "HVP, forward-over-reverse (jvp of grad)": "forward"}
    paths = {"gradient": lambda: objective.loss_and_grad(w), "kept": lambda: kept @ v,
             "rebuilt": lambda: rebuilt @ v, "forward": lambda: forward @ v}
    best = min_seconds(paths, args.calls)
    agreement = {key: float(torch.linalg.vector_norm(op @ v - reference) / torch.linalg.vector_norm(reference))
                 for key, op in (("kept", kept), ("forward", forward))}
    print(f"ResNet-18-GN: {flat.dim:,} parameters, {args.samples} samples of 3x32x32 in batches of "
          f"{args.batch_size}, 1 thread; minimum of {args.calls} interleaved calls:\n")
    print("| path | seconds | x gradient | rel. difference to the rebuilt-graph product |\n|---|---|---|---|")
    for label, key in names.items():
        difference = f"{agreement[key]:.1e}" if key in agreement else "-"
        print(f"| {label} | {best[key]:.2f} | {best[key] / best['gradient']:.2f}x | {difference} |")
    print(f"\nThe kept gradient graphs hold {kept.graph_bytes / 2**20:,.0f} MiB for {args.samples} samples "
          f"({kept.graph_bytes / args.samples / 2**20:.1f} MiB per sample).")


if __name__ == "__main__":
    main()
