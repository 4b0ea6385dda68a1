"""Benchmark: one client's local work in a training round, through landscape's training path and through a plain
channels-last PyTorch loop doing the same arithmetic (issue 47 item 5).

The demo's training recipe (train/digits-fedavg.toml: digits, the CNN, 20 clients, local_epochs 5 of batch 32,
lr 0.1; 15 local steps for a client of 72 samples) with FedAvg and with FedSAM (rho 0.1): the first client of
round 0 at the seeded initial model, float32, train mode, one thread, the layout the trainer settles on the CPU
(channels-last). Two paths do the same work:

- landscape: ``Trainer.clients.train`` for that one client, as ``Trainer.run_round`` calls it (the client's
  problem: its minibatch order, its buffers; the algorithm's ``client_update``: ``local_sgd`` over
  ``FlatModel.loss_and_grad``, FedSAM's ``sam_direction``);
- plain: the same ``nn.Module`` with its convolution weights in channels-last strides once (``nhwc``) and
  trained in place: per step the minibatch (the same shuffle: one ``randperm`` per epoch from the client's
  seeded generator), ``torch.autograd.grad`` of its cross-entropy, ``w -= lr * g`` by hand (no
  ``torch.optim``); FedSAM: g at w, then the gradient at w + rho g / ||g|| (one global norm), w restored and
  stepped with it.

The final weights of the two are checked to agree (to float32 rounding: the plain loop's norm sums per tensor;
the largest absolute difference is printed) before anything is timed. Timed in process CPU seconds
(``time.process_time``), the two paths interleaved, ``--repeats`` calls each after one warm-up; a path's time is
the median of its calls.

``--baseline COMMIT`` (default b02ec39, before issue 47's work; '' for none) also times landscape's path as it
was at that commit: each side runs in a process of its own (this script with ``--worker``, the package of a git
worktree of the commit on its path for the baseline), each beside its own plain loop, in the order this, that,
that, this (``--pairs`` rounds), so that a machine whose speed drifts weighs on both alike. Prints one Markdown
table. Usage:

    .venv/bin/python benchmarks/train_overhead.py [--repeats 20] [--baseline b02ec39] [--pairs 2]
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "train" / "digits-fedavg.toml"
ALGORITHMS = ("fedavg", "fedsam")


def nhwc(t: Tensor) -> Tensor:
    """A 4-D tensor with channels-last strides (HWC, 1, WC, C), by views and one reshape: also for C = 1, where
    ``contiguous(memory_format=torch.channels_last)`` keeps the NCHW strides and PyTorch then runs NCHW kernels
    (the layout ``landscape.core.memory_format.channels_last_copy`` makes)."""
    n, c, h, w = t.shape
    return t.permute(0, 2, 3, 1).reshape(n, h * w * c).view(n, h, w, c).permute(0, 3, 1, 2)


def shuffled_batches(indices: Tensor, seed: int, batch_size: int, epochs: int, steps: int) -> list[Tensor]:
    """A client's minibatch indices as a plain loop draws them: one ``randperm`` per epoch from a generator seeded
    with ``seed``, split into batches (the last of an epoch shorter); ``steps`` > 0: that many batches."""
    generator = torch.Generator().manual_seed(seed)
    batches: list[Tensor] = []
    while True:
        perm = indices[torch.randperm(len(indices), generator=generator)]
        for chunk in perm.split(batch_size):
            batches.append(chunk)
            if steps and len(batches) == steps:
                return batches
        if not steps and len(batches) == epochs * math.ceil(len(indices) / batch_size):
            return batches


def plain_round(module: nn.Module, x: Tensor, y: Tensor, batches: Callable[[], list[Tensor]], lr: float,
                rho: float | None) -> Tensor:
    """One client's local steps on ``module`` in place (plain SGD, or SAM with radius ``rho``); the mean loss."""
    params = [p for p in module.parameters() if p.requires_grad]
    total = torch.zeros((), dtype=torch.float64)
    steps = 0
    for b in batches():
        xb, yb = x[b], y[b]
        if xb.dim() == 4:
            xb = nhwc(xb)
        loss = F.cross_entropy(module(xb), yb)
        grads = torch.autograd.grad(loss, params)
        if rho is not None:  # SAM: the gradient at w + rho g / ||g||, on the same batch
            norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
            with torch.no_grad():
                saved = [p.clone() for p in params]
                for p, g in zip(params, grads):
                    p.add_(rho * (g / norm))
            grads = torch.autograd.grad(F.cross_entropy(module(xb), yb), params)
            with torch.no_grad():
                for p, w in zip(params, saved):
                    p.copy_(w)
        with torch.no_grad():
            for p, g in zip(params, grads):
                p.sub_(lr * g)
        total += loss.detach().double()
        steps += 1
    return total / max(steps, 1)


