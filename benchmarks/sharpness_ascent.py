"""Benchmark: the S_rho ascent, the former 5-step single start against today's multi-start converged default.

S_rho = max_{||e|| <= rho} F(w + e) - F(w) is estimated by ``landscape.measure.sharpness.sharpness_profile``
(the function the ``sharpness`` pass calls, plain ball, seed 0), under these settings:

- "old: 5 steps, 1 start": at most 5 trials from the centre, no early stop (tol 0): the former estimate's
  budget (its step rule is gone; these are today's Armijo trials);
- "1 start (steps 50, tol 1e-3)": today's ascent from the centre only (trial 1 = SAM's step);
- "default (steps 50, tol 1e-3, 8 starts)": the pass's default (``SharpnessOptions``);
- "16 starts (steps 200, tol 1e-3)": a longer multi-start, for the best value;
- on the BatchNorm MLP also "16 starts (steps 200, tol 0)" and the tests' independent reference ascent
  (``_long_multistart``: 16 normalised projected ascents from random points, 200 steps).

Models: the digits CNN (53,002 parameters, float32) of a FedSAM run trained first unless it is there (the
default recipe of `landscape train --algorithm fedsam`: digits, Dirichlet 0.1, 20 clients, 25% per round, 30
rounds, checkpoints at rounds 10, 20, 30), at rounds 10 and 30, F over the whole training set (eval mode,
batches of 512: the pass's defaults); and the 626-parameter BatchNorm MLP of
``tests/measure/test_sharpness.py::test_defaults_reach_the_tolerance_of_a_long_multistart_ascent`` (float64,
trained near interpolation on 256 digits, built by that test's helper). Per radius each setting is run alone
(its own centre gradient): S_rho, how far short of the best value of that row group it is, whether the best
start's ascent converged, how many starts ended within tol of the estimate, gradient and loss evaluations,
seconds (1 thread). Usage:

    .venv/bin/python benchmarks/sharpness_ascent.py [--out runs/publish-sharpness/fedsam]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import torch

import landscape
from landscape.measure.sharpness import sharpness_profile

ROOT = Path(__file__).resolve().parents[1]
RHOS = (0.01, 0.05, 0.1)
ROUNDS = (10, 30)
TRAIN = ["train", "--algorithm", "fedsam", "--rounds", "30", "--quiet"]
SETTINGS = {
    "old: 5 steps, 1 start": {"steps": 5, "tol": 0.0, "starts": 1},
    "1 start (steps 50, tol 1e-3)": {"steps": 50, "tol": 1e-3, "starts": 1},
    "default (steps 50, tol 1e-3, 8 starts)": {"steps": 50, "tol": 1e-3, "starts": 8},
    "16 starts (steps 200, tol 1e-3)": {"steps": 200, "tol": 1e-3, "starts": 16},
}
BN_ONLY = {"16 starts (steps 200, tol 0)": {"steps": 200, "tol": 0.0, "starts": 16}}
REFERENCE = "the tests' reference: 16 random starts, 200 steps"


def fedsam_problems(out: Path) -> list[tuple[str, int, object]]:
    """(label, round, Problem) of the FedSAM digits CNN at each of ``ROUNDS``; trains the run first."""
    if not (out / "metrics.jsonl").is_file():
        subprocess.run([sys.executable, "-m", "landscape", *TRAIN, "--out", str(out.parent), "--name", out.name,
                        "--overwrite"], check=True, stdout=sys.stderr)  # its summary line is not part of the table
    run = landscape.open_run(out)
    train_set, _ = run.data()
    problems = []
    for round in ROUNDS:
        model = run.model(round)
        label = f"FedSAM digits CNN ({sum(p.numel() for p in model.parameters()):,} parameters, float32)"
        problems.append((label, round, landscape.problem(model, (train_set.x, train_set.y))))
    return problems


def bn_mlp():
    """(objective, w, long reference ascent) of the tests' 626-parameter BatchNorm MLP."""
    sys.path[:0] = [str(ROOT / "tests" / "measure"), str(ROOT / "tests")]  # the test module and its helpers
    from test_sharpness import _long_multistart, _tiny_trained

    objective, w = _tiny_trained("bn-mlp")
    return objective, w, _long_multistart


def measure(objective, w, rho: float, settings: dict) -> dict:
    started = time.perf_counter()
    p = sharpness_profile(objective, w, [rho], seed=0, **settings)
    return {"value": float(p.sharpness[0]), "converged": bool(p.ascent_converged[0]),
            "at_best": f"{int(p.starts_at_best[0])} of {p.starts}", "gradients": p.gradient_evaluations,
            "losses": p.loss_evaluations, "seconds": time.perf_counter() - started}


def reference(objective, w, rho: float, long_multistart) -> dict:
    started = time.perf_counter()
    value = long_multistart(objective, w, rho)
    return {"value": value, "converged": None, "at_best": "-", "gradients": 16 * 200, "losses": 0,
            "seconds": time.perf_counter() - started}


def print_rows(model: str, round: str, rho: float, rows: dict[str, dict]) -> None:
    best = max(r["value"] for r in rows.values())
    for setting, r in rows.items():
        short = 1 - r["value"] / best if best > 0 else 0.0
        converged = {True: "yes", False: "no", None: "-"}[r["converged"]]
        print(f"| {model} | {round} | {rho:g} | {setting} | {r['value']:.6f} | {short:.3%} | {converged} | "
              f"{r['at_best']} | {r['gradients']} | {r['losses']} | {r['seconds']:.1f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/publish-sharpness/fedsam"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    problems = fedsam_problems(args.out)
    print("S_rho per radius and setting; short = 1 - S_rho / the best value of the radius's rows; converged: "
          "the best start's ascent met the stopping test; at best: starts within tol of S_rho.\n")
    print("| model | round | rho | setting | S_rho | short of the best | converged | starts at best | gradients "
          "| losses | seconds |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for label, round, p in problems:
        for rho in RHOS:
            print_rows(label, str(round), rho, {s: measure(p.objective, p.w, rho, o) for s, o in SETTINGS.items()})
    objective, w, long_multistart = bn_mlp()
    for rho in RHOS:
        rows = {s: measure(objective, w, rho, o) for s, o in {**SETTINGS, **BN_ONLY}.items()}
        rows[REFERENCE] = reference(objective, w, rho, long_multistart)
        print_rows(f"BatchNorm MLP ({w.numel()} parameters, float64, the tests')", "-", rho, rows)


if __name__ == "__main__":
    main()
