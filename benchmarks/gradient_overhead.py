"""Benchmark: landscape's gradient and Hessian-vector product against a plain ``nn.Module`` gradient (issue 23).

Two models at their seeded initial weights on the digits training set (1,437 samples of 1x8x8, analysis
batches of 512, eval mode, float32, one thread): the 657,910-parameter MLP of ``lanczos_overhead.py`` (hidden
[774, 774]) and the digits CNN (``build_model("cnn", ...)``, as in ``hessian_vs_pyhessian.py``). Timed,
interleaved, minimum over ``--calls`` calls after one warm-up each (``min_seconds``):

- one batch of 512: the plain gradient (``torch.autograd.grad`` of the module's cross-entropy over
  ``module.parameters()``), training's ``FlatModel.loss_and_grad`` (per-parameter leaves, the gradient added
  in place into one flat tensor) and, for comparison, the flat-vector formulation it replaced (views of one
  w that requires grad: a split in the forward, a cat in its backward);
- the whole set: the plain gradient summed over the batches, analysis's ``Objective.loss_and_grad``, and one
  Hessian-vector product through the kept gradient graphs (``HessianOperator``, double-backward), with the
  product as it was before issue 23 for comparison (the flat-vector formulation, PyTorch's own derivatives of
  convolutions, ReLU and max-pools); the operator's product is checked to equal the flat-vector one in graphs
  built alike (``landscape.measure.gradient_graphs``);
- one small client's data (the first ``CLIENT`` samples: 1,437 over 100 clients), where the fixed cost of a
  call weighs most (a sharpness ascent on a client is thousands of such calls): the plain loss (the module's
  cross-entropy under ``torch.no_grad``) against ``Objective.loss``, and the plain gradient against
  ``Objective.loss_and_grad``; each timed call runs ``CLIENT_CALLS`` of them and the table gives one.

Prints one Markdown table: each row's ratio to the plain row of its scope (the first of the scope, the same data
and the same quantity).

A second table (issue 47: the per-call costs of the analysis and of the function API, before and after, in one
process) takes the digits CNN in channels-last layout, the layout the CLI analyses it in on the CPU, against
plain PyTorch in that layout (the module's 4-D weights and the inputs with channels-last strides): "before" is
the model as it was analysed (resting in training mode, so each evaluation switched every module's flag to eval
and back; the convolution weights copied to channels-last at every forward; the API's model contiguous), "after"
as it is now (the flags set once where the model is made; a weight's copy reused while w is unchanged; the API
laid out as the CLI). Rows: a client of ``CLIENT`` samples, its F and its gradient (``CLIENT_CALLS`` per timed
call) and one S_rho ascent (``functions.sharpness``: 8 starts of at most 50 steps, what the sharpness pass runs
per client); the whole set through ``landscape.problem``, F and its gradient. Each ratio to the plain row of its
scope (the ascent's: to before). Usage:

    .venv/bin/python benchmarks/gradient_overhead.py [--calls 20] [--models mlp,cnn]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
from pathlib import Path

import torch
import torch.nn.functional as F
from hessian_vs_pyhessian import min_seconds  # benchmarks/ is on the path of a script run from it
from torch import nn

import landscape
from landscape.core.flat import FlatModel
from landscape.core.memory_format import channels_last_copy
from landscape.data.datasets import load_dataset
from landscape.measure import functions
from landscape.measure.analysis_data import AnalysisData
from landscape.measure.gradient_graphs import product_gradient_graphs
from landscape.measure.objective import Objective
from landscape.measure.operator import HessianOperator
from landscape.models import build_model

BATCH = 512
CLIENT = 14  # samples of a small client (digits at 100 clients)
CLIENT_CALLS = 20  # evaluations per timed call of a client row (one alone is too short to time)
MODELS = {"mlp": ("mlp", {"hidden": [774, 774]}), "cnn": ("cnn", {})}


def plain_gradient(module: nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]], n: int) -> list[torch.Tensor]:
    """The gradient of the size-weighted mean cross-entropy as plain PyTorch writes it: per-parameter
    gradients of each batch's summed loss / n, added up over the batches."""
    params = list(module.parameters())
    total = None
    for xb, yb in batches:
        grads = torch.autograd.grad(F.cross_entropy(module(xb), yb, reduction="sum") / n, params)
        total = list(grads) if total is None else [t + g for t, g in zip(total, grads)]
    return total


