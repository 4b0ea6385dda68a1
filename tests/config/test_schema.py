"""The one schema loader (landscape.core.schema): kinds, ranges, choices, unknown keys, nested tables and
arrays of tables, each refused in one line naming the key; TOML written back by tomli-w reads the same."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Annotated, Literal

import pytest

from landscape.core.errors import LandscapeError
from landscape.core.schema import check, choices, dump_toml, holds, load, rule

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


@dataclass(frozen=True)
class Inner:
    k: Annotated[int, rule(ge=1)] = 2


@dataclass(frozen=True)
class Train:
    lr: Annotated[float, rule(gt=0)] = 0.1
    local_steps: Annotated[int, rule("0: use local_epochs", ge=0)] = 0
    participation: Annotated[float, rule(gt=0, le=1, text="must be in (0, 1]")] = 0.25
    lr_schedule: Literal["constant", "cosine"] = "constant"
    rhos: tuple[Annotated[float, rule(gt=0)], ...] = (0.05,)
    keep: bool = False
    inner: Inner = field(default_factory=Inner)
    plots: tuple[Inner, ...] = ()


def test_defaults_and_values():
    assert load(Train, {}, "train") == Train()
    got = load(Train, {"lr": 1, "rhos": [0.1, 0.2], "plots": [{"k": 3}], "inner": {"k": 4}}, "train")
    assert got.lr == 1.0 and isinstance(got.lr, float)
    assert got.rhos == (0.1, 0.2) and got.plots == (Inner(3),) and got.inner == Inner(4)


@pytest.mark.parametrize("raw, message", [
    ({"lr": 0}, "train.lr must be > 0 (got 0)"),
    ({"local_steps": -1}, "train.local_steps must be >= 0 (0: use local_epochs) (got -1)"),
    ({"participation": 2}, "train.participation must be in (0, 1] (got 2)"),
    ({"lr_schedule": "cos"}, "train.lr_schedule must be one of constant, cosine (got 'cos')"),
    ({"lr": "0.1"}, "train.lr must be a number (got '0.1')"),
    ({"lr": float("nan")}, "train.lr must be finite (got nan)"),
    ({"local_steps": 1.0}, "train.local_steps must be an integer (got 1.0)"),
    ({"local_steps": True}, "train.local_steps must be an integer (got True)"),
    ({"keep": 1}, "train.keep must be true or false (got 1)"),
    ({"lrr": 1}, "unknown key 'train.lrr'; allowed in [train]: lr, local_steps, participation, lr_schedule, rhos, "
                 "keep, inner, plots; did you mean 'train.lr'?"),
    ({"rhos": [0.1, -1]}, "train.rhos[1] must be > 0 (got -1)"),
    ({"rhos": 0.1}, "train.rhos must be a list (got 0.1)"),
    ({"inner": {"k": 0}}, "train.inner.k must be >= 1 (got 0)"),
    ({"inner": {"kk": 0}}, "unknown key 'train.inner.kk'; allowed in [train.inner]: k; did you mean 'train.inner.k'?"),
    ({"plots": [{"k": 3}, {"k": 0}]}, "train.plots[1].k must be >= 1 (got 0)"),
    ({"inner": 3}, "train.inner must be a table (got 3)"),
])
def test_refused_in_one_line(raw, message):
    with pytest.raises(LandscapeError) as e:
        load(Train, raw, "train")
    assert str(e.value) == message


def test_choices_and_toml_round_trip():
    assert choices(Train, "lr_schedule") == ("constant", "cosine")
    value = load(Train, {"rhos": [0.1, 0.2], "plots": [{"k": 3}]})
    assert load(Train, tomllib.loads(dump_toml(value))) == value


@dataclass(frozen=True)
class Pair:
    ids: Annotated[str, rule(text="must be two ids like '3,7'"), holds(lambda v: v.count(",") == 1)] = "0,1"
    n: Annotated[int, rule(ge=1)] = 1

    def __post_init__(self) -> None:
        check(self, "pair")


def test_holds_and_check():
    assert load(Pair, {"ids": "3,7"}).ids == "3,7"
    with pytest.raises(LandscapeError, match=r"^pair.ids must be two ids like '3,7' \(got '3'\)$"):
        load(Pair, {"ids": "3"}, "pair")
    with pytest.raises(LandscapeError, match=r"^pair.n must be >= 1 \(got 0\)$"):  # made directly: checked too
        Pair(n=0)
