"""Benchmark: a 2D loss surface by ``evaluate_surface`` against the loss-landscapes package and per-cell loops.

One trained digits CNN (the default recipe, 10 rounds, trained here through the API unless --run names a run
directory), its whole analysis set (the union of the clients' training data, 1,437 samples, eval mode,
batches of 512) and an n x n grid over [-1, 1]^2, timed in one process, side by side:

* loss-landscapes ``random_plane`` (``pip install -e .[bench]``): the same checkpoint and data, filter
  normalisation, ``steps = n``, the model's parameters moved in place cell by cell, and its ``Loss`` metric
  (the whole set in one forward pass, loss only). It draws its own random directions, so its values are not
  compared;
* ours, the default (``evaluate_surface``; on the CPU one cell per forward pass with channels-last
  convolution weights);
* ours, one cell at a time with the module's own (NCHW) layout: what the channels-last layout contributes;
* ours, ``cells_per_pass`` cells vmapped into one forward pass (16: the default before it was chosen per
  device; the default on a GPU);
* with ``--reference-loop``: the reference scripts' loop (deep copy, ``load_state_dict``, DataLoader per cell).

Our variants and the reference loop use one filter-normalised random plane (seed 0) and must give the same grid
(max |difference| against our default is printed). ``--passes`` also times cells per forward pass 1, 2, 4, 8
and 16 on a small grid (the measurement behind ``default_cells_per_pass``). Prints Markdown tables; timings,
not assertions: check the load average it prints. Usage:

    .venv/bin/python benchmarks/surface_vs_loop.py [--grid 51] [--also 21] [--threads 1] [--passes]
"""

from __future__ import annotations

import argparse
import copy
import os
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import landscape.measure.surface.evaluation as surface_module
from landscape.analyze.context import CheckpointContext
from landscape.analyze.settings import AnalysisSettings
from landscape.analyze.source import find_sources
from landscape.config import overrides as recipe_overrides
from landscape.core.flat import FlatModel
from landscape.measure.directions import random_plane
from landscape.measure.surface.evaluation import evaluate_surface
from landscape.measure.surface.grid import make_axis
from landscape.train import loop


def model_name(recipe) -> str:
    """The recipe's model name (a recipe object or, in older versions, a dict)."""
    return recipe.model.name if hasattr(recipe, "model") else recipe["model"]["name"]


def train(out: Path, device: str) -> Path:
    if (out / "recipe.toml").is_file() and any((out / "checkpoints").glob("round-*.pt")):
        return out  # trained by an earlier call
    recipe = recipe_overrides.build(None, [("train.rounds", 10), ("train.device", device)])
    loop.start_run(recipe, out, overwrite=True, progress=False)
    return out


def checkpoint_module(ctx: CheckpointContext) -> torch.nn.Module:
    """A copy of the module holding the checkpoint's weights and buffers, eval mode."""
    module = copy.deepcopy(ctx.flat.module)
    FlatModel(module).load_into_module(ctx.w, ctx.buffers)
    return module.eval()


