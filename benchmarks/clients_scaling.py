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
the package as it was at that commit (a git worktree of it, run from there), in the same process: the
100-client analyses of this code and of that one alternate, this, that, that, this (``--pairs`` such rounds),
and each side's seconds are the mean of its analyses, so that a machine whose speed drifts during the
benchmark (a shared host) weighs on both alike; "now / COMMIT" is this code's seconds over that code's for
the same work.

What the arithmetic costs: before the timed analyses, a separate process (``--count-flops RUN``) runs the last
count's analysis once more, slowed by counting and so not timed, and counts each pass's floating-point
operations (``FlopCount``): those of the matrix products and convolutions, forward and backward, 2 per
multiply-add (what ``torch.utils.flop_counter`` has formulas for; activations, pooling and the losses are not
counted; the first pass's include the layout's start-up timing, as its seconds do). Then it times F over the
whole data, its gradient and a Hessian-vector product at the checkpoint (medians of ``RATE_REPEATS``, in the
analysis' layouts). Each pass's GFLOP over its timed seconds is the rate at which it ran: beside those three
rates it says how far a pass is from the arithmetic of full-data batches, and the last line says the rate that
half of the baseline's time would need. Usage:

    .venv/bin/python benchmarks/clients_scaling.py [--clients 20,100] [--baseline 3eee690] [--pairs 1]
        [--out runs/publish-clients]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

RATE_REPEATS = 15  # timed losses, gradients and products of the rates (after one of each untimed)

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


class FlopCount(TorchDispatchMode):
    """The floating-point operations of the matrix products and convolutions run under it (``gflop``), forward
    and backward, by the formulas of ``torch.utils.flop_counter``. Not its ``FlopCounterMode``: that one's
    module tracking holds every forward graph that is dropped without a backward pass (a sharpness ascent's
    rejected trials), and the counted analysis grew to gigabytes."""

    def __init__(self) -> None:
        super().__init__()
        self.flops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        formula = flop_registry.get(func._overloadpacket)
        if formula is not None:
            self.flops += formula(*args, **kwargs, out_val=out)
        return out

    @property
    def gflop(self) -> float:
        return self.flops / 1e9


def _names_runs(cwd: Path | None) -> bool:
    """Whether the package in ``cwd`` names a single run with ``--name`` (--out its folder); an older one (a
    baseline commit) takes the run directory itself as ``--out``."""
    shown = subprocess.run([sys.executable, "-m", "landscape", "train", "--help"], check=True, capture_output=True,
                           text=True, cwd=cwd)
    return "--name" in shown.stdout


def train(run: Path, clients: int, cwd: Path | None = None) -> None:
    """Train ``run`` with ``clients`` clients unless it is there (by the package in ``cwd``)."""
    if not (run / "metrics.jsonl").is_file():
        where = ["--out", str(run.parent), "--name", run.name] if _names_runs(cwd) else ["--out", str(run)]
        subprocess.run([sys.executable, "-m", "landscape", *TRAIN, "--clients", str(clients), *where, "--overwrite"],
                       check=True, stdout=subprocess.DEVNULL, cwd=cwd)


def count_flops(run: Path) -> dict[str, dict[str, float]]:
    """``flops_and_rates`` of ``run`` in a process of its own (this script with ``--count-flops``)."""
    done = subprocess.run([sys.executable, __file__, "--count-flops", str(run)], check=True, stdout=subprocess.PIPE,
                          text=True)
    return json.loads(done.stdout)


def flops_and_rates(run: Path) -> dict[str, dict[str, float]]:
    """{"flops": GFLOP of each default pass at ``run``'s last checkpoint, "rates": GFLOP/s of a full-data loss
    and gradient of F and of a Hessian-vector product there} (module docstring), one thread."""
    from landscape.analyze import scheduler
    from landscape.analyze.context import CheckpointContext
    from landscape.analyze.settings import AnalysisSettings
    from landscape.analyze.source import find_sources
    from landscape.cli import main as landscape_main
    from landscape.measure.operator import HessianOperator

    torch.set_num_threads(1)
    flops: dict[str, float] = {}
    run_job = scheduler._run_job  # every job of the analysis passes through it: each pass counted alone

    def counted(job, *args, **kwargs):
        with FlopCount() as counter:
            result = run_job(job, *args, **kwargs)
        flops[job.name] = counter.gflop
        return result

    scheduler._run_job = counted
    sys.argv = ["landscape", "analyze", str(run), "--force", "--quiet"]
    try:
        landscape_main()
    except SystemExit as e:
        if e.code:
            raise

    sources, _ = find_sources(run)
    ctx = CheckpointContext(sources[0], max(sources[0].checkpoints), AnalysisSettings())
    objective, w = ctx.objective, ctx.w  # the layout the analysis settles (contiguous products in any case)
    operator = HessianOperator(objective, w, "auto")
    v = torch.randn(w.shape, generator=torch.Generator().manual_seed(0), dtype=w.dtype)
    rates = {}
    for name, work in (("loss", lambda: objective.loss(w)), ("gradient", lambda: objective.loss_and_grad(w)),
                       ("product", lambda: operator.matvec(v))):
        work()
        with FlopCount() as counter:
            work()
        seconds = []
        for _ in range(RATE_REPEATS):
            started = time.perf_counter()
            work()
            seconds.append(time.perf_counter() - started)
        rates[name] = counter.gflop / statistics.median(seconds)
    return {"rates": rates, "flops": flops}


def mean_of(analyses: list[tuple[dict[str, float], float]]) -> tuple[dict[str, float], float]:
    """Each pass's mean seconds over ``analyses`` (``analyse``'s results of the same run), and the process's."""
    passes = analyses[0][0]
    return ({name: statistics.fmean(a[0][name] for a in analyses) for name in passes},
            statistics.fmean(a[1] for a in analyses))


def alternating(run: Path, base_run: Path, tree: Path, pairs: int) -> tuple[tuple, tuple]:
    """(this code's, the worktree's) mean ``analyse`` of ``run`` and of ``base_run``, in the order this, that,
    that, this for each of ``pairs`` rounds."""
    ours: list = []
    theirs: list = []
    for _ in range(pairs):
        ours.append(analyse(run))
        theirs.append(analyse(base_run, cwd=tree))
        theirs.append(analyse(base_run, cwd=tree))
        ours.append(analyse(run))
    return mean_of(ours), mean_of(theirs)


def timings(out: Path, counts: list[int], baseline: str, pairs: int) -> tuple[dict[int, tuple], tuple | None]:
    """({count: ``analyse`` of its run}, the baseline's ``analyse`` of the last count's run or None): with a
    baseline, the last count's analyses alternate with the baseline's (``alternating``)."""
    if not baseline:
        return {n: analyse(out / f"clients{n}") for n in counts}, None
    last = counts[-1]
    base_run = (out / f"baseline-clients{last}").resolve()
    from publish import worktree  # this folder's tool (run as a script: benchmarks/ is on the path)

    with worktree(baseline) as tree:
        train(base_run, last, cwd=tree)
        measured = {n: analyse(out / f"clients{n}") for n in counts[:-1]}
        measured[last], base = alternating(out / f"clients{last}", base_run, tree, pairs)
    return measured, base


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", default="20,100")
    parser.add_argument("--baseline", default="3eee690", help="a commit to compare the last count with ('' for none)")
    parser.add_argument("--pairs", type=int, default=1, help="rounds of this, that, that, this (with --baseline)")
    parser.add_argument("--out", type=Path, default=Path("runs/publish-clients"))
    parser.add_argument("--count-flops", type=Path, metavar="RUN", help=argparse.SUPPRESS)  # count_flops' process
    args = parser.parse_args()
    if args.pairs < 1:
        parser.error(f"--pairs must be at least 1 (got {args.pairs})")
    if args.count_flops is not None:
        with contextlib.redirect_stdout(sys.stderr):  # the analysis' own printing: standard output is the JSON
            record = flops_and_rates(args.count_flops)
        print(json.dumps(record))
        return
    counts = [int(n) for n in args.clients.split(",")]
    first, last = counts[0], counts[-1]
    for n in counts:
        train(args.out / f"clients{n}", n)
    arithmetic = count_flops(args.out / f"clients{last}")
    measured, base = timings(args.out, counts, args.baseline, args.pairs)
    alternated = (f" (at {last} clients the mean of {2 * args.pairs} analyses, alternating with "
                  f"{args.baseline}'s)") if base is not None else ""
    print(f"FedAvg on digits, 10 rounds, every default pass at round 10, seconds per pass{alternated} (1 thread); "
          f"GFLOP: the pass's matrix products and convolutions at {last} clients, and the rate at which it ran "
          "them:\n")
    header = "| pass | " + " | ".join(f"{n} clients" for n in counts) + f" | {last} / {first} |"
    if base is not None:
        header += f" {last} clients at {args.baseline} | now / {args.baseline} |"
    header += f" GFLOP at {last} | GFLOP/s at {last} |"
    print(header)
    print("|---|" + "---|" * (len(counts) + 3 + (2 if base is not None else 0)))

    def row(name: str, values: list[float], before: float | None, gflop: float | None) -> str:
        text = f"| {name} | " + " | ".join(f"{v:.1f}" for v in values) + f" | {values[-1] / values[0]:.2f}x |"
        if base is not None:
            text += f" {before:.1f} | {values[-1] / before:.2f}x |"
        if gflop is None:
            return text + " | |"
        rate = f"{gflop / values[-1]:.1f}" if gflop >= 0.05 else "-"  # no arithmetic to speak of: no rate
        return text + f" {gflop:.1f} | {rate} |"

    nan = float("nan")
    flops = arithmetic["flops"]
    for name in measured[first][0]:
        values = [measured[n][0].get(name, nan) for n in counts]
        print(row(name, values, None if base is None else base[0].get(name, nan), flops.get(name, nan)))
    totals = [sum(measured[n][0].values()) for n in counts]
    total_gflop = sum(flops.get(name, nan) for name in measured[last][0])
    print(row("every pass", totals, None if base is None else sum(base[0].values()), total_gflop))
    print(row("the analyze process (start to exit)", [measured[n][1] for n in counts],
              None if base is None else base[1], None))
    rates = arithmetic["rates"]
    print(f"\nAt the {last}-client checkpoint F over the whole data ran at {rates['loss']:.1f} GFLOP/s, its gradient "
          f"at {rates['gradient']:.1f} GFLOP/s and a Hessian-vector product at {rates['product']:.1f} GFLOP/s "
          f"(medians of {RATE_REPEATS}).", end="")
    if base is not None:
        half = sum(base[0].values()) / 2
        print(f" Every pass at {last} clients in half of {args.baseline}'s time ({half:.1f} s) would run at "
              f"{total_gflop / half:.1f} GFLOP/s.")
    else:
        print()


if __name__ == "__main__":
    main()