def flat_vector_gradient(flat: FlatModel, w: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The gradient as ``FlatModel.loss_and_grad`` computed it before issue 23: through views of one w."""
    u = w.detach().requires_grad_(True)
    (grad,) = torch.autograd.grad(F.cross_entropy(flat.logits(u, x, {}), y), u)
    return grad


def flat_vector_product(flat: FlatModel, w: torch.Tensor, data: AnalysisData, our_graphs: bool = False):
    """A kept-graph product as the operator computed it before issue 23: gradients of f_b with respect to one
    flat w (a cat in the graph), back-propagated into w (another cat), through PyTorch's own derivatives;
    ``our_graphs``: in ``product_gradient_graphs`` instead, as the operator now does (the same numbers as
    the operator's: what the per-parameter leaves change is the layout of the graph, not its arithmetic)."""
    u = w.detach().clone().requires_grad_(True)
    graphs = []
    for xb, yb in data.batches():
        with product_gradient_graphs() if our_graphs else contextlib.nullcontext():
            (grad,) = torch.autograd.grad(F.cross_entropy(flat.logits(u, xb, {}), yb), u, create_graph=True)
        graphs.append((len(yb) / len(data), grad))

    def product(v: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(v)
        for weight, grad in graphs:
            out += weight * torch.autograd.grad(grad, u, grad_outputs=v, retain_graph=True)[0]
        return out

    return product


def plain_loss(module: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The mean cross-entropy as plain PyTorch evaluates it, without a graph."""
    with torch.no_grad():
        return F.cross_entropy(module(x), y)


def repeated(fn, count: int):
    """``fn`` called ``count`` times in one call."""
    def run() -> None:
        for _ in range(count):
            fn()
    return run


def rows_for(name: str, x: torch.Tensor, y: torch.Tensor, calls: int) -> list[tuple[str, str, float, float]]:
    """(model, path, seconds of one call, ratio to the plain row of its scope) for one model."""
    kind, options = MODELS[name]
    torch.manual_seed(0)
    module = build_model(kind, (1, 8, 8), 10, options).eval()
    flat = FlatModel(module)
    w = flat.vector()
    data = AnalysisData(x, y, BATCH)
    objective = Objective(flat, flat.buffers(), data, "eval")
    xc, yc = x[:CLIENT], y[:CLIENT]
    client = objective.with_data(AnalysisData(xc, yc, BATCH))
    batches = list(data.batches())
    xb, yb = batches[0]
    kept = HessianOperator(objective, w, "double-backward", keep_graph=True)
    before = flat_vector_product(flat, w, data)
    v = torch.randn(flat.dim, generator=torch.Generator().manual_seed(1))
    ours, theirs = kept @ v, flat_vector_product(flat, w, data, our_graphs=True)(v)
    if not torch.equal(ours, theirs):
        raise SystemExit(f"{name}: the product differs from the flat-vector one by {(ours - theirs).abs().max():.1e}")
    paths = {
        "batch: plain gradient": lambda: plain_gradient(module, [(xb, yb)], len(yb)),
        "batch: FlatModel.loss_and_grad": lambda: flat.loss_and_grad(w, xb, yb, {}),
        "batch: flat-vector gradient (before)": lambda: flat_vector_gradient(flat, w, xb, yb),
        "set: plain gradient": lambda: plain_gradient(module, batches, len(data)),
        "set: Objective.loss_and_grad": lambda: objective.loss_and_grad(w),
        "set: HVP through the kept graphs": lambda: kept @ v,
        "set: HVP through kept flat-vector graphs, PyTorch's own derivatives (before)": lambda: before(v),
        f"client of {CLIENT}, F: plain loss": repeated(lambda: plain_loss(module, xc, yc), CLIENT_CALLS),
        f"client of {CLIENT}, F: Objective.loss": repeated(lambda: client.loss(w), CLIENT_CALLS),
        f"client of {CLIENT}, gradient: plain gradient": repeated(lambda: plain_gradient(module, [(xc, yc)], CLIENT),
                                                              CLIENT_CALLS),
        f"client of {CLIENT}, gradient: Objective.loss_and_grad": repeated(lambda: client.loss_and_grad(w),
                                                                       CLIENT_CALLS),
    }
    best = min_seconds(paths, calls)
    label = f"{name} ({flat.dim:,} parameters)"
    out = []
    plain: dict[str, float] = {}  # scope -> its first row's seconds
    for path, seconds in best.items():
        if path.startswith("client"):
            seconds /= CLIENT_CALLS
        scope = path.split(":")[0]
        plain.setdefault(scope, seconds)
        out.append((label, path, seconds, seconds / plain[scope]))
    return out


def channels_last_module(module: nn.Module) -> nn.Module:
    """``module`` with every 4-D weight in channels-last strides (``channels_last_copy``: a one-channel first
    convolution's too), in place: plain PyTorch in the layout the CLI analyses a CNN in on the CPU."""
    with torch.no_grad():
        for p in module.parameters():
            if p.dim() == 4:
                p.data = channels_last_copy(p.data)
    return module


def before_issue_47(p: landscape.Problem, api: bool = False) -> landscape.Problem:
    """A problem over a copy of ``p``'s model analysed as before issue 47: the model resting in training mode
    (every evaluation switched the flags), the channels-last weights copied at every forward (``api``: no
    layout at all, as the API analysed); the same data, BN mode and w."""
    module = copy.deepcopy(p.flat.module).train()
    flat = FlatModel(module)
    flat.channels_last = p.flat.channels_last and not api
    flat._reuse_layout_copies = False  # noqa: SLF001 - the code path before the copies were reused
    o = p.objective
    return landscape.Problem(Objective(flat, flat.buffers(), o.data, o.bn_mode), p.w)


def plain_set_loss(module: nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """The mean cross-entropy over ``batches`` as plain PyTorch evaluates it, without a graph."""
    with torch.no_grad():
        return sum(F.cross_entropy(module(xb), yb, reduction="sum") for xb, yb in batches) / sum(len(yb) for _, yb
                                                                                                in batches)


def ascent(p: landscape.Problem):
    """S_rho at 0.05 as the sharpness pass runs it on a client (its defaults: 8 starts of at most 50 steps)."""
    return functions.sharpness(p, [0.05], steps=50, tol=1e-3, starts=8, adaptive=False, eta=0.01, seed=0)


def issue_47_rows(x: torch.Tensor, y: torch.Tensor, calls: int) -> list[tuple[str, str, float, float]]:
    """(scope, path, seconds of one call, ratio to the plain row of its scope): the second table."""
    torch.manual_seed(0)
    module = build_model("cnn", (1, 8, 8), 10, {}).eval()
    plain = channels_last_module(copy.deepcopy(module))
    xs, xc, yc = channels_last_copy(x), channels_last_copy(x[:CLIENT]), y[:CLIENT]
    client, whole = landscape.problem(module, (x[:CLIENT], yc)), landscape.problem(module, (x, y))
    assert client.flat.channels_last and whole.flat.channels_last and not client.flat.module.training
    old_client, old_whole = before_issue_47(client), before_issue_47(whole, api=True)
    for new, old in ((client, old_client), (whole, before_issue_47(whole))):  # the same numbers in one layout
        a, b = new.objective.loss_and_grad(new.w), old.objective.loss_and_grad(old.w)
        if not (torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])):
            raise SystemExit("issue 47: F or its gradient differs from the one before")
    sharp = ascent(client).sharpness, ascent(old_client).sharpness
    if sharp[0].tolist() != sharp[1].tolist():
        raise SystemExit("issue 47: S_rho differs from the one before")
    n = CLIENT_CALLS
    batches = [(xs[i:i + BATCH], y[i:i + BATCH]) for i in range(0, len(y), BATCH)]  # F's batches, as the API's
    paths = {
        f"client of {CLIENT}, F: plain loss, channels-last": repeated(lambda: plain_loss(plain, xc, yc), n),
        f"client of {CLIENT}, F: Objective.loss before": repeated(lambda: old_client.objective.loss(client.w), n),
        f"client of {CLIENT}, F: Objective.loss after": repeated(lambda: client.objective.loss(client.w), n),
        f"client of {CLIENT}, gradient: plain gradient, channels-last": repeated(
            lambda: plain_gradient(plain, [(xc, yc)], CLIENT), n),
        f"client of {CLIENT}, gradient: Objective.loss_and_grad before": repeated(
            lambda: old_client.objective.loss_and_grad(client.w), n),
        f"client of {CLIENT}, gradient: Objective.loss_and_grad after": repeated(
            lambda: client.objective.loss_and_grad(client.w), n),
        f"client of {CLIENT}, S_rho ascent: before": lambda: ascent(old_client),
        f"client of {CLIENT}, S_rho ascent: after": lambda: ascent(client),
        f"set of {len(y):,}, F: plain loss, channels-last": lambda: plain_set_loss(plain, batches),
        f"set of {len(y):,}, F: API before (contiguous)": lambda: old_whole.objective.loss(whole.w),
        f"set of {len(y):,}, F: API after (channels-last, as the CLI)": lambda: whole.objective.loss(whole.w),
        f"set of {len(y):,}, gradient: plain gradient, channels-last": lambda: plain_gradient(plain, batches, len(y)),
        f"set of {len(y):,}, gradient: API before (contiguous)": lambda: old_whole.objective.loss_and_grad(whole.w),
        f"set of {len(y):,}, gradient: API after (channels-last, as the CLI)": lambda: whole.objective.loss_and_grad(
            whole.w),
    }
    best = min_seconds(paths, calls)
    out, first = [], {}
    for path, seconds in best.items():
        seconds /= n if path.startswith("client") and "S_rho" not in path else 1
        scope = path.split(":")[0]
        first.setdefault(scope, seconds)
        out.append((scope, path.split(": ", 1)[1], seconds, seconds / first[scope]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--models", default="mlp,cnn")
    parser.add_argument("--root", type=Path, default=Path("data"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    bundle = load_dataset("digits", root=args.root, download=False, augment=False, num_clients=1, seed=0,
                          options={})
    x, y = bundle.train.x, bundle.train.y
    print(f"| model | path ({len(y):,} samples; batch: the first {BATCH}; client: the first {CLIENT}) | ms | "
          "x plain |")
    print("|---|---|---|---|")
    for name in [m for m in args.models.split(",") if m]:
        for label, path, seconds, ratio in rows_for(name, x, y, args.calls):
            print(f"| {label} | {path} | {seconds * 1e3:.{2 if seconds >= 0.01 else 3}f} | {ratio:.2f}x |", flush=True)
    if "cnn" in args.models.split(","):
        print(f"Issue 47, the digits CNN in channels-last layout, before and after (ms of one call; a client's F "
              f"and gradient timed {CLIENT_CALLS} calls at a time; the S_rho ascent's ratio is to before):\n")
        print("| scope | path | ms | x plain |")
        print("|---|---|---|---|")
        for scope, path, seconds, ratio in issue_47_rows(x, y, args.calls):
            print(f"| {scope} | {path} | {seconds * 1e3:.{2 if seconds >= 0.01 else 3}f} | {ratio:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
