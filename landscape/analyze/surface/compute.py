"""Loss surfaces computed: F (and accuracy) on a 1D line or a 2D plane around a checkpoint (docs/metrics.md
"Surfaces"): the planes (random, PCA, client plane, interpolation) and ``compute_surface``, which the ``surface``
pass (``passes.surface``, its options and declaration) calls. ``opts`` is that pass's ``SurfaceOptions``.

The computation's parts: ``grid`` (the axes, the [ix, iy] layout and ``SurfaceGrid``),
``evaluation`` (``evaluate_surface``: the cells, batched where the BN mode allows) and ``partial``
(partial grids on disk, so that an interrupted surface resumes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from torch import Tensor

from landscape.analyze.registry import PassOutput
from landscape.analyze.surface.partial import PARTIAL_SCHEMA, load_partial, save_partial, tensor_digest
from landscape.core import parallel
from landscape.core.errors import LandscapeError
from landscape.measure import directions as dirs
from landscape.measure.analysis_data import AnalysisData
from landscape.measure.objective import Objective
from landscape.measure.surface.evaluation import evaluate_surface, vectorizable
from landscape.measure.surface.grid import (
    DEFAULT_SPANS,
    auto_half_width,
    make_axis,
    make_line,
    parse_clients,
    parse_data,
    parse_grid,
    parse_reference_round,
    parse_span,
)

if TYPE_CHECKING:
    from landscape.analyze.context import CheckpointContext

# -- the objective and the plane --------------------------------------------------------------------------


def _objective(ctx: CheckpointContext, data: str) -> tuple[Objective, str]:
    """The objective of the surface and the quantity's name for figures."""
    which = parse_data(data)
    if which == "global":
        spec = getattr(ctx.source, "spec", None)  # a plain state_dict's data factory: its data, whatever the split
        if spec is not None and ":" in spec.dataset:
            return ctx.objective, f"loss on data from {spec.dataset}"
        split = "training" if ctx.settings.split == "train" else "test"
        return ctx.objective, f"{split} loss (global F)"
    if which == "test":
        x, y = ctx.source.analysis_set("test")
        data_set = AnalysisData(x, y, ctx.settings.batch_size).place(ctx.device, ctx.dtype)
        return ctx.objective.with_data(data_set), "test loss (global F on the test set)"
    if not 0 <= which < ctx.num_clients:
        raise LandscapeError(f"client {which} does not exist (the run has {ctx.num_clients} clients)")
    return ctx.client_objective(which), f"training loss of client {which} (local F_{which})"


def _kept(ctx: CheckpointContext) -> dict[int, Tensor]:
    return {i: y.to(ctx.device) for i, y in ctx.kept_clients().items()}


def _pick_kept(kept: dict[int, Tensor], client: int) -> Tensor:
    if client not in kept:
        raise LandscapeError(f"client {client} has no kept model this round; kept clients: "
                             + ", ".join(map(str, sorted(kept))))
    return kept[client]


def _target_model(ctx: CheckpointContext, target: str) -> tuple[Tensor, str]:
    """The interpolation target and its description: a kept client model or another run's checkpoint."""
    if not target or target.startswith("client:"):
        kept = _kept(ctx)
        if target:
            try:
                client = int(target.split(":", 1)[1])
            except ValueError:
                raise LandscapeError(f"interpolation target must be client:<i> or a checkpoint file, got "
                                     f"'{target}'") from None
        else:
            client = min(kept)
        return _pick_kept(kept, client), f"client:{client}"
    path = Path(target)
    if not path.is_file():
        raise LandscapeError(f"interpolation target {path} is not a file (give client:<i> or a checkpoint "
                             "file)")
    return ctx.load_global(path), str(path)  # as analysis of that run would use it (x_swa once it exists)


def _trajectory(ctx: CheckpointContext) -> tuple[list[int], list[Tensor]]:
    """x^t of every checkpoint of the run up to and including this round (training models, not SWA)."""
    rounds = sorted(r for r in ctx.source.checkpoints if r <= ctx.round)
    models = [ctx.global_w if r == ctx.round else ctx.load_global(ctx.source.checkpoints[r], analysed=False)
              for r in rounds]
    return rounds, models


@dataclass
class _Plane:
    d1: Tensor
    d2: Tensor | None
    scalars: dict[str, Any] = field(default_factory=dict)
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    points: np.ndarray | None = None  # [n, 2] coordinates a span 'auto' must cover


