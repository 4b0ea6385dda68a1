"""Links planted in a received run never carry a write outside it (issue 46, S3): ``analysis``, a round folder,
``checkpoints`` or a tracker's folder linked to a folder outside is refused in one line naming the link, before
anything is written there; a user's file in that folder under a result's name is never replaced."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from support.helpers import analyze_args, invoke, one_line_error, snapshot

NOTES = b"MY THESIS NOTES\n"


def _plant(run: Path, outside: Path, where: str) -> Path:
    """Move ``run/where`` (a folder the run holds, or a new one) to ``outside`` and leave a link in its place;
    a user's file lies in the outside folder under every name the run's folder holds, and a few more."""
    link = run / where
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.exists():
        shutil.move(str(link), str(outside))
    outside.mkdir(parents=True, exist_ok=True)
    for name in ("round-0008.pt", "events.out.tfevents.1", "logged-results.json", "metrics-logged.json"):
        (outside / name).write_bytes(NOTES)
    link.symlink_to(outside, target_is_directory=True)
    return link


def _analyze(run: Path):
    return invoke(*analyze_args(run, "--passes", "loss", "--checkpoints", "6"))


def _resume(run: Path):
    return invoke("train", "--resume", run, "--rounds", "8", "--quiet")


def _resume_logged(run: Path):
    recipe = run / "recipe.toml"
    recipe.write_text(recipe.read_text().replace("log = []", 'log = ["tensorboard"]'))
    assert 'log = ["tensorboard"]' in recipe.read_text()
    return _resume(run)


CASES = {  # the folder linked outside, what is done to the run
    "analysis": ("analysis", _analyze),
    "round folder": ("analysis/round-0006", _analyze),
    "checkpoints": ("checkpoints", _resume),
    "tensorboard": ("tensorboard", _resume_logged),
}


@pytest.mark.parametrize("case", CASES)
def test_a_link_planted_in_a_run_never_carries_a_write_outside_it(six_round_copy, tmp_path, case):
    where, action = CASES[case]
    run = six_round_copy
    if where.startswith("analysis/"):  # the round folder's results named as the user's notes are
        assert _analyze(run).exit_code == 0
        for result in (run / where).glob("*.json"):
            result.write_bytes(NOTES)
    outside = tmp_path / "outside"
    link = _plant(run, outside, where)
    before = snapshot(outside)
    line = one_line_error(action(run))
    assert snapshot(outside) == before, "a file outside the run was written or replaced through a link"
    assert sorted(p.name for p in outside.iterdir()) == sorted(before), "a file was made outside the run"
    assert f"{link} is a symbolic link in the run {run}" in line, line



@pytest.mark.parametrize("name", ["result", "recipe.toml", "partition.json"])
def test_a_file_linked_outside_is_never_written_through(six_round_copy, tmp_path, name):
    """A link in place of one of the run's files (a result, recipe.toml, partition.json), pointing at a user's file
    outside: the file outside keeps its bytes whatever is done to the run (analyze --force, --resume); a file
    written anew replaces the link (already so before issue 46: kept here beside the folder links)."""
    run = six_round_copy
    if name == "result":
        assert _analyze(run).exit_code == 0
        (target,) = (run / "analysis" / "round-0006").glob("loss*.json")
    else:
        target = run / name
    outside = tmp_path / "notes.txt"
    outside.write_bytes(NOTES)
    target.unlink()
    target.symlink_to(outside)
    done = invoke(*analyze_args(run, "--passes", "loss", "--checkpoints", "6", "--force")) if name == "result" \
        else _resume(run)
    assert outside.read_bytes() == NOTES, "the file outside the run was written through the link"
    if name == "recipe.toml":  # the notes read as the run's recipe: refused, nothing written
        assert "recipe.toml: not valid TOML" in one_line_error(done) and target.is_symlink()
    else:  # written beside the link: a plain file in its place
        assert done.exit_code == 0, done.output
        assert target.is_file() and not target.is_symlink()


@pytest.mark.parametrize("tracker", ["tensorboard", "wandb"])
def test_a_trackers_folder_linked_outside_is_refused_before_the_tracker_starts(six_round_copy, tmp_path, tracker):
    """The trackers' folders are checked before either tracker is imported or started (wandb need not be
    installed for the refusal)."""
    from landscape.core.errors import LandscapeError
    from landscape.store.tracking import RunTrackers

    link = _plant(six_round_copy, tmp_path / "outside", tracker)
    before = snapshot(tmp_path / "outside")
    with pytest.raises(LandscapeError) as refused:
        RunTrackers(six_round_copy, [tracker], "p")
    assert f"{link} is a symbolic link in the run {six_round_copy}" in str(refused.value)
    assert snapshot(tmp_path / "outside") == before


@pytest.mark.parametrize("where", ["analysis", "analysis/round-0006"])
def test_analyze_refuses_a_planted_link_before_any_work(six_round_copy, tmp_path, monkeypatch, where):
    """The link is named before a pass is computed, not when its first result is filed."""
    from landscape.analyze import scheduler

    computed = []
    monkeypatch.setattr(scheduler, "_run_job", lambda job, *args, **kwargs: computed.append(job))
    link = _plant(six_round_copy, tmp_path / "outside", where)
    line = one_line_error(_analyze(six_round_copy))
    assert f"{link} is a symbolic link in the run {six_round_copy}" in line, line
    assert computed == [], "a pass was computed before the link was refused"
