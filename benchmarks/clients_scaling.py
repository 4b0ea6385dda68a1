"""Benchmark: what every analysis pass costs at 20 and at 100 clients (the papers' client count), and at 100
clients against the code before issue 23.

Two FedAvg runs on digits that differ only in the number of clients (Dirichlet 0.2: at 0.1 some of 100 digits
clients get fewer than 2 samples; 25% per round, 10 rounds, the CNN, client models kept; trained first unless
they are there), each analysed by one `landscape analyze` process with every default pass at its last
checkpoint (the passes' per-client work covers every client: their ``clients = 0`` default), one thread. Each
pass's seconds are those its result file records. A per-client pass whose cost grows as the clients do takes
about 5x the time at 100 clients; one that does more than one pass of the data per client and minibatch draw
grows faster.

``--baseline COMMIT`` (default: 3eee690, where issue 23 began) also trains and analyses the 100-client run with
the package as it was at that commit (a git worktree of it, run from there), in the same process, after the
runs of this code: the last column is this code's seconds over that code's for the same work. Usage:

    .venv/bin/python benchmarks/clients_scaling.py [--clients 20,100] [--baseline 3eee690] [--out runs/publish-clients]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TRAIN = ["train", "--algorithm", "fedavg", "--partition", "dirichlet", "--alpha", "0.2", "--participation", "0.25",
         "--rounds", "10", "--checkpoint-every", "10", "--keep-clients", "--quiet"]


def analyse(run: Path, cwd: Path | None = None) -> tuple[dict[str, float], float]:
    """Every default pass of ``run``'s last checkpoint, computed afresh: seconds per pass and of the process
    (the package the working directory ``cwd`` holds; by default this one)."""
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "landscape", "analyze", str(run), "--force", "--quiet"], check=True,
                   stdout=subprocess.DEVNULL, cwd=cwd)
    wall = time.perf_counter() - started
    folder = sorted((run / "analysis").glob("round-*"))[-1]
    seconds = {}
    for path in sorted(folder.glob("*.json")):
        record = json.loads(path.read_text())
        if "seconds" in record:
            seconds[record["pass"]] = record["seconds"]
    return seconds, wall


def measure(run: Path, clients: int, cwd: Path | None = None) -> tuple[dict[str, float], float]:
    """Train ``run`` with ``clients`` clients unless it is there, then analyse it (both by the package in ``cwd``)."""
    if not (run / "metrics.jsonl").is_file():
        subprocess.run([sys.executable, "-m", "landscape", *TRAIN, "--clients", str(clients), "--out", str(run),
                        "--overwrite"], check=True, stdout=subprocess.DEVNULL, cwd=cwd)
    return analyse(run, cwd)


def at_commit(commit: str, run: Path, clients: int) -> tuple[dict[str, float], float]:
    """``measure`` by the package as it was at ``commit``: a detached git worktree, removed afterwards."""
    root = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), commit], cwd=root, check=True,
                       capture_output=True)
        try:
            return measure(run.resolve(), clients, cwd=tree)  # `python -m` imports the package of its cwd first
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=root, check=True,
                           capture_output=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", default="20,100")
    parser.add_argument("--baseline", default="3eee690", help="a commit to compare the last count with ('' for none)")
    parser.add_argument("--out", type=Path, default=Path("runs/publish-clients"))
    args = parser.parse_args()
    counts = [int(n) for n in args.clients.split(",")]
    measured = {n: measure(args.out / f"clients{n}", n) for n in counts}
    first, last = counts[0], counts[-1]
    base = at_commit(args.baseline, args.out / f"baseline-clients{last}", last) if args.baseline else None
    print("FedAvg on digits, 10 rounds, every default pass at round 10, seconds per pass (1 thread):\n")
    header = "| pass | " + " | ".join(f"{n} clients" for n in counts) + f" | {last} / {first} |"
    if base is not None:
        header += f" {last} clients at {args.baseline} | now / {args.baseline} |"
    print(header)
    print("|---|" + "---|" * (len(counts) + 1 + (2 if base is not None else 0)))

    def row(name: str, values: list[float], before: float | None) -> str:
        text = f"| {name} | " + " | ".join(f"{v:.1f}" for v in values) + f" | {values[-1] / values[0]:.2f}x |"
        if base is not None:
            text += f" {before:.1f} | {values[-1] / before:.2f}x |"
        return text

    nan = float("nan")
    for name in measured[first][0]:
        values = [measured[n][0].get(name, nan) for n in counts]
        print(row(name, values, None if base is None else base[0].get(name, nan)))
    totals = [sum(measured[n][0].values()) for n in counts]
    print(row("every pass", totals, None if base is None else sum(base[0].values())))
    print(row("the analyze process (start to exit)", [measured[n][1] for n in counts],
              None if base is None else base[1]))


if __name__ == "__main__":
    main()
