"""Benchmark: the 51x51 digits loss surface computed by 1 and by 2 torchrun ranks.

The model and data of ``surface_vs_loop.py``: the digits CNN (53,002 parameters) of the default recipe after
10 rounds (trained here unless --run names a run directory), its whole analysis set (1,437 samples, eval
mode, batches of 512) and one filter-normalised random plane (seed 0); the grid evaluated by
``evaluate_surface`` (vmap, 16 cells per pass). Each configuration RANKSxTHREADS is one
``torchrun --standalone --nproc-per-node RANKS`` job with OMP_NUM_THREADS=THREADS per rank; the ranks split
the grid's chunks of cells (``landscape.core.parallel``) and rank 0 records the wall time between two barriers
(the grid only: start-up, data and model loading excluded) and the grid, which must equal the first
configuration's (max |difference| printed). Prints a Markdown table. Timings, not assertions: run it on a
quiet machine. Usage:

    .venv/bin/python benchmarks/surface_ranks.py [--grid 51] [--configs 1x1,2x1,1x2] [--run DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

from landscape.analyze.context import CheckpointContext
from landscape.analyze.settings import AnalysisSettings
from landscape.analyze.source import find_sources
from landscape.core import parallel
from landscape.measure.directions import random_plane
from landscape.measure.surface.evaluation import evaluate_surface
from landscape.measure.surface.grid import make_axis


def worker(run: Path, grid: int, out: Path) -> None:
    """One torchrun rank: evaluate the grid together with the other ranks; rank 0 saves grid and time."""
    with parallel.session():
        sources, _ = find_sources(run)
        ctx = CheckpointContext(sources[0], max(sources[0].checkpoints), AnalysisSettings(device="cpu"))
        plane = random_plane(ctx.flat, ctx.w, 0)
        xs = ys = make_axis(grid, -1.0, 1.0)
        evaluate_surface(ctx.objective, ctx.w, plane.d1, plane.d2, xs[:3], ys[:3])  # warm-up
        parallel.barrier()
        start = time.perf_counter()
        result = evaluate_surface(ctx.objective, ctx.w, plane.d1, plane.d2, xs, ys, cells_per_batch=16)
        parallel.barrier()
        seconds = time.perf_counter() - start
        if parallel.is_main():
            np.savez(out, loss=result.loss, accuracy=result.accuracy, seconds=seconds,
                     ranks=parallel.world_size(), threads=torch.get_num_threads())


def launch(config: str, run: Path, grid: int, out: Path) -> dict:
    ranks, threads = (int(v) for v in config.split("x"))
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    env["OMP_NUM_THREADS"] = str(threads)
    target = out / f"{config}.npz"
    # The worker's arguments are positional: torchrun would take "--run" for its own "--run-path".
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks),
                    __file__, "worker", str(run), str(grid), str(target)], env=env, check=True)
    saved = np.load(target)
    return {"config": config, "ranks": ranks, "threads": threads, "seconds": float(saved["seconds"]),
            "loss": saved["loss"], "accuracy": saved["accuracy"]}


def main() -> None:
    if sys.argv[1:2] == ["worker"]:  # one rank of a configuration: worker RUN GRID SAVE
        worker(Path(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grid", type=int, default=51, help="n for an n x n grid (odd)")
    parser.add_argument("--configs", default="1x1,2x1", help="RANKSxTHREADS per configuration, comma separated")
    parser.add_argument("--run", type=Path, default=None, help="an existing digits run directory")
    parser.add_argument("--out", type=Path, default=Path("/tmp/landscape-bench/surface-ranks"))
    args = parser.parse_args()

    sys.path.insert(0, str(Path(__file__).parent))
    from surface_vs_loop import train

    args.out.mkdir(parents=True, exist_ok=True)
    run = args.run or train(args.out / "digits-run", "cpu")
    rows = [launch(config, run, args.grid, args.out) for config in args.configs.split(",")]
    print(f"\n{args.grid}x{args.grid} digits surface ({args.grid**2} cells), {os.cpu_count()} CPU cores\n")
    print("| ranks x threads | seconds | s / cell | speed-up vs first | max abs diff loss | max abs diff acc |")
    print("|---|---|---|---|---|---|")
    first = rows[0]
    for row in rows:
        print(f"| {row['ranks']} x {row['threads']} | {row['seconds']:.1f} | {row['seconds'] / args.grid**2:.4f} | "
              f"{first['seconds'] / row['seconds']:.2f}x | {np.max(np.abs(row['loss'] - first['loss'])):.1e} | "
              f"{np.max(np.abs(row['accuracy'] - first['accuracy'])):.1e} |")
    (args.out / "results.json").write_text(json.dumps(
        [{k: v for k, v in row.items() if k not in ("loss", "accuracy")} for row in rows], indent=1) + "\n")


if __name__ == "__main__":
    main()
