"""A recipe's ``imports`` run code: reading a run never imports them unless the user says so (``--trust-imports``,
``open_run(path, trust_imports=True)``); training from a recipe the user names imports them and says so; an
import that fails (SystemExit included) is one line; ``open_run`` names a bad argument (issue 20, security).

The user's module writes a marker file beside itself when it is imported and registers the model the run uses
("marknet"). It lies beside the run, in the current folder, and on sys.path: whatever can find it, only the
user's word imports it. Each test forgets the module first (sys.modules, the registry), as a fresh process has.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from support.helpers import invoke, one_line_error, tiny_recipe

import landscape
from landscape.core.errors import LandscapeError

MARKED = textwrap.dedent('''
    from pathlib import Path

    import torch
    from torch import nn

    from landscape.models import MODELS

    Path(__file__).with_suffix(".imported").write_text(__name__)  # the proof that this code ran


    @MODELS.register("marknet", summary="a user's model, registered by the module that leaves a marker")
    def marknet(input_shape, num_classes, options):
        torch.manual_seed(0)
        return nn.Sequential(nn.Flatten(), nn.Linear(int(torch.tensor(input_shape).prod()), num_classes))
''')


def _forget(name: str) -> None:
    from landscape.models import MODELS

    MODELS._entries.pop("marknet", None)
    sys.modules.pop(name, None)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A folder holding the marker module and two one-round runs whose recipes import it: ``run`` builds the
    module's model (marknet), ``plain`` only built-in entries (mlp)."""
    from landscape.train import loop

    folder = tmp_path_factory.mktemp("received")
    name = f"marklab_{folder.name.replace('-', '_')}"[:60]
    (folder / f"{name}.py").write_text(MARKED)
    sys.path.insert(0, str(folder))
    try:
        loop.start_run(tiny_recipe(imports=[name], model__name="marknet", train__rounds=1), folder / "run",
                       progress=False)
        loop.start_run(tiny_recipe(imports=[name], model__name="mlp", model__hidden=[8], train__rounds=1),
                       folder / "plain", progress=False)
    finally:
        sys.path.remove(str(folder))
        _forget(name)
    return folder, name


@pytest.fixture
def received(trained, tmp_path, monkeypatch):
    """A fresh copy of the runs, the module beside them, in the current folder and on sys.path, not imported."""
    folder, name = trained
    here = tmp_path / "here"
    shutil.copytree(folder, here)
    (here / f"{name}.imported").unlink(missing_ok=True)
    monkeypatch.chdir(here)
    monkeypatch.syspath_prepend(str(here))
    _forget(name)
    yield here, name
    _forget(name)


def _ok(result):
    assert result.exit_code == 0, result.output
    return result


def _report(here, trust):
    return _ok(invoke("report", here / "run", "-o", here / "r.html"))


def _compare(here, trust):
    return _ok(invoke("compare", here / "run", here / "plain", "-o", here / "cmp", "--quiet"))


def _figures_stored(here, trust):  # a figure of stored results only (accuracy: no analysis)
    return _ok(invoke("figures", "figures/accuracy.toml", "--runs", here / "run", "-o", here / "fig", "--quiet"))


def _metrics(here, trust):
    run = landscape.open_run(here / "run", trust_imports=trust)
    assert run.recipe.model.name == "marknet" and run.recipe.imports and run.metrics()


def _analyze_plain(here, trust):  # its imports register nothing it builds: analysed without them
    return _ok(invoke("analyze", here / "plain", "--passes", "loss", "--quiet", *(["--trust-imports"] * trust)))


def _open_run_model(here, trust):
    return landscape.open_run(here / "run", trust_imports=trust).model()


def _open_run_data(here, trust):
    return landscape.open_run(here / "run", trust_imports=trust).client_data(0)


def _analyze(here, trust):
    return invoke("analyze", here / "run", "--passes", "loss", "--quiet", *(["--trust-imports"] * trust))


def _analyze_dry_run(here, trust):
    return invoke("analyze", here / "run", "--passes", "loss", "--dry-run", *(["--trust-imports"] * trust))


def _analyze_checkpoints(here, trust):  # a folder of checkpoints copied away: the recipe they carry
    shutil.copytree(here / "run" / "checkpoints", here / "copied", dirs_exist_ok=True)
    return invoke("analyze", here / "copied", "--passes", "loss", "--quiet", *(["--trust-imports"] * trust))


def _figures_analysed(here, trust):  # a figure whose pass the run lacks: its model is built
    return invoke("figures", "figures/fedsam-hessian.toml", "--runs", here / "run", "-o", here / "fig", "--quiet",
                  "--set", "hessian.top_k=1", "--set", "hessian.trace_hvps=6", "--set", "hessian.density_steps=3",
                  "--set", "analyze.analysis_samples=64", *(["--trust-imports"] * trust))


def _resume(here, trust):
    return invoke("train", "--resume", here / "run", "--rounds", "2", "--quiet", *(["--trust-imports"] * trust))


