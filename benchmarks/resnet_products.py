"""Benchmark: one Hessian-vector product against one gradient on ResNet-18 with GroupNorm (CIFAR-shaped data).

The papers' model at CPU scale: ``resnet18`` (GroupNorm with 2 groups, 11,173,962 parameters for 10 classes)
at its seeded initial weights, ``--samples`` random 3x32x32 inputs with random labels in batches of
``--batch-size`` (eval mode, float32, one thread). Timed, interleaved, minimum over ``--calls`` calls after
one warm-up each: the gradient of F (``Objective.loss_and_grad``), a product through the kept gradient graphs
(double-backward in ``landscape.measure.gradient_graphs``: convolutions differentiated on first-order
kernels, ReLUs without PyTorch's zero terms), the same through graphs that PyTorch's own double-backward
builds (its derivatives, written out here as the reference), a product with the graph rebuilt every time
(double-backward, ``keep_graph=False``), a forward-over-reverse product (``torch.func.jvp`` of
``torch.func.grad``) and the ``auto`` backend where the graphs do not fit (``memory_budget=0``: the
double-backward product, rebuilt every call; where they fit, auto is the kept-graph row). Beside each the memory it
holds: the peak of the bytes allocated during one call above what was allocated before it (the profiler's
record of CPU allocations), plus, for kept graphs, the bytes they hold (as the operator measures them for its
memory rule); the floating-point operations of one call, those of its matrix products and convolutions
(``FlopCount`` of benchmarks/clients_scaling.py, 2 per multiply-add; GroupNorm, activations and pooling are not
counted), and their ratio to the gradient's: what "x gradient" would be if a product ran its arithmetic at the
gradient's rate; and the products' agreement.

Then the memory left after the call (issue 47): a fresh ``auto`` operator makes one product and is deleted
and garbage-collected, as the hessian pass makes its operator (its backend decided first, on a measured
first-batch graph; then the graphs kept), as ``client_lambda_max`` makes a client's (graphs kept), and where the
graphs do not fit (``memory_budget=0``: the first graph measured, every product rebuilding it): the bytes
allocated in that time and not freed (the profiler's record of CPU allocations) and the tensors alive after it
that were not before, now and with the saved-tensor pack hook as it was before (``former_measured_gradient``: it
kept each saved tensor itself, with its ``grad_fn``, a reference cycle that no collection frees). Usage:

    .venv/bin/python benchmarks/resnet_products.py [--samples 64] [--batch-size 32] [--calls 3]
"""

from __future__ import annotations

import argparse
import gc
from collections.abc import Callable
from contextlib import nullcontext
from unittest import mock

import torch
from clients_scaling import FlopCount  # benchmarks/ is on the path of a script run from it
from hessian_vs_pyhessian import min_seconds
from torch.profiler import ProfilerActivity, profile

from landscape.core.flat import FlatModel, ParameterLeaves
from landscape.measure import products
from landscape.measure.analysis_data import AnalysisData
from landscape.measure.objective import Objective
from landscape.measure.operator import HessianOperator
from landscape.models import build_model


