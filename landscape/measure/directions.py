"""Directions in parameter space for loss surfaces (docs/metrics.md "Surfaces").

Four ways to pick the plane (or line) a surface is drawn on, each a plain function of flat parameter vectors:

* ``filter_normalized_direction`` / ``random_plane``: Gaussian directions with filter normalisation (Li et
  al. 2018, "Visualizing the Loss Landscape of Neural Nets", the ``filter`` norm with ``ignore = biasbn``):
  every dim-0 slice ("filter") of a weight tensor with dim > 1 is rescaled to the Frobenius norm of the same
  slice of the model, d_slice * ||w_slice|| / (||d_slice|| + 1e-10); tensors with dim <= 1 (biases, norm-layer
  scales) are zeroed. With ``ignore_1d=False`` they are kept and scaled the same way as whole tensors,
  d * ||w_t|| / (||d_t|| + 1e-10) (the reference code instead copies w into them; we keep one normaliser).
* ``euclidean_direction``: the same seeded Gaussian draw (dim <= 1 tensors zeroed with ``ignore_1d``),
  scaled as a whole to one stated Euclidean length, d = length * g / ||g||. It does not depend on the
  model's weights, so two models of one architecture get the same vector from the same seed and one unit of
  a surface axis is the same distance in parameter space for both (the geometry of lambda_max and S_rho).
  ``random_plane(..., normalization="filter-reference", reference=x_ref)`` filter-normalises to one named
  reference model x_ref instead of each model's own weights (also the same vector for every model).
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

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from landscape.core.errors import LandscapeError
from landscape.core.flat import FlatModel

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


def _check_flat(flat: FlatModel, w: Tensor, what: str = "w") -> None:
    if w.dim() != 1 or w.numel() != flat.dim:
        raise LandscapeError(f"{what} must be a flat vector of {flat.dim} parameters, got shape {tuple(w.shape)}")


def _gaussian(flat: FlatModel, seed: int) -> Tensor:
    """The standard normal draw of a direction: float32, the model's full dimension, a CPU generator."""
    generator = torch.Generator(device="cpu").manual_seed(int(seed))
    return torch.randn(flat.dim, generator=generator, dtype=torch.float32)


def filter_normalized_direction(flat: FlatModel, w: Tensor, seed: int, *, ignore_1d: bool = True) -> Tensor:
    """A Gaussian direction with each filter scaled to the norm of the same filter of ``w`` (Li et al. 2018).

    ``flat`` gives the tensors' names, shapes and sizes; ``w`` is the flat model. Tensors with dim > 1 are
    normalised per dim-0 slice; tensors with dim <= 1 are zeroed (``ignore_1d``) or normalised as a whole.
    """
    _check_flat(flat, w)
    gaussian = _gaussian(flat, seed)
    parts = []
    for d_t, w_t, shape in zip(gaussian.split(flat.numels), w.detach().cpu().split(flat.numels), flat.shapes):
        d_t, w_t = d_t.view(shape), w_t.view(shape)
        if d_t.dim() <= 1 and ignore_1d:
            parts.append(torch.zeros(d_t.numel(), dtype=torch.float64))
        else:
            parts.append(_normalise_like(d_t, w_t).reshape(-1))
    return torch.cat(parts).to(w.device, w.dtype)


def euclidean_direction(flat: FlatModel, seed: int, length: float, *, ignore_1d: bool = True,
                        like: Tensor | None = None) -> Tensor:
    """The seeded Gaussian g of ``filter_normalized_direction`` (the same draw), its dim <= 1 tensors zeroed
    with ``ignore_1d``, scaled as a whole to Euclidean norm ``length``: d = length * g / ||g|| (in float64).

    It does not depend on any model's weights: every model of one architecture gets the same vector from the
    same seed. Returned in ``like``'s dtype and device (default float32 on the CPU).
    """
    if isinstance(length, bool) or not isinstance(length, (int, float)) or not math.isfinite(length) \
            or length <= 0:
        raise LandscapeError(f"a euclidean direction's length must be a finite number > 0, got {length!r}")
    if like is not None:
        _check_flat(flat, like, "like")
    gaussian = _gaussian(flat, seed).double()
    if ignore_1d:
        gaussian = torch.cat([g if len(shape) > 1 else torch.zeros_like(g)
                              for g, shape in zip(gaussian.split(flat.numels), flat.shapes)])
    norm = gaussian.norm()
    if norm == 0:
        raise LandscapeError("the model has no tensor of dim > 1 to draw a direction in (ignore_1d zeroes "
                             "the others); set ignore_1d = false")
    d = gaussian * (float(length) / norm)
    return d if like is None else d.to(like.device, like.dtype)


