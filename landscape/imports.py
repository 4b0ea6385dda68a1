"""Code of the user's own, named by an import path: ``package.module:attribute`` (a model factory, a data
factory) or ``package.module`` (a module that registers models, data sets or algorithms when imported, named
in a recipe's ``imports``). Every failure is a one-line error naming what is missing."""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path
from typing import Any

from landscape.errors import LandscapeError

_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


def import_module(name: str, what: str = "module") -> Any:
    """Import ``name`` (the current folder is searched too, as ``python -m`` does)."""
    if not isinstance(name, str) or not _MODULE.match(name):
        raise LandscapeError(f"{what} '{name}' is not a module path such as mypackage.models")
    cwd = str(Path.cwd())
    if cwd not in sys.path:
        sys.path.append(cwd)
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        raise LandscapeError(f"cannot import {what} '{name}': no module named '{e.name}'") from None
    except Exception as e:  # noqa: BLE001 - the user's module failed while importing: say how, in one line
        detail = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise LandscapeError(f"importing {what} '{name}' failed: {type(e).__name__}: {detail}") from None


def load_object(spec: str, what: str = "object") -> Any:
    """The attribute named by ``package.module:attribute``."""
    module_name, sep, attribute = spec.partition(":")
    if not sep or not attribute:
        raise LandscapeError(f"{what} '{spec}' must be package.module:name (e.g. mymodels:make_net)")
    module = import_module(module_name, what=f"the module of {what} '{spec}'")
    found: Any = module
    for part in attribute.split("."):
        if not hasattr(found, part):
            raise LandscapeError(f"{what} '{spec}': module '{module_name}' has no '{attribute}'")
        found = getattr(found, part)
    return found


def call_factory(spec: str, what: str) -> Any:
    """Call the zero-argument factory named by ``spec`` and return what it makes."""
    factory = load_object(spec, what)
    if not callable(factory):
        raise LandscapeError(f"{what} '{spec}' is not callable")
    try:
        return factory()
    except Exception as e:  # noqa: BLE001 - the user's factory failed: one line naming it
        detail = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise LandscapeError(f"{what} '{spec}' failed: {type(e).__name__}: {detail}") from None
