"""GPU check: FedSAM rounds per second (clients one after another and vectorised), HVP/gradient, seconds for
lambda_1..5 and for a 51x51 surface, on one device.

The paper-scale setting on synthetic tensors of CIFAR-10's shape (no download): 100 clients of 500 samples
(3x32x32, 10 classes, random labels, an IID split), ResNet-18 with GroupNorm(2), FedSAM (rho 0.1), 10
clients per round, E = 5 local epochs of batch 50 (K = 50 SAM steps, 100 forward/backward passes per client
and round). Timed after one warm-up round, with the device synchronised:

* training: ``--rounds`` rounds of ``Trainer.run_round`` (test evaluation every round, on 1,000 samples) with
  ``train.vectorize = "off"`` (the clients one after another) and ``"on"`` (the round's clients in lockstep,
  one vmapped gradient per local step: ``landscape.train.vectorised``), the two runs' rounds interleaved from
  the same initial model, and the relative distance of their final models; beside them the one-off timing
  ``"auto"`` makes (one local step's gradients of the round's clients both ways). In float32 that distance is
  the rounding of other kernels, grown by training, not a difference of the rule: the CPU smoke run below gives
  7e-4 after two rounds, and channels-last against contiguous layout the same; in float64 1e-16;
* HVP/gradient: one Hessian-vector product of the operator below (after Lanczos: its backend chosen, its
  graphs kept where they fit) against one gradient of F over the same samples, minima of 3 interleaved calls;
* lambda_1..5: ``lanczos_topk`` (k = 5, tol 1e-3, true residuals from the recorded products; the gradient
  graphs kept where they fit, as reported) of the Hessian of F over
  ``--analysis-samples`` training samples (batches of 512, eval mode, float32: curvature never runs in
  bfloat16 or through torch.compile);
* the surface: ``evaluate_surface`` on a ``--grid`` x ``--grid`` filter-normalised random plane over
  ``--surface-samples`` samples (chunks of 16 cells; a GPU evaluates a chunk in one vmapped pass, the CPU
  cell by cell).

``--precision bf16`` and ``--compile`` set the recipe's ``train.precision`` and ``train.compile`` (training
only). Under ``torchrun --standalone --nproc-per-node N`` the clients, the HVP batches and the surface cells
are split over N GPUs. Prints a Markdown table naming the device and writes ``--out`` (JSON). Usage:

    .venv/bin/python benchmarks/gpu_check.py [--device cuda] [--rounds 5] [--precision bf16] [--compile]
    .venv/bin/python benchmarks/gpu_check.py --device cpu --clients 10 --participation 0.3 --samples-per-client 4 \\
        --local-epochs 1 --rounds 1 --analysis-samples 32 --surface-samples 16 --grid 3 --test-samples 16 --max-products 15
        # a CPU smoke run (a few minutes: one product on ResNet-18 takes about 2.4 s on one CPU thread, so the
        # 100 products Lanczos may take unconverged are left to the GPU)
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from landscape.config import overrides as recipe_overrides
from landscape.config.setup import DataSetup, build_module
from landscape.core import parallel
from landscape.core.flat import FlatModel
from landscape.data.datasets import ArrayDataset, DatasetBundle
from landscape.data.partitions import class_histogram
from landscape.measure.analysis_data import AnalysisData
from landscape.measure.directions import random_plane
from landscape.measure.lanczos import lanczos_topk
from landscape.measure.objective import Objective
from landscape.measure.operator import HessianOperator
from landscape.measure.surface.evaluation import default_cells_per_pass, evaluate_surface
from landscape.measure.surface.grid import make_axis
from landscape.store.directory import RunDir
from landscape.train import vectorised
from landscape.train.loop import Trainer


def time_oracles(trainer: Trainer, clients: int, repeats: int = 3) -> tuple[float, float]:
    """Seconds of one local step's gradients for ``clients`` clients, (one after another, one vmapped pass):
    minima over ``repeats`` interleaved repeats after a warm-up, at the initial model on the first training
    samples (a full batch), under the run's autocast, the device synchronised."""
    flat = trainer.flat
    n = min(trainer.train_cfg.batch_size, len(trainer.train_y))
    x, y = trainer.train_x[:n], trainer.train_y[:n]
    w, constants = flat.vector(), flat.buffers()
    stacked = vectorised.StackedOracle(flat)
    ws, xs, ys = (t.unsqueeze(0).expand(clients, *t.shape).contiguous() for t in (w, x, y))

    def sequential() -> None:
        for _ in range(clients):
            flat.loss_and_grad(w, x, y, constants)

    best = [float("inf"), float("inf")]
    for _ in range(repeats + 1):  # the first pass warms up (kernels, caches); minima ignore it
        for k, run in enumerate((sequential, lambda: stacked(ws, xs, ys, constants))):
            synchronize(trainer.device)
            started = time.perf_counter()
            with trainer.mixed_precision():
                run()
            synchronize(trainer.device)
            best[k] = min(best[k], time.perf_counter() - started)
    return best[0], best[1]

