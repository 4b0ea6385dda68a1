"""Reading the files of the ``surface`` analysis pass (NPZ arrays + JSON metadata) into ``SurfaceData``, with
the figures' axis labels and the comparison of several models' planes.

Input: ``analysis/round-NNNN/surface.npz`` (``loss``, ``accuracy``, ``x_coords``, ``y_coords`` and, by
directions, ``trajectory`` / ``trajectory_rounds`` or ``client_ids`` / ``client_coords``) and, when it sits
beside it, ``surface.json`` (the pass's record: directions, explained variance, clients, data, run, round).
A bare NPZ with ``loss`` and ``x_coords`` (and ``y_coords``) is enough; labels then fall back to d1 / d2.

Orientation. Surfaces are stored ``[ix, iy]`` (first index along d1). Matplotlib's ``contour(X, Y, Z)`` and
plotly's ``Surface(x, y, z)`` both take Z with ROWS along y and COLUMNS along x, so every renderer draws
``Z = values.T`` against ``X, Y = meshgrid(x_coords, y_coords)`` (``image_arrays``): d1 is the horizontal
axis of every picture.

Several models side by side: ``compare_planes`` says whether their surfaces lie on one plane (euclidean
or filter-reference directions, the stored d1 / d2 equal) or each on its model's own filter-normalised plane,
with each model's weight norm ||x||; the panels and the HTML put ||x|| under each title and that line under
the panels.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from landscape.core.errors import LandscapeError
from landscape.core.reading import read_json
from landscape.store.results.files import read_arrays

# -- reading ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SurfaceData:
    """One surface as read from its files: values [nx, ny] (or [nx]) and what the figures need to label it."""

    x_coords: np.ndarray
    y_coords: np.ndarray | None
    loss: np.ndarray
    accuracy: np.ndarray | None = None
    meta: dict[str, Any] = field(default_factory=dict)  # the JSON record's "result" (may be empty)
    run: str = ""
    round: int | None = None
    extra: dict[str, np.ndarray] = field(default_factory=dict)  # trajectory, client_coords, ...

    @classmethod
    def from_arrays(cls, x_coords: Any, loss: Any, y_coords: Any = None, accuracy: Any = None,
                    meta: dict[str, Any] | None = None, run: str = "") -> SurfaceData:
        """A surface from arrays in our layout ([nx, ny] values, or [nx] for a line)."""
        surface = cls(np.asarray(x_coords, float), None if y_coords is None else np.asarray(y_coords, float),
                      np.asarray(loss, float), None if accuracy is None else np.asarray(accuracy, float),
                      dict(meta or {}), run)
        surface.check()
        return surface

    @property
    def is_2d(self) -> bool:
        return self.y_coords is not None

    def check(self) -> None:
        expected = (len(self.x_coords),) + (() if self.y_coords is None else (len(self.y_coords),))
        if self.loss.shape != expected:
            raise LandscapeError(f"surface values have shape {self.loss.shape}, but the coordinates give "
                                 f"{expected} ([ix, iy] layout)")
        if min(expected) < 2:
            raise LandscapeError(f"a surface of {'x'.join(map(str, expected))} points cannot be drawn "
                                 "(at least 2 per axis; the surface pass computes 3 or more)")

    def values(self, quantity: str = "loss") -> np.ndarray:
        values = {"loss": self.loss, "accuracy": self.accuracy}.get(quantity)
        if values is None:
            raise LandscapeError(f"this surface has no '{quantity}' values (loss or accuracy)")
        return values

    def axis_labels(self) -> tuple[str, str]:
        return axis_labels(self.meta)

    def quantity_label(self, quantity: str = "loss") -> str:
        text = str(self.meta.get("quantity", "loss"))
        return text.replace("loss", "accuracy", 1) if quantity == "accuracy" else text

    def title(self) -> str:
        if self.run and self.round is not None:
            return f"{self.run}, round {self.round}"
        return self.run


def load_surface(path: str | Path) -> SurfaceData:
    """Read ``surface.npz`` (give the NPZ or its JSON) and the JSON record beside it when present."""
    path = Path(path)
    npz = path.with_suffix(".npz")
    if not npz.exists():
        raise LandscapeError(f"surface file not found: {npz}")
    arrays = read_arrays(npz)  # a cut, oversized or special file: one line naming it
    if "loss" not in arrays or "x_coords" not in arrays:
        raise LandscapeError(f"{npz} is not a surface file (it has no 'loss' and 'x_coords')")
    record: dict[str, Any] = {}
    sidecar = npz.with_suffix(".json")
    if sidecar.exists():
        record = read_json(sidecar, "a surface record")
        if not isinstance(record, dict) or not isinstance(record.get("result", {}), dict):
            raise LandscapeError(f"{sidecar} is not a surface record (a JSON object with a 'result' table); "
                                 "rerun the surface pass with --force")
    known = {"loss", "accuracy", "x_coords", "y_coords"}
    surface = SurfaceData(
        arrays["x_coords"].astype(float), arrays["y_coords"].astype(float) if "y_coords" in arrays else None,
        arrays["loss"].astype(float), arrays["accuracy"].astype(float) if "accuracy" in arrays else None,
        record.get("result", {}), str(record.get("run", npz.parent.name)), record.get("round"),
        {k: v for k, v in arrays.items() if k not in known},
    )
    surface.check()
    return surface


def _as_surface(source: str | Path | SurfaceData) -> SurfaceData:
    if isinstance(source, SurfaceData):
        return source
    if not isinstance(source, (str, Path)):
        raise TypeError(f"the surface figures take a surface file (a path) or SurfaceData, not "
                        f"{type(source).__name__}; a result of landscape.surface is drawn by "
                        "landscape.plot_surface")
    return load_surface(source)


def normalization_of(meta: dict[str, Any]) -> str | None:
    """How a random plane was normalised: filter (per model; also every record written before the option
    existed), euclidean or filter-reference; None for other directions (or no record)."""
    if meta.get("directions") != "random":
        return None
    return str(meta.get("normalization") or "filter")


def axis_labels(meta: dict[str, Any]) -> tuple[str, str]:
    """The names of the two directions, as the figures write them."""
    kind = meta.get("directions")
    if kind == "random":
        ortho = ", orthogonalised" if meta.get("orthogonalize") else ""
        normalization = normalization_of(meta)
        if normalization == "euclidean":
            length = f"{float(meta.get('length', float('nan'))):g}"
            return f"d1 (random, ||d1|| = {length})", f"d2 (random, ||d2|| = {length}{ortho})"
        if normalization == "filter-reference":
            to = f"filter-normalised to {meta.get('reference', 'a reference')}"
            return f"d1 (random, {to})", f"d2 (random, {to}{ortho})"
        return "d1 (filter-normalised random)", f"d2 (filter-normalised random{ortho})"
    if kind == "pca":
        ratios = list(meta.get("explained_variance", [])) + [float("nan")] * 2
        return f"PC1 ({100 * float(ratios[0]):.1f}% var.)", f"PC2 ({100 * float(ratios[1]):.1f}% var.)"
    if kind == "clients":
        a, b = (list(meta.get("clients", [])) + ["a", "b"])[:2]
        return f"client {a} direction", f"client {b} direction (Gram-Schmidt)"
    if kind == "interpolate":
        return f"alpha (x -> {meta.get('target', 'target')})", ""
    return "d1", "d2"


def image_arrays(surface: SurfaceData, quantity: str = "loss") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(X, Y, Z) for matplotlib / plotly: Z[iy, ix] = values[ix, iy], X[iy, ix] = x_coords[ix]."""
    if not surface.is_2d:
        raise LandscapeError("this surface is a 1D line; draw it with plot_curve_1d")
    x_grid, y_grid = np.meshgrid(surface.x_coords, surface.y_coords, indexing="xy")
    return x_grid, y_grid, surface.values(quantity).T


