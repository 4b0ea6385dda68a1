"""The per-checkpoint gradient cache (``landscape.measure.gradient_cache``): every pass that reads it gives the
numbers it gives without it (bit for bit on the CPU: a cached value is the same call made once), the
quantities several passes need are computed once per checkpoint, the cached gradient is the gradient (against
a plain nn.Module loop), and misuse (another point, a negative budget) is a one-line error."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from landscape.analyze.catalog import load_passes, pass_options
from landscape.analyze.context import CheckpointContext
from landscape.analyze.settings import AnalysisSettings
from landscape.analyze.source import find_sources
from landscape.core.errors import LandscapeError
from landscape.measure import sharpness
from landscape.measure.alignment import gradient_alignment, minibatch_alignment
from landscape.measure.flatness import client_minibatch_gradients, flatness_incompatibility
from landscape.measure.gradient_cache import GradientCache, full_gradient
from landscape.measure.sharpness import local_sharpness, sharpness_profile

SETTINGS = AnalysisSettings(device="cpu", analysis_samples=200)
# The per-client passes in the order the scheduler runs them, with options small enough for a test
PASSES = (("alignment", {"batches": 3}), ("incompatibility", {"batches": 3}),
          ("sharpness", {"rhos": [0.02, 0.05], "steps": 4, "starts": 2, "local_rho": 0.05}),
          ("hessian", {"top_k": 2, "trace_hvps": 6, "density_runs": 1, "density_steps": 4}))


def _context(run) -> CheckpointContext:
    (source,), _ = find_sources(run)
    return CheckpointContext(source, 6, SETTINGS)


def _assert_equal(a, b, where: str = "") -> None:
    """Equal bit for bit: dicts key by key, arrays with NaN where NaN, floats exactly (NaN equal to NaN)."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype, where
        a, b = a.detach().cpu().numpy(), b.detach().cpu().numpy()
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for k in a:
            _assert_equal(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (np.ndarray, list, tuple)):
        assert np.array_equal(np.asarray(a), np.asarray(b), equal_nan=np.asarray(a).dtype.kind == "f"), where
    elif isinstance(a, float):
        assert a == b or (np.isnan(a) and np.isnan(b)), where
    else:
        assert a == b, where


def _run_passes(ctx: CheckpointContext) -> dict:
    passes = load_passes()
    outputs = {}
    for name, options in PASSES:
        out = passes.get(name).factory(ctx, pass_options(name, options))
        outputs[name] = {"scalars": out.scalars, "arrays": out.arrays, "summary": out.summary}
    return outputs


@pytest.mark.parametrize("budget", [None, 0])
def test_every_pass_gives_its_numbers_with_and_without_the_cache(six_round_run, budget):
    """The passes of one checkpoint share one cache (the default budget, or 0: only values without tensors,
    the ascents, are kept); the same passes on a context without one (every function computing directly, as
    the notebook API calls them) give identical results."""
    shared = _context(six_round_run)
    if budget is not None:
        shared.__dict__["gradients"] = GradientCache(shared.w, budget=budget)  # the cached_property's slot
    with_cache = _run_passes(shared)
    assert shared.gradients.hits > 0 and (shared.gradients.kept_bytes > 0) == (budget is None)
    uncached = _context(six_round_run)
    uncached.__dict__["gradients"] = None
    _assert_equal(with_cache, _run_passes(uncached))


def test_functions_give_their_numbers_with_and_without_the_cache(six_round_run):
    """The measuring functions called without ``gradients`` (the notebook API) and with one cache passed to
    them all, in the passes' order: identical results."""
    ctx = _context(six_round_run)
    clients = {i: ctx.client_objective(i) for i in ctx.sample_clients(0)}
    w, glob = ctx.w, ctx.objective
    draws = {"batch_size": 4, "batches": 3, "seed": 5}
    ascent = {"steps": 4, "tol": 1e-3, "starts": 2, "seed": 5}

    def measure(gradients):
        return (gradient_alignment(glob, clients, w, gradients=gradients),
                minibatch_alignment(clients, w, **draws, gradients=gradients),
                flatness_incompatibility(glob, clients, w, 0.05, **draws, gradients=gradients),
                sharpness_profile(glob, w, [0.02, 0.05], **ascent, gradients=gradients),
                local_sharpness(clients, glob, w, 0.05, **ascent, gradients=gradients))

    cache = GradientCache(w)
    for cached, plain in zip(measure(cache), measure(None)):
        _assert_equal(vars(cached), vars(plain), type(plain).__name__)
    # grad F once, each grad F_i once, each client's draws once, the start directions once, the global ascents
    # at 0.02 and 0.05 once, each client's ascent once
    assert cache.misses == 1 + len(clients) + len(clients) + 1 + 2 + len(clients) * 1
    assert cache.hits > 0


