"""Run directories for notebooks: ``landscape.open_run``, ``landscape.results`` and ``landscape.Run``, the
store's (``landscape.store.run``) with what the analysis declares each pass measures (``PassSpec.measures``), so
that their results tables hold quantities only, each concept under one name.

The store reads files and imports no analysis (the layers contract); the declarations live with the passes
(``landscape.analyze.passes``): this module passes them in (``DECLARED``). A pass a module of your own declares
is known once that module is imported (``open_run(path, trust_imports=True)`` of a run whose recipe imports it,
or an import of your own); a pass that declares no quantities, or none known here, gives every number of its
results (``landscape.store.results.records``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from landscape.analyze.passes import PASSES
from landscape.store import run as store
from landscape.store.results.records import Indexed, Measures

if TYPE_CHECKING:
    import pandas

__all__ = ["DECLARED", "Run", "open_run", "results"]


class DeclaredMeasures:
    """What each declared pass measures (``store.results.records.Measures``), read from the registry when asked,
    so a pass declared later (a module of your own, imported after this one) is known too."""

    def measures(self, pass_name: str) -> Mapping[str, str] | None:
        return PASSES.get(pass_name).measures if pass_name in PASSES else None

    def indexed(self, pass_name: str) -> Sequence[Indexed]:
        return PASSES.get(pass_name).indexed if pass_name in PASSES else ()


DECLARED = DeclaredMeasures()


class Run(store.Run):
    """A run directory read (``landscape.store.run.Run``) whose ``results()`` hold what each pass declares it
    measures: ``landscape.Run(path)`` is ``landscape.open_run(path)`` of a run directory, its recipe read on
    first use."""

    def __init__(self, path: str | Path, trust_imports: bool = False, measures: Measures | None = DECLARED) -> None:
        super().__init__(path, trust_imports=trust_imports, measures=measures)


def open_run(path: str | Path, trust_imports: bool = False) -> store.Run | store.Runs:
    """Open a run directory for reading (a ``Run``: ``.recipe``, ``.metrics()``, ``.records()``,
    ``.results()``, ``.model(round)``, ``.data()``; its recipe is read and resolved now: the one its checkpoints
    record, with a ``RecipeEditedWarning`` where recipe.toml was edited after training), or every run of a
    folder of runs (``Runs``: a list of ``Run``, sorted by name, each opened so); ``trust_imports=True``
    imports the modules the recipes' ``imports`` name (their code runs). Their ``results()`` hold what each
    pass declares it measures (``landscape.store.run.open_run`` with ``DECLARED``)."""
    return store.open_run(path, trust_imports=trust_imports, measures=DECLARED)


def results(paths: str | Path | store.Run | Iterable[str | Path | store.Run]) -> pandas.DataFrame:
    """Every analysis result of many runs as one tidy pandas DataFrame, the quantities each pass declares it
    measures (``landscape.store.run.results`` with ``DECLARED``): ``paths`` a run directory, a folder of runs, a
    ``Run``, or a list of them, each run once, in the order given (a folder's runs by name). ``run`` is the
    directory's name, or its path where two runs share a name."""
    return store.results(paths, measures=DECLARED)
