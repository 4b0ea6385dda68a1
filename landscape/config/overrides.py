"""Recipe overrides: what edits a recipe from outside (``--set key=value``, flags, ``[sweep]`` axes).

``parse_value`` and ``parse_assignment`` read a ``--set`` value (``recipe.set_key`` sets it in a raw
recipe dict); ``build`` loads a recipe file, applies overrides in order and resolves it (one run),
``build_sweep`` does so for every point of its sweep, and ``sweep_run_name`` names each point's run folder.
"""

from __future__ import annotations

import copy
import difflib
import itertools
import sys
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from landscape.config.recipe import Recipe, resolve, run_name, set_key
from landscape.config.sections import SECTIONS, TOP_LEVEL
from landscape.core.errors import LandscapeError, shown
from landscape.core.schema import read_toml

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


def parse_value(text: str) -> Any:
    """A ``--set`` value: TOML syntax when it parses (0.1, true, [1, 2], "x"), else the plain string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def parse_assignment(text: str) -> tuple[str, Any]:
    if "=" not in text:
        raise LandscapeError(f"--set takes key=value (got '{shown(text)}')")
    key, value = text.split("=", 1)
    return key.strip(), parse_value(value.strip())

def build(path: str | Path | None = None, overrides: list[tuple[str, Any]] = ()) -> Recipe:
    """Load a recipe file (or start empty), apply overrides in order, resolve. One run: no sweep."""
    runs = build_sweep(path, overrides)
    if len(runs) != 1:
        raise LandscapeError(f"this recipe is a sweep of {len(runs)} runs; one run is needed here")
    return runs[0][0]


def build_sweep(
    path: str | Path | None = None, overrides: list[tuple[str, Any]] = (), axes: dict[str, list] | None = None
) -> list[tuple[Recipe, dict[str, Any]]]:
    """Every run of a recipe: the product of its ``[sweep]`` axes (and ``axes``, which replace same-named
    ones).

    Returns (resolved recipe, the swept values of that run) pairs in sweep order. ``[sweep]`` maps recipe keys
    to lists, e.g. ``"algorithm.name" = ["fedavg", "fedsam"]``; overrides apply to every run.
    """
    raw = read_toml(path) if path is not None else {}
    sweep = raw.pop("sweep", {})
    if not isinstance(sweep, dict):
        raise LandscapeError("recipe key 'sweep' must be a table of key = [values]")
    for key, value in overrides:
        sweep.pop(key, None)  # a flag or --set value replaces that axis
        set_key(raw, key, value)
    sweep.update(axes or {})
    for key, values in sweep.items():
        if not isinstance(values, list) or not values:
            raise LandscapeError(f"sweep.'{shown(key)}' must be a non-empty list of values")
    runs = []
    for combo in itertools.product(*sweep.values()):
        point = copy.deepcopy(raw)
        chosen = dict(zip(sweep, combo))
        for key, value in chosen.items():
            set_key(point, key, value)
        runs.append((resolve(point), chosen))
    return runs


_NAMED_KEYS = ("dataset.name", "algorithm.name", "partition.name", "partition.alpha",
               "partition.classes_per_client", "model.name", "partition.clients", "seed")


def sweep_run_name(recipe: Recipe, swept: dict[str, Any]) -> str:
    """The run name of one sweep point: the recipe's name (if any), the systematic name, then the swept keys
    that the systematic name does not show (e.g. ``-lr0.05``)."""
    parts = [recipe.name] if recipe.name else []
    parts.append(run_name(recipe))
    for key, value in swept.items():
        if key not in _NAMED_KEYS:
            part = (f"{key.split('.')[-1]}{value:g}" if isinstance(value, float)
                    else f"{key.split('.')[-1]}{value}")
            if any(c in "/\\" or not c.isprintable() for c in part):
                # The run's folder must stay one folder under --out: no path separators, no control
                # characters.
                raise LandscapeError(f"sweep value {value!r} of '{key}' cannot be part of a run folder "
                                     "name (it holds '/', '\\' or a control character)")
            parts.append(part)
    name = "-".join(parts)
    if len(name.encode()) > 255:
        raise LandscapeError(f"the run name of sweep point {swept} is longer than 255 bytes; shorten the "
                             "recipe's name")
    return name


# -- one grammar of --set for every command -----------------------------------------------------------------
# A --set key's first part says what it sets (``classify_assignment``): a table or top-level key of a training
# recipe (dataset, partition, model, algorithm, train, name, seed, imports) a training recipe key, ``analyze``
# an analysis setting (analyze.<setting>), a registered pass's name an option of that pass (<pass>.<option>).
RECIPE_KEY, ANALYSIS_SETTING, PASS_OPTION = "a training recipe key", "an analysis setting", "a pass option"
SET_KINDS = {  # the kinds of --set key each command takes
    "train": (RECIPE_KEY,),
    "analyze": (ANALYSIS_SETTING, PASS_OPTION),
    "figures": (RECIPE_KEY, ANALYSIS_SETTING, PASS_OPTION),
    "claims": (RECIPE_KEY, ANALYSIS_SETTING, PASS_OPTION),
    "demo": (RECIPE_KEY, ANALYSIS_SETTING, PASS_OPTION),
}


def classify_assignment(key: str, pass_names: Collection[str] | Callable[[], Collection[str]],
                        command: str | None = None) -> str | None:
    """What the ``--set`` key ``key`` sets, by its first part: ``RECIPE_KEY``, ``ANALYSIS_SETTING``,
    ``PASS_OPTION`` (a pass of ``pass_names``, or of what it returns when called: only called when the key is
    neither of the others), None when it names none of them. With ``command`` (a key of ``SET_KINDS``) a kind
    that command does not take is refused in one line naming the commands that take it, and a key naming
    nothing is a training recipe key where the command takes those (the recipe refuses an unknown one naming
    its keys and the closest), refused naming the passes elsewhere."""
    head = key.partition(".")[0]
    names: Collection[str] = ()
    if head in SECTIONS or head in TOP_LEVEL:
        kind: str | None = RECIPE_KEY
    elif head == "analyze":
        kind = ANALYSIS_SETTING
    else:
        names = pass_names() if callable(pass_names) else pass_names
        kind = PASS_OPTION if head in names else None
    if command is None:
        return kind
    takes = SET_KINDS[command]
    if kind is None and RECIPE_KEY in takes:
        return RECIPE_KEY
    if kind is None:
        close = difflib.get_close_matches(head, ["analyze", *names], n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise LandscapeError(f"--set {shown(key)}: '{shown(head)}' is neither analyze (analyze.<setting>) nor a "
                             f"pass ({', '.join(names)}){hint}")
    if kind not in takes:
        takers = [f"landscape {name}" for name, kinds in SET_KINDS.items() if kind in kinds]
        raise LandscapeError(f"--set {shown(key)} is {kind}: give it to {', '.join(takers[:-1])} or {takers[-1]}")
    return kind