# -- comparing surfaces of several models -------------------------------------------------------------------


@dataclass(frozen=True)
class PlaneComparison:
    """Whether surfaces drawn side by side share one plane, so that their axes are one distance in parameter
    space and their widths compare the models; with every model's weight norm ||x|| to print beside them.

    ``normalizations``: each surface's (``normalization_of``: filter | euclidean | filter-reference, None for
    pca / clients / interpolate or a bare NPZ). ``weight_norms``: each surface's ``weight_norm`` record (None
    where it was written before the pass recorded it). ``comparable``: every surface a random plane of a mode
    whose directions do not depend on the model (euclidean, filter-reference) with the same settings.
    ``same_plane``: the stored d1 (and d2) are equal for all of them (None when some NPZ lacks them)."""

    normalizations: tuple[str | None, ...]
    weight_norms: tuple[float | None, ...]
    comparable: bool
    same_plane: bool | None
    text: str  # one line for a caption or under a table
    planes: str = ""  # what the planes are, without the weight norms (``text`` is it + '; ' + the norms)


def weight_norm_text(surface: SurfaceData) -> str:
    """'||x|| = 23.41' from the surface's record ('' when it does not hold one)."""
    norm = surface.meta.get("weight_norm")
    return f"||x|| = {float(norm):.4g}" if isinstance(norm, (int, float)) else ""


