"""Benchmark: FedAvg on digits (Dirichlet 0.1, 20 clients, 25% participation, 30 rounds).

Runs the README's command as a real subprocess for several seeds and prints a Markdown table of final test
accuracy and wall time (process start to exit, install excluded), one thread per process. Usage:

    .venv/bin/python benchmarks/train_digits.py [--seeds 0,1,2,3,4] [--out runs/publish-train-digits]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

COMMAND = ["train", "--algorithm", "fedavg", "--dataset", "digits", "--partition", "dirichlet", "--alpha", "0.1",
           "--clients", "20", "--participation", "0.25", "--rounds", "30", "--quiet"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--out", default="runs/publish-train-digits")
    args = parser.parse_args()
    rows = []
    for seed in (int(s) for s in args.seeds.split(",")):
        out = Path(args.out) / f"seed{seed}"
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "landscape", *COMMAND, "--seed", str(seed),
                        "--out", str(out.parent), "--name", out.name, "--overwrite"],
                       check=True, env={**os.environ}, stdout=subprocess.DEVNULL)
        seconds = time.perf_counter() - started
        last = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()][-1]
        rows.append((seed, last["test_acc"], seconds))
    print("| seed | final test accuracy | wall time (s) |\n|---|---|---|")
    for seed, acc, seconds in rows:
        print(f"| {seed} | {acc:.4f} | {seconds:.1f} |")
    accs = [r[1] for r in rows]
    print(f"| mean | {sum(accs) / len(accs):.4f} | {sum(r[2] for r in rows) / len(rows):.1f} |")


if __name__ == "__main__":
    main()
