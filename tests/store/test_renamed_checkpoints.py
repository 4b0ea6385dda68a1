"""A checkpoint is the round it records, not the round its file name says (issue 46, W3): a round-NNNN.pt renamed,
or copied over another round's, is refused in one line by analyze and open_run(...).model(), never analysed or
loaded under the name's round (``--resume`` refuses it the same way already)."""

from __future__ import annotations

import shutil

import pytest
from support.helpers import invoke, one_line_error

import landscape
from landscape.core.errors import LandscapeError


@pytest.mark.parametrize("damage", ["renamed", "copied"])
def test_a_checkpoint_under_another_rounds_name_is_refused(six_round_copy, damage):
    checkpoints = six_round_copy / "checkpoints"
    if damage == "renamed":  # round 4's checkpoint renamed to round 9
        (checkpoints / "round-0004.pt").rename(checkpoints / "round-0009.pt")
        named, held = 9, 4
    else:  # round 2's checkpoint copied over round 4's
        shutil.copyfile(checkpoints / "round-0002.pt", checkpoints / "round-0004.pt")
        named, held = 4, 2
    line = one_line_error(invoke("analyze", six_round_copy, "--passes", "loss", "--checkpoints", str(named),
                                 "--analysis-samples", "64", "--device", "cpu", "--quiet"))
    assert f"round-{named:04d}.pt holds round {held}, its name says round {named}" in line, line
    assert not (six_round_copy / "analysis" / f"round-{named:04d}").exists()  # nothing filed under the name's round
    with pytest.raises(LandscapeError, match=f"holds round {held}, its name says round {named}"):
        landscape.open_run(six_round_copy).model(named)
    assert landscape.open_run(six_round_copy).model(6) is not None  # the others load as before
