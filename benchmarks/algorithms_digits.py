"""Benchmark: every algorithm of train/digits-quick.toml on digits (Dirichlet 0.1, 20 clients).

Runs the README's sweep command once (`landscape train train/digits-quick.toml --out DIR`; finished runs are
skipped, so a second call only re-reads) and prints a Markdown table per algorithm: final test accuracy,
final flatness distance Delta_D, uplink floats per client, and training speed (rounds per second from the
per-round `seconds` of metrics.jsonl, i.e. local work + aggregation + evaluation, without process start),
also relative to FedAvg. Usage:

    .venv/bin/python benchmarks/algorithms_digits.py [--out runs/publish-algorithms]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from landscape.core.schema import read_toml
from landscape.store.directory import RunDir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/publish-algorithms")
    parser.add_argument("--recipe", default=str(Path(__file__).resolve().parents[1] / "train" / "digits-quick.toml"))
    args = parser.parse_args()
    subprocess.run([sys.executable, "-m", "landscape", "train", args.recipe, "--out", args.out, "--quiet"],
                   check=True, stdout=subprocess.DEVNULL)
    rows = []
    for path in sorted(Path(args.out).iterdir()):
        run = RunDir(path)
        metrics = run.read_metrics()
        if not metrics:
            continue
        recipe = read_toml(run.recipe)
        algorithm = recipe["algorithm"]["name"] + ("+swa" if recipe["train"].get("swa") else "")
        seconds = sum(m["seconds"] for m in metrics)
        rows.append((algorithm, metrics[-1]["test_acc"], metrics[-1]["flatness_distance"],
                     metrics[-1]["uplink_floats"], len(metrics) / seconds))
    order = read_toml(args.recipe).get("sweep", {}).get("algorithm.name", [])  # the recipe's order
    rows.sort(key=lambda row: (order.index(row[0]) if row[0] in order else len(order), row[0]))
    base = {a: speed for a, *_, speed in rows}.get("fedavg")
    print("| algorithm | final test accuracy | final Delta_D | uplink floats / client | rounds/s | time vs FedAvg |")
    print("|---|---|---|---|---|---|")
    for algorithm, acc, distance, uplink, speed in rows:
        ratio = f"{base / speed:.2f}x" if base else "-"
        print(f"| {algorithm} | {acc:.4f} | {distance:.3f} | {uplink:,.0f} | {speed:.2f} | {ratio} |")


if __name__ == "__main__":
    main()