def peak_bytes(fn) -> int:
    """The peak, during ``fn()``, of the bytes allocated since it started (allocations and frees in time order)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    running = peak = 0
    for _, change in sorted((e.time_range.start, e.self_cpu_memory_usage) for e in prof.events()):
        running += change
        peak = max(peak, running)
    return peak


def pytorch_kept_products(objective: Objective, w: torch.Tensor,
                          v: torch.Tensor) -> tuple[Callable[[], torch.Tensor], int]:
    """H v by PyTorch's own double-backward through gradient graphs kept per batch (its derivatives of
    convolutions and ReLU, not ``landscape.measure.gradient_graphs``), and the bytes those graphs save: the
    kept-graph row as it was without gradient_graphs, written out here as a reference."""
    leaves = objective.flat.leaves(w)
    data, graphs, saved = objective.data, [], {}
    existing = {t.untyped_storage().data_ptr() for t in (leaves.vector, data.x, data.y)}  # as the operator counts

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.untyped_storage().data_ptr() not in existing:
            saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t.detach()  # not t: a saved output's grad_fn would hold it in a cycle (see former_measured_gradient)

    for start, stop in data.batch_ranges():
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = objective.batch_loss(leaves.named, data.batch(start, stop))
            grads = torch.autograd.grad(loss, leaves.tensors, create_graph=True)
        graphs.append(((stop - start) / len(data), grads))
    tangents = leaves.views(v)

    def product() -> torch.Tensor:
        out = torch.zeros_like(v)
        for weight, grads in graphs:
            parts = torch.autograd.grad(grads, leaves.tensors, tangents, retain_graph=True)
            out += weight * torch.cat([p.reshape(-1) for p in parts])
        return out

    return product, sum(saved.values())


def former_measured_gradient(loss: products.BatchLoss, leaves: ParameterLeaves,
                             existing: set[int]) -> tuple[products.Gradient, int]:
    """``products.measured_gradient`` as it was before issue 47: its pack hook kept each saved tensor itself,
    so a saved output held its own ``grad_fn`` (node -> saved tensor -> node, through C++: never collected)."""
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.untyped_storage().data_ptr() not in existing:
            saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        grad = products.batch_gradient(loss, leaves)
    return grad, sum(saved.values()) + sum(g.numel() * g.element_size() for g in grad or () if g is not None)


def live_tensors() -> int:
    """Tensors alive after a full garbage collection."""
    gc.collect()
    return sum(1 for obj in gc.get_objects() if issubclass(type(obj), torch.Tensor))


def left_after(objective: Objective, w: torch.Tensor, v: torch.Tensor, *, decide: bool, memory_budget: int | None,
               former: bool) -> tuple[int, int]:
    """(bytes allocated and not freed, tensors alive that were not) after a fresh ``auto`` operator made one
    product (``decide``: its backend decided first, on a measured first-batch graph, as the hessian pass does)
    and was deleted; ``former``: with ``former_measured_gradient``."""
    def call() -> None:
        op = HessianOperator(objective, w, "auto", memory_budget=memory_budget)
        if decide:
            op.decide_backend()
        op @ v
        del op
        gc.collect()

    before = live_tensors()
    with mock.patch.object(products, "measured_gradient", former_measured_gradient) if former else nullcontext():
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            call()
    return sum(e.self_cpu_memory_usage for e in prof.events()), live_tensors() - before


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
    kept = HessianOperator(objective, w, "double-backward", keep_graph=True)
    rebuilt = HessianOperator(objective, w, "double-backward", keep_graph=False)  # by name
    forward = HessianOperator(objective, w, "forward-over-reverse")
    auto = HessianOperator(objective, w, "auto", memory_budget=0)
    reference = rebuilt @ v
    pytorch, pytorch_bytes = pytorch_kept_products(objective, w, v)
    auto @ v  # the first product decides the backend (double-backward) and that no graph is kept
    names = {"gradient of F": "gradient", "HVP, double-backward through the kept graphs": "kept",
             "HVP, PyTorch's own double-backward through kept graphs (its derivatives)": "pytorch",
             "HVP, double-backward, graph rebuilt every product": "rebuilt",
             "HVP, forward-over-reverse (jvp of grad)": "forward",
             f"HVP, auto where the graphs do not fit: {auto.backend_used}": "auto"}
    paths = {"gradient": lambda: objective.loss_and_grad(w), "kept": lambda: kept @ v, "pytorch": pytorch,
             "rebuilt": lambda: rebuilt @ v, "forward": lambda: forward @ v, "auto": lambda: auto @ v}
    best = min_seconds(paths, args.calls)
    held = {key: peak_bytes(fn) for key, fn in paths.items()}  # after the timing: the profiler slows calls down
    flops = {}
    for key, fn in paths.items():
        with FlopCount() as counter:
            fn()
        flops[key] = counter.gflop
    held["kept"] += kept.graph_bytes
    held["pytorch"] += pytorch_bytes
    agreement = {key: float(torch.linalg.vector_norm(product() - reference) / torch.linalg.vector_norm(reference))
                 for key, product in (("kept", lambda: kept @ v), ("pytorch", pytorch),
                                      ("forward", lambda: forward @ v), ("auto", lambda: auto @ v))}
    print(f"ResNet-18-GN: {flat.dim:,} parameters, {args.samples} samples of 3x32x32 in batches of "
          f"{args.batch_size}, 1 thread; minimum of {args.calls} interleaved calls:\n")
    print("| path | seconds | x gradient | GFLOP | x gradient's GFLOP | memory held (MiB) "
          "| rel. difference to the rebuilt-graph product |")
    print("|---|---|---|---|---|---|---|")
    for label, key in names.items():
        difference = f"{agreement[key]:.1e}" if key in agreement else "-"
        print(f"| {label} | {best[key]:.2f} | {best[key] / best['gradient']:.2f}x | {flops[key]:.1f} | "
              f"{flops[key] / flops['gradient']:.2f}x | {held[key] / 2**20:,.0f} | {difference} |")
    print(f"\nauto where the graphs do not fit: {auto.backend_used}, the graph rebuilt every product (never "
          "chosen by a timing).")
    print(f"\nThe kept gradient graphs hold {kept.graph_bytes / 2**20:,.0f} MiB for {args.samples} samples "
          f"({kept.graph_bytes / args.samples / 2**20:.1f} MiB per sample).")
    kept.release()
    pytorch = paths = None  # the reference graphs go before the next operators are built
    print("\nMemory left after the call: a fresh auto operator, one product, the operator deleted and garbage-"
          "collected; MiB allocated in that time and not freed (the profiler's record), tensors left alive; now and "
          "with the saved-tensor pack hook as it was before issue 47:\n")
    print("| operator | MiB left | tensors left | MiB left, former pack hook (before) | tensors left, former |")
    print("|---|---|---|---|---|")
    for label, decide, budget in (
            ("the hessian pass's: backend decided (a measured graph), a product through the kept graphs", True, None),
            ("a client's (client_lambda_max): a product through the kept graphs", False, None),
            ("where the graphs do not fit (memory_budget=0): a product, the graph rebuilt", False, 0)):
        now, former = (left_after(objective, w, v, decide=decide, memory_budget=budget, former=old)
                       for old in (False, True))
        print(f"| {label} | {now[0] / 2**20:,.0f} | {now[1]} | {former[0] / 2**20:,.0f} | {former[1]} |", flush=True)


if __name__ == "__main__":
    main()
