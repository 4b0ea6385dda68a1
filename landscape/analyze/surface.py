"""Loss surfaces: F (and accuracy) on a 1D line or a 2D grid around a checkpoint (docs/metrics.md "Surfaces").

Layout. A 2D surface is stored as arrays ``loss[ix, iy]`` and ``accuracy[ix, iy]`` of shape [nx, ny] with
named axes ("ix", "iy"):

    loss[ix, iy] = F(w + x_coords[ix] * d1 + y_coords[iy] * d2)

so the FIRST index walks along d1 (the horizontal axis of every figure) and the second along d2. A 1D
surface (an interpolation line) is stored as ``loss[ix]`` of shape [nx] (no y axis, no d2):
loss[ix] = F(w + x_coords[ix] * d1). NaN marks a cell not yet computed.

Grids. 2D axes are symmetric, odd-sized and put the checkpoint at the centre cell exactly: ``make_axis``
builds hi * k / c for k = -c..c (c = (n - 1) / 2), so the centre coordinate is exactly 0.0 and the axis is
exactly symmetric; even n or a span with lo != -hi is refused. A 1D line (``make_line``) must have grid
points at exactly alpha = 0 (x) and alpha = 1 (the target): its points are k / m for integers k, m.

Evaluation (``evaluate_surface``). Only NaN cells are computed. The cells are enumerated in C order over
[ix, iy] and cut into fixed chunks of ``cells_per_batch``; with a ``landscape`` ``Objective`` whose BN mode
allows it (no BatchNorm, or BN mode ``eval``), the cells of a chunk are evaluated together: one forward pass
per data batch over the stacked parameter vectors w + a d1 + b d2 (``torch.func.vmap`` over
``functional_call``), with the data kept on the objective's device and the module never rebuilt or written.
Other BN modes (``train-batch-stats``, ``recompute``: statistics depend on each cell's w) evaluate the cells
one at a time through the objective's own BN handling, loss and accuracy in one pass. Any other object with
``loss(w)`` and ``accuracy(w)`` is evaluated cell by cell through those two methods.

The centre cell (all coefficients exactly 0) is F(w) itself: it is evaluated by ``objective.loss(w)`` and
``objective.accuracy(w)`` on the unmodified w, so it equals the checkpoint's F bitwise (a vmapped batch uses
other kernels, which agree with the unbatched ones to float rounding, about 1e-7 relative in float32).
Because the chunks are fixed, a chunk recomputed after an interruption holds the same cells as before and
gives bitwise the same values. Under torchrun the ranks take the chunks in turn and gather each step's
values, so a chunk (and its values) is the same whatever the number of ranks.

Resumability. ``on_checkpoint(grid)`` is called after every ``save_every`` computed cells (at chunk ends);
the surface pass saves the partial grid there (``save_partial``: NPZ written atomically, NaN for the rest,
with a key of the settings, checkpoint hash and direction hashes) and a rerun loads it (``load_partial``,
only when the key matches) and computes only the missing cells. A cell whose loss comes out NaN (a diverged
far-away point) counts as missing and is computed again on a resume.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.func import vmap

from landscape import parallel
from landscape.analyze import directions as dirs
from landscape.analyze.context import CheckpointContext
from landscape.analyze.objective import AnalysisData, Objective
from landscape.analyze.registry import PASSES, Cost, PassOutput
from landscape.analyze.results import result_name, settings_record
from landscape.errors import LandscapeError
from landscape.runs import atomic_write, surface_result_name

AXES_2D = ("ix", "iy")
AXES_1D = ("ix",)
PARTIAL_SCHEMA = 1
AUTO_MARGIN = 1.25  # span "auto": half-width = 1.25 x the largest |coordinate| of the points to cover

# -- grids ------------------------------------------------------------------------------------------------


def parse_grid(spec: str, dims: int = 2) -> tuple[int, ...]:
    """"41" -> (41, 41) in 2D or (41,) in 1D; "41x25" -> (41, 25) (nx x ny, 2D only)."""
    text = str(spec).strip().lower()
    parts = text.split("x")
    if dims == 1 and len(parts) != 1:
        raise LandscapeError(f"a 1D surface takes one number of points as its grid (e.g. '41'), got '{spec}'")
    if len(parts) not in (1, 2):
        raise LandscapeError(f"grid must be 'N' or 'NXxNY' (e.g. '41' or '41x25'), got '{spec}'")
    try:
        sizes = [int(p) for p in parts]
    except ValueError:
        raise LandscapeError(f"grid must be 'N' or 'NXxNY' with whole numbers (e.g. '41x25'), "
                             f"got '{spec}'") from None
    if any(n < 1 for n in sizes):
        raise LandscapeError(f"grid sizes must be positive, got '{spec}'")
    if dims == 2 and len(sizes) == 1:
        sizes = sizes * 2
    return tuple(sizes)


def parse_span(spec: str) -> tuple[float, float]:
    """"-1:1" -> (-1.0, 1.0); lo < hi."""
    parts = str(spec).strip().split(":")
    if len(parts) != 2:
        raise LandscapeError(f"span must be 'LO:HI' (e.g. '-1:1'), got '{spec}'")
    try:
        lo, hi = float(parts[0]), float(parts[1])
    except ValueError:
        raise LandscapeError(f"span must be 'LO:HI' with numbers (e.g. '-1:1'), got '{spec}'") from None
    if not (math.isfinite(lo) and math.isfinite(hi)) or not lo < hi:
        raise LandscapeError(f"span LO:HI needs finite LO < HI, got '{spec}'")
    return lo, hi


def make_axis(n: int, lo: float, hi: float) -> np.ndarray:
    """n symmetric coordinates hi * k / c, k = -c..c: the centre is exactly 0.0 (the checkpoint's cell)."""
    if n < 1 or n % 2 == 0:
        raise LandscapeError(f"a 2D surface axis needs an odd number of points so that the checkpoint is the "
                             f"centre cell, got {n}")
    if not (hi > 0 and lo == -hi):
        raise LandscapeError(f"a 2D surface span must be symmetric around the checkpoint (LO = -HI), "
                             f"got {lo:g}:{hi:g}")
    c = (n - 1) // 2
    if c == 0:
        return np.zeros(1)
    return hi * (np.arange(n) - c) / c


def make_line(n: int, lo: float, hi: float) -> np.ndarray:
    """n points k / m (k, m integers) from lo to hi, with alpha = 0 and alpha = 1 exactly on the grid."""
    if not (lo <= 0 and hi >= 1):
        raise LandscapeError(f"an interpolation span must include alpha = 0 and alpha = 1, got {lo:g}:{hi:g}")

    def points_per_unit(count: int) -> int | None:
        if count < 2:
            return None
        m = (count - 1) / (hi - lo)
        k0 = lo * m
        whole = abs(m - round(m)) <= 1e-9 * max(m, 1) and abs(k0 - round(k0)) <= 1e-9 * max(abs(k0), 1)
        if not whole or round(m) < 1:
            return None
        return round(m)

    m = points_per_unit(n)
    if m is None:
        better = next((k for k in range(max(n, 2), n + 10_000) if points_per_unit(k)), None)
        hint = f"; e.g. {better} points" if better else ""
        raise LandscapeError(f"{n} points over {lo:g}:{hi:g} do not put grid points at alpha = 0 and 1 "
                             f"(the step (HI - LO)/(N - 1) must divide both -LO and 1){hint}")
    k0 = round(lo * m)
    return (k0 + np.arange(n)) / m


# -- the grid ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SurfaceGrid:
    """loss and accuracy on the grid (float64, NaN = not computed): [nx, ny] with axes ("ix", "iy"), or
    [nx] with axes ("ix",) for a 1D line (``y_coords`` None)."""

    x_coords: np.ndarray
    y_coords: np.ndarray | None
    loss: np.ndarray
    accuracy: np.ndarray
    cells_evaluated: int = 0  # cells computed by the call that returned this grid

    @classmethod
    def empty(cls, x_coords: np.ndarray, y_coords: np.ndarray | None = None) -> SurfaceGrid:
        shape = (len(x_coords),) if y_coords is None else (len(x_coords), len(y_coords))
        return cls(np.asarray(x_coords, float), None if y_coords is None else np.asarray(y_coords, float),
                   np.full(shape, np.nan), np.full(shape, np.nan))

    @property
    def axes(self) -> tuple[str, ...]:
        return AXES_1D if self.y_coords is None else AXES_2D

    @property
    def shape(self) -> tuple[int, ...]:
        return self.loss.shape

    @property
    def missing_mask(self) -> np.ndarray:
        return np.isnan(self.loss) | np.isnan(self.accuracy)

    @property
    def missing(self) -> int:
        return int(self.missing_mask.sum())

    @property
    def complete(self) -> bool:
        return self.missing == 0


# -- evaluation -------------------------------------------------------------------------------------------


def _vectorizable(objective: Any) -> bool:
    return isinstance(objective, Objective) and (not objective.has_batchnorm or objective.bn_mode == "eval")


@torch.no_grad()
def _cells_vmapped(objective: Objective, weights: Tensor) -> tuple[np.ndarray, np.ndarray]:
    """(F, accuracy) at each row of ``weights`` [B, dim]: one batched forward pass per data batch."""
    flat, data = objective.flat, objective.data
    buffers = objective.buffers_for(weights[0])  # eval mode: the checkpoint's running statistics
    count = weights.shape[0]
    total = torch.zeros(count, dtype=torch.float64, device=weights.device)
    correct = torch.zeros(count, dtype=torch.long, device=weights.device)
    with objective.bn_mode_context():
        for xb, yb in data.batches():
            logits = vmap(lambda u, xb=xb: flat.logits(u, xb, buffers))(weights)  # [B, n, C]
            total += objective.sample_losses(logits, yb).double()
            correct += objective.num_correct(logits, yb)
    n = len(data)
    accuracy = correct.cpu().numpy() / n if objective.classifies else np.full(count, np.nan)
    return (total / n).cpu().numpy(), accuracy


def default_cells_per_pass(device: torch.device, cells_per_batch: int) -> int:
    """How many cells share one forward pass when ``evaluate_surface`` is not told: 1 on the CPU, where a
    vmapped chunk is slower per cell than one cell at a time (the digits CNN: 16 cells per pass cost 1.9x,
    2 cells 1.1x; ``benchmarks/surface_vs_loop.py``), the whole chunk elsewhere (one small model leaves a
    GPU mostly idle). A rule per device rather than a timing, so a surface has the same bits on every run."""
    return 1 if torch.device(device).type == "cpu" else cells_per_batch


def _channels_last_parameters(objective: Objective, w: Tensor) -> dict[str, Tensor]:
    """The parameters at w, every 4-D (convolution) weight copied into channels-last layout.

    On the CPU the convolutions then produce channels-last activations, and max-pooling's channels-last kernel
    is several times faster than its NCHW one on small images (the digits CNN's forward pass: 2.6x); the
    values equal the NCHW ones to float rounding."""
    params = objective.flat.params(w)
    return {name: torch.empty_like(t, memory_format=torch.channels_last).copy_(t) if t.dim() == 4 else t
            for name, t in params.items()}


@torch.no_grad()
def _cell_one_pass(objective: Objective, w: Tensor) -> tuple[float, float]:
    """(F(w), accuracy) in one pass over the data, with the objective's BN handling (the sums of ``loss``);
    on the CPU with channels-last convolution weights (``_channels_last_parameters``)."""
    from torch.func import functional_call

    buffers = objective.buffers_for(w)
    channels_last = w.device.type == "cpu"
    tensors = {**(_channels_last_parameters(objective, w) if channels_last else objective.flat.params(w)),
               **buffers}
    total = torch.zeros((), dtype=torch.float64, device=w.device)
    correct = torch.zeros((), dtype=torch.long, device=w.device)
    with objective.bn_mode_context():
        for xb, yb in objective.data.batches():
            logits = functional_call(objective.module, tensors, (xb,))
            total += objective.summed_loss(logits, yb).double()
            correct += objective.num_correct(logits, yb)
    n = len(objective.data)
    return (total / n).item(), (correct.item() / n if objective.classifies else math.nan)


def evaluate_surface(
    objective: Any,
    w: Tensor,
    d1: Tensor,
    d2: Tensor | None,
    x_coords: np.ndarray,
    y_coords: np.ndarray | None,
    *,
    loss: np.ndarray | None = None,
    accuracy: np.ndarray | None = None,
    cells_per_batch: int = 16,
    save_every: int = 64,
    on_checkpoint: Callable[[SurfaceGrid], None] | None = None,
    progress: bool | None | Callable[[int, int | None], None] = False,
    vectorize: bool = True,
    cells_per_pass: int | None = None,
) -> SurfaceGrid:
    """F and accuracy at w + x_coords[ix] d1 (+ y_coords[iy] d2) for every cell that is NaN in ``loss`` /
    ``accuracy`` (all cells when they are None). 1D when ``d2`` and ``y_coords`` are None.

    ``objective``: a ``landscape`` ``Objective`` (batched path, see the module docstring) or any object with
    ``loss(w)`` and ``accuracy(w)``. ``on_checkpoint(grid)`` is called after every ``save_every`` computed
    cells (at the end of a chunk) with the grid so far (its arrays are live: save them, do not keep them);
    an exception from it stops the evaluation. ``vectorize=False`` forces one cell at a time.

    ``cells_per_batch`` cells form a chunk (the unit that ranks share and a resume recomputes);
    ``cells_per_pass`` of them share one vmapped forward pass (default ``default_cells_per_pass``: 1 on the
    CPU, the whole chunk on a GPU; 1 = cell by cell, on the CPU with channels-last convolution weights).
    ``progress``: True shows a progress bar, False hides it, None leaves it to tqdm (shown on a terminal);
    a callable is called instead, as ``progress(cells done, cells to compute)`` after every step (the cells
    this call computes, not those resumed).

    Under torchrun every rank calls this with the same arguments: the ranks split the chunks of cells and
    all return the whole grid; ``on_checkpoint``, the progress bar and the progress callable run on rank 0 only.
    """
    from tqdm.auto import tqdm

    if (d2 is None) != (y_coords is None):
        raise LandscapeError("a 2D surface needs both d2 and y_coords; a 1D line neither")
    if cells_per_batch < 1 or save_every < 1 or (cells_per_pass is not None and cells_per_pass < 1):
        raise LandscapeError("cells_per_batch, cells_per_pass and save_every must be at least 1")
    grid = SurfaceGrid.empty(x_coords, y_coords)
    for name, given, target in (("loss", loss, grid.loss), ("accuracy", accuracy, grid.accuracy)):
        if given is not None:
            if np.shape(given) != grid.shape:
                raise LandscapeError(f"{name} has shape {np.shape(given)}, the grid is {grid.shape}")
            target[...] = given
    directions = [d1] if d2 is None else [d1, d2]
    coords = [grid.x_coords] if y_coords is None else [grid.x_coords, grid.y_coords]
    for d in directions:
        if d.shape != w.shape:
            raise LandscapeError(f"directions must have the shape of w {tuple(w.shape)}, "
                                 f"got {tuple(d.shape)}")

    cells = list(np.ndindex(grid.shape))  # C order over [ix, iy]
    missing = grid.missing_mask
    pending = [c for c in cells if missing[c]]
    if cells_per_pass is None:
        cells_per_pass = default_cells_per_pass(w.device, cells_per_batch)
    cells_per_pass = min(cells_per_pass, cells_per_batch)
    batched = vectorize and cells_per_pass > 1 and _vectorizable(objective)
    evaluated = since_save = 0
    buffer = torch.empty_like(w)

    def coefficients(cell: tuple[int, ...]) -> list[float]:
        return [float(axis[i]) for axis, i in zip(coords, cell)]

    def point(coeffs: list[float]) -> Tensor:
        """w + sum_k c_k d_k built in place; zero coefficients add nothing, so (0, 0) is exactly w."""
        buffer.copy_(w)
        for c, d in zip(coeffs, directions):
            if c != 0.0:
                buffer.add_(d, alpha=c)
        return buffer

    def compute(chunk: list[tuple[int, ...]]) -> list[tuple[tuple[int, ...], float, float]]:
        """(cell, F, accuracy) of every cell of one chunk."""
        values, rest = [], []
        for cell in chunk:
            coeffs = coefficients(cell)
            if all(c == 0.0 for c in coeffs):  # the checkpoint itself: F(w) as the objective gives it
                values.append((cell, float(objective.loss(w)), float(objective.accuracy(w))))
            else:
                rest.append((cell, coeffs))
        if batched and rest:
            for start in range(0, len(rest), cells_per_pass):
                part = rest[start : start + cells_per_pass]
                c = torch.tensor([coeffs for _, coeffs in part], dtype=w.dtype, device=w.device)
                weights = w.expand(len(part), -1).clone()
                for k, d in enumerate(directions):
                    weights.addcmul_(c[:, k : k + 1], d.unsqueeze(0))
                losses, accs = _cells_vmapped(objective, weights)
                values += [(cell, float(lo), float(ac)) for (cell, _), lo, ac in zip(part, losses, accs)]
        elif isinstance(objective, Objective):
            values += [(cell, *_cell_one_pass(objective, point(coeffs))) for cell, coeffs in rest]
        else:
            for cell, coeffs in rest:
                w_cell = point(coeffs)
                values.append((cell, float(objective.loss(w_cell)), float(objective.accuracy(w_cell))))
        return values

    # Fixed chunks of the C-ordered cells, keeping only missing cells. Under torchrun the ranks take the
    # chunks in turn (a step: one chunk each) and gather the step's values, so every rank holds the whole
    # grid and a chunk holds the same cells, with the same values, whatever the number of ranks.
    chunks = [chunk for start in range(0, len(cells), cells_per_batch)
              if (chunk := [c for c in cells[start : start + cells_per_batch] if missing[c]])]
    ranks, me = parallel.world_size(), parallel.rank()
    main = parallel.is_main()
    report = progress if callable(progress) and main else None
    show = None if progress is None else (progress is True)
    bar = tqdm(total=len(pending), desc="surface", unit="cell", leave=False, dynamic_ncols=True,
               disable=(None if show is None else not show) if main and not callable(progress) else True)
    try:
        for step in range(0, len(chunks), ranks):
            group = chunks[step : step + ranks]
            mine = compute(group[me]) if me < len(group) else []
            for values in parallel.all_gather_objects(mine):
                for cell, lo, ac in values:
                    grid.loss[cell], grid.accuracy[cell] = lo, ac
            done = sum(len(chunk) for chunk in group)
            evaluated += done
            since_save += done
            bar.update(done)
            if report is not None:
                report(evaluated, len(pending))
            if on_checkpoint is not None and since_save >= save_every and evaluated < len(pending):
                since_save = 0
                if main:
                    on_checkpoint(grid)
    finally:
        bar.close()
    return SurfaceGrid(grid.x_coords, grid.y_coords, grid.loss, grid.accuracy, evaluated)


# -- partial grids on disk --------------------------------------------------------------------------------


def tensor_digest(t: Tensor) -> str:
    """SHA-256 of a tensor's float64 CPU bytes (identifies directions in a partial grid's key)."""
    return hashlib.sha256(t.detach().double().cpu().contiguous().numpy().tobytes()).hexdigest()


def _key_text(key: dict) -> str:
    return json.dumps(key, sort_keys=True, default=str)


def save_partial(path: Path, grid: SurfaceGrid, key: dict) -> None:
    """Write the grid so far (NaN = not computed) and its key, atomically."""
    arrays = {"loss": grid.loss, "accuracy": grid.accuracy, "x_coords": grid.x_coords,
              "key": np.array(_key_text(key))}
    if grid.y_coords is not None:
        arrays["y_coords"] = grid.y_coords
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    atomic_write(Path(path), lambda f: f.write(buffer.getvalue()))


def load_partial(path: Path, key: dict, x_coords: np.ndarray,
                 y_coords: np.ndarray | None) -> SurfaceGrid | None:
    """The saved grid when ``path`` holds one for exactly this key and these coordinates; else None
    (missing, unreadable, or from other settings, another checkpoint or other directions)."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as saved:
            if str(saved["key"]) != _key_text(key):
                return None
            loaded = SurfaceGrid(saved["x_coords"], saved.get("y_coords"),
                                 saved["loss"].astype(float), saved["accuracy"].astype(float))
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
        return None
    same_y = (loaded.y_coords is None and y_coords is None) or (
        loaded.y_coords is not None and y_coords is not None and np.array_equal(loaded.y_coords, y_coords))
    if not (np.array_equal(loaded.x_coords, x_coords) and same_y):
        return None
    return loaded


# -- the pass ---------------------------------------------------------------------------------------------

DIRECTIONS = ("random", "pca", "clients", "interpolate")
DEFAULT_SPANS = {"random": "-1:1", "pca": "auto", "clients": "auto", "interpolate": "-0.5:1.5"}


@dataclass(frozen=True)
class SurfaceOptions:
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
                                     "\"round:<r>\" (e.g. round:0, the run's initial model) or a checkpoint file")
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
        raise LandscapeError(f"a 2D surface needs at least 3 points per axis (odd), got grid '{'x'.join(map(str, sizes))}'")
    cells = int(np.prod(sizes, dtype=object))
    needed = cells * GRID_BYTES_PER_CELL
    from landscape.analyze.operator import free_memory

    free = free_memory(torch.device("cpu"))
    if free is not None and needed > free:
        raise LandscapeError(f"a {'x'.join(map(str, sizes))} grid ({cells:,} cells) needs about {needed / 2**30:,.1f} GiB "
                             f"of memory, {free / 2**30:,.1f} GiB are free: choose a smaller grid")


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
    try:
        ids = [int(p) for p in spec.split(",")]
    except ValueError:
        ids = []
    if len(ids) != 2 or ids[0] == ids[1] or min(ids) < 0:
        raise LandscapeError(f"surface clients must be two different client ids like '3,7', got '{spec}'")
    return ids[0], ids[1]


def _objective(ctx: CheckpointContext, data: str) -> tuple[Objective, str]:
    """The objective of the surface and the quantity's name for figures."""
    which = parse_data(data)
    if which == "global":
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


def _auto_half_width(values: np.ndarray) -> float:
    extent = float(np.max(np.abs(values))) if values.size else 0.0
    if extent <= 0:
        raise LandscapeError("span 'auto' has no points to cover along one axis; give the span as LO:HI")
    return AUTO_MARGIN * extent


@dataclass
class _Plane:
    d1: Tensor
    d2: Tensor | None
    scalars: dict[str, Any] = field(default_factory=dict)
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    points: np.ndarray | None = None  # [n, 2] coordinates a span 'auto' must cover


def _reference_model(ctx: CheckpointContext, reference: str) -> tuple[Tensor, str]:
    """The model filter-reference directions are normalised to, and how the result names it: this run's
    checkpoint of a round (its training model x^r, not x_swa) or a checkpoint file (as its run analyses it)."""
    if reference.startswith("round:"):
        r = parse_reference_round(reference)
        if r not in ctx.source.checkpoints:
            raise LandscapeError(f"surface reference {reference}: run {ctx.source.name} has no checkpoint of "
                                 f"round {r} (it has rounds {', '.join(map(str, sorted(ctx.source.checkpoints)))})")
        return ctx.load_global(ctx.source.checkpoints[r], analysed=False), reference
    path = Path(reference)
    if not path.is_file():
        raise LandscapeError(f"surface reference {path} is not a file (give round:<r> or a checkpoint file)")
    return ctx.load_global(path), str(path)


def _random_plane(ctx: CheckpointContext, opts: SurfaceOptions) -> _Plane:
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


def _plane(ctx: CheckpointContext, opts: SurfaceOptions) -> _Plane:
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
@PASSES.register("surface", options=SurfaceOptions,
                 summary="1D / 2D loss surfaces: random (filter-normalised or euclidean), PCA, client plane, "
                         "interpolation",
                 opt_in=True, collective=True, without_clients="random directions", cost=_surface_cost)
def surface_pass(ctx: CheckpointContext, opts: SurfaceOptions) -> PassOutput:
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
            hx, hy = _auto_half_width(plane.points[:, 0]), _auto_half_width(plane.points[:, 1])
        else:
            hx = hy = parse_span(span)[1]
        x_coords, y_coords = make_axis(sizes[0], -hx, hx), make_axis(sizes[1], -hy, hy)
        spans = [[-hx, hx], [-hy, hy]]

    # Resume from a partial grid of exactly this computation (save_every does not change any value).
    key = {"schema": PARTIAL_SCHEMA, "run": ctx.source.name, "round": ctx.round,
           "checkpoint_sha256": ctx.digest, "analysis": ctx.settings.record(),
           "options": {k: v for k, v in opts.__dict__.items() if k != "save_every"},
           "d1_sha256": tensor_digest(plane.d1), "d2_sha256": None if one_d else tensor_digest(plane.d2)}
    # One partial grid per result, named as the result is (by its settings): surfaces of other settings (another
    # grid, data, span) never take over each other's partial grid.
    partial_name = result_name("surface", settings_record(ctx.settings, opts))
    partial_path = ctx.source.result_dir(ctx.round) / f"{partial_name}.partial.npz"
    partial = parallel.on_main(lambda: load_partial(partial_path, key, x_coords, y_coords))  # rank 0 reads it
    grid = evaluate_surface(
        objective, ctx.w, plane.d1, plane.d2, x_coords, y_coords,
        loss=None if partial is None else partial.loss,
        accuracy=None if partial is None else partial.accuracy,
        cells_per_batch=opts.cells_per_batch, save_every=opts.save_every,
        on_checkpoint=lambda g: save_partial(partial_path, g, key), progress=ctx.progress,
    )
    if parallel.is_main():
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
        "batched": bool(opts.cells_per_batch > 1 and _vectorizable(objective)),
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
