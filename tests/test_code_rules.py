"""The shape rules of the package's code: modules cut by concept (three or more modules of one folder that share
a name's first word form a subpackage; a module over 500 lines is flagged, to be cut where its concepts part),
and ``ruff check`` of the package passing with the rules of pyproject.toml (ruff's defaults and C901: no function
more complex than 10)."""

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
MAX_LINES = 500
MAX_COMPLEXITY = 10
FAMILY = 3  # modules of one folder sharing a first word: a subpackage


def test_no_module_of_the_package_is_over_500_lines():
    lengths = {path.relative_to(ROOT).as_posix(): len(path.read_text(encoding="utf-8").splitlines())
               for path in sorted(PACKAGE.rglob("*.py"))}
    assert len(lengths) > 50, f"found only {len(lengths)} modules under {PACKAGE}"
    over = [f"{path} ({lines} lines)" for path, lines in lengths.items() if lines > MAX_LINES]
    assert not over, f"modules over {MAX_LINES} lines (cut each where its concepts part): {', '.join(over)}"


def first_word(module: str) -> str:
    """The first word of a module's name, singular: run, run_writer and runs share "run"."""
    word = module.split("_")[0]
    return word[:-1] if word.endswith("s") and not word.endswith("ss") and len(word) > 3 else word


def test_modules_that_share_a_first_word_form_a_subpackage():
    families = {}
    for folder in sorted({path.parent for path in PACKAGE.rglob("*.py")}):
        names = [p.stem for p in folder.glob("*.py") if p.stem != "__init__"]
        for word in {first_word(name) for name in names}:
            members = sorted(name for name in names if first_word(name) == word)
            if len(members) >= FAMILY:
                families[folder.relative_to(ROOT).as_posix()] = members
    assert not families, f"modules that share a first word, to gather in a subpackage: {families}"


def test_the_family_rule_sees_a_family():
    assert first_word("run_writer") == first_word("runs") == first_word("run") == "run"
    assert first_word("surface_data") == first_word("surfaces") == "surface"
    assert first_word("loss") == "loss" and first_word("seeds") == "seed"


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
