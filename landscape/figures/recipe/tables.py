"""The schema of figure recipe files (``figures/*.toml``): ``FigureFile`` (the top level), ``FigureTables`` (the
recipe at one scale, its ``[digits]`` or ``[paper]`` table merged over the rest) and the tables they hold, each a
frozen dataclass read by ``landscape.core.schema.load`` (``landscape.figures.recipe.figure`` reads the files;
each ``[[plots]]`` table is checked by its kind's options, ``landscape.figures.plot_kinds``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from landscape.core.schema import rule
from landscape.figures.plot_kinds import ID_PATTERN

SCALES = ("digits", "paper")
SEED_MAX = 2**32 - 1  # recipes take 32-bit seeds
_NAME = rule(pattern=ID_PATTERN, text="must be letters, digits, '.', '_' or '-'")
_FOLDER = rule(pattern=ID_PATTERN, text="must be letters, digits, '.', '_' or '-' (it is a folder)")
Seeds = tuple[Annotated[int, rule(ge=0, le=SEED_MAX)], ...] | None  # different ones, at least one (``figure_recipe._seeds``)


@dataclass(frozen=True)
class TrainTable:
    """``[train]``: the training recipe every run starts from (relative to the figure recipe; none: the
    defaults) and the recipe keys every run shares."""

    recipe: Annotated[str | None, rule(min_length=1)] = None
    set: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RunTable:
    """A ``[[runs]]`` table: the run's id (its folder), its label (default: the id), its recipe keys, and its
    keys at one scale only."""

    id: Annotated[str, _FOLDER]
    label: str | None = None
    set: dict[str, Any] = field(default_factory=dict)
    digits: dict[str, Any] = field(default_factory=dict)
    paper: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class FigureTables:
    """A figure recipe at one scale: its top level with the scale's table merged over it. ``analyze`` holds
    the analysis settings (``figure.RECIPE_SETTINGS``, checked by ``AnalysisSettings``) and a table of options per
    pass; each of ``plots`` is checked
    by its kind's options (``landscape.figures.plot_kinds``)."""

    name: Annotated[str, _NAME]
    title: str | None = None
    seeds: Seeds = None
    train: TrainTable = field(default_factory=TrainTable)
    runs: tuple[RunTable, ...] = ()
    analyze: dict[str, Any] = field(default_factory=dict)
    plots: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True)
class ScaleTable:
    """``[digits]`` / ``[paper]``: what one scale changes, merged over the rest of the recipe (its values are
    checked then, as ``FigureTables``)."""

    name: Any = None
    title: Any = None
    seeds: Any = None
    train: Any = None
    runs: Any = None
    analyze: Any = None
    plots: Any = None


@dataclass(frozen=True)
class FigureFile(ScaleTable):
    """The top level of a figure recipe file: the keys of ``FigureTables`` (checked after the scale's table is
    merged over them), the scale and the two scale tables."""

    scale: Literal["digits", "paper"] = "digits"
    digits: ScaleTable = field(default_factory=ScaleTable)
    paper: ScaleTable = field(default_factory=ScaleTable)