def compare_planes(sources: Sequence[str | Path | SurfaceData], labels: Sequence[str] | None = None
                   ) -> PlaneComparison:
    """What a side-by-side picture of these surfaces compares (``PlaneComparison``), with a line that says it:
    per-model filter normalisation (Li et al. 2018) scales each plane with its own model's filters, so a plane
    of a model with c times the weights reaches c times as far per axis unit; euclidean directions (one stated
    length) and filter directions normalised to one reference model are the same vector for every model."""
    surfaces = [_as_surface(s) for s in sources]
    labels = list(labels) if labels else [s.title() or f"surface {k}" for k, s in enumerate(surfaces)]
    modes = tuple(normalization_of(s.meta) for s in surfaces)
    norms = tuple(float(s.meta["weight_norm"]) if isinstance(s.meta.get("weight_norm"), (int, float))
                  else None for s in surfaces)
    settings = {(m, s.meta.get("length") if m == "euclidean" else s.meta.get("reference"))
                for m, s in zip(modes, surfaces)}
    comparable = all(m in ("euclidean", "filter-reference") for m in modes) and len(settings) == 1
    names = [k for k in ("d1", "d2") if all(k in s.extra for s in surfaces)]
    same = (None if "d1" not in names else
            all(np.array_equal(s.extra[k], surfaces[0].extra[k]) for s in surfaces for k in names))
    given = [f"{label} = {norm:.4g}" for label, norm in zip(labels, norms) if norm is not None]
    norms_text = ("||x||: " + ", ".join(given)) if given else "||x|| not recorded (rerun the surface pass)"
    if comparable:
        mode, setting = next(iter(settings))
        what = (f"euclidean directions of length {float(setting):g}" if mode == "euclidean"
                else f"directions filter-normalised to {setting}")
        plane = {True: "one plane for every model (identical d1, d2)", False: "but the planes differ "
                 "(other seeds or architectures)", None: "one setting for every model"}[same]
        planes = f"{what}: {plane}"
    elif all(m == "filter" for m in modes):
        planes = ("per-model filter-normalised planes (Li et al. 2018): each axis unit scales with that "
                  "model's own filters, so the widths also compare weight norms")
    elif all(m in ("euclidean", "filter-reference") for m in modes):
        shown = ", ".join(sorted(f"{m} {'length' if m == 'euclidean' else 'to'} {v}" for m, v in settings))
        planes = f"planes of different settings ({shown}): the axes are not one distance"
    else:
        shown = ", ".join(sorted({m or "not a random plane" for m in modes}))
        planes = f"planes of different normalisations ({shown}): the axes are not one distance"
    return PlaneComparison(modes, norms, comparable, same, f"{planes}; {norms_text}", planes)


def _short_labels(titles: Sequence[str]) -> list[str]:
    """Panel titles without the settings they show ('label, round 30 [grid=21, ...]' -> 'label, round 30'),
    for the caption line that names every panel's ||x||."""
    return [title.split("\n")[0].split(" [")[0] for title in titles]


def _panel_titles(surfaces: list[SurfaceData], titles: list[str]) -> list[str]:
    """Titles with each model's ||x|| under them, when there is more than one panel."""
    if len(surfaces) < 2:
        return titles
    return [f"{title}\n{weight_norm_text(s)}" if weight_norm_text(s) else title
            for title, s in zip(titles, surfaces)]
