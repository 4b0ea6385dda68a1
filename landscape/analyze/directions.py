"""Directions in parameter space for loss surfaces (docs/metrics.md "Surfaces").

Four ways to pick the plane (or line) a surface is drawn on, each a plain function of flat parameter vectors:

* ``filter_normalized_direction`` / ``random_plane``: Gaussian directions with filter normalisation (Li et
  al. 2018, "Visualizing the Loss Landscape of Neural Nets", the ``filter`` norm with ``ignore = biasbn``):
  every dim-0 slice ("filter") of a weight tensor with dim > 1 is rescaled to the Frobenius norm of the same
  slice of the model, d_slice * ||w_slice|| / (||d_slice|| + 1e-10); tensors with dim <= 1 (biases, norm-layer
  scales) are zeroed. With ``ignore_1d=False`` they are kept and scaled the same way as whole tensors,
  d * ||w_t|| / (||d_t|| + 1e-10) (the reference code instead copies w into them; we keep one normaliser).
* ``pca_plane``: the top-2 principal directions of the optimisation trajectory x^t - x^T over saved
  checkpoints (Li et al. Sec. 7), with explained-variance ratios and the trajectory's coordinates.
* ``client_plane``: the plane through the global model x and two client models y_a, y_b (Gram-Schmidt), with
  every kept client projected onto it and its distance from the plane.
* ``interpolation_direction``: target - x, so alpha = 1 lands on the target (1D).

Seeding. A direction is drawn from a CPU ``torch.Generator`` seeded with the given seed, as one standard
normal vector of the model's full dimension that is then split per tensor (the same numbers whatever
``ignore_1d`` says, and the same on every device, since the draw always happens on the CPU). ``random_plane``
draws d1 and d2 from two independent streams derived from one seed, ``direction_seed(seed, 0)`` and
``direction_seed(seed, 1)`` (numpy SeedSequence mixing, so seed 0's d2 is not seed 1's d1).

All geometry (norms, Gram-Schmidt, SVD, projections) is computed in float64; directions are returned in the
model's dtype and device.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from landscape.errors import LandscapeError
from landscape.flat import FlatModel

FILTER_EPS = 1e-10  # Li et al.'s guard in d * ||w|| / (||d|| + eps)


def direction_seed(seed: int, index: int) -> int:
    """The generator seed of direction ``index`` (0 = d1, 1 = d2) of a plane drawn with ``seed``."""
    state = np.random.SeedSequence([int(seed), 7919, int(index)]).generate_state(2, np.uint64)
    return int(state[0] >> np.uint64(1))


def _normalise_like(d: Tensor, w: Tensor) -> Tensor:
    """d scaled to the Frobenius norm of w, row by row (rows = dim-0 slices), in float64."""
    d64, w64 = d.double(), w.double()
    if d.dim() > 1:
        d_rows, w_rows = d64.reshape(d.shape[0], -1), w64.reshape(w.shape[0], -1)
        scale = w_rows.norm(dim=1, keepdim=True) / (d_rows.norm(dim=1, keepdim=True) + FILTER_EPS)
        return (d_rows * scale).reshape(d.shape)
    return d64 * (w64.norm() / (d64.norm() + FILTER_EPS))


def filter_normalized_direction(flat: FlatModel, w: Tensor, seed: int, *, ignore_1d: bool = True) -> Tensor:
    """A Gaussian direction with each filter scaled to the norm of the same filter of ``w`` (Li et al. 2018).

    ``flat`` gives the tensors' names, shapes and sizes; ``w`` is the flat model. Tensors with dim > 1 are
    normalised per dim-0 slice; tensors with dim <= 1 are zeroed (``ignore_1d``) or normalised as a whole.
    """
    if w.dim() != 1 or w.numel() != flat.dim:
        raise LandscapeError(f"w must be a flat vector of {flat.dim} parameters, got shape {tuple(w.shape)}")
    generator = torch.Generator(device="cpu").manual_seed(int(seed))
    gaussian = torch.randn(flat.dim, generator=generator, dtype=torch.float32)
    parts = []
    for d_t, w_t, shape in zip(gaussian.split(flat.numels), w.detach().cpu().split(flat.numels), flat.shapes):
        d_t, w_t = d_t.view(shape), w_t.view(shape)
        if d_t.dim() <= 1 and ignore_1d:
            parts.append(torch.zeros(d_t.numel(), dtype=torch.float64))
        else:
            parts.append(_normalise_like(d_t, w_t).reshape(-1))
    return torch.cat(parts).to(w.device, w.dtype)


@dataclass(frozen=True)
class RandomPlane:
    """Two filter-normalised random directions (d2 optionally Gram-Schmidt-orthogonalised against d1)."""

    d1: Tensor
    d2: Tensor
    seed: int  # the plane's seed; the generators were seeded with ``seeds``
    seeds: tuple[int, int]  # direction_seed(seed, 0), direction_seed(seed, 1)
    ignore_1d: bool
    orthogonalized: bool
    cosine_before: float  # cos(d1, d2) as drawn (about 0 in high dimension)


def random_plane(flat: FlatModel, w: Tensor, seed: int, *, orthogonalize: bool = False,
                 ignore_1d: bool = True) -> RandomPlane:
    """d1, d2 filter-normalised from two seeded streams of ``seed``.

    With ``orthogonalize``, d2 is made orthogonal to d1 AFTER normalising (d2 - <d2, d1>/||d1||^2 d1) and then
    rescaled to its own norm before the projection, so both axes keep the model's scale (the per-filter norms
    of d2 then hold only approximately; in high dimension the correction is tiny anyway).
    """
    seeds = (direction_seed(seed, 0), direction_seed(seed, 1))
    d1 = filter_normalized_direction(flat, w, seeds[0], ignore_1d=ignore_1d)
    d2 = filter_normalized_direction(flat, w, seeds[1], ignore_1d=ignore_1d)
    a, b = d1.double(), d2.double()
    cosine = float(a @ b / (a.norm() * b.norm()).clamp_min(torch.finfo(torch.float64).tiny))
    if orthogonalize:
        if a.norm() == 0:
            raise LandscapeError("cannot orthogonalise: d1 is zero (the model has no tensor of dim > 1)")
        residual = b - (b @ a) / (a @ a) * a
        d2 = (residual * (b.norm() / residual.norm())).to(w.dtype)
    return RandomPlane(d1, d2, int(seed), seeds, ignore_1d, orthogonalize, cosine)


@dataclass(frozen=True)
class PCAPlane:
    """Top-2 principal directions of a trajectory and the trajectory in their coordinates."""

    d1: Tensor  # unit vectors, orthogonal
    d2: Tensor
    explained_variance: np.ndarray  # [2] ratios of the centred trajectory's variance, descending, in [0, 1]
    singular_values: np.ndarray  # [2]
    coordinates: np.ndarray  # [T, 2]: (<x^t - x^T, d1>, <x^t - x^T, d2>)


def _sign_fixed(v: Tensor) -> Tensor:
    """SVD signs are arbitrary: make the largest-magnitude entry positive (sklearn's svd_flip rule)."""
    return v if v[v.abs().argmax()] >= 0 else -v


def pca_plane(trajectory: Sequence[Tensor], final: Tensor) -> PCAPlane:
    """PCA of the matrix M with rows x^t - x^T (Li et al. 2018, Sec. 7).

    As in the reference code (sklearn PCA), the rows are centred before the SVD, so the directions are the
    axes of largest variance of the trajectory and the ratios are shares of its variance; the coordinates
    are projections of the uncentred x^t - x^T, so x^T itself sits at (0, 0). Needs at least 3 distinct
    points (including x^T when it is in the trajectory) to span a plane.
    """
    if len(trajectory) < 3:
        raise LandscapeError(f"PCA directions need at least 3 checkpoints of the trajectory, got "
                             f"{len(trajectory)} (train with --checkpoint-every 1 or analyse a later round)")
    final64 = final.detach().double().cpu()
    rows = torch.stack([x.detach().double().cpu() - final64 for x in trajectory])
    centred = rows - rows.mean(dim=0, keepdim=True)
    _, s, vh = torch.linalg.svd(centred, full_matrices=False)
    if len(s) < 2 or s[1] <= s[0] * 1e-6:
        raise LandscapeError("the trajectory spans less than a plane (its checkpoints lie on one line or are "
                             "equal)")
    d1, d2 = _sign_fixed(vh[0]), _sign_fixed(vh[1])
    variance = (s**2).numpy()
    ratios = variance[:2] / variance.sum()
    coords = torch.stack([rows @ d1, rows @ d2], dim=1).numpy()
    return PCAPlane(d1.to(final.device, final.dtype), d2.to(final.device, final.dtype), ratios, s[:2].numpy(),
                    coords)


@dataclass(frozen=True)
class ClientPlane:
    """The plane through x, y_a and y_b in orthonormal coordinates, and the kept clients projected onto it."""

    d1: Tensor  # (y_a - x) / ||y_a - x||
    d2: Tensor  # Gram-Schmidt of (y_b - x) against d1, normalised
    clients: tuple[int, int]  # (a, b)
    ids: np.ndarray  # [n] client ids of ``others``, ascending
    coordinates: np.ndarray  # [n, 2]: (<y_i - x, d1>, <y_i - x, d2>)
    distances: np.ndarray  # [n]: ||(y_i - x) - projection||, the distance of y_i from the plane


def client_plane(x: Tensor, y_a: Tensor, y_b: Tensor, others: dict[int, Tensor],
                 clients: tuple[int, int] = (-1, -1)) -> ClientPlane:
    """d1 = (y_a - x)/||y_a - x||; d2 = unit Gram-Schmidt residual of (y_b - x); every ``others`` projected.

    y_a lands at (||y_a - x||, 0) and y_b at (<y_b - x, d1>, ||residual||); both at distance 0.
    ``clients`` only labels the result (the ids of y_a and y_b).
    """
    x64 = x.detach().double().cpu()
    u = y_a.detach().double().cpu() - x64
    v = y_b.detach().double().cpu() - x64
    if u.norm() == 0:
        raise LandscapeError("client model y_a equals x: it does not define a direction")
    e1 = u / u.norm()
    residual = v - (v @ e1) * e1
    # Collinear up to the rounding of the models' own dtype (e.g. FedAvg with two clients: x is their mean).
    noise = 16 * torch.finfo(x.dtype).eps * float(x64.norm() + y_b.detach().double().norm())
    if residual.norm() <= 1e-9 * v.norm() + noise:
        raise LandscapeError("the two client models are collinear with x (as when x is the average of just "
                             "these two): they do not span a plane; pick clients of a round with at least 3 "
                             "kept models")
    e2 = residual / residual.norm()
    ids = sorted(others)
    coords = np.zeros((len(ids), 2))
    distances = np.zeros(len(ids))
    for k, i in enumerate(ids):
        delta = others[i].detach().double().cpu() - x64
        c1, c2 = delta @ e1, delta @ e2
        coords[k] = (float(c1), float(c2))
        distances[k] = float((delta - c1 * e1 - c2 * e2).norm())
    return ClientPlane(e1.to(x.device, x.dtype), e2.to(x.device, x.dtype), clients,
                       np.array(ids, dtype=np.int64), coords, distances)


def interpolation_direction(x: Tensor, target: Tensor) -> Tensor:
    """target - x: the line x + alpha (target - x) passes x at alpha = 0 and the target at alpha = 1."""
    if x.shape != target.shape:
        raise LandscapeError(f"cannot interpolate between models of {x.numel()} and {target.numel()} "
                             "parameters")
    return target.detach().to(x.device, x.dtype) - x.detach()
