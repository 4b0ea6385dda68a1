"""The analysis pass registry's contract, over every declared pass: it skips what is done, refuses bad
options in one line (every option with a rule refuses a value just outside it, the analysis settings too),
reports every Hessian-vector product it makes, and its cost model estimates them (the dry run's factor of 2);
its function is attached by the catalog; and no registered pass or algorithm name is compared as a string
literal outside its own file."""

import ast
import inspect
import json
import typing
from pathlib import Path

import annotated_types
import pytest
from support.helpers import result_file

import landscape
from landscape.analyze.catalog import load_passes, pass_options
from landscape.analyze.passes import hessian as hessian_pass
from landscape.analyze.passes.surface import SurfaceOptions
from landscape.analyze.scheduler import run_analysis
from landscape.analyze.settings import AnalysisSettings
from landscape.core.errors import LandscapeError
from landscape.core.schema import choices, load
from landscape.measure import directions, operator, trace
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
    estimate = PASSES.get(name).cost(options).hvps
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


_BOUNDS = {annotated_types.Gt: ("gt", -1), annotated_types.Ge: ("ge", -1), annotated_types.Lt: ("lt", 1),
           annotated_types.Le: ("le", 1)}


def _outside(kind: type, rules: list) -> list[tuple[typing.Any, typing.Any]]:
    """(a value just outside each range rule, the bound itself where it is allowed) of a number's rules."""
    step = 1 if kind is int else 1e-9
    cases = []
    for item in rules:
        for bound_type, (attr, side) in _BOUNDS.items():
            if isinstance(item, bound_type):
                bound = kind(getattr(item, attr))
                inclusive = attr in ("ge", "le")
                cases.append((bound + side * step if inclusive else bound, bound if inclusive else None))
    return cases


def _rule_cases(cls: type) -> list[tuple[str, typing.Any, typing.Any]]:
    """(field, a value its annotation refuses, a value at the edge it takes or None) of every field of a
    schema with a range or choices: generated from the annotations, so a new rule is covered by itself."""
    cases = []
    for name, hint in typing.get_type_hints(cls, include_extras=True).items():
        if typing.get_origin(hint) is typing.Literal:
            cases.append((name, "no-such-choice", typing.get_args(hint)[0]))
            continue
        if typing.get_origin(hint) is not typing.Annotated:
            continue
        kind, *meta = typing.get_args(hint)
        rules = [m for info in meta for m in getattr(info, "metadata", [])]
        item = typing.get_args(kind)[0] if typing.get_origin(kind) is tuple else None
        if item is not None:  # tuple[Annotated[float, rule(...)], ...]: each item's rules, and its length's
            item_kind, *item_meta = typing.get_args(item)
            item_rules = [m for info in item_meta for m in getattr(info, "metadata", [])]
            cases += [(name, (bad,), None if good is None else (good,)) for bad, good in _outside(item_kind, item_rules)]
            cases += [(name, (), None) for m in rules if isinstance(m, annotated_types.MinLen) and m.min_length == 1]
        elif kind in (int, float):
            cases += [(name, bad, good) for bad, good in _outside(kind, rules)]
        elif kind is str:
            cases += [(name, "", None) for m in rules if isinstance(m, annotated_types.MinLen)]
    return cases


SCHEMAS = [(spec.name, spec.options) for spec in PASSES.entries() if spec.options is not None]
RULES = [(where, cls, *case) for where, cls in [*SCHEMAS, ("settings", AnalysisSettings)]
         for case in _rule_cases(cls)]


def _make(where: str, cls: type, values: dict):
    if cls is AnalysisSettings:
        return load(AnalysisSettings, values, "settings", noun="analysis setting")
    return PASSES.get(where).make_options(values)


@pytest.mark.parametrize("where, cls, key, bad, good", RULES, ids=[f"{r[0]}.{r[2]}={r[3]!r}" for r in RULES])
def test_every_option_with_a_rule_refuses_a_value_outside_it_in_one_line(where, cls, key, bad, good):
    with pytest.raises(LandscapeError) as refused:
        _make(where, cls, {key: bad})
    message = str(refused.value)
    assert message.startswith(f"{where}.{key}") and "must" in message and "\n" not in message, message
    if good is not None:  # the edge of the range (or a choice) is taken
        assert getattr(_make(where, cls, {key: good}), key) == good


def test_the_rules_cover_every_range_and_choice():
    covered = {(where, key) for where, _, key, *_ in RULES}
    assert {("hessian", "trace_hvps"), ("hessian", "trace_method"), ("sharpness", "rhos"), ("surface", "directions"),
            ("surface", "cells_per_batch"), ("settings", "seed"), ("settings", "dtype")} <= covered
    assert len(covered) >= 30, sorted(covered)


def test_the_declarations_restate_the_computations_names():
    """The light declarations cannot import the computation: the names they restate agree with it."""
    assert choices(hessian_pass.HessianOptions, "trace_method") == trace.TRACE_METHODS
    assert hessian_pass.HessianOptions().trace_method == trace.DEFAULT_TRACE_METHOD
    assert choices(SurfaceOptions, "normalization") == directions.NORMALIZATIONS


def test_every_declared_pass_has_its_function_once_the_catalog_is_loaded():
    for spec in PASSES.entries():
        assert callable(spec.factory), spec.name
    with pytest.raises(ValueError, match="implemented twice"):
        PASSES.implement("loss")(lambda ctx, opts: None)


def _registered_files() -> dict[str, set[Path]]:
    """Each registered pass and algorithm name -> the file(s) of its entry (a pass's function and its
    declaration: the file of its options)."""
    files: dict[str, set[Path]] = {}
    for entry in [*PASSES.entries(), *ALGORITHMS.entries()]:
        for thing in (entry.factory, entry.options):
            if thing is not None:
                files.setdefault(entry.name, set()).add(Path(inspect.getsourcefile(thing)).resolve())
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
