"""Recipe overrides: what edits a recipe from outside (``--set key=value``, flags, ``[sweep]`` axes).

``parse_value`` and ``parse_assignment`` read a ``--set`` value (``recipe.set_key`` sets it in a raw
recipe dict); ``build`` loads a recipe file, applies overrides in order and resolves it (one run),
``build_sweep`` does so for every point of its sweep, and ``sweep_run_name`` names each point's run folder.
"""

from __future__ import annotations

import copy
import itertools
import sys
from pathlib import Path
from typing import Any

from landscape.config.recipe import Recipe, read_toml, resolve, run_name, set_key
from landscape.core.errors import LandscapeError, shown

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
