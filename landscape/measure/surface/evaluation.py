"""Evaluating a loss surface: F and accuracy at the missing cells of a ``SurfaceGrid`` around w
(docs/metrics.md "Surfaces").

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
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.func import vmap

from landscape.core import parallel
from landscape.core.errors import LandscapeError
from landscape.core.memory_format import channels_last_copy
from landscape.measure.objective import Objective
from landscape.measure.surface.grid import SurfaceGrid


def vectorizable(objective: Any) -> bool:
    """Whether the cells of ``objective`` can share a vmapped forward pass: a ``landscape`` ``Objective``
    without BatchNorm or in BN mode ``eval`` (other BN modes' statistics depend on each cell's w)."""
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
    return {name: channels_last_copy(t) for name, t in objective.flat.params(w).items()}


@torch.no_grad()
def _cell_one_pass(objective: Objective, w: Tensor) -> tuple[float, float]:
    """(F(w), accuracy) in one pass over the data, with the objective's BN handling (the sums of ``loss``);
    on the CPU with channels-last convolution weights (``_channels_last_parameters``)."""
    buffers = objective.buffers_for(w)
    channels_last = w.device.type == "cpu"
    tensors = {**(_channels_last_parameters(objective, w) if channels_last else objective.flat.params(w)),
               **buffers}
    total = torch.zeros((), dtype=torch.float64, device=w.device)
    correct = torch.zeros((), dtype=torch.long, device=w.device)
    with objective.bn_mode_context():
        for xb, yb in objective.data.batches():
            logits = objective.flat.call(tensors, xb)
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
    all return the whole grid; ``on_checkpoint``, the progress bar and the progress callable run on rank 0
    only.
    """
    if (d2 is None) != (y_coords is None):
        raise LandscapeError("a 2D surface needs both d2 and y_coords; a 1D line neither")
    if cells_per_batch < 1 or save_every < 1 or (cells_per_pass is not None and cells_per_pass < 1):
        raise LandscapeError("cells_per_batch, cells_per_pass and save_every must be at least 1")
    grid, directions, coords = _start_grid(w, d1, d2, x_coords, y_coords, loss, accuracy)
    if cells_per_pass is None:
        cells_per_pass = default_cells_per_pass(w.device, cells_per_batch)
    cells_per_pass = min(cells_per_pass, cells_per_batch)
    batched = vectorize and cells_per_pass > 1 and vectorizable(objective)
    cells = _Cells(objective, w, directions, coords, batched, cells_per_pass)
    # Fixed chunks of the C-ordered cells, keeping only missing cells. Under torchrun the ranks take the
    # chunks in turn (a step: one chunk each) and gather the step's values, so every rank holds the whole
    # grid and a chunk holds the same cells, with the same values, whatever the number of ranks.
    order = list(np.ndindex(grid.shape))  # C order over [ix, iy]
    missing = grid.missing_mask
    chunks = [chunk for start in range(0, len(order), cells_per_batch)
              if (chunk := [c for c in order[start : start + cells_per_batch] if missing[c]])]
    ranks, me = parallel.world_size(), parallel.rank()
    steps = _Steps(progress, sum(len(chunk) for chunk in chunks), on_checkpoint, save_every)
    try:
        for step in range(0, len(chunks), ranks):
            group = chunks[step : step + ranks]
            mine = cells.compute(group[me]) if me < len(group) else []
            for values in parallel.all_gather_objects(mine):
                for cell, lo, ac in values:
                    grid.loss[cell], grid.accuracy[cell] = lo, ac
            steps.done(grid, sum(len(chunk) for chunk in group))
    finally:
        steps.bar.close()
    return SurfaceGrid(grid.x_coords, grid.y_coords, grid.loss, grid.accuracy, steps.evaluated)


def _start_grid(w: Tensor, d1: Tensor, d2: Tensor | None, x_coords: np.ndarray, y_coords: np.ndarray | None,
                loss: np.ndarray | None,
                accuracy: np.ndarray | None) -> tuple[SurfaceGrid, list[Tensor], list[np.ndarray]]:
    """The grid ``evaluate_surface`` starts from (the given loss and accuracy, else all NaN), its directions
    and its coordinate axes, each checked in one line."""
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
    return grid, directions, coords