@dataclass
class Case:
    """One algorithm's client work both ways: ``landscape()`` and ``plain()`` each train the client from the same
    ``start`` and return its final weights as one flat vector (the layout of landscape's w)."""

    algorithm: str
    steps: int
    batch_size: int
    start: Tensor
    landscape: Callable[[], Tensor]
    plain: Callable[[], Tensor]


def build_case(algorithm: str, overrides: list[tuple[str, object]] = (), run_dir: Path | None = None) -> Case:
    """``algorithm`` on the recipe (with ``overrides``) for round 0's first client (module docstring)."""
    from landscape.config import overrides as recipe_overrides
    from landscape.config.setup import derived_seed
    from landscape.core.flat import FlatModel
    from landscape.store.directory import RunDir
    from landscape.train.schedule import STREAM_CLIENT, learning_rate, sample_clients
    from landscape.train.trainer import Trainer

    recipe = recipe_overrides.build(RECIPE, [("algorithm.name", algorithm), *overrides])
    trainer = Trainer(recipe, RunDir(run_dir or ROOT / "runs" / "train-overhead"))  # nothing is written
    state = trainer.initial_state()
    cfg, flat = trainer.train_cfg, trainer.flat
    if flat.channels_last is not True or trainer.device.type != "cpu":
        raise SystemExit(f"error: the trainer settled {trainer.memory_format}; channels-last on the CPU expected")
    client = sample_clients(recipe.seed, 0, trainer.num_clients, trainer.per_round)[0]
    lr = learning_rate(cfg, 0)
    message = trainer.algorithm.broadcast(state.x, state.server_state, 0)
    flat.module.train()

    def landscape() -> Tensor:
        (result,), _ = trainer.clients.train(state, message, [client], lr)
        return result.model

    module = copy.deepcopy(flat.module)  # its own parameters, at the round's start
    FlatModel(module).load_into_module(state.x, state.buffers)
    start = {name: p.detach().clone() for name, p in module.named_parameters()}
    with torch.no_grad():
        for p in module.parameters():
            if p.dim() == 4:
                p.data = nhwc(p.data).clone()  # conv weights in channels-last strides, once
    seed = derived_seed(recipe.seed, STREAM_CLIENT, 0, client)
    indices = torch.as_tensor(trainer.setup.client_indices[client], dtype=torch.long)
    rho = trainer.algorithm.options.rho if algorithm == "fedsam" else None
    batches = lambda: shuffled_batches(indices, seed, cfg.batch_size, cfg.local_epochs, cfg.local_steps)  # noqa: E731
    parameters = dict(module.named_parameters())

    def plain() -> Tensor:
        with torch.no_grad():
            for name, p in parameters.items():
                p.copy_(start[name])  # the round's start (a copy_ keeps p's channels-last strides)
        plain_round(module, trainer.train_x, trainer.train_y, batches, lr, rho)
        return torch.cat([parameters[n].detach().reshape(-1) for n in flat.names])

    return Case(algorithm, len(batches()), cfg.batch_size, state.x.clone(), landscape, plain)


def agreement(case: Case) -> float:
    """The largest absolute difference of the two paths' final weights; exits when it is above float32
    rounding of weights of this size, or when the client did not move (nothing compared)."""
    ours, theirs = case.landscape(), case.plain()
    difference = (ours - theirs).abs().max().item()
    tolerance = 1e-5 * max(ours.abs().max().item(), 1.0)
    if not difference <= tolerance:
        raise SystemExit(f"error: {case.algorithm}: the plain loop's weights differ from landscape's by "
                         f"{difference:.2e} (tolerance {tolerance:.1e})")
    if not (ours - case.start).abs().max().item() > 10 * tolerance:
        raise SystemExit(f"error: {case.algorithm}: the client's weights did not move: nothing was compared")
    return difference


def cpu_seconds(paths: dict[str, Callable[[], object]], repeats: int) -> dict[str, list[float]]:
    """Process CPU seconds of each path's calls: one warm-up each, then ``repeats`` calls, interleaved."""
    for fn in paths.values():
        fn()
    seconds: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(repeats):
        for name, fn in paths.items():
            started = time.process_time()
            fn()
            seconds[name].append(time.process_time() - started)
    return seconds


