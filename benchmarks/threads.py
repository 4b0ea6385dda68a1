"""Benchmark: one torch thread against two, for training and for a hessian pass, on this machine as it is.

The digits CNN (FedAvg, the default recipe) trained for 10 rounds, and the `hessian` pass of that run's last
checkpoint, each as one `landscape` process with `--threads 1` and `--threads 2`, interleaved (1, 2, 1, 2, ...)
``--repeat`` times so both see the same load; wall time of the whole process, median, min and max. The load
average before and after is in the results file's first line: with other jobs on the cores, two threads wait
for a core another process holds. Usage:

    .venv/bin/python benchmarks/threads.py [--repeat 3] [--out runs/publish-threads]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

TRAIN = ["train", "--algorithm", "fedavg", "--rounds", "10", "--quiet", "--overwrite"]
ANALYZE = ["analyze", "--passes", "hessian", "--force", "--quiet"]


def timed(args: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "landscape", *args], check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("runs/publish-threads"))
    args = parser.parse_args()
    seconds: dict[tuple[str, int], list[float]] = {}
    for _ in range(args.repeat):
        for threads in (1, 2):
            run = args.out / f"threads{threads}"
            seconds.setdefault(("train", threads), []).append(
                timed([*TRAIN, "--threads", str(threads), "--out", str(run.parent), "--name", run.name]))
            seconds.setdefault(("hessian", threads), []).append(
                timed([*ANALYZE[:1], str(run), *ANALYZE[1:], "--threads", str(threads)]))
    jobs = {"train": "train: FedAvg, 10 rounds of the digits CNN", "hessian": "analyze: the hessian pass, round 10"}
    print(f"Wall time of one process, {args.repeat} interleaved repeats:\n")
    print("| job | threads | median s | min s | max s | median / 1 thread |\n|---|---|---|---|---|---|")
    for job, label in jobs.items():
        one = statistics.median(seconds[(job, 1)])
        for threads in (1, 2):
            values = seconds[(job, threads)]
            print(f"| {label} | {threads} | {statistics.median(values):.1f} | {min(values):.1f} | {max(values):.1f} "
                  f"| {statistics.median(values) / one:.2f}x |")


if __name__ == "__main__":
    main()