def _reference_model(ctx: CheckpointContext, reference: str) -> tuple[Tensor, str]:
    """The model filter-reference directions are normalised to, and how the result names it: this run's
    checkpoint of a round (its training model x^r, not x_swa) or a checkpoint file (as its run analyses
    it)."""
    if reference.startswith("round:"):
        r = parse_reference_round(reference)
        if r not in ctx.source.checkpoints:
            raise LandscapeError(f"surface reference {reference}: run {ctx.source.name} has no checkpoint of "
                                 f"round {r} (it has rounds "
                                 f"{', '.join(map(str, sorted(ctx.source.checkpoints)))})")
        return ctx.load_global(ctx.source.checkpoints[r], analysed=False), reference
    path = Path(reference)
    if not path.is_file():
        raise LandscapeError(f"surface reference {path} is not a file (give round:<r> or a checkpoint file)")
    return ctx.load_global(path), str(path)


def _random_plane(ctx: CheckpointContext, opts: Any) -> _Plane:
    zeroed = "zeroed" if opts.ignore_1d else "scaled as whole tensors"
    reference, named = (_reference_model(ctx, opts.reference) if opts.normalization == "filter-reference"
                        else (None, ""))
    plane = dirs.random_plane(ctx.flat, ctx.w, ctx.settings.seed, orthogonalize=opts.orthogonalize,
                              ignore_1d=opts.ignore_1d, normalization=opts.normalization, length=opts.length,
                              reference=reference)
    text = {"filter": f"filter (Li et al. 2018): to this model's own filters; dim <= 1 tensors {zeroed}",
            "euclidean": f"euclidean: ||d|| = {opts.length:g}, the same for every model; dim <= 1 tensors "
                         + ("zeroed" if opts.ignore_1d else "kept"),
            "filter-reference": f"filter (Li et al. 2018) to the reference model {named}'s filters; dim <= 1 "
                                f"tensors {zeroed}"}[opts.normalization]
    scalars = {"normalisation": text, "normalization": opts.normalization,
               "length": plane.length, "reference": named or None,
               "orthogonalize": opts.orthogonalize, "ignore_1d": opts.ignore_1d,
               "direction_seed": plane.seed, "generator_seeds": list(plane.seeds),
               "cosine_d1_d2_drawn": plane.cosine_before}
    if reference is not None:
        scalars["reference_weight_norm"] = float(reference.double().norm())
    return _Plane(plane.d1, plane.d2, scalars)


def _plane(ctx: CheckpointContext, opts: Any) -> _Plane:
    if opts.directions == "random":
        return _random_plane(ctx, opts)
    if opts.directions == "pca":
        rounds, models = _trajectory(ctx)
        plane = dirs.pca_plane(models, ctx.w)
        return _Plane(plane.d1, plane.d2, {
            "normalisation": "unit principal directions of the centred trajectory x^t - x^T",
            "explained_variance": plane.explained_variance.tolist(), "trajectory_rounds": rounds,
        }, {"explained_variance": plane.explained_variance, "singular_values": plane.singular_values,
            "trajectory": plane.coordinates, "trajectory_rounds": np.array(rounds, dtype=np.int64)},
            points=plane.coordinates)
    if opts.directions == "clients":
        kept = _kept(ctx)
        if len(kept) < 2:
            raise LandscapeError(f"a client plane needs two kept client models; round {ctx.round} kept "
                                 f"{len(kept)}")
        a, b = parse_clients(opts.clients) if opts.clients else tuple(sorted(kept)[:2])
        plane = dirs.client_plane(ctx.w, _pick_kept(kept, a), _pick_kept(kept, b), kept, (a, b))
        return _Plane(plane.d1, plane.d2, {
            "normalisation": "unit: d1 = (y_a - x)/||.||, d2 = Gram-Schmidt of y_b - x, normalised",
            "clients": [a, b], "client_ids": plane.ids.tolist(),
            "client_distances": plane.distances.tolist(),
        }, {"client_ids": plane.ids, "client_coords": plane.coordinates, "client_distances": plane.distances},
            points=plane.coordinates)
    target, described = _target_model(ctx, opts.target)
    d1 = dirs.interpolation_direction(ctx.w, target)
    return _Plane(d1, None, {"normalisation": "none: d1 = target - x (alpha = 1 is the target)",
                             "target": described, "target_distance": float(d1.double().norm())})


# -- the pass ---------------------------------------------------------------------------------------------

