"""The options of the ``surface`` analysis pass (``SurfaceOptions``, ``--set surface.KEY=VALUE``) and the
parsers of their specs, checked when the options are made, before any work (docs/metrics.md "Surfaces").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from landscape.analyze import directions as dirs
from landscape.analyze.surface_grid import make_axis, make_line, parse_grid, parse_span
from landscape.core.errors import LandscapeError
from landscape.store.runs import surface_result_name

DIRECTIONS = ("random", "pca", "clients", "interpolate")
DEFAULT_SPANS = {"random": "-1:1", "pca": "auto", "clients": "auto", "interpolate": "-0.5:1.5"}


@dataclass(frozen=True)
class SurfaceOptions:
    """What a surface is computed over: its directions, grid, span and data (docs/metrics.md "Surfaces")."""

    directions: str = "random"  # random | pca | clients | interpolate (1D)
    grid: str = "41"  # 2D: "41" (41 x 41) or "41x25" (nx x ny), odd sizes; interpolate: points on the line
    span: str = ""  # "" = the directions' default: random -1:1, pca/clients auto, interpolate -0.5:1.5
    data: str = "global"  # global (the analysis data) | test (the test set) | client:<i> (F_i)
    orthogonalize: bool = False  # random: Gram-Schmidt d2 against d1 after normalising
    ignore_1d: bool = True  # random: zero the dim <= 1 tensors (biases, norm scales)
    # random: "filter" (Li et al. 2018: each model's own filters; the paper's figure, not comparable across
    # models), "euclidean" (each direction of norm `length`, the same vector for every model of the
    # architecture) or "filter-reference" (filter-normalised to the model `reference` names)
    normalization: str = "filter"
    length: float = 1.0  # euclidean: ||d1|| = ||d2|| = length (one axis unit = this distance in parameters)
    reference: str = ""  # filter-reference: "round:<r>" (this run's x^r; round:0 = the shared init) or a file
    clients: str = ""  # clients: two client ids "3,7"; "" = the first two kept clients
    target: str = ""  # interpolate: "client:<i>" or a checkpoint file; "" = the first kept client
    cells_per_batch: int = 16  # cells evaluated together (vmap) where the BN mode allows
    save_every: int = 64  # cells between partial saves (resumable)

    @property
    def output_name(self) -> str:
        """The output name: surface (random plane) or surface-<directions>; the result files add the settings
        off their defaults (``results.result_name``)."""
        return surface_result_name(self.directions)

    @property
    def needs_kept_clients(self) -> bool:
        """The client plane, and a line to a client's model, read the round's kept client models."""
        return self.directions == "clients" or (self.directions == "interpolate"
                                                and (not self.target or self.target.startswith("client:")))

    @property
    def described(self) -> str:
        """The pass as these options ask for it, in the words of ``landscape analyze``'s flags."""
        return f"surface --directions {self.directions}"

    def __post_init__(self) -> None:
        # --set surface.grid=41 arrives as an int and surface.clients=[3,7] as a list: keep one spelling each,
        # so equal settings are recorded (and skipped) equally.
        if isinstance(self.grid, int) and not isinstance(self.grid, bool):
            object.__setattr__(self, "grid", str(self.grid))
        if isinstance(self.clients, (list, tuple)):
            object.__setattr__(self, "clients", ",".join(str(c) for c in self.clients))
        for name in ("cells_per_batch", "save_every"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise LandscapeError(f"surface {name} must be a whole number >= 1, got {value!r}")
        for name, example in (("grid", "41"), ("span", "-1:1"), ("data", "client:3"), ("clients", "3,7"),
                              ("target", "client:3")):
            value = getattr(self, name)
            if not isinstance(value, str):  # e.g. --set surface.data=0 (a number, not text)
                raise LandscapeError(f"surface {name} must be text such as '{example}', got {value!r}")
        if self.directions not in DIRECTIONS:
            raise LandscapeError(f"unknown surface directions '{self.directions}'; choose from: "
                                 + ", ".join(DIRECTIONS))
        one_d = self.directions == "interpolate"
        sizes = parse_grid(self.grid, 1 if one_d else 2)
        check_grid_size(sizes, one_d)
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
        parse_data(self.data)
        if self.clients:
            parse_clients(self.clients)
        self._check_normalization()

    def _check_normalization(self) -> None:
        length = self.length
        if isinstance(length, bool) or not isinstance(length, (int, float)) or not math.isfinite(length) \
                or length <= 0:
            raise LandscapeError(f"surface length must be a finite number > 0, got {length!r}")
        object.__setattr__(self, "length", float(length))  # --set surface.length=10 arrives as an int
        if not isinstance(self.reference, str):
            raise LandscapeError(f"surface reference must be text such as 'round:0', got {self.reference!r}")
        if self.normalization not in dirs.NORMALIZATIONS:
            raise LandscapeError(f"unknown surface normalization '{self.normalization}'; choose from: "
                                 + ", ".join(dirs.NORMALIZATIONS))
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


def parse_reference_round(spec: str) -> int:
    """"round:<r>" -> r (a checkpointed round of the analysed run)."""
    try:
        value = int(spec.split(":", 1)[1])
    except ValueError:
        value = -1
    if value < 0:
        raise LandscapeError(f"surface reference must be round:<r> (e.g. round:0) or a checkpoint file, "
                             f"got '{spec}'")
    return value


# Host memory a grid cell takes while the surface is computed: its loss and accuracy (float64), the list of
# cell indices, the partial grid written to disk, with room to spare.
GRID_BYTES_PER_CELL = 160


def check_grid_size(sizes: tuple[int, ...], one_d: bool) -> None:
    """A 2D grid has at least 3 points per axis (a 1-point "surface" is only the checkpoint), and no grid
    needs more memory than the machine has free: refused in one line before anything is allocated."""
    if not one_d and min(sizes) < 3:
        raise LandscapeError(f"a 2D surface needs at least 3 points per axis (odd), got grid "
                             f"'{'x'.join(map(str, sizes))}'")
    cells = int(np.prod(sizes, dtype=object))
    needed = cells * GRID_BYTES_PER_CELL
    from landscape.analyze.operator import free_memory

    free = free_memory(torch.device("cpu"))
    if free is not None and needed > free:
        raise LandscapeError(f"a {'x'.join(map(str, sizes))} grid ({cells:,} cells) needs about "
                             f"{needed / 2**30:,.1f} GiB of memory, {free / 2**30:,.1f} GiB are free: "
                             "choose a smaller grid")


def parse_data(spec: str) -> int | str:
    """"global" | "test" | "client:<i>" -> the string, or the client id."""
    if spec in ("global", "test"):
        return spec
    if spec.startswith("client:"):
        try:
            client = int(spec.split(":", 1)[1])
        except ValueError:
            client = -1
        if client >= 0:
            return client
    raise LandscapeError(f"surface data must be global, test or client:<i> (e.g. client:3), got '{spec}'")


def parse_clients(spec: str) -> tuple[int, int]:
    """"3,7" -> (3, 7): the two clients of a client plane."""
    try:
        ids = [int(p) for p in spec.split(",")]
    except ValueError:
        ids = []
    if len(ids) != 2 or ids[0] == ids[1] or min(ids) < 0:
        raise LandscapeError(f"surface clients must be two different client ids like '3,7', got '{spec}'")
    return ids[0], ids[1]