def _from_python(action):
    def call(here, trust):
        try:
            action(here, trust)
        except LandscapeError as e:
            return str(e)
        return None
    return call


READS = [_report, _compare, _figures_stored, _metrics, _analyze_plain]  # never need the module
BUILDS = [_analyze, _analyze_dry_run, _analyze_checkpoints, _figures_analysed, _resume,
          _from_python(_open_run_model), _from_python(_open_run_data)]  # need it: refused unless trusted


@pytest.mark.parametrize("action", READS + BUILDS, ids=lambda a: getattr(a, "__name__", "python").lstrip("_"))
def test_reading_a_run_imports_its_modules_only_when_trusted(received, action):
    here, name = received
    marker = here / f"{name}.imported"
    builds = action in BUILDS
    if action is _figures_stored or action is _figures_analysed:
        shutil.copytree(Path(__file__).resolve().parents[2] / "figures", here / "figures")
        shutil.copytree(Path(__file__).resolve().parents[2] / "train", here / "train")
    if not builds:
        action(here, False)
        assert not marker.exists(), "a reading command ran the recipe's imports"
        return
    refused = action(here, False)
    line = refused if isinstance(refused, str) else one_line_error(refused)
    assert not marker.exists(), "an untrusted run's imports ran"
    assert name in line and "--trust-imports" in line and "marknet" in line, line
    _forget(name)
    trusted = action(here, True)
    assert marker.exists(), "--trust-imports / trust_imports=True did not import the recipe's module"
    if not isinstance(trusted, str) and trusted is not None:
        assert trusted.exit_code == 0, trusted.output
        assert f"note: importing {name} (recipe imports: runs its code)" in trusted.stderr
    assert trusted is None or not isinstance(trusted, str), trusted


@pytest.mark.parametrize("how", ["dry-run", "train", "sweep-dry-run"])
def test_training_from_a_named_recipe_imports_it_and_says_so(received, how):
    here, name = received
    sys.path.remove(str(here))  # found in the current folder alone, as `python -m` finds it
    (here / "mine.toml").write_text(f'imports = ["{name}"]\n[model]\nname = "marknet"\n[partition]\nclients = 4\n'
                                    '[train]\nrounds = 1\nlocal_steps = 1\nparticipation = 0.5\ndevice = "cpu"\n')
    extra = {"dry-run": ["--dry-run"], "train": ["-o", here / "new", "--quiet"],
             "sweep-dry-run": ["--seed", "0,1", "--dry-run"]}[how]
    result = _ok(invoke("train", here / "mine.toml", *extra))
    assert (here / f"{name}.imported").exists()
    note = f"note: importing {name} (recipe imports: runs its code)"
    assert result.stderr.splitlines().count(note) == 1, result.stderr


FAILING = {
    "exit3": ("raise SystemExit(3)", "importing recipe import '{m}' failed: SystemExit: 3"),
    "exit-none": ("raise SystemExit()", "importing recipe import '{m}' failed: SystemExit"),
    "exit-text": ("raise SystemExit('bye now')", "importing recipe import '{m}' failed: SystemExit: bye now"),
    "error": ("raise RuntimeError('boom\\nsecond line')", "importing recipe import '{m}' failed: RuntimeError: boom"),
    "missing-dependency": ("import nosuchdep_q", "cannot import recipe import '{m}': no module named 'nosuchdep_q'"),
}


@pytest.mark.parametrize("case", [*FAILING, "trusted-read-not-on-path"])
def test_a_failing_recipe_import_is_one_line(received, case):
    here, name = received
    if case == "trusted-read-not-on-path":  # beside the run, in the current folder, but not on the path
        sys.path.remove(str(here))
        line = one_line_error(invoke("analyze", here / "run", "--passes", "loss", "--trust-imports", "--quiet"))
        assert line == (f"error: cannot import recipe import '{name}': no module named '{name}' (reading a run "
                        "does not search the current folder: put its module on PYTHONPATH)")
        return
    code, message = FAILING[case]
    (here / "failing_q.py").write_text(code + "\n")
    (here / "bad.toml").write_text('imports = ["failing_q"]\n')
    try:
        line = one_line_error(invoke("train", here / "bad.toml", "--dry-run"))
    finally:
        sys.modules.pop("failing_q", None)
    assert line == "error: " + message.format(m="failing_q")


@pytest.mark.parametrize("path, trust, message", [
    (Path("nosuch"), False, "open_run: nosuch does not exist"),  # None and 3: tests/cli/test_data_and_api_inputs.py
    ("nosuch/run", False, "open_run: nosuch/run does not exist"),
    ("here.txt", False, "open_run: here.txt is not a directory (give a run directory or a folder of runs)"),
    ("run", "yes", "open_run: trust_imports must be True or False, got 'yes'"),
])
def test_open_run_names_a_bad_argument(received, path, trust, message):
    here, _ = received
    (here / "here.txt").write_text("x")
    with pytest.raises(LandscapeError) as raised:
        landscape.open_run(path, trust_imports=trust)
    assert str(raised.value) == message


