"""The analysis pass registry's contract, over every registered pass: it skips what is done, refuses bad
options in one line, reports every Hessian-vector product it makes, and its cost model estimates them (the dry
run's factor of 2); and no registered pass or algorithm name is compared as a string literal outside its own
file."""

import ast
import inspect
import json
from pathlib import Path

import pytest
from conftest import result_file

import landscape
from landscape.analyze import operator
from landscape.analyze.catalog import load_passes, pass_options
from landscape.analyze.scheduler import run_analysis
from landscape.analyze.settings import AnalysisSettings
from landscape.core.errors import LandscapeError
from landscape.train.algorithms import ALGORITHMS

PASSES = load_passes()
SETTINGS = AnalysisSettings(device="cpu", analysis_samples=100)
# Options that make each pass fast on the six-round run (a pass not named here runs with its defaults).
FAST = {"hessian": {"clients": -1, "top_k": 2, "trace_hvps": 6, "density_steps": 5, "density_runs": 1},
        "sharpness": {"clients": 2, "steps": 2, "starts": 2}, "incompatibility": {"clients": 2, "batches": 2},
        "alignment": {"clients": 2, "batches": 2}, "loss": {"clients": 2}, "surface": {"grid": "3"}}


def _analyse(path: Path, name: str):
    options = pass_options(name, FAST.get(name, {}))
    report = run_analysis(path, passes=[name], settings=SETTINGS, options={name: options}, progress=False)
    return report, options


@pytest.mark.parametrize("name", PASSES.names())
def test_every_pass_skips_what_is_done_and_estimates_the_products_it_makes(six_round_copy, name, monkeypatch):
    made = []
    count = operator.HessianOperator._count
    monkeypatch.setattr(operator.HessianOperator, "_count", lambda op, n: (made.append(n), count(op, n)))
    first, options = _analyse(six_round_copy, name)
    products = sum(made)
    again, _ = _analyse(six_round_copy, name)
    assert (first.computed, first.skipped) == (1, 0) and (again.computed, again.skipped) == (0, 1)
    assert again.rows == first.rows and sum(made) == products  # nothing computed the second time
    result = json.loads(result_file(six_round_copy / "analysis" / "round-0006", name).read_text())["result"]
    assert result.get("hvp_count", 0) == products  # every product the pass made is in its count
    estimate = PASSES.info(name).cost(options).hvps
    assert products / 2 <= estimate <= 2 * products  # as `landscape analyze --dry-run` says: a factor of 2


@pytest.mark.parametrize("name", PASSES.names())
def test_every_pass_refuses_bad_options_in_one_line_naming_them(name):
    messages = {}
    with pytest.raises(LandscapeError) as refused:
        pass_options(name, {"no_such_option": 1})
    messages["no_such_option"] = str(refused.value)
    for option, default in PASSES.get(name).option_defaults().items():
        with pytest.raises(LandscapeError) as refused:  # a number where text goes, text anywhere else
            pass_options(name, {option: 3.5 if isinstance(default, str) else "x"})
        messages[option] = str(refused.value)
    for option, message in messages.items():
        assert option in message and "\n" not in message, (option, message)




def _registered_files() -> dict[str, set[Path]]:
    """Each registered pass and algorithm name -> the file(s) of its entry."""
    files: dict[str, set[Path]] = {}
    for entry in [*PASSES.entries(), *ALGORITHMS.entries()]:
        files.setdefault(entry.name, set()).add(Path(inspect.getsourcefile(entry.factory)).resolve())
    return files


def _name_comparisons(files: dict[str, set[Path]]) -> set[tuple[str, str, int]]:
    """(file, name, line) of each ``== "<name>"`` or ``!= "<name>"`` of a registered name outside its
    entry's file."""
    package = Path(landscape.__file__).parent
    found = set()
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Compare):
                continue
            for left, op, right in zip([node.left, *node.comparators], node.ops, node.comparators):
                for side in (left, right):
                    if (isinstance(op, (ast.Eq, ast.NotEq)) and isinstance(side, ast.Constant)
                            and side.value in files and path.resolve() not in files[side.value]):
                        found.add((path.relative_to(package.parent).as_posix(), side.value, node.lineno))
    return found


def test_no_registered_name_is_compared_as_a_string_outside_its_entry():
    found = _name_comparisons(_registered_files())
    assert not found, "ask the entry (its registered metadata) instead of comparing its name: " + "; ".join(
        f"{f}:{line} == {n!r}" for f, n, line in sorted(found))