def test_each_shared_quantity_is_computed_once_per_checkpoint(six_round_run, monkeypatch):
    """Across alignment, incompatibility and sharpness: grad F at x and each grad F_i at x once, each
    client's minibatch gradients once (counted where the objectives compute them), the ascents' start
    directions once for both profiles and every client."""
    ctx = _context(six_round_run)
    calls: dict[str, int] = {}
    draw = sharpness.unit_directions

    def directions(*args):
        calls["directions"] = calls.get("directions", 0) + 1
        return draw(*args)

    monkeypatch.setattr(sharpness, "unit_directions", directions)

    def counted(name, method):
        def wrapper(v, *args, **kwargs):
            if torch.equal(v, ctx.w):
                calls[name] = calls.get(name, 0) + 1
            return method(v, *args, **kwargs)
        return wrapper

    objectives = {"global": ctx.objective, **{f"client {i}": ctx.client_objective(i) for i in range(ctx.num_clients)}}
    for name, objective in objectives.items():
        objective.loss_and_grad = counted(name, objective.loss_and_grad)
        objective.batch_loss_and_grad = counted(f"{name} minibatch", objective.batch_loss_and_grad)
    passes = load_passes()
    for name, options in PASSES[:3]:
        passes.get(name).factory(ctx, pass_options(name, options))
    assert calls["global"] == 1 and calls["directions"] == 1
    for i in range(ctx.num_clients):
        assert calls[f"client {i}"] == 1
        assert calls[f"client {i} minibatch"] == 3  # the 3 draws, for alignment and incompatibility together


def test_the_cached_gradient_is_the_gradient_of_a_plain_loop(six_round_run):
    """grad F_i from the cache against a plain nn.Module forward and backward over client 0's data."""
    ctx = _context(six_round_run)
    objective = ctx.client_objective(0)
    loss, grad = full_gradient(objective, ctx.w, ctx.gradients)
    module = ctx.flat.module
    with torch.no_grad():
        torch.nn.utils.vector_to_parameters(ctx.w, [p for p in module.parameters() if p.requires_grad])
    module.zero_grad()
    reference = F.cross_entropy(module(objective.data.x), objective.data.y)
    reference.backward()
    expected = torch.cat([p.grad.reshape(-1) for p in module.parameters() if p.requires_grad])
    assert float(loss) == pytest.approx(float(reference.detach()), rel=1e-6)
    torch.testing.assert_close(grad, expected, rtol=1e-5, atol=1e-7)
    assert full_gradient(objective, ctx.w, ctx.gradients)[1] is grad  # the second request is the cached tensor


def test_a_value_over_the_budget_is_computed_again_with_the_same_numbers(six_round_run):
    ctx = _context(six_round_run)
    objective = ctx.client_objective(1)
    size = ctx.w.numel() * ctx.w.element_size() + 8  # a gradient and its float64 loss
    cache = GradientCache(ctx.w, budget=size)  # room for one loss and gradient, not for three draws
    first = client_minibatch_gradients(objective, ctx.w, 4, 3, 0, 1, cache)
    second = client_minibatch_gradients(objective, ctx.w, 4, 3, 0, 1, cache)
    assert cache.misses == 2 and cache.kept_bytes == 0
    for a, b in zip(first[1], second[1]):
        assert torch.equal(a, b)
    full_gradient(objective, ctx.w, cache)
    assert cache.kept_bytes == size  # a full gradient fits
    other = client_minibatch_gradients(objective, ctx.w, 4, 3, 1, 1, cache)  # another seed: other draws
    assert not all(torch.equal(a, b) for a, b in zip(first[1], other[1]))


def test_misuse_is_a_one_line_error(six_round_run):
    ctx = _context(six_round_run)
    with pytest.raises(LandscapeError, match="budget must be >= 0"):
        GradientCache(ctx.w, budget=-1)
    with pytest.raises(LandscapeError, match="at another point") as error:
        full_gradient(ctx.objective, ctx.w + 1e-3, ctx.gradients)
    assert "\n" not in str(error.value)
    assert full_gradient(ctx.objective, ctx.w.clone(), ctx.gradients)[1] is not None  # equal values: the same point