# -- trusted imports come from the user's environment, never from the current folder (issue 46, S1) -----------
# A received run whose recipe imports `<lab>.registry` and `<sidecar>`, copies of both lying beside it in the folder
# the user works in (`recv/`), the user's own installed ones in `site/` (on PYTHONPATH). Each module, when its code
# runs, leaves a marker naming itself and where it came from. Real processes: `python -m` and `python -c` put the
# current folder first on sys.path, as the interactive prompt does; a trusted import must not search it.

COPY = "from pathlib import Path\nPath({marks!r}).joinpath({mark!r}).write_text('ran')\n"


@pytest.fixture(scope="module")
def received_copies(tmp_path_factory):
    base = tmp_path_factory.mktemp("copies")
    tag = base.name.replace("-", "_")
    lab, side = f"mylabx_{tag}", f"sidecar_{tag}"
    marks = base / "marks"
    marks.mkdir()
    for origin in ("site", "recv"):
        (base / origin / lab).mkdir(parents=True)
        (base / origin / lab / "__init__.py").write_text("")
        (base / origin / lab / "registry.py").write_text(COPY.format(marks=str(marks), mark=f"registry-{origin}"))
        (base / origin / f"{side}.py").write_text(COPY.format(marks=str(marks), mark=f"sidecar-{origin}"))
    from landscape.train import loop

    sys.path.insert(0, str(base / "site"))
    try:
        loop.start_run(tiny_recipe(imports=[f"{lab}.registry", side], model__name="mlp", model__hidden=[8],
                                   train__rounds=1), base / "recv" / "run", progress=False)
    finally:
        sys.path.remove(str(base / "site"))
        for name in (lab, f"{lab}.registry", side):
            sys.modules.pop(name, None)
    return base


TRUSTED_READS = {
    "cli -m": ["-m", "landscape", "analyze", "run", "--passes", "loss", "--dry-run", "--trust-imports"],
    "open_run(trust_imports=True)": ["-c", "import landscape; landscape.open_run('run', trust_imports=True).model()"],
    "trusted_imports()": ["-c", "import landscape\nfrom landscape.core.imports import trusted_imports\n"
                                "with trusted_imports(): landscape.open_run('run').model()"],
}


@pytest.mark.parametrize("installed", [True, False], ids=["installed", "not-installed"])
@pytest.mark.parametrize("how", TRUSTED_READS)
def test_a_trusted_import_never_comes_from_the_current_folder(received_copies, how, installed):
    base = received_copies
    marks = base / "marks"
    for mark in marks.iterdir():
        mark.unlink()
    package_root = str(Path(landscape.__file__).resolve().parents[1])
    path = [str(base / "site")] * installed + [package_root]
    done = subprocess.run([sys.executable, *TRUSTED_READS[how]], cwd=base / "recv", capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(path)},
                          timeout=120)
    ran = sorted(p.name for p in marks.iterdir())
    assert not [m for m in ran if m.endswith("-recv")], f"the copies beside the run ran: {ran}\n{done.stderr}"
    if installed:
        assert done.returncode == 0, done.stderr
        assert ran == ["registry-site", "sidecar-site"], done.stderr
    else:  # not installed: one line naming the module, never the copy in the current folder
        assert done.returncode != 0 and ran == []
        last = done.stderr.strip().splitlines()[-1]
        assert "cannot import recipe import" in last and "reading a run does not search the current folder" in last, \
            done.stderr


# -- a run's recorded recipe reached through a figure or claim is the run's, not the user's (issue 46, S2) ------
FIGURE = ('name = "recv"\n[[runs]]\nid = "a"\nset = {}\n[[runs]]\nid = "b"\nset = { "train.lr" = 0.01 }\n'
          '[[plots]]\nkind = "accuracy"\n[digits.train]\nrecipe = "plain/recipe.toml"\n')
CLAIM = ('claim = "b is better"\nsource = "a test"\nfigure = "fig.toml"\nseeds = [0, 1]\nquantity = "test_acc"\n'
         'rounds = "last"\n[[compare]]\nlower = "a"\nhigher = "b"\n')


@pytest.mark.parametrize("command", [["figures", "fig.toml"], ["claims", "claim.toml"]], ids=lambda c: c[0])
def test_a_figure_or_claim_naming_a_runs_recipe_imports_it_only_when_trusted(received, command):
    here, name = received
    (here / "fig.toml").write_text(FIGURE)
    (here / "claim.toml").write_text(CLAIM)
    marker = here / f"{name}.imported"
    line = one_line_error(invoke(*command, "--dry-run", "-o", here / "out"))
    assert not marker.exists(), "a run's recorded recipe named by a figure ran its imports untrusted"
    assert "plain/recipe.toml" in line and "recorded recipe" in line and name in line and "--trust-imports" in line
    trusted = _ok(invoke(*command, "--dry-run", "-o", here / "out", "--trust-imports"))
    assert marker.exists(), "--trust-imports did not import the recorded recipe's module"
    assert f"note: importing {name} (recipe imports: runs its code)" in trusted.stderr
