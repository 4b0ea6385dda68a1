"""The tests' shared helpers: tiny, fast recipes on the bundled digits data, folders built once per session for every
pytest-xdist worker (``shared_folder``), the command line invoked in process, one-line error checks, and
comparisons of run folders, checkpoints and metrics. Fixtures live in tests/conftest.py."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import tempfile
from pathlib import Path

import torch
from filelock import FileLock
from hypothesis import HealthCheck, settings
from hypothesis.configuration import set_hypothesis_home_dir

from landscape.config import overrides as recipe_overrides
from landscape.config import recipe as recipes

# The fuzz tests' settings: LANDSCAPE_FUZZ_EXAMPLES=2000 fuzzes deeper. No example database, and hypothesis's
# caches go to the temporary folder, not into the repository.
set_hypothesis_home_dir(os.environ.get("HYPOTHESIS_STORAGE_DIRECTORY")
                        or os.path.join(tempfile.gettempdir(), "landscape-hypothesis"))
FUZZ = settings(max_examples=int(os.environ.get("LANDSCAPE_FUZZ_EXAMPLES", "60")), deadline=None,
                database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

ROOT = Path(__file__).resolve().parents[2]


def shared_folder(tmp_path_factory, name: str, build) -> Path:
    """A folder ``build(folder)`` fills once per test session: under pytest-xdist the first worker that asks builds
    it (under a file lock) in the session's common temporary folder and the others wait and read it. Read-only
    for the tests (one that writes copies it)."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the workers' folders (popen-gw0, ...) share their parent
    folder, done = root / "shared" / name, root / "shared" / f"{name}.built"
    folder.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(root / "shared" / f"{name}.lock")):
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)  # what a failed build left
            folder.mkdir()
            build(folder)
            done.touch()
    return folder


def shared_analysed_run(tmp_path_factory, run: Path, name: str, *args: str) -> Path:
    """A copy of ``run`` analysed once per test session by ``landscape analyze`` with ``args`` (``shared_folder``:
    read-only for the tests; one that writes copies it)."""

    def build(folder: Path) -> None:
        shutil.copytree(run, folder / "run")
        result = invoke(*analyze_args(folder / "run", *args))
        assert result.exit_code == 0, result.output

    return shared_folder(tmp_path_factory, name, build) / "run"


def load_script(relative: str):
    """The repository's script at ``relative`` (a tool or benchmark, not part of the package), imported as a
    module named after its file (registered in sys.modules, which its dataclasses need)."""
    path = ROOT / relative
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module


TINY = {
    "partition.clients": 4,
    "partition.alpha": 0.5,
    "train.rounds": 3,
    "train.participation": 0.5,
    "train.local_steps": 2,
    "train.batch_size": 16,
    "train.checkpoint_every": 1,
    "train.device": "cpu",
}


def tiny_recipe(**changes) -> dict:
    """A resolved recipe of a few-second digits run; keys as 'section__key' or top-level names."""
    overrides = dict(TINY)
    for key, value in changes.items():
        overrides[key.replace("__", ".")] = value
    return recipe_overrides.build(None, list(overrides.items()))


def result_file(folder, pass_name: str):
    """The JSON of the one result of ``pass_name`` in an ``analysis/round-NNNN`` folder (result files are named
    by their settings: ``hessian``, ``hessian@top_k-2_...``)."""
    from landscape.store.results.files import stored_results

    (path,) = [p for p, record in stored_results(folder) if record.get("pass") == pass_name]
    return path


def one_line_error(result) -> str:
    """The CLI's answer to bad input: exit 1, one line on stderr, no traceback."""
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


def recipe6(**changes) -> recipes.Recipe:
    """Six fast rounds (a small MLP), checkpoints every 2 rounds, the clients' models kept; ``changes`` as for
    :func:`tiny_recipe`."""
    values = {"model__name": "mlp", "model__hidden": [16], "train__rounds": 6, "train__checkpoint_every": 2,
              "train__keep_clients": True}
    values.update(changes)
    return tiny_recipe(**values)


def invoke(*args):
    """The command line in process: ``landscape ARGS`` (each argument passed as ``str``)."""
    from click.testing import CliRunner

    from landscape.cli import cli

    return CliRunner().invoke(cli, [str(a) for a in args])


def analyze_args(path, *more) -> list:
    """``analyze PATH`` on the CPU, quiet, on 200 samples, then ``more``."""
    return ["analyze", path, "--device", "cpu", "--quiet", "--analysis-samples", "200", *more]


def no_traceback(result) -> None:
    """The CLI ended without an exception (an exit code is fine) and printed no traceback."""
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output, result.output


def snapshot(path: Path) -> dict[str, bytes]:
    """Relative path -> bytes of every regular file under ``path`` (symbolic links left out)."""
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in sorted(Path(path).rglob("*"))
            if p.is_file() and not p.is_symlink()}


def metrics_without_time(path: Path) -> list[dict]:
    """The metrics rows of the run at ``path``, less their timing (``seconds``)."""
    from landscape.store.directory import RunDir

    return [{k: v for k, v in row.items() if k != "seconds"} for row in RunDir(path).read_metrics()]


def assert_same_values(a, b, where: str = "") -> None:
    """``a`` and ``b`` are equal: tensors bit for bit and of one dtype, dicts key by key (``where`` names the
    key path in the failure)."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for k in a:
            assert_same_values(a[k], b[k], f"{where}.{k}")
    else:
        assert a == b, where


def write_user_module(tmp_path: Path, monkeypatch, prefix: str, text: str) -> str:
    """A module of the user's own, ``<prefix>_<test folder>.py`` holding ``text``, in the test's folder, which
    becomes the current folder and the first on the path; its name (unique per test, so no copy is cached)."""
    name = f"{prefix}_{tmp_path.name.replace('-', '_')}"[:60]
    (tmp_path / f"{name}.py").write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    return name


def drop_recorded_recipes(run: Path) -> None:
    """Each checkpoint of ``run`` without the recipe it records, as a version before checkpoints carried one
    wrote it (a ``RunWriter``'s or an imported run's carry none either): its readers then read recipe.toml."""
    from landscape.store.checkpoints import load_checkpoint
    from landscape.store.directory import RunDir

    for round in RunDir(run).rounds():
        path = RunDir(run).checkpoint(round)
        payload = load_checkpoint(path)
        del payload["recipe"]
        torch.save(payload, path)
