"""The size rules of the package's code: every module at most 400 lines, and ``ruff check`` of the package
passing with the rules of pyproject.toml (ruff's defaults and C901: no function more complex than 10)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "landscape"
MAX_LINES = 400
MAX_COMPLEXITY = 10


def test_every_module_of_the_package_is_at_most_400_lines():
    lengths = {path.relative_to(ROOT).as_posix(): len(path.read_text(encoding="utf-8").splitlines())
               for path in sorted(PACKAGE.rglob("*.py"))}
    assert len(lengths) > 50, f"found only {len(lengths)} modules under {PACKAGE}"
    over = [f"{path} ({lines} lines)" for path, lines in lengths.items() if lines > MAX_LINES]
    assert not over, f"modules over {MAX_LINES} lines (split each by job): {', '.join(over)}"


def test_pyproject_selects_the_complexity_rule():
    lint = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["ruff"]["lint"]
    assert {"E4", "E7", "E9", "F", "C901"} <= set(lint["select"]), lint
    assert lint["mccabe"]["max-complexity"] == MAX_COMPLEXITY
    assert not lint.get("ignore") and not lint.get("per-file-ignores"), "the rules hold everywhere"


def test_ruff_check_of_the_package_passes():
    if importlib.util.find_spec("ruff") is None:
        pytest.skip("ruff is not installed (it is in the test extra: pip install -e '.[test]')")
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise",
                           str(PACKAGE)], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, f"ruff check landscape:\n{done.stdout[-6000:]}{done.stderr[-2000:]}"
