"""Benchmark: `landscape analyze` of a digits FedSAM run with every default pass, at its last checkpoint.

Trains the run first unless it is there (FedSAM, Dirichlet 0.1, 20 clients, 25% per round, 30 rounds, the
digits CNN, client models kept), then times one `landscape analyze RUN` process from start to exit (every
default pass on the whole training set, the round-30 checkpoint, 1 thread) and reads each pass's own seconds
from its result file. Prints a Markdown table: pass, seconds, and the process's wall time and peak memory.
Usage:

    .venv/bin/python benchmarks/analyze_digits.py [--out runs/publish-analyze]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TRAIN = ["train", "--algorithm", "fedsam", "--partition", "dirichlet", "--alpha", "0.1", "--clients", "20",
         "--participation", "0.25", "--rounds", "30", "--keep-clients", "--quiet"]
# the analysis process reports its own peak resident memory when it exits
ANALYZE = """
import atexit, resource, sys
peak = sys.argv.pop(1)
atexit.register(lambda: open(peak, "w").write(str(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)))
from landscape.cli import main
sys.argv[0] = "landscape"
main()
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/publish-analyze/fedsam"))
    args = parser.parse_args()
    if not (args.out / "metrics.jsonl").is_file():
        subprocess.run([sys.executable, "-m", "landscape", *TRAIN, "--out", str(args.out.parent),
                        "--name", args.out.name, "--overwrite"], check=True,
                       stdout=subprocess.DEVNULL)
    with tempfile.TemporaryDirectory() as folder:
        peak_file = Path(folder) / "peak"
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", ANALYZE, str(peak_file), "analyze", str(args.out), "--force",
                        "--quiet"], check=True, stdout=subprocess.DEVNULL)
        wall = time.perf_counter() - started
        peak_mib = int(peak_file.read_text()) / 1024
    results = sorted((args.out / "analysis").glob("round-*"))[-1]
    print(f"FedSAM on digits (Dirichlet 0.1, 20 clients, 30 rounds, the CNN), `landscape analyze` at "
          f"{results.name}:\n")
    print("| pass | seconds |\n|---|---|")
    for path in sorted(results.glob("*.json")):
        record = json.loads(path.read_text())
        if "seconds" in record:
            print(f"| {record['pass']} | {record['seconds']:.1f} |")
    print(f"| the whole process (start to exit) | {wall:.1f} |")
    print(f"\nPeak memory of the analysis process: {peak_mib:,.0f} MiB.")


if __name__ == "__main__":
    main()
