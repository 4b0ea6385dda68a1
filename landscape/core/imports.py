"""Code of the user's own, named by an import path: ``package.module:attribute`` (a model factory, a data
factory) or ``package.module`` (a module that registers models, data sets or algorithms when imported, named
in a recipe's ``imports``). Every failure is a one-line error naming what is missing.

Importing a module runs its code. A recipe the user names (``landscape train X.toml``, a dict given to
``recipe.resolve``) is the user's own: its imports run, the current folder is searched too (as ``python -m``
does, so ``imports = ["mylab"]`` finds ./mylab), and each newly imported module is named on stderr. A recorded
recipe (a run's recipe.toml, a checkpoint's) is someone's output: its imports run only when the user trusts it
(``--trust-imports``, ``open_run(path, trust_imports=True)``, or ``with trusted_imports():``), and then only
from where the user's environment has them: the current folder is not searched, not even the entry Python itself
puts first on sys.path (``''`` for ``python -c`` and the interactive prompt, the starting folder for ``python -m``)
unless the user named that folder in PYTHONPATH, so a .py file that came with a run never runs by lying beside
it (``without_current_folder``)."""

from __future__ import annotations

import contextlib
import contextvars
import importlib
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from landscape.core.errors import LandscapeError

_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")

# Whether the recorded recipes read now are trusted (their imports imported): the CLI's --trust-imports.
_TRUSTED: contextvars.ContextVar[bool] = contextvars.ContextVar("landscape_trusted_imports", default=False)


@contextlib.contextmanager
def trusted_imports(trust: bool = True) -> Iterator[None]:
    """Within the block, the recorded recipes read (runs, checkpoints) have their ``imports`` imported when
    ``trust`` is true: the CLI's ``--trust-imports``; in Python, around ``run_analysis`` or ``resume_run``."""
    if not isinstance(trust, bool):
        raise LandscapeError(f"trust_imports must be True or False, got {trust!r}")
    token = _TRUSTED.set(trust)
    try:
        yield
    finally:
        _TRUSTED.reset(token)


def imports_trusted() -> bool:
    """True inside ``trusted_imports()`` (the CLI's ``--trust-imports``)."""
    return _TRUSTED.get()


def _implicit_entry() -> str | None:
    """The folder Python itself put first on sys.path when it started: the starting folder for ``python -m``
    (``''`` for ``-c`` and the interactive prompt, which sys.path holds as such); None for a script, ``-P`` or
    ``-I``. Read from how this Python was started (``sys.orig_argv``) when this module is first imported."""
    if getattr(sys.flags, "safe_path", False) or sys.flags.isolated:
        return None
    args = list(getattr(sys, "orig_argv", []))[1:]
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg in ("-X", "-W", "--check-hash-based-pycs"):
            skip = True  # an option that takes the next argument
        elif arg == "-m" or (arg.startswith("-m") and not arg.startswith("--")):
            return os.getcwd()
        elif arg.startswith("-c") or not arg.startswith("-") or arg == "-":
            return None  # -c: sys.path holds '' (always taken out); a script (or stdin): its folder is the user's
    return None


_IMPLICIT = _implicit_entry()


def _user_path() -> set[str]:
    """The folders the user named in PYTHONPATH (resolved)."""
    given = os.environ.get("PYTHONPATH", "")
    return {os.path.realpath(entry or os.curdir) for entry in given.split(os.pathsep)} if given else set()


def _is_current_folder(entry: str, user: set[str]) -> bool:
    """An entry of sys.path that Python put there for the current folder, not the user: ``''`` (``python -c``,
    the interactive prompt; always the current folder), the starting folder ``python -m`` put first, and the
    current folder as the user-named-recipe imports append it; none the user named in PYTHONPATH."""
    if not isinstance(entry, str):
        return False
    where = os.path.realpath(entry or os.curdir)
    if where in user:
        return False
    return entry in ("", os.curdir) or (_IMPLICIT is not None and where == os.path.realpath(_IMPLICIT)) \
        or entry in _APPENDED


# The current folders appended to sys.path by imports of the user's own recipes (``import_module``).
_APPENDED: set[str] = set()


