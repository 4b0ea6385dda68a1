"""The analysed runs the figure tests read (tests/figures/test_figures_rundata.py, tests/figures/test_figures_curves.py:
built once per session for both, ``support.helpers.shared_folder``)."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from landscape.analyze.catalog import pass_options
from landscape.analyze.scheduler import run_analysis
from landscape.analyze.settings import AnalysisSettings
from landscape.train import loop
from support.helpers import tiny_recipe

FAST = {"hessian": {"top_k": 2, "tol": 0.01, "clients": 2, "trace_hvps": 6, "density_steps": 4, "density_runs": 1},
        "sharpness": {"clients": 2, "steps": 2}, "incompatibility": {"clients": 2, "batches": 2},
        "alignment": {"clients": 2, "batches": 2}}


def tiny_run(path: Path, algorithm: str) -> None:
    recipe = tiny_recipe(train__keep_clients=True, train__rounds=3, algorithm__name=algorithm, model__name="mlp",
                         model__hidden=[16])
    loop.start_run(recipe, path, progress=False)


def analysed_runs(root: Path) -> Path:
    """Two analysed runs (FedAvg, FedSAM) at rounds 2 and 3 under ``root/analysed``, and one run with no
    analysis, ``root/bare/fedavg``; returns ``root`` (read-only for the tests: they write elsewhere)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: one thread is several times faster on a busy machine
    try:
        for algorithm in ("fedavg", "fedsam"):
            tiny_run(root / "analysed" / algorithm, algorithm)
        options = {name: pass_options(name, FAST.get(name, {})) for name in FAST}
        options["flatness"] = None
        run_analysis(root / "analysed", rounds="2,3", passes=[*FAST, "flatness"], options=options,
                     settings=AnalysisSettings(device="cpu", analysis_samples=100), progress=False)
    finally:
        torch.set_num_threads(threads)
    bare = root / "bare" / "fedavg"
    bare.mkdir(parents=True)
    for name in ("recipe.toml", "metrics.jsonl"):
        shutil.copy(root / "analysed" / "fedavg" / name, bare / name)
    return root