def synthetic_setup(clients: int, per_client: int, test: int, seed: int = 0) -> DataSetup:
    """CIFAR-10-shaped standardised noise with random labels, split IID over the clients."""
    generator = torch.Generator().manual_seed(seed)
    n = clients * per_client
    x = torch.randn(n + test, 3, 32, 32, generator=generator)
    y = torch.randint(0, 10, (n + test,), generator=generator)
    bundle = DatasetBundle("cifar10-shaped", ArrayDataset(x[:n], y[:n]), ArrayDataset(x[n:], y[n:]), 10,
                           (3, 32, 32), None, None)
    order = np.random.default_rng(seed).permutation(n)
    indices = [np.sort(part) for part in np.array_split(order, clients)]
    return DataSetup(bundle, indices, class_histogram(y[:n].numpy(), indices, 10))


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(device: torch.device, fn):
    synchronize(device)
    parallel.barrier()
    start = time.perf_counter()
    result = fn()
    synchronize(device)
    parallel.barrier()
    return time.perf_counter() - start, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds (after one warm-up round)")
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--participation", type=float, default=0.1)
    parser.add_argument("--samples-per-client", type=int, default=500)
    parser.add_argument("--local-epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=50)
    parser.add_argument("--test-samples", type=int, default=1000)
    parser.add_argument("--precision", choices=["float32", "bf16"], default="float32")
    parser.add_argument("--compile", action="store_true", help="train.compile = true")
    parser.add_argument("--analysis-samples", type=int, default=5000)
    parser.add_argument("--surface-samples", type=int, default=2000)
    parser.add_argument("--grid", type=int, default=51)
    parser.add_argument("--top-k", type=int, default=5)
    parser.add_argument("--max-products", type=int, default=None,
                        help="most Hessian-vector products of the Lanczos run (default: lanczos_topk's, 100; "
                        "at least k + 10)")
    parser.add_argument("--out", type=Path, default=Path("/tmp/landscape-bench/gpu-check.json"))
    args = parser.parse_args()

    with parallel.session():
        setup = synthetic_setup(args.clients, args.samples_per_client, args.test_samples)
        recipe = recipe_overrides.build(None, [
            ("model.name", "resnet18"), ("algorithm.name", "fedsam"), ("partition.name", "iid"),
            ("partition.clients", args.clients), ("train.participation", args.participation),
            ("train.local_epochs", args.local_epochs), ("train.batch_size", args.batch_size),
            ("train.rounds", args.rounds + 1), ("train.device", args.device),
            ("train.precision", args.precision), ("train.compile", args.compile),
        ])
        trainers = {}
        with tempfile.TemporaryDirectory() as folder:  # rounds run through run_round, which writes no file
            for mode in ("off", "on"):
                trainers[mode] = Trainer(recipe.with_values({"train.vectorize": mode}), RunDir(folder), setup)
        trainer = trainers["off"]
        device = trainer.device
        # the rounds of the two runs interleaved (the machine's load shared), after one warm-up round each
        states = {mode: t.run_round(t.initial_state())[0] for mode, t in trainers.items()}
        seconds = dict.fromkeys(trainers, 0.0)
        for _ in range(args.rounds):
            for mode, t in trainers.items():
                took, (states[mode], _, _) = timed(device, lambda t=t, mode=mode: t.run_round(states[mode]))
                seconds[mode] += took
        train_seconds, state = seconds["off"], states["off"]
        final_distance = ((states["on"].x - state.x).norm() / state.x.norm()).item()
        auto_seconds = time_oracles(trainers["on"], vectorised.block_size(trainers["on"]))
        steps = len(trainer._batch_indices(0, torch.Generator().manual_seed(0)))

        # Analysis: a fresh, uncompiled float32 model of the last round (curvature never autocasts or compiles).
        flat = FlatModel(build_module(recipe, setup.bundle).to(device))
        w = state.x.detach().float()
        train_set = setup.bundle.train
        hessian_data = AnalysisData(train_set.x[: args.analysis_samples], train_set.y[: args.analysis_samples])
        objective = Objective(flat, {}, hessian_data.place(device))
        op = HessianOperator(objective, w)  # gradient graphs kept where they fit (op.keeps_graph)
        lanczos_seconds, top = timed(device, lambda: lanczos_topk(op, args.top_k, tol=1e-3, seed=0,
                                                                       max_iter=args.max_products))
        v = torch.randn(w.shape, generator=torch.Generator().manual_seed(1)).to(device)
        best = {"hvp": float("inf"), "gradient": float("inf")}
        for _ in range(3):  # after Lanczos: the operator's backend is chosen and its graphs built
            best["hvp"] = min(best["hvp"], timed(device, lambda: op @ v)[0])
            best["gradient"] = min(best["gradient"], timed(device, lambda: objective.loss_and_grad(w))[0])
        surface_data = AnalysisData(train_set.x[: args.surface_samples], train_set.y[: args.surface_samples])
        surface_objective = Objective(flat, {}, surface_data.place(device))
        plane = random_plane(flat, w, 0)
        axis = make_axis(args.grid, -1.0, 1.0)
        evaluate_surface(surface_objective, w, plane.d1, plane.d2, axis[:3], axis[:3])  # warm-up
        surface_seconds, grid = timed(device, lambda: evaluate_surface(surface_objective, w, plane.d1, plane.d2,
                                                                       axis, axis, cells_per_batch=16))

        name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "CPU"
        per_round = trainer.per_round
        result = {
            "device": name, "ranks": parallel.world_size(), "torch": torch.__version__,
            "model": "resnet18 (GroupNorm 2)", "parameters": flat.dim, "precision": args.precision,
            "compile": args.compile, "clients_per_round": per_round, "local_steps": steps,
            "rounds_timed": args.rounds, "rounds_per_second": args.rounds / train_seconds,
            "seconds_per_round": train_seconds / args.rounds,
            "vectorized_rounds_per_second": args.rounds / seconds["on"],
            "vectorized_seconds_per_round": seconds["on"] / args.rounds,
            "vectorized_used": vectorised.vectorisation(trainers["on"]).record(),
            "vectorized_final_model_distance": final_distance,
            "auto_step_seconds": {"sequential": auto_seconds[0], "vectorized": auto_seconds[1]},
            "hvp_seconds": best["hvp"], "gradient_seconds": best["gradient"],
            "hvp_per_gradient": best["hvp"] / best["gradient"], "hvp_backend": op.backend_used,
            "lanczos_seconds": lanczos_seconds, "lanczos_hvps": top.hvp_count, "eigenvalues": top.values.tolist(),
            "converged": top.converged.tolist(), "analysis_samples": len(hessian_data),
            "graphs_kept": op.keeps_graph, "graph_bytes": op.graph_bytes,
            "surface_cells_per_pass": default_cells_per_pass(device, 16),
            "surface_seconds": surface_seconds, "surface_grid": [args.grid, args.grid],
            "surface_samples": len(surface_data), "surface_finite": bool(np.isfinite(grid.loss).all()),
        }
        if parallel.is_main():
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(result, indent=1) + "\n")
            print(f"\n{name}, {parallel.world_size()} rank(s), torch {torch.__version__}, ResNet-18-GN "
                  f"({flat.dim:,} parameters), precision {args.precision}, compile {args.compile}\n")
            print("| job | setting | seconds | rate |")
            print("|---|---|---|---|")
            setting = f"{per_round} clients/round, K = {steps} steps, batch {args.batch_size}"
            print(f"| FedSAM training, clients one after another | {setting} | "
                  f"{train_seconds / args.rounds:.2f} per round | {args.rounds / train_seconds:.3f} rounds/s |")
            print(f"| FedSAM training, vectorised (train.vectorize = \"on\") | {setting}; final model "
                  f"{final_distance:.1e} from the sequential one (relative) | {seconds['on'] / args.rounds:.2f} "
                  f"per round | {args.rounds / seconds['on']:.3f} rounds/s ({train_seconds / seconds['on']:.2f}x) |")
            print(f"| auto's timing: one local step's gradients | {vectorised.block_size(trainer)} clients, one "
                  f"after another vs one vmapped pass | {auto_seconds[0]:.4f} vs {auto_seconds[1]:.4f} | "
                  f"{auto_seconds[0] / auto_seconds[1]:.2f}x |")
            print(f"| HVP / gradient | {len(hessian_data):,} samples, {op.backend_used} | "
                  f"{best['hvp']:.3f} vs {best['gradient']:.3f} | {best['hvp'] / best['gradient']:.2f}x |")
            graphs = (f"graphs kept ({op.graph_bytes / 2**30:.1f} GiB)" if op.keeps_graph else
                      f"graphs rebuilt per product ({(op.graph_bytes or 0) / 2**30:.1f} GiB would not fit)")
            print(f"| lambda_1..{args.top_k} (Lanczos, tol 1e-3) | {len(hessian_data):,} samples, {graphs} | "
                  f"{lanczos_seconds:.1f} | {top.hvp_count} HVPs, {int(top.converged.sum())} of {args.top_k} "
                  "converged |")
            print(f"| {args.grid}x{args.grid} surface | {len(surface_data):,} samples, "
                  f"{default_cells_per_pass(device, 16)} cells per pass | {surface_seconds:.1f} | "
                  f"{surface_seconds / args.grid**2:.4f} s/cell |")


if __name__ == "__main__":
    main()