def reference_loop(ctx: CheckpointContext, d1: torch.Tensor, d2: torch.Tensor, xs: np.ndarray,
                   ys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The reference scripts' way: a fresh model per cell, weights loaded, a DataLoader over the data."""
    base = checkpoint_module(ctx)
    names = ctx.flat.names
    w_parts = dict(zip(names, ctx.flat.params(ctx.w).values()))
    d1_parts, d2_parts = ctx.flat.params(d1), ctx.flat.params(d2)
    data = ctx.global_data
    loader = DataLoader(TensorDataset(data.x, data.y), batch_size=data.batch_size, shuffle=False)
    loss = np.full((len(xs), len(ys)), np.nan)
    accuracy = np.full_like(loss, np.nan)
    for ix, a in enumerate(xs):
        for iy, b in enumerate(ys):
            model = copy.deepcopy(base)
            state = model.state_dict()
            for n in names:
                state[n] = w_parts[n] + float(a) * d1_parts[n] + float(b) * d2_parts[n]
            model.load_state_dict(state)
            model.eval()
            total, correct, count = 0.0, 0, 0
            with torch.no_grad():
                for xb, yb in loader:
                    out = model(xb)
                    total += F.cross_entropy(out, yb).item() * len(yb)
                    correct += int((out.argmax(1) == yb).sum())
                    count += len(yb)
            loss[ix, iy], accuracy[ix, iy] = total / count, correct / count
    return loss, accuracy


def loss_landscapes_plane(ctx: CheckpointContext, n: int) -> np.ndarray:
    """loss-landscapes' random plane of the same checkpoint on the same data (its own directions)."""
    import loss_landscapes
    import loss_landscapes.metrics

    model = checkpoint_module(ctx)
    metric = loss_landscapes.metrics.Loss(F.cross_entropy, ctx.global_data.x, ctx.global_data.y)
    with torch.no_grad():
        return loss_landscapes.random_plane(model, metric, distance=1, steps=n, normalization="filter",
                                            deepcopy_model=True)


def timed(fn):
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    result = fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - start, result


def nchw_cells(fn):
    """Run ``fn`` with our one-cell path using the module's own NCHW layout (for comparison only)."""
    original = surface_module._channels_last_parameters
    surface_module._channels_last_parameters = lambda objective, w: objective.flat.params(w)
    try:
        return fn()
    finally:
        surface_module._channels_last_parameters = original


def compare(ctx: CheckpointContext, n: int, reference: bool) -> list[tuple]:
    plane = random_plane(ctx.flat, ctx.w, 0)
    xs = ys = make_axis(n, -1.0, 1.0)
    objective = ctx.objective

    def ours(**options):
        return evaluate_surface(objective, ctx.w, plane.d1, plane.d2, xs, ys, cells_per_batch=16, **options)

    evaluate_surface(objective, ctx.w, plane.d1, plane.d2, xs[:3], ys[:3])  # warm-up
    seconds, grid = timed(ours)
    rows = [("ours, default (CPU: one cell per pass, channels-last convolution weights)", seconds, 0.0, 0.0)]

    def versus(label: str, seconds: float, other) -> None:
        rows.append((label, seconds, float(np.max(np.abs(other.loss - grid.loss))),
                     float(np.max(np.abs(other.accuracy - grid.accuracy)))))

    seconds, other = timed(lambda: nchw_cells(ours))
    versus("ours, one cell per pass, the module's NCHW layout", seconds, other)
    seconds, other = timed(lambda: ours(cells_per_pass=16))
    versus("ours, 16 cells per pass (vmap; the former default, the GPU default)", seconds, other)
    try:
        seconds, _ = timed(lambda: loss_landscapes_plane(ctx, n))
        rows.append(("loss-landscapes 3.0.6 random_plane (its own directions, loss only)", seconds, None, None))
    except ImportError as error:
        rows.append((f"loss-landscapes: not installed ({error})", None, None, None))
    if reference:
        seconds, (loss, accuracy) = timed(lambda: reference_loop(ctx, plane.d1, plane.d2, xs, ys))
        rows.append(("reference loop (deepcopy + load_state_dict + DataLoader per cell)", seconds,
                     float(np.max(np.abs(loss - grid.loss))), float(np.max(np.abs(accuracy - grid.accuracy)))))
    return rows


def passes_table(ctx: CheckpointContext, n: int) -> list[tuple[int, float]]:
    """Seconds per cell for 1, 2, 4, 8, 16 cells per forward pass on an n x n grid (chunks of 16)."""
    plane = random_plane(ctx.flat, ctx.w, 0)
    xs = ys = make_axis(n, -1.0, 1.0)
    best = {}
    for _ in range(2):  # interleaved, min of two
        for cells in (1, 2, 4, 8, 16):
            seconds, _ = timed(lambda cells=cells: evaluate_surface(
                ctx.objective, ctx.w, plane.d1, plane.d2, xs, ys, cells_per_batch=16, cells_per_pass=cells))
            best[cells] = min(best.get(cells, float("inf")), seconds / n**2)
    return sorted(best.items())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grid", type=int, default=51, help="n for an n x n grid (odd)")
    parser.add_argument("--also", type=int, nargs="*", default=[], help="more grids to time as well")
    parser.add_argument("--run", type=Path, default=None, help="an existing digits run directory")
    parser.add_argument("--out", type=Path, default=Path("/tmp/landscape-bench/surface-digits"))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--reference-loop", action="store_true", help="also time the reference scripts' loop")
    parser.add_argument("--passes", action="store_true", help="also time 1..16 cells per pass on a 9x9 grid")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    run = args.run or train(args.out, args.device)
    sources, _ = find_sources(run)
    ctx = CheckpointContext(sources[0], max(sources[0].checkpoints), AnalysisSettings(device=args.device))
    load = os.getloadavg()
    print(f"model: {model_name(ctx.source.recipe)} ({ctx.flat.dim} parameters), round {ctx.round}, analysis set "
          f"{len(ctx.global_data)} samples, device {ctx.device}, torch threads {torch.get_num_threads()} of "
          f"{os.cpu_count()} cores, load average {load[0]:.2f}\n")
    print("| grid | method | seconds | s / cell | loss-landscapes time / this | max abs diff loss | max abs diff acc |")
    print("|---|---|---|---|---|---|---|")
    for n in [args.grid, *args.also]:
        rows = compare(ctx, n, args.reference_loop)
        peer = next((r[1] for r in rows if r[0].startswith("loss-landscapes") and r[1] is not None), None)
        for label, seconds, diff_loss, diff_acc in rows:
            if seconds is None:
                print(f"| {n}x{n} | {label} | - | - | - | - | - |")
                continue
            ratio = "-" if peer is None else f"{peer / seconds:.2f}x"
            diffs = ("-", "-") if diff_loss is None else (f"{diff_loss:.1e}", f"{diff_acc:.1e}")
            print(f"| {n}x{n} | {label} | {seconds:.1f} | {seconds / n**2:.4f} | {ratio} | {diffs[0]} | {diffs[1]} |",
                  flush=True)
    if args.passes:
        table = passes_table(ctx, 9)
        one = table[0][1]
        print("\n| cells per forward pass (9x9 grid) | s / cell | time / one cell per pass |")
        print("|---|---|---|")
        for cells, seconds in table:
            print(f"| {cells} | {seconds:.4f} | {seconds / one:.2f}x |")
    print(f"\nload average at the end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
