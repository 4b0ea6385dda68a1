"""Analysis recipes (``analyze/*.toml``): which passes, on which rounds, with which settings and options.

```
rounds = "all"                       # last, last N, all, a round or a list of rounds (``core.rounds``)
passes = ["loss", "hessian", "sharpness"]
[settings]                           # shared by every pass: split, analysis_samples, bn_mode, batch_size,
analysis_samples = 500               #   seed, dtype, hvp, backend, device
[hessian]                            # one table per pass: its options (`landscape list` names them)
top_k = 3
```
``landscape analyze RUN analyze/quick.toml`` takes one; flags given on the command line win over it. Read by
the one schema loader (``landscape.core.schema``): the top-level keys by ``RecipeKeys``, ``[settings]`` by
``AnalysisSettings``, each pass's table by its options (``PassSpec.make_options``, as ``--set`` values are).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from landscape.analyze.passes import PASSES
from landscape.analyze.settings import AnalysisSettings
from landscape.core.errors import LandscapeError
from landscape.core.rounds import Rounds
from landscape.core.schema import load, read_toml, rule, unknown_key_message


@dataclass(frozen=True)
class RecipeKeys:
    """The top-level keys of an analysis recipe (besides a table per pass)."""

    rounds: Any = ""  # a ``Rounds`` (last, last N, all, a round or a list of rounds); "": --checkpoints decides
    passes: Annotated[tuple[str, ...], rule(min_length=1)] = ()  # (): the default passes
    settings: dict = field(default_factory=dict)  # checked as AnalysisSettings
    title: str = ""


@dataclass(frozen=True)
class AnalysisRecipe:
    path: Path
    rounds: Rounds | str | None = None  # text: a comma list of plain state_dicts' names (``_rounds``)
    passes: tuple[str, ...] | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    options: dict[str, dict[str, Any]] = field(default_factory=dict)


def load_analysis_recipe(path: str | Path) -> AnalysisRecipe:
    """Read and check an analysis recipe: every key known, every value of the right kind, in range and one of
    its choices; a bad one is one line naming the file and the key."""
    path = Path(path)
    raw = read_toml(path, "analysis recipe")
    try:
        return _checked(path, raw)
    except LandscapeError as e:
        raise LandscapeError(f"{path}: {e}") from None


def _checked(path: Path, raw: dict[str, Any]) -> AnalysisRecipe:
    names = PASSES.names()
    top = [f.name for f in dataclasses.fields(RecipeKeys)]
    for key in raw:
        if key not in top and key not in names:
            raise LandscapeError(unknown_key_message(key, [*top, *names], "top-level", "analysis recipe key"))
    keys = load(RecipeKeys, {k: v for k, v in raw.items() if k in top}, noun="analysis recipe key")
    for name in keys.passes:
        PASSES.get(name)  # an unknown pass: one line naming the passes
    load(AnalysisSettings, keys.settings, "settings", noun="analysis setting")
    options = {}
    for name in names:
        if name in raw:
            PASSES.get(name).make_options(raw[name])
            options[name] = dict(raw[name])
    return AnalysisRecipe(path, _rounds(keys.rounds), keys.passes or None, dict(keys.settings), options)


def _rounds(value: Any) -> Rounds | str | None:
    """The recipe's rounds: a ``Rounds``; None where it gives none (""); a text that is no ``Rounds`` is kept
    as a comma list of plain state_dicts' names (``StateDictSource.select``; a run refuses it,
    ``workflows.analysis``); anything else is one line naming the grammar."""
    if value == "":
        return None
    try:
        return Rounds.parse(value)
    except LandscapeError:
        if isinstance(value, str) and value.strip(", "):
            return value
        raise
