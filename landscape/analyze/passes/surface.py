"""The ``surface`` analysis pass: loss surfaces, F (and accuracy) on a 1D line or a 2D plane around a checkpoint
(docs/metrics.md "Surfaces"): its options (``SurfaceOptions``, ``--set surface.KEY=VALUE``), its cost model, the
check that its grid fits in memory, and its function, whose computation (``analyze.surface.compute``) is imported when it
runs.

Each option's kind, choices and format are its annotation (the one schema loader,
``landscape.core.schema``); ``SurfaceOptions.__post_init__`` checks what depends on several options (a
grid and span for the directions' line or plane, a normalisation for the directions), all when the options
are made, before any work.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal

import numpy as np

from landscape.analyze.passes._common import keys, measured
from landscape.analyze.registry import PASSES, Cost, PassOutput
from landscape.core.errors import LandscapeError
from landscape.core.schema import choices, holds, rule
from landscape.measure.surface.grid import (
    DEFAULT_SPANS,
    make_axis,
    make_line,
    parse_clients,
    parse_data,
    parse_grid,
    parse_reference_round,
    parse_span,
)
from landscape.store.results.names import surface_output_name

if TYPE_CHECKING:
    from landscape.analyze.context import CheckpointContext

def _parses(parse: Callable[[str], Any], empty: bool = False) -> Callable[[str], bool]:
    """Whether ``parse`` takes a value (and "" when ``empty``: the option's default, meaning "choose")."""

    def test(spec: str) -> bool:
        try:
            return (empty and spec == "") or parse(spec) is not None
        except LandscapeError:
            return False

    return test


@dataclass(frozen=True)
class SurfaceOptions:
    """What a surface is computed over: its directions, grid, span and data (docs/metrics.md "Surfaces")."""

    directions: Literal["random", "pca", "clients", "interpolate"] = "random"  # interpolate: a 1D line
    grid: str = "41"  # 2D: "41" (41 x 41) or "41x25" (nx x ny), odd sizes; interpolate: points on the line
    span: str = ""  # "" = the directions' default: random -1:1, pca/clients auto, interpolate -0.5:1.5
    # global (the analysis data) | test (the test set) | client:<i> (F_i)
    data: Annotated[str, rule(text="must be global, test or client:<i> (e.g. client:3)"),
                    holds(_parses(parse_data))] = "global"
    orthogonalize: bool = False  # random: Gram-Schmidt d2 against d1 after normalising
    ignore_1d: bool = True  # random: zero the dim <= 1 tensors (biases, norm scales)
    # random: "filter" (Li et al. 2018: each model's own filters; the paper's figure, not comparable across
    # models), "euclidean" (each direction of norm `length`, the same vector for every model of the
    # architecture) or "filter-reference" (filter-normalised to the model `reference` names);
    # directions.NORMALIZATIONS
    normalization: Literal["filter", "euclidean", "filter-reference"] = "filter"
    # euclidean: ||d1|| = ||d2|| = length (one axis unit = this distance in parameters)
    length: Annotated[float, rule(gt=0)] = 1.0
    reference: str = ""  # filter-reference: "round:<r>" (this run's x^r; round:0 = the shared init) or a file
    # clients: two client ids "3,7"; "" = the first two kept clients
    clients: Annotated[str, rule(text="must be two different client ids like '3,7'"),
                       holds(_parses(parse_clients, empty=True))] = ""
    target: str = ""  # interpolate: "client:<i>" or a checkpoint file; "" = the first kept client
    cells_per_batch: Annotated[int, rule(ge=1)] = 16  # cells evaluated together (vmap) where the BN mode allows
    save_every: Annotated[int, rule(ge=1)] = 64  # cells between partial saves (resumable)

    @property
    def output_name(self) -> str:
        """The output name: surface (random plane) or surface-<directions>; the result files add the settings
        off their defaults (``ResultNames.result_name``)."""
        return surface_output_name(self.directions)

    @property
    def needs_kept_clients(self) -> bool:
        """The client plane, and a line to a client's model, read the round's kept client models."""
        return self.directions == "clients" or (self.directions == "interpolate"
                                                and (not self.target or self.target.startswith("client:")))

    def unavailable(self, source: Any, round: int) -> str | None:
        """Why this surface cannot be computed at ``round`` of ``source`` (a ``Source``), or None: a PCA plane
        needs 3 checkpoints of the trajectory up to the round, a client plane two kept client models, and a
        named client (``clients``, ``target = "client:<i>"``) must have been sampled (kept) in the round. The
        plan skips such rounds with a note (``plan.skip_unavailable``); kept models at all: ``needs``."""
        if self.directions == "pca":
            if sum(1 for r in source.checkpoints if r <= round) < 3:
                return "the PCA of the trajectory needs 3 checkpoints up to the round"
            return None
        if not self.needs_kept_clients:
            return None
        kept = source.kept_client_ids(round)
        if not kept:
            return None  # no kept models at all: said by the plan, for every pass that needs them
        if self.directions == "clients":
            named = list(parse_clients(self.clients)) if self.clients else []
            if not named and len(kept) < 2:
                return f"a client plane needs two kept client models, and that round kept {len(kept)}"
        else:
            spec = self.target.partition(":")[2]
            named = [int(spec)] if spec.isdigit() else []
        clients = source.recipe.partition.clients
        for c in named:
            if c >= clients:
                raise LandscapeError(f"client {c} does not exist (the run has {clients} clients)")
        missing = [c for c in named if c not in kept]
        if missing:
            which = " and ".join(f"client {c}" for c in missing)
            return (f"{which} {'was' if len(missing) == 1 else 'were'} not sampled in that round (no kept "
                    f"model); kept clients there: {', '.join(map(str, kept))}")
        return None

    @property
    def described(self) -> str:
        """The pass as these options ask for it, in the words of ``landscape analyze``'s flags."""
        return f"surface --directions {self.directions}"

    def __post_init__(self) -> None:
        """The checks across options: the grid and span make the directions' line or plane, the
        normalisation fits the directions."""
        one_d = self.directions == "interpolate"
        sizes = parse_grid(self.grid, 1 if one_d else 2)
        if not one_d and min(sizes) < 3:  # a 1-point "surface" is only the checkpoint
            raise LandscapeError(f"a 2D surface needs at least 3 points per axis (odd), got grid "
                                 f"'{'x'.join(map(str, sizes))}'")
        span = self.span or DEFAULT_SPANS[self.directions]
        if span == "auto":
            if self.directions not in ("pca", "clients"):
                raise LandscapeError("span 'auto' is for pca and clients directions; give LO:HI (e.g. -1:1)")
            for n in sizes:
                make_axis(n, -1.0, 1.0)  # odd sizes
        elif one_d:
            make_line(sizes[0], *parse_span(span))
        else:
            for n in sizes:
                make_axis(n, *parse_span(span))
        self._check_normalization()

    def _check_normalization(self) -> None:
        if self.normalization != "filter" and self.directions != "random":
            raise LandscapeError(f"surface normalization '{self.normalization}' is for random directions; "
                                 f"{self.directions} directions are not normalised to a model")
        if self.length != 1.0 and self.normalization != "euclidean":
            raise LandscapeError("surface length is the norm of euclidean directions: set normalization = "
                                 "\"euclidean\" with it")
        if self.normalization == "filter-reference":
            if not self.reference:
                raise LandscapeError("surface normalization 'filter-reference' needs reference = "
                                     "\"round:<r>\" (e.g. round:0, the run's initial model) or a "
                                     "checkpoint file")
            if self.reference.startswith("round:"):
                parse_reference_round(self.reference)
        elif self.reference:
            raise LandscapeError("surface reference is the model that filter-reference directions are "
                                 "normalised to: set normalization = \"filter-reference\" with it")


DIRECTIONS = choices(SurfaceOptions, "directions")


def _one_spelling(values: dict[str, Any]) -> dict[str, Any]:
    """--set surface.grid=41 arrives as an int and surface.clients=[3,7] as a list: one spelling each, so equal
    settings are recorded (and skipped) equally."""
    out = dict(values)
    if isinstance(out.get("grid"), int) and not isinstance(out["grid"], bool):
        out["grid"] = str(out["grid"])
    if isinstance(out.get("clients"), (list, tuple)):
        out["clients"] = ",".join(str(c) for c in out["clients"])
    return out


# Host memory a grid cell takes while the surface is computed: its loss and accuracy (float64), the list of
# cell indices, the partial grid written to disk, with room to spare.
GRID_BYTES_PER_CELL = 160


def check_grid_memory(options: SurfaceOptions) -> None:
    """No grid needs more memory than the machine has free: refused in one line before anything is
    allocated (checked when options are made for work, not when stored results are read)."""
    from landscape.core.machine import require_memory

    sizes = parse_grid(options.grid, 1 if options.directions == "interpolate" else 2)
    cells = int(np.prod(sizes, dtype=object))
    require_memory(cells * GRID_BYTES_PER_CELL, f"a {'x'.join(map(str, sizes))} grid ({cells:,} cells)",
                   "choose a smaller grid")


# Work of a surface besides Hessian-vector products, in full-data gradient equivalents: a cell is one forward
# pass, about 0.4 of a gradient.
CELL_COST = 0.4


def _surface_cost(o: SurfaceOptions) -> Cost:
    """The grid's cells (a number of points alone is n x n on a plane)."""
    sizes = [int(n) for n in str(o.grid).split("x") if n.isdigit()] or [1]
    if len(sizes) == 1 and o.directions != "interpolate":  # "41": 41 x 41 on a plane
        sizes *= 2
    cells = 1
    for n in sizes:
        cells *= n
    return Cost(gradients=CELL_COST * cells)


# Opt-in (expensive); collective: its grid cells are split across the ranks, partial grids saved by rank 0.
PASSES.declare("surface", options=SurfaceOptions,
               summary="1D / 2D loss surfaces: random (filter-normalised or euclidean), PCA, client plane, "
                       "interpolation",
               opt_in=True, collective=True, without_clients="random directions", cost=_surface_cost,
               spelling=_one_spelling, machine_check=check_grid_memory,
               measures=measured("centre_accuracy min_loss weight_norm d1_norm d2_norm cosine_d1_d2_drawn "
                                 "reference_weight_norm target_loss",
                                 {"centre_loss": "surface_centre_loss", "max_loss": "surface_max_loss"}),
               # the grid and its directions as asked (length: euclidean's setting), the data's size; a line's
               # target_distance is its d1_norm (d1 = target - x)
               bookkeeping=keys("length direction_seed data_samples cells cells_evaluated cells_resumed "
                                "target_distance"))


@PASSES.implement("surface")
def surface_pass(ctx: CheckpointContext, opts: SurfaceOptions) -> PassOutput:
    """The surface ``opts`` asks for around the checkpoint of ``ctx`` (resuming its partial grid where one of
    exactly this computation is on disk): the grid, its directions and what figures read of it."""
    from landscape.analyze.surface.compute import compute_surface

    return compute_surface(ctx, opts)
