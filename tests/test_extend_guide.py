"""The extend guide's worked example, from the guide's own text: its module blocks (``# mylab_ext/<name>.py``)
written into a temporary package as printed, its last block (``# use.py``) run there in a fresh interpreter
(forked from a warm launcher); the algorithm trains, the pass's result equals the norm computed from each
checkpoint, the plot kind draws, and FedAvgM with beta = 0 is FedAvg bit for bit (its reduction to a known
rule)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import torch
from support.helpers import ROOT
from support.warm import WarmLauncher

from landscape.store.directory import RunDir

GUIDE = ROOT / "docs" / "guides" / "extend.md"


def guide_blocks() -> dict[str, str]:
    """The guide's Python blocks by the file their first line names (``# mylab_ext/fedavgm.py``, ``# use.py``)."""
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), flags=re.S)
    named = {}
    for block in blocks:
        first = block.splitlines()[0]
        if re.fullmatch(r"# [\w/]+\.py", first):
            named[first[2:]] = block
    return named


@pytest.fixture(scope="module")
def launcher(tmp_path_factory):
    """A fresh interpreter per block, forked from a warm launcher (tests/support/warm.py) that has torch and the
    package imported but none of the guide's modules."""
    env = {**os.environ, "MPLBACKEND": "Agg", "OMP_NUM_THREADS": "1"}
    warm = WarmLauncher(tmp_path_factory.mktemp("extend"), env, timeout=600)
    yield warm
    warm.close()


def run_python(launcher: WarmLauncher, code: str, cwd: Path) -> subprocess.CompletedProcess:
    return launcher.python(code, cwd=cwd, pythonpath=os.pathsep.join([str(cwd), str(ROOT)]))


def test_the_worked_example_runs_as_printed_and_measures_what_it_says(launcher, tmp_path):
    blocks = guide_blocks()
    assert sorted(blocks) == ["mylab_ext/fedavgm.py", "mylab_ext/norm_plot.py", "mylab_ext/weight_norm.py",
                              "use.py"]
    for name, text in blocks.items():
        if name.startswith("mylab_ext/"):
            (tmp_path / name).parent.mkdir(exist_ok=True)
            (tmp_path / name).write_text(text)
    done = run_python(launcher, blocks["use.py"], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    figures = [Path(line) for line in done.stdout.split()]
    assert [p.name for p in figures] == ["weight-norm.png", "weight-norm.pdf"]
    assert (tmp_path / figures[0]).stat().st_size > 10_000

    run = RunDir(tmp_path / "runs" / "fedavgm")
    assert run.rounds() == [0, 2, 4]
    for r in run.rounds():  # the pass's ||x|| against the checkpoint's trainable parameters
        (result,) = (run.path / "analysis" / f"round-{r:04d}").glob("weight-norm*.json")
        model = torch.load(run.checkpoint(r), weights_only=True)["model"]
        expected = torch.cat([v.double().reshape(-1) for k, v in model.items()
                              if "running" not in k and "num_batches" not in k]).norm()
        assert abs(json.loads(result.read_text())["result"]["norm"] - float(expected)) <= 1e-6 * float(expected)


def test_fedavgm_with_no_momentum_is_fedavg_bit_for_bit(launcher, tmp_path):
    blocks = guide_blocks()
    (tmp_path / "mylab_ext").mkdir()
    (tmp_path / "mylab_ext" / "fedavgm.py").write_text(blocks["mylab_ext/fedavgm.py"])
    code = (
        "import torch\n"
        "from landscape.config import overrides\n"
        "from landscape.train.loop import start_run\n"
        "common = [('model.name', 'mlp'), ('train.rounds', 3), ('train.local_steps', 2), ('partition.clients', 4)]\n"
        "start_run(overrides.build(None, common + [('imports', ['mylab_ext.fedavgm']), ('algorithm.name', 'fedavgm'),"
        " ('algorithm.beta', 0.0)]), 'm', progress=False)\n"
        "start_run(overrides.build(None, common + [('algorithm.name', 'fedavg')]), 'a', progress=False)\n"
        "m = torch.load('m/checkpoints/round-0003.pt', weights_only=True)['model']\n"
        "a = torch.load('a/checkpoints/round-0003.pt', weights_only=True)['model']\n"
        "print(all(torch.equal(m[k], a[k]) for k in a) and m.keys() == a.keys())\n"
    )
    done = run_python(launcher, code, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "True"
