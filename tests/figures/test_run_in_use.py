"""A run another process is training into (its ``RunLock`` held) is named as in use where a figure, the report,
compare or a claim read what it lacks (issue 46, U5), instead of the advice for a finished run ("train with
--eval-every", "run landscape analyze")."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap

import pytest

from landscape.claims.files import run_value
from landscape.core.errors import LandscapeError
from landscape.figures import curves, extract
from landscape.figures.compare import compare
from landscape.figures.report.build import build_report
from landscape.figures.rundata import load_runs
from landscape.store.directory import RunDir
from landscape.store.fileio import LOCK_NAME, RunLock, lock_holder

# Another process that takes a run's lock as a trainer does (flock on <run>/.lock, its pid written), says so
# and holds it until its stdin closes.
HOLDER = textwrap.dedent("""
    import fcntl, os, sys
    fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.pwrite(fd, f"{os.getpid()}\\n".encode(), 0)
    print("held", flush=True)
    sys.stdin.read()
""")


@pytest.fixture
def training(one_round_run, tmp_path):
    """Two runs as a trainer leaves them when it has just started (no metrics rows, no analysis); another
    process holds the lock of the first: (the runs, that process)."""
    runs = [tmp_path / "runs" / name for name in ("prox", "avg")]
    for run in runs:
        shutil.copytree(one_round_run, run, ignore=shutil.ignore_patterns("analysis"))
        (run / "metrics.jsonl").write_text("")
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(runs[0] / LOCK_NAME)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        yield runs, holder
    finally:
        holder.stdin.close()
        holder.wait(timeout=10)


@pytest.mark.parametrize("read", ["accuracy", "hessian", "compare", "report", "claim metric", "claim analysis"])
def test_a_run_in_use_is_named_so(training, tmp_path, read):
    runs, holder = training
    in_use = f"run prox is in use by another landscape process (pid {holder.pid}): it is still being trained"
    if read == "report":  # the report draws what it can; the curve no run logs yet names the run in use
        page = build_report(runs)
        assert f"no run has &#39;test_acc&#39; in metrics.jsonl yet: {in_use}" in page, page
        return
    if read.startswith("claim"):  # one number per run: the run in use is named, the other as before
        quantity = "test_acc" if read == "claim metric" else "lambda_max"
        prox, avg = load_runs(runs)
        with pytest.raises(LandscapeError) as e:
            run_value(prox, quantity, "last")
        assert str(e.value).startswith(f"{in_use} and has no ") and "\n" not in str(e.value), str(e.value)
        with pytest.raises(LandscapeError, match="^run .*avg"):
            run_value(avg, quantity, "last")
        return
    if read == "compare":  # compare draws what it can and lists what is missing, one line per run
        lines = compare(runs, tmp_path / "cmp").missing
        assert any(line.startswith(f"{in_use} and has no ") for line in lines), lines
        assert not any(line.startswith("run prox has no") for line in lines), lines
        assert any(line.startswith("run avg has no ") for line in lines), lines  # a run not in use: as before
        return
    with pytest.raises(LandscapeError) as e:
        if read == "accuracy":
            curves.accuracy_figure(runs)
        else:
            extract.hessian_summaries(runs)
    message = str(e.value)
    assert message.startswith(in_use) and "\n" not in message, message
    prox = message.split("; run avg")[0]
    assert "--eval-every" not in prox and "; run `landscape analyze" not in prox, message


def test_lock_holder_asks_without_taking_or_making_the_lock(training, tmp_path):
    runs, holder = training
    assert lock_holder(runs[0]) == f"pid {holder.pid}"
    assert lock_holder(runs[1]) is None and not (runs[1] / LOCK_NAME).exists()  # asked: nothing made
    with RunLock(RunDir(runs[1])):  # a lock nobody else holds is free again once asked about
        pass
    holder.stdin.close()
    holder.wait(timeout=10)
    assert lock_holder(runs[0]) is None  # the process is gone, its lock with it
    # the advice for a finished run is back
    with pytest.raises(LandscapeError, match="run prox, avg has no 'test_acc' in metrics.jsonl"):
        curves.accuracy_figure(runs)
