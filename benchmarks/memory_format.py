"""Benchmark: contiguous (NCHW) against channels-last (NHWC) layout for each kind of work, on the CPU (issue 23).

``train.memory_format`` and ``analyze.memory_format`` resolve "auto" to channels-last on the CPU for a model
with 2-D convolutions (never by a timing); this table is the measurement behind that rule and the one the
analysis keeps (losses and gradients in the chosen layout, Hessian-vector products contiguous in every case). Four convolutional models at their seeded initial weights, one thread,
float32, eval mode, seeded Gaussian inputs of each shape: the CNN on digits-shaped 1x8x8 inputs (a
one-channel input: ``channels_last_copy`` writes its strides out), on MNIST-shaped 1x28x28 and on
CIFAR-shaped 3x32x32 inputs, and LeNet-5 on 3x32x32. The work, timed interleaved, minimum over ``--calls``
calls after one warm-up each (``min_seconds``):

- a training step: ``FlatModel.loss_and_grad`` on a batch of 32 in train mode (``training_step``);
- a loss of 512 samples (``Objective.loss``) and its gradient (``Objective.loss_and_grad``);
- a Hessian-vector product through the kept double-backward graph of those 512 samples.

Prints one Markdown table: milliseconds each way and channels-last / contiguous (below 1: channels-last is
faster). Usage:

    .venv/bin/python benchmarks/memory_format.py [--calls 10]
"""

from __future__ import annotations

import argparse

import torch
from hessian_vs_pyhessian import min_seconds  # benchmarks/ is on the path of a script run from it

from landscape.core.flat import FlatModel
from landscape.measure import products
from landscape.measure.analysis_data import AnalysisData
from landscape.measure.objective import Objective
from landscape.models import build_model

SAMPLES, TRAIN_BATCH = 512, 32
CASES = (("cnn", (1, 8, 8)), ("cnn", (1, 28, 28)), ("cnn", (3, 32, 32)), ("lenet5", (3, 32, 32)))
WORK = ("training step (batch 32)", "loss (512 samples)", "gradient (512 samples)", "Hessian-vector product (512)")


def training_step(flat: FlatModel, x: torch.Tensor, y: torch.Tensor):
    """One training step's forward and backward at the module's parameters in train mode (``loss_and_grad``),
    the global RNG restored (dropout's masks)."""
    w = flat.vector()

    def step() -> None:
        with flat.mode(True), torch.random.fork_rng(devices=[]):
            flat.loss_and_grad(w, x, y, {})

    return step


def work_for(flat: FlatModel, objective: Objective, w: torch.Tensor, channels_last: bool) -> dict:
    """Each kind of work as a call in one layout; the product's graph is built (and kept) in that layout."""
    x, y = objective.data.x, objective.data.y
    with flat.layout(channels_last):
        leaves = flat.leaves(w)
        graph = products.batch_gradient(lambda params: objective.batch_loss(params, (x, y)), leaves)
    v = torch.randn(flat.dim, 1, generator=torch.Generator().manual_seed(1))
    step = training_step(flat, x[:TRAIN_BATCH], y[:TRAIN_BATCH])

    def layout(fn):
        def call():
            with flat.layout(channels_last):
                return fn()
        return call

    return dict(zip(WORK, (layout(step), layout(lambda: objective.loss(w)),
                           layout(lambda: objective.loss_and_grad(w)),
                           lambda: products.hvps_through(graph, leaves, v, keep=True))))


def rows(name: str, shape: tuple[int, ...], calls: int) -> list[tuple[str, str, float, float]]:
    torch.manual_seed(0)
    module = build_model(name, shape, 10, {}).eval()
    flat = FlatModel(module)
    w = flat.vector()
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(SAMPLES, *shape, generator=generator)
    y = torch.randint(0, 10, (SAMPLES,), generator=generator)
    objective = Objective(flat, flat.buffers(), AnalysisData(x, y, SAMPLES), "eval")
    paths = {}
    for channels_last in (False, True):
        for work, fn in work_for(flat, objective, w, channels_last).items():
            paths[work, channels_last] = fn
    best = min_seconds(paths, calls)
    label = f"{name} on {'x'.join(map(str, shape))}"
    return [(label, work, best[work, False], best[work, True]) for work in WORK]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=10)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print("| model | work | contiguous ms | channels-last ms | channels-last / contiguous |")
    print("|---|---|---|---|---|")
    for name, shape in CASES:
        for label, work, contiguous, channels_last in rows(name, shape, args.calls):
            print(f"| {label} | {work} | {contiguous * 1e3:.2f} | {channels_last * 1e3:.2f} | "
                  f"{channels_last / contiguous:.2f} |", flush=True)


if __name__ == "__main__":
    main()