def worker(repeats: int) -> dict:
    """Each algorithm's case checked and timed in this process (the package on its path): JSON-ready."""
    import landscape

    torch.set_num_threads(1)
    out: dict = {"package": str(Path(landscape.__file__).resolve().parent)}
    with tempfile.TemporaryDirectory(prefix="train-overhead-") as folder:
        for algorithm in ALGORITHMS:
            case = build_case(algorithm, run_dir=Path(folder) / algorithm)
            difference = agreement(case)
            seconds = cpu_seconds({"landscape": case.landscape, "plain": case.plain}, repeats)
            out[algorithm] = {"steps": case.steps, "batch": case.batch_size, "difference": difference, **seconds}
    return out


def run_worker(repeats: int, package_root: Path) -> dict:
    """``worker`` in a new process that imports the package under ``package_root`` (this checkout or a
    worktree), run from this checkout (its recipes and data)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(package_root), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, __file__, "--worker", "--repeats", str(repeats)], cwd=ROOT, env=env,
                          check=True, stdout=subprocess.PIPE, text=True)
    record = json.loads(done.stdout)
    if Path(record["package"]) != (package_root / "landscape").resolve():
        raise SystemExit(f"error: the worker imported {record['package']}, not {package_root / 'landscape'}")
    return record


def merged(records: list[dict]) -> dict:
    """Each algorithm's calls of ``records`` (workers of one package) together; the largest difference."""
    out = {}
    for algorithm in ALGORITHMS:
        rows = [r[algorithm] for r in records]
        out[algorithm] = {"steps": rows[0]["steps"], "batch": rows[0]["batch"],
                          "difference": max(r["difference"] for r in rows),
                          "landscape": [s for r in rows for s in r["landscape"]],
                          "plain": [s for r in rows for s in r["plain"]]}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20, help="timed calls of each path per process")
    parser.add_argument("--baseline", default="b02ec39", help="a commit whose landscape path is timed too ('' none)")
    parser.add_argument("--pairs", type=int, default=2, help="rounds of this, that, that, this (with --baseline)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)  # run_worker's process
    args = parser.parse_args()
    if args.repeats < 1 or args.pairs < 1:
        parser.error(f"--repeats and --pairs must be at least 1 (got {args.repeats}, {args.pairs})")
    if args.worker:
        print(json.dumps(worker(args.repeats)))
        return
    ours: list[dict] = []
    theirs: list[dict] = []
    if args.baseline:
        from publish import worktree  # this folder's tool (run as a script: benchmarks/ is on the path)

        with worktree(args.baseline) as tree:
            for _ in range(args.pairs):
                ours.append(run_worker(args.repeats, ROOT))
                theirs += [run_worker(args.repeats, tree), run_worker(args.repeats, tree)]
                ours.append(run_worker(args.repeats, ROOT))
    else:
        ours.append(run_worker(args.repeats, ROOT))
    now, before = merged(ours), merged(theirs) if theirs else None
    median = statistics.median
    calls = len(now["fedavg"]["plain"])
    print(f"One client's local work in round 0 of train/digits-fedavg.toml (digits, the CNN, channels-last, "
          f"float32, 1 thread): process CPU ms, the median of {calls} interleaved calls of each path"
          + (f" (processes alternating with {args.baseline}'s, each path beside its own plain loop)"
             if before else "") + "; max |dw|: the largest difference of the final weights, landscape's and the "
          "plain loop's:\n")
    head = "| algorithm | steps x batch | plain channels-last loop ms | landscape ms | landscape / plain |"
    if before:
        head += f" plain ms ({args.baseline}) | landscape ms at {args.baseline} | landscape / plain at " \
                f"{args.baseline} |"
    print(head + " max abs dw |")
    print("|---|---|---|---|---|" + ("---|---|---|" if before else "") + "---|")
    for algorithm in ALGORITHMS:
        row = now[algorithm]
        plain, ours_ms = median(row["plain"]) * 1e3, median(row["landscape"]) * 1e3
        text = (f"| {algorithm} | {row['steps']} x {row['batch']} | {plain:.1f} | {ours_ms:.1f} | "
                f"{ours_ms / plain:.2f}x |")
        difference = row["difference"]
        if before:
            base = before[algorithm]
            base_plain, base_ms = median(base["plain"]) * 1e3, median(base["landscape"]) * 1e3
            text += f" {base_plain:.1f} | {base_ms:.1f} | {base_ms / base_plain:.2f}x |"
            difference = max(difference, base["difference"])
        print(f"{text} {difference:.1e} |", flush=True)


if __name__ == "__main__":
    main()