@contextlib.contextmanager
def without_current_folder() -> Iterator[None]:
    """Within the block, sys.path holds only the folders of the user's environment: the entries of the current
    folder (``_is_current_folder``) are taken out, and put back after (with whatever the block added)."""
    user = _user_path()
    saved = list(sys.path)
    kept = [entry for entry in saved if not _is_current_folder(entry, user)]
    if len(kept) == len(saved):
        yield
        return
    sys.path[:] = kept
    try:
        yield
    finally:
        added = [entry for entry in sys.path if entry not in kept and entry not in saved]
        sys.path[:] = saved + added


def _one_line(e: BaseException) -> str:
    detail = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {detail}" if detail else type(e).__name__


def import_module(name: str, what: str = "module", *, search_cwd: bool = True) -> Any:
    """Import ``name``; with ``search_cwd`` the current folder is searched too (appended to sys.path, as
    ``python -m`` searches it), only when the module is not imported yet. A module that fails while importing,
    SystemExit included (KeyboardInterrupt excepted), is one line naming it."""
    if not isinstance(name, str) or not _MODULE.match(name):
        raise LandscapeError(f"{what} '{name}' is not a module path such as mypackage.models")
    if name in sys.modules:
        return sys.modules[name]
    cwd = str(Path.cwd())
    if search_cwd and cwd not in sys.path:
        sys.path.append(cwd)
        _APPENDED.add(cwd)
    try:
        with contextlib.nullcontext() if search_cwd else without_current_folder():
            return importlib.import_module(name)
    except ModuleNotFoundError as e:
        hint = "" if search_cwd else (" (reading a run does not search the current folder: put its module on "
                                      "PYTHONPATH)")
        raise LandscapeError(f"cannot import {what} '{name}': no module named '{e.name}'{hint}") from None
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # noqa: BLE001 - the user's module failed (or exited) while importing: one line
        raise LandscapeError(f"importing {what} '{name}' failed: {_one_line(e)}") from None


def import_recipe_modules(modules: tuple[str, ...] | list[str], *, search_cwd: bool) -> None:
    """Import a recipe's ``imports`` in order, naming each one newly imported on stderr once it is imported
    (``note: importing mylab.registry (recipe imports: runs its code)``; under torchrun on rank 0 only). One
    that fails is the one-line error alone."""
    from landscape.core import parallel

    for module in modules:
        new = module not in sys.modules
        import_module(module, what="recipe import", search_cwd=search_cwd)
        if new and parallel.is_main():
            print(f"note: importing {module} (recipe imports: runs its code)", file=sys.stderr, flush=True)


def untrusted(origin: str, modules: tuple[str, ...] | list[str], entries: list[str]) -> str:
    """The one-line refusal of a recorded recipe whose ``entries`` ("model 'mynet'") only its ``modules``
    provide, when the user has not said to trust them."""
    return (f"{origin} names {' and '.join(entries)}, which only its imports ({', '.join(modules)}) provide: "
            "a recipe's imports run code, so reading a run does not import them; pass --trust-imports if you "
            "trust that code (Python: open_run(path, trust_imports=True), or import it first)")


def load_object(spec: str, what: str = "object") -> Any:
    """The attribute named by ``package.module:attribute`` (the current folder searched too)."""
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
    """Call the zero-argument factory named by ``spec`` and return what it makes (a factory that raises or
    exits, KeyboardInterrupt excepted, is one line naming it)."""
    factory = load_object(spec, what)
    if not callable(factory):
        raise LandscapeError(f"{what} '{spec}' is not callable")
    try:
        return factory()
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # noqa: BLE001 - the user's factory failed: one line naming it
        raise LandscapeError(f"{what} '{spec}' failed: {_one_line(e)}") from None


def check_factory_spec(spec: object, where: str) -> None:
    """``spec`` names a function by ``package.module:function`` (never ``__main__``, which another process
    cannot import), or a one-line error naming ``where`` it was given."""
    if not isinstance(spec, str) or spec.count(":") != 1 or not all(spec.split(":")):
        raise LandscapeError(f"{where} must name a function as package.module:function (got {spec!r:.80})")
    if spec.split(":")[0] == "__main__":
        raise LandscapeError(f"{where} '{spec}' is in the script being run (__main__), which the analysis cannot "
                             "import: put the function in a module of its own (e.g. mylab/nets.py: "
                             "mylab.nets:make_net)")