def compute_surface(ctx: CheckpointContext, opts: Any) -> PassOutput:
    """The surface ``opts`` asks for around the checkpoint of ``ctx`` (resuming its partial grid where one of
    exactly this computation is on disk): the grid, its directions and what figures read of it (the
    ``surface`` pass, ``passes.surface``)."""
    objective, quantity = _objective(ctx, opts.data)
    plane = _plane(ctx, opts)
    one_d = plane.d2 is None
    sizes = parse_grid(opts.grid, 1 if one_d else 2)
    span = opts.span or DEFAULT_SPANS[opts.directions]
    if one_d:
        x_coords, y_coords = make_line(sizes[0], *parse_span(span)), None
        spans = [[float(x_coords[0]), float(x_coords[-1])]]
    else:
        if span == "auto":
            hx, hy = auto_half_width(plane.points[:, 0]), auto_half_width(plane.points[:, 1])
        else:
            hx = hy = parse_span(span)[1]
        x_coords, y_coords = make_axis(sizes[0], -hx, hx), make_axis(sizes[1], -hy, hy)
        spans = [[-hx, hx], [-hy, hy]]

    # Resume from a partial grid of exactly this computation (save_every does not change any value).
    key = {"schema": PARTIAL_SCHEMA, "run": ctx.source.name, "round": ctx.round,
           "checkpoint_sha256": ctx.digest, "analysis": ctx.settings.record(),
           "options": {k: v for k, v in opts.__dict__.items() if k != "save_every"},
           "d1_sha256": tensor_digest(plane.d1), "d2_sha256": None if one_d else tensor_digest(plane.d2)}
    # One partial grid per result, named as the result is (the job's result name, which the scheduler gives
    # the context): surfaces of other settings (another grid, data, span) never take over each other's partial
    # grid. A context given no result name (not run by the scheduler) keeps no partial grid.
    partial_path = (None if ctx.result_name is None
                    else ctx.source.result_dir(ctx.round) / f"{ctx.result_name}.partial.npz")
    partial = None if partial_path is None else parallel.on_main(  # rank 0 reads it
        lambda: load_partial(partial_path, key, x_coords, y_coords))
    grid = evaluate_surface(
        objective, ctx.w, plane.d1, plane.d2, x_coords, y_coords,
        loss=None if partial is None else partial.loss,
        accuracy=None if partial is None else partial.accuracy,
        cells_per_batch=opts.cells_per_batch, save_every=opts.save_every,
        on_checkpoint=None if partial_path is None else (lambda g: save_partial(partial_path, g, key)),
        progress=ctx.progress,
    )
    if parallel.is_main() and partial_path is not None:
        partial_path.unlink(missing_ok=True)

    centre = tuple(int(np.flatnonzero(axis == 0.0)[0]) for axis in
                   ([x_coords] if one_d else [x_coords, y_coords]))
    finite = grid.loss[np.isfinite(grid.loss)]
    argmin = np.unravel_index(int(np.nanargmin(grid.loss)), grid.shape) if finite.size else centre
    scalars = {
        "directions": opts.directions,
        **plane.scalars,
        "data": opts.data,
        "quantity": quantity,
        "data_samples": len(objective.data),
        "bn_mode": objective.bn_mode,
        "grid": list(grid.shape),
        "span": spans,
        "axes": list(grid.axes),
        "layout": ("loss[ix] = F(w + x_coords[ix] d1)" if one_d else
                   "loss[ix, iy] = F(w + x_coords[ix] d1 + y_coords[iy] d2)"),
        "centre_index": list(centre),
        "centre_loss": float(grid.loss[centre]),
        "centre_accuracy": float(grid.accuracy[centre]),
        "min_loss": float(finite.min()) if finite.size else math.nan,
        "max_loss": float(finite.max()) if finite.size else math.nan,
        "argmin_index": [int(i) for i in argmin],
        "cells": int(grid.loss.size),
        "cells_evaluated": grid.cells_evaluated,
        "cells_resumed": int(grid.loss.size) - grid.cells_evaluated,
        "batched": bool(opts.cells_per_batch > 1 and vectorizable(objective)),
        "weight_norm": float(ctx.w.double().norm()),
        "d1_norm": float(plane.d1.double().norm()),
    }
    arrays = {"loss": grid.loss, "accuracy": grid.accuracy, "x_coords": grid.x_coords,
              "d1": plane.d1.detach().float().cpu().numpy(), **plane.arrays}
    if not one_d:
        scalars["d2_norm"] = float(plane.d2.double().norm())
        arrays["y_coords"] = grid.y_coords
        arrays["d2"] = plane.d2.detach().float().cpu().numpy()
    else:
        scalars["target_loss"] = float(grid.loss[int(np.flatnonzero(x_coords == 1.0)[0])])
    summary = {"surface_centre_loss": scalars["centre_loss"], "surface_max_loss": scalars["max_loss"]}
    return PassOutput(scalars, arrays, summary)