NORMALIZATIONS = ("filter", "euclidean", "filter-reference")


@dataclass(frozen=True)
class RandomPlane:
    """Two seeded random directions (d2 optionally Gram-Schmidt-orthogonalised against d1), normalised by
    ``normalization``: "filter" (to the model's own filters, Li et al. 2018), "euclidean" (each of norm
    ``length``, the same for every model) or "filter-reference" (to a reference model's filters)."""

    d1: Tensor
    d2: Tensor
    seed: int  # the plane's seed; the generators were seeded with ``seeds``
    seeds: tuple[int, int]  # direction_seed(seed, 0), direction_seed(seed, 1)
    ignore_1d: bool
    orthogonalized: bool
    cosine_before: float  # cos(d1, d2) as drawn (about 0 in high dimension)
    normalization: str = "filter"
    length: float | None = None  # euclidean: ||d1|| = ||d2|| = length; None otherwise


def random_plane(flat: FlatModel, w: Tensor, seed: int, *, orthogonalize: bool = False,
                 ignore_1d: bool = True, normalization: str = "filter", length: float = 1.0,
                 reference: Tensor | None = None) -> RandomPlane:
    """d1, d2 from two seeded streams of ``seed``, normalised by ``normalization``:

    - "filter": ``filter_normalized_direction`` to the filters of ``w`` (Li et al. 2018; per model);
    - "euclidean": ``euclidean_direction`` of norm ``length`` (independent of ``w``: one plane for every model
      of the architecture);
    - "filter-reference": ``filter_normalized_direction`` to the filters of ``reference`` (one plane for
      every model normalised to that reference).

    With ``orthogonalize``, d2 is made orthogonal to d1 AFTER normalising (d2 - <d2, d1>/||d1||^2 d1) and then
    rescaled to its own norm before the projection, so both axes keep their scale (``length`` in the euclidean
    mode; the per-filter norms of d2 then hold only approximately; in high dimension the correction is tiny).
    The directions are in ``w``'s dtype and device.
    """
    if normalization not in NORMALIZATIONS:
        raise LandscapeError(f"unknown normalization '{normalization}'; choose from: " + ", ".join(NORMALIZATIONS))
    _check_flat(flat, w)
    seeds = (direction_seed(seed, 0), direction_seed(seed, 1))
    if normalization == "euclidean":
        d1, d2 = (euclidean_direction(flat, s, length, ignore_1d=ignore_1d, like=w) for s in seeds)
    else:
        if normalization == "filter-reference":
            if reference is None:
                raise LandscapeError("normalization 'filter-reference' needs the reference model")
            _check_flat(flat, reference, "the reference model")
            base = reference.detach().to(w.device, w.dtype)
        else:
            base = w
        d1, d2 = (filter_normalized_direction(flat, base, s, ignore_1d=ignore_1d) for s in seeds)
    a, b = d1.double(), d2.double()
    cosine = float(a @ b / (a.norm() * b.norm()).clamp_min(torch.finfo(torch.float64).tiny))
    if orthogonalize:
        if a.norm() == 0:
            raise LandscapeError("cannot orthogonalise: d1 is zero (the model has no tensor of dim > 1)")
        residual = b - (b @ a) / (a @ a) * a
        d2 = (residual * (b.norm() / residual.norm())).to(w.dtype)
    return RandomPlane(d1, d2, int(seed), seeds, ignore_1d, orthogonalize, cosine, normalization,
                       float(length) if normalization == "euclidean" else None)


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
