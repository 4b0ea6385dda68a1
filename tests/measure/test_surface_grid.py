"""Surface grids (``analyze/surface_grid.py``): symmetric odd axes with the checkpoint exactly at the
centre, lines through alpha = 0 and 1, and the grid and span specs."""

import numpy as np
import pytest

from landscape.core.errors import LandscapeError
from landscape.measure.surface.grid import make_axis, make_line, parse_grid, parse_span


def test_axes_are_symmetric_with_the_checkpoint_exactly_at_the_centre():
    for n, hi in ((41, 1.0), (5, 0.3), (3, 2.5), (51, 0.7)):
        axis = make_axis(n, -hi, hi)
        assert len(axis) == n and axis[(n - 1) // 2] == 0.0
        assert axis[0] == -hi and axis[-1] == hi
        np.testing.assert_array_equal(axis, -axis[::-1])
        np.testing.assert_allclose(np.diff(axis), 2 * hi / (n - 1), rtol=1e-12)
    assert make_axis(1, -1, 1).tolist() == [0.0]
    with pytest.raises(LandscapeError, match="odd number of points so that the checkpoint is the centre "
                                             "cell, got 40"):
        make_axis(40, -1, 1)
    with pytest.raises(LandscapeError, match="symmetric around the checkpoint .LO = -HI., got -0.5:1"):
        make_axis(41, -0.5, 1)


def test_interpolation_lines_hit_alpha_0_and_1_exactly():
    line = make_line(41, -0.5, 1.5)
    assert line[10] == 0.0 and line[30] == 1.0 and line[0] == -0.5 and line[-1] == 1.5
    assert make_line(5, -0.5, 1.5).tolist() == [-0.5, 0.0, 0.5, 1.0, 1.5]
    line = make_line(50, 0, 1)  # step 1/49: 49 * (1/49) is not 1.0 in floating point, k / 49 is
    assert line[0] == 0.0 and line[-1] == 1.0
    with pytest.raises(LandscapeError, match=r"40 points over -0.5:1.5 do not put grid points at alpha = 0 "
                                             r"and 1.*e.g. 41 points"):
        make_line(40, -0.5, 1.5)
    with pytest.raises(LandscapeError, match="must include alpha = 0 and alpha = 1, got 0.2:1.5"):
        make_line(41, 0.2, 1.5)


def test_grid_and_span_specs():
    assert parse_grid("41") == (41, 41) and parse_grid("41x25") == (41, 25) and parse_grid("41", 1) == (41,)
    assert parse_span("-1:1") == (-1.0, 1.0) and parse_span(" -0.25:0.25 ") == (-0.25, 0.25)
    for bad, message in (("41x25x3", "grid must be 'N' or 'NXxNY'"), ("a", "with whole numbers"),
                         ("0x5", "grid sizes must be positive")):
        with pytest.raises(LandscapeError, match=message):
            parse_grid(bad)
    with pytest.raises(LandscapeError, match="a 1D surface takes one number of points"):
        parse_grid("41x25", 1)
    for bad, message in (("1", "span must be 'LO:HI'"), ("a:b", "with numbers"), ("1:-1", "finite LO < HI")):
        with pytest.raises(LandscapeError, match=message):
            parse_span(bad)
