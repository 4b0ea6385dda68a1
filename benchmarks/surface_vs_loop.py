"""Benchmark: a 2D loss surface by ``evaluate_surface`` vs the per-cell loop of the reference scripts.

One trained digits CNN (the default recipe, 10 rounds, trained here through the API unless --run names a run
directory), its whole analysis set (the union of the clients' training data, 1,437 samples, eval mode,
batches of 512) and one filter-normalised random plane (seed 0). Timed, on the same grid:

* reference loop: for every cell, deep-copy the module, ``load_state_dict`` the weights w + a d1 + b d2 built
  tensor by tensor, and evaluate it with a ``DataLoader`` over the data (as loss-landscape's
  ``plot_surface.py`` / ``evaluation.eval_loss`` do: per-batch ``loss.item() * batch_size`` sums);
* ours, one cell at a time (``vectorize=False``): no model rebuilt, data already on the device, loss and
  accuracy in one pass;
* ours, batched (the default): ``cells_per_batch`` cells per forward pass through ``torch.func.vmap``.

Both must give the same grid (max |difference| of loss and accuracy is printed). Prints a Markdown table.
Timings, not assertions: run it on a quiet machine. Usage:

    .venv/bin/python benchmarks/surface_vs_loop.py [--grid 51] [--also 21] [--run DIR] [--device cpu]
"""

from __future__ import annotations

import argparse
import copy
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from landscape import recipe as recipes
from landscape.analyze.context import AnalysisSettings, CheckpointContext, find_sources
from landscape.analyze.directions import random_plane
from landscape.analyze.surface import evaluate_surface, make_axis
from landscape.train import loop


def train(out: Path, device: str) -> Path:
    if (out / "recipe.toml").is_file() and any((out / "checkpoints").glob("round-*.pt")):
        return out  # trained by an earlier call
    recipe = recipes.build(None, [("train.rounds", 10), ("train.device", device)])
    loop.start_run(recipe, out, overwrite=True, progress=False)
    return out


def reference_loop(ctx: CheckpointContext, d1: torch.Tensor, d2: torch.Tensor, xs: np.ndarray,
                   ys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The reference scripts' way: a fresh model per cell, weights loaded, a DataLoader over the data."""
    base = ctx.flat.load_into_module(ctx.w, ctx.buffers)
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


def timed(fn):
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    result = fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - start, result


def compare(ctx: CheckpointContext, n: int, cells_per_batch: int, per_cell: bool) -> list[tuple]:
    plane = random_plane(ctx.flat, ctx.w, 0)
    xs = ys = make_axis(n, -1.0, 1.0)
    objective = ctx.objective
    warm_up = (xs[:3], ys[:3])
    evaluate_surface(objective, ctx.w, plane.d1, plane.d2, *warm_up, cells_per_batch=cells_per_batch)
    rows = []
    t_ref, (ref_loss, ref_acc) = timed(lambda: reference_loop(ctx, plane.d1, plane.d2, xs, ys))
    rows.append(("reference loop (deepcopy + load_state_dict + DataLoader per cell)", t_ref, 0.0, 0.0))
    variants = [(f"ours, batched (vmap, {cells_per_batch} cells per pass)", True)]
    if per_cell:
        variants.insert(0, ("ours, one cell at a time (model never rebuilt)", False))
    for label, vectorize in variants:
        seconds, grid = timed(lambda v=vectorize: evaluate_surface(
            objective, ctx.w, plane.d1, plane.d2, xs, ys, cells_per_batch=cells_per_batch, vectorize=v))
        rows.append((label, seconds, float(np.max(np.abs(grid.loss - ref_loss))),
                     float(np.max(np.abs(grid.accuracy - ref_acc)))))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grid", type=int, default=51, help="n for an n x n grid (odd)")
    parser.add_argument("--also", type=int, nargs="*", default=[], help="smaller grids to time as well")
    parser.add_argument("--run", type=Path, default=None, help="an existing digits run directory")
    parser.add_argument("--out", type=Path, default=Path("/tmp/landscape-bench/surface-digits"))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--cells-per-batch", type=int, default=16)
    parser.add_argument("--per-cell", action="store_true", help="also time our one-cell-at-a-time path")
    args = parser.parse_args()

    run = args.run or train(args.out, args.device)
    sources, _ = find_sources(run)
    ctx = CheckpointContext(sources[0], max(sources[0].checkpoints), AnalysisSettings(device=args.device))
    print(f"model: {ctx.source.recipe.model.name} ({ctx.flat.dim} parameters), round {ctx.round}, "
          f"analysis set {len(ctx.global_data)} samples, device {ctx.device}, torch threads "
          f"{torch.get_num_threads()}\n")
    print("| grid | method | seconds | s / cell | speed-up vs reference | max abs diff loss "
          "| max abs diff acc |")
    print("|---|---|---|---|---|---|---|")
    for n in [args.grid, *args.also]:
        rows = compare(ctx, n, args.cells_per_batch, args.per_cell)
        reference = rows[0][1]
        for label, seconds, diff_loss, diff_acc in rows:
            print(f"| {n}x{n} | {label} | {seconds:.1f} | {seconds / n**2:.4f} | "
                  f"{reference / seconds:.2f}x | {diff_loss:.2e} | {diff_acc:.2e} |", flush=True)


if __name__ == "__main__":
    main()
