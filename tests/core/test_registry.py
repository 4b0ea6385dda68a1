"""The one registry (``landscape.core.registry``): declare, implement, register, and the one option check; and
that every kind of entry of the package (data sets, partitions, models, algorithms, passes, plot kinds) is
kept in it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import pytest

from landscape.core.errors import LandscapeError
from landscape.core.registry import Entry, Registry
from landscape.core.schema import rule


@dataclass(frozen=True)
class Options:
    width: Annotated[int, rule(ge=1)] = 3
    name: str = "x"


@dataclass(frozen=True, kw_only=True)
class Labelled(Entry):
    label: str = ""


def test_a_declared_entry_has_its_metadata_before_its_code_and_gets_its_code_once():
    registry = Registry("widget", Labelled)
    declared = registry.declare("w", label="W", options=Options, summary="a widget")
    assert declared.factory is None and registry.get("w").label == "W"

    @registry.implement("w")
    def make(options):
        return options.width

    entry = registry.get("w")
    assert entry.factory is make and entry.label == "W" and entry.summary == "a widget"
    with pytest.raises(ValueError, match="widget 'w' implemented twice"):
        registry.implement("w")(make)
    with pytest.raises(ValueError, match="widget 'w' declared twice"):
        registry.declare("w")
    with pytest.raises(TypeError, match="implement"):
        registry.declare("v", factory=make)


def test_register_declares_and_implements_at_once_with_the_docstring_as_summary():
    registry = Registry("widget")

    @registry.register("a")
    def first():
        """The first widget.

        More words."""

    @registry.register("b", summary="given")
    def second():
        pass

    assert registry.get("a").summary == "The first widget." and registry.get("b").summary == "given"
    assert registry.get("a").factory is first and registry.names() == ["a", "b"] == list(registry)
    assert "a" in registry and "c" not in registry
    with pytest.raises(LandscapeError, match="unknown widget 'c'; choose from: a, b"):
        registry.get("c")


def test_options_are_checked_by_the_schema_loader_in_one_line_naming_the_key():
    entry = Entry(name="w", options=Options)
    assert entry.make_options({"width": 5}) == Options(width=5)
    assert entry.option_defaults() == {"width": 3, "name": "x"}
    with pytest.raises(LandscapeError, match=r"w\.width must be >= 1 \(got 0\)"):
        entry.make_options({"width": 0})
    with pytest.raises(LandscapeError, match=r"unknown .*model\.depth"):
        entry.make_options({"depth": 2}, "model", noun="recipe key")
    bare = Entry(name="plain")
    assert bare.make_options({}) is None and bare.option_defaults() == {}
    with pytest.raises(LandscapeError, match="plain takes no options"):
        bare.make_options({"width": 1})


def test_every_kind_of_entry_of_the_package_is_kept_in_the_one_registry():
    from landscape.analyze.passes import PASSES
    from landscape.config.algorithms import ALGORITHMS
    from landscape.data.datasets import DATASETS
    from landscape.data.partitions import PARTITIONS
    from landscape.figures.plot_kinds import PLOT_KINDS
    from landscape.models import MODELS

    for registry in (PASSES, ALGORITHMS, DATASETS, PARTITIONS, PLOT_KINDS, MODELS):
        assert isinstance(registry, Registry) and registry.names()
        assert all(isinstance(entry, Entry) for entry in registry.entries())
