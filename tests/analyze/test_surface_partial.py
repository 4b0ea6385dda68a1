"""Partial surface grids on disk (``analyze/surface_partial.py``): a file that cannot be used is
ignored."""

from landscape.analyze.surface.partial import load_partial, save_partial
from landscape.measure.surface.grid import SurfaceGrid, make_axis


def test_partial_files_that_cannot_be_used_are_ignored(tmp_path):
    xs = make_axis(3, -1, 1)
    assert load_partial(tmp_path / "none.npz", {}, xs, xs) is None
    (tmp_path / "bad.npz").write_bytes(b"not a zip file")
    assert load_partial(tmp_path / "bad.npz", {}, xs, xs) is None
    save_partial(tmp_path / "line.npz", SurfaceGrid.empty(xs), {})
    assert load_partial(tmp_path / "line.npz", {}, xs, xs) is None  # saved 1D, asked 2D
    assert load_partial(tmp_path / "line.npz", {}, xs, None).shape == (3,)
