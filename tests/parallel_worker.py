"""Run by tests/core/test_parallel.py under ``torchrun --standalone --nproc-per-node 2`` (gloo, CPU).

    torchrun --standalone --nproc-per-node 2 tests/parallel_worker.py OUT RUN_DIR [RESUME ROUNDS COPIES...]

With RESUME, it first continues the training run RESUME to ROUNDS rounds on the 2 ranks, as
``torchrun -m landscape train --resume RESUME --rounds ROUNDS`` does (the command line's own entry, in this
process: one launch instead of two), and rank 0 copies the resumed run into each of COPIES (RUN_DIR among them).
Then it checks the collectives of ``landscape.core.parallel`` on the spot (a failed assertion ends the rank, and torchrun
with an error), then computes, with the work split across the ranks, what the test compares with a single
process: a Hessian-vector product (``hvp.pt``), a resumed surface grid (``surface.npz``) and
``run_analysis`` over RUN_DIR (written into RUN_DIR by rank 0). ``problem()`` builds the same model, data,
vectors and directions in the worker and in the test.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import torch

from landscape.core import parallel
from landscape.core.errors import LandscapeError
from landscape.core.flat import FlatModel
from landscape.data.datasets import load_dataset
from landscape.measure.analysis_data import AnalysisData
from landscape.measure.objective import Objective
from landscape.models import build_model

GRID = (np.linspace(-1.0, 1.0, 9), np.linspace(-0.5, 0.5, 7))  # 63 cells: chunks of 4 split unevenly
CELLS_PER_BATCH = 4
ANALYSIS = {"rounds": "0,1,3", "passes": ["loss", "hessian", "surface"], "samples": 120}
HESSIAN = {"top_k": 2, "trace_hvps": 6, "density_runs": 1, "density_steps": 3, "clients": -1}
SURFACE = {"grid": "5", "cells_per_batch": 4, "save_every": 4}


def problem() -> dict:
    """A float64 MLP on 300 digits samples in batches of 64 (5 batches, the last one short), three vectors
    and two surface directions; the same in every process."""
    bundle = load_dataset("digits", root="data", download=False, augment=False, num_clients=1, seed=0, options={})
    torch.manual_seed(0)
    module = build_model("mlp", bundle.input_shape, bundle.num_classes, {"hidden": [16]}).double()
    flat = FlatModel(module)
    data = AnalysisData(bundle.train.x[:300].double(), bundle.train.y[:300], batch_size=64)
    generator = torch.Generator().manual_seed(1)
    w = flat.vector()
    vectors = torch.randn(flat.dim, 3, generator=generator, dtype=torch.float64)
    d1, d2 = (0.1 * torch.randn(flat.dim, generator=generator, dtype=torch.float64) for _ in range(2))
    loss = np.full((len(GRID[0]), len(GRID[1])), np.nan)
    loss[:2] = 0.5  # a partial grid: the first two rows are already computed (a resumed surface)
    return {"flat": flat, "objective": Objective(flat, flat.buffers(), data), "w": w, "vectors": vectors,
            "d1": d1, "d2": d2, "partial_loss": loss, "partial_accuracy": np.where(np.isnan(loss), np.nan, 0.25)}


def check_collectives() -> None:
    rank, ranks = parallel.rank(), parallel.world_size()
    assert ranks == 2 and parallel.is_main() == (rank == 0)
    assert parallel.shard(list(range(5))) == ([0, 1, 2] if rank == 0 else [3, 4])
    # Tensors of any number, dtype and shape per rank come back bit for bit, in rank order.
    def tensors_of(r: int) -> list[torch.Tensor]:
        if r == 0:
            return [torch.arange(6, dtype=torch.float32).reshape(2, 3) / 7, torch.tensor(-3, dtype=torch.int64),
                    torch.tensor([True, False, True])]
        return [torch.linspace(0, 1, 5, dtype=torch.float64) ** 0.5]

    gathered = parallel.all_gather_tensors(tensors_of(rank), "cpu")
    for r, received in enumerate(gathered):
        expected = tensors_of(r)
        assert len(received) == len(expected)
        for got, want in zip(received, expected):
            assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)
    total = parallel.all_reduce_sum(torch.tensor([1.0 + rank, 10.0]))
    assert total.tolist() == [3.0, 20.0]
    assert parallel.all_gather_objects({"rank": rank}) == [{"rank": 0}, {"rank": 1}]
    assert parallel.broadcast_object("from rank 0" if rank == 0 else "not sent") == "from rank 0"
    assert parallel.on_main(lambda: rank * 10 + 5) == 5  # rank 0's result on both ranks

    def refuse() -> None:
        raise LandscapeError("refused on rank 0")

    try:
        parallel.on_main(refuse)
    except LandscapeError as e:
        assert str(e) == "refused on rank 0"
    else:
        raise AssertionError("on_main did not hand rank 0's error to every rank")
    with parallel.solo():  # one rank alone: no collectives
        assert parallel.world_size() == 1 and parallel.shard([1, 2, 3]) == [1, 2, 3]
        assert parallel.all_gather_objects(rank) == [rank] and parallel.is_main() == (rank == 0)


def main() -> None:
    from landscape.analyze.catalog import pass_options
    from landscape.analyze.scheduler import run_analysis
    from landscape.analyze.settings import AnalysisSettings
    from landscape.measure.operator import HessianOperator
    from landscape.measure.surface.evaluation import evaluate_surface

    out, run = Path(sys.argv[1]), Path(sys.argv[2])
    with parallel.session():
        if len(sys.argv) > 3:
            resume, rounds, copies = sys.argv[3], sys.argv[4], sys.argv[5:]
            from landscape.cli import cli

            cli.main(["train", "--resume", resume, "--rounds", rounds, "--quiet"], prog_name="landscape",
                     standalone_mode=False)
            if parallel.is_main():
                for copy in copies:
                    shutil.copytree(resume, copy)
            parallel.barrier()
        check_collectives()
        p = problem()
        products = {backend: HessianOperator(p["objective"], p["w"], backend).matmat(p["vectors"])
                    for backend in ("double-backward", "forward-over-reverse")}
        # auto with nothing fitting: the ranks agree not to keep graphs and time the backends together
        products["auto"] = HessianOperator(p["objective"], p["w"], "auto", memory_budget=0).matmat(p["vectors"])
        saves: list[int] = []
        grid = evaluate_surface(p["objective"], p["w"], p["d1"], p["d2"], *GRID, loss=p["partial_loss"],
                                accuracy=p["partial_accuracy"], cells_per_batch=CELLS_PER_BATCH, save_every=8,
                                on_checkpoint=lambda g: saves.append(int((~g.missing_mask).sum())))
        assert parallel.is_main() == bool(saves)  # partial grids are saved by rank 0 only
        options = {"loss": pass_options("loss", {}), "hessian": pass_options("hessian", HESSIAN),
                   "surface": pass_options("surface", SURFACE)}
        settings = AnalysisSettings(device="cpu", analysis_samples=ANALYSIS["samples"])
        report = run_analysis(run, rounds=ANALYSIS["rounds"], passes=ANALYSIS["passes"], settings=settings,
                              options=options, progress=False)
        assert report.computed == 9 and len(report.rows) == 3
        if parallel.is_main():
            torch.save(products, out / "hvp.pt")
            np.savez(out / "surface.npz", loss=grid.loss, accuracy=grid.accuracy, saves=np.array(saves),
                     evaluated=grid.cells_evaluated)


if __name__ == "__main__":
    main()
