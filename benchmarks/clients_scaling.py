"""Benchmark: what every analysis pass costs at 20 and at 100 clients (the papers' client count).

Two FedAvg runs on digits that differ only in the number of clients (Dirichlet 0.2: at 0.1 some of 100 digits
clients get fewer than 2 samples; 25% per round, 10 rounds, the CNN, client models kept; trained first unless
they are there), each analysed by one `landscape analyze` process with every default pass at its last
checkpoint (the passes' per-client work covers every client: their ``clients = 0`` default), one thread. Each
pass's seconds are those its result file records. A per-client pass whose cost grows as the clients do takes
about 5x the time at 100 clients; one that does more than one pass of the data per client and minibatch draw
grows faster. Usage:

    .venv/bin/python benchmarks/clients_scaling.py [--clients 20,100] [--out runs/publish-clients]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

TRAIN = ["train", "--algorithm", "fedavg", "--partition", "dirichlet", "--alpha", "0.2", "--participation", "0.25",
         "--rounds", "10", "--checkpoint-every", "10", "--keep-clients", "--quiet"]


def analyse(run: Path) -> tuple[dict[str, float], float]:
    """Every default pass of ``run``'s last checkpoint, computed afresh: seconds per pass and of the process."""
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "landscape", "analyze", str(run), "--force", "--quiet"], check=True,
                   stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    folder = sorted((run / "analysis").glob("round-*"))[-1]
    seconds = {}
    for path in sorted(folder.glob("*.json")):
        record = json.loads(path.read_text())
        if "seconds" in record:
            seconds[record["pass"]] = record["seconds"]
    return seconds, wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", default="20,100")
    parser.add_argument("--out", type=Path, default=Path("runs/publish-clients"))
    args = parser.parse_args()
    counts = [int(n) for n in args.clients.split(",")]
    measured = {}
    for n in counts:
        run = args.out / f"clients{n}"
        if not (run / "metrics.jsonl").is_file():
            subprocess.run([sys.executable, "-m", "landscape", *TRAIN, "--clients", str(n), "--out", str(run),
                            "--overwrite"], check=True, stdout=subprocess.DEVNULL)
        measured[n] = analyse(run)
    first, last = counts[0], counts[-1]
    print("FedAvg on digits, 10 rounds, every default pass at round 10, seconds per pass (1 thread):\n")
    print("| pass | " + " | ".join(f"{n} clients" for n in counts) + f" | {last} / {first} |")
    print("|---|" + "---|" * (len(counts) + 1))
    for name in measured[first][0]:
        cells = [f"{measured[n][0].get(name, float('nan')):.1f}" for n in counts]
        ratio = measured[last][0].get(name, float("nan")) / measured[first][0][name]
        print(f"| {name} | " + " | ".join(cells) + f" | {ratio:.2f}x |")
    totals = [sum(measured[n][0].values()) for n in counts]
    print("| every pass | " + " | ".join(f"{t:.1f}" for t in totals) + f" | {totals[-1] / totals[0]:.2f}x |")
    walls = [measured[n][1] for n in counts]
    print("| the analyze process (start to exit) | " + " | ".join(f"{w:.1f}" for w in walls)
          + f" | {walls[-1] / walls[0]:.2f}x |")


if __name__ == "__main__":
    main()
