"""Analysis recipes (``analyze/*.toml``): which passes, on which rounds, with which settings and options.

```
rounds = "all"                       # last, all, or a comma list
passes = ["loss", "hessian", "sharpness"]
[settings]                           # shared by every pass: split, analysis_samples, bn_mode, batch_size,
analysis_samples = 500               #   seed, dtype, hvp, backend, device
[hessian]                            # one table per pass: its options (`landscape list` names them)
top_k = 3
```
``landscape analyze RUN analyze/quick.toml`` takes one; flags given on the command line win over it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from landscape.analyze.catalog import load_passes
from landscape.analyze.settings import AnalysisSettings
from landscape.config.recipe import read_toml
from landscape.core.errors import LandscapeError

TOP_LEVEL = ("rounds", "passes", "settings", "title")


@dataclass(frozen=True)
class AnalysisRecipe:
    path: Path
    rounds: str | None = None
    passes: tuple[str, ...] | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    options: dict[str, dict[str, Any]] = field(default_factory=dict)


def load_analysis_recipe(path: str | Path) -> AnalysisRecipe:
    """Read and check an analysis recipe: every key known, every value of the right kind."""
    path = Path(path)
    raw = read_toml(path)
    registry = load_passes()
    for key in raw:
        if key not in TOP_LEVEL and key not in registry.names():
            raise LandscapeError(f"{path}: unknown key '{key}'; allowed: {', '.join(TOP_LEVEL)} and the pass names "
                                 f"({', '.join(registry.names())})")
    rounds = raw.get("rounds")
    if rounds is not None and not isinstance(rounds, (str, int)):
        raise LandscapeError(f"{path}: rounds must be last, all or a comma list (got {rounds!r})")
    passes = raw.get("passes")
    if passes is not None:
        if not isinstance(passes, list) or not passes or not all(isinstance(p, str) for p in passes):
            raise LandscapeError(f"{path}: passes must be a non-empty list of pass names")
        for name in passes:
            registry.get(name)
    settings = raw.get("settings", {})
    if not isinstance(settings, dict):
        raise LandscapeError(f"{path}: [settings] must be a table")
    allowed = {f.name: f for f in dataclasses.fields(AnalysisSettings)}
    for key, value in settings.items():
        if key not in allowed:
            raise LandscapeError(f"{path}: unknown setting '{key}'; allowed: {', '.join(allowed)}")
        default = allowed[key].default
        if type(value) is not type(default):
            raise LandscapeError(f"{path}: settings.{key} must be a {type(default).__name__} (got {value!r})")
    options = {}
    for name in registry.names():
        if name in raw:
            if not isinstance(raw[name], dict):
                raise LandscapeError(f"{path}: [{name}] must be a table of that pass's options")
            try:
                registry.get(name).make_options(raw[name])
            except (TypeError, ValueError) as e:
                raise LandscapeError(f"{path}: [{name}]: {e}") from None
            options[name] = dict(raw[name])
    return AnalysisRecipe(path, None if rounds is None else str(rounds), tuple(passes) if passes else None,
                          dict(settings), options)