class _Cells:
    """F and accuracy at the cells w + sum_k c_k d_k of a surface: vmapped ``cells_per_pass`` at a time
    (``batched``), else one at a time (in one pass over the data for an ``Objective``); the centre cell always
    by the objective itself on the unmodified w."""

    def __init__(self, objective: Any, w: Tensor, directions: list[Tensor], coords: list[np.ndarray],
                 batched: bool, cells_per_pass: int) -> None:
        self.objective, self.w, self.directions, self.coords = objective, w, directions, coords
        self.batched, self.cells_per_pass = batched, cells_per_pass
        self.buffer = torch.empty_like(w)

    def coefficients(self, cell: tuple[int, ...]) -> list[float]:
        return [float(axis[i]) for axis, i in zip(self.coords, cell)]

    def point(self, coeffs: list[float]) -> Tensor:
        """w + sum_k c_k d_k built in place; zero coefficients add nothing, so (0, 0) is exactly w."""
        self.buffer.copy_(self.w)
        for c, d in zip(coeffs, self.directions):
            if c != 0.0:
                self.buffer.add_(d, alpha=c)
        return self.buffer

    def compute(self, chunk: list[tuple[int, ...]]) -> list[tuple[tuple[int, ...], float, float]]:
        """(cell, F, accuracy) of every cell of one chunk."""
        objective, w = self.objective, self.w
        values, rest = [], []
        for cell in chunk:
            coeffs = self.coefficients(cell)
            if all(c == 0.0 for c in coeffs):  # the checkpoint itself: F(w) as the objective gives it
                values.append((cell, float(objective.loss(w)), float(objective.accuracy(w))))
            else:
                rest.append((cell, coeffs))
        if self.batched and rest:
            values += self._vmapped(rest)
        elif isinstance(objective, Objective):
            values += [(cell, *_cell_one_pass(objective, self.point(coeffs))) for cell, coeffs in rest]
        else:
            for cell, coeffs in rest:
                w_cell = self.point(coeffs)
                values.append((cell, float(objective.loss(w_cell)), float(objective.accuracy(w_cell))))
        return values

    def _vmapped(self, rest: list[tuple[tuple[int, ...], list[float]]]) -> list[tuple[tuple[int, ...], float, float]]:
        """(cell, F, accuracy) of the cells ``rest`` (cell, coefficients), ``cells_per_pass`` to a forward pass."""
        w, values = self.w, []
        for start in range(0, len(rest), self.cells_per_pass):
            part = rest[start : start + self.cells_per_pass]
            c = torch.tensor([coeffs for _, coeffs in part], dtype=w.dtype, device=w.device)
            weights = w.expand(len(part), -1).clone()
            for k, d in enumerate(self.directions):
                weights.addcmul_(c[:, k : k + 1], d.unsqueeze(0))
            losses, accs = _cells_vmapped(self.objective, weights)
            values += [(cell, float(lo), float(ac)) for (cell, _), lo, ac in zip(part, losses, accs)]
        return values


class _Steps:
    """What follows each step of ``evaluate_surface``: the cells counted, the progress bar and the progress
    callable updated, and ``on_checkpoint`` called every ``save_every`` cells (on rank 0; never after the
    last step)."""

    def __init__(self, progress: bool | None | Callable[[int, int | None], None], pending: int,
                 on_checkpoint: Callable[[SurfaceGrid], None] | None, save_every: int) -> None:
        from landscape.core.progress import progress_bar

        self.main = parallel.is_main()
        self.report = progress if callable(progress) and self.main else None
        show = None if progress is None else (progress is True)
        self.bar = progress_bar(total=pending, desc="surface", unit="cell", leave=False, dynamic_ncols=True,
                                disable=(None if show is None else not show) if self.main and not callable(progress)
                                else True)
        self.pending, self.on_checkpoint, self.save_every = pending, on_checkpoint, save_every
        self.evaluated = self.since_save = 0

    def done(self, grid: SurfaceGrid, count: int) -> None:
        self.evaluated += count
        self.since_save += count
        self.bar.update(count)
        if self.report is not None:
            self.report(self.evaluated, self.pending)
        if self.on_checkpoint is not None and self.since_save >= self.save_every and self.evaluated < self.pending:
            self.since_save = 0
            if self.main:
                self.on_checkpoint(grid)
