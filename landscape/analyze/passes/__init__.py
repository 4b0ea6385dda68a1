"""The analysis passes, one module each: its options (a schema dataclass), its declaration in ``PASSES`` (opt-in,
needs, cost model, summary quantities) and its function. Adding a pass is adding a module here: importing this
package imports every module in it (``_``-prefixed ones are shared helpers), so every pass is declared and has its
function. A pass imports its computation (Lanczos, the ascent, the surface grid evaluation, ...) inside its
function, so importing the passes stays light: figures, reports and claims read their metadata from here and
load no computation.

A pass reads one checkpoint (``CheckpointContext``) and its options, and returns a ``PassOutput``: scalars
(for ``analysis/round-NNNN/<pass>.json``), arrays (``<pass>.npz``) and the few numbers of the summary table.
``scheduler.run_analysis`` runs them; ``landscape.store.results`` writes what they return, named by
``RESULT_NAMES`` (the store's naming rule against the declared passes' options and the analysis settings).
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

from landscape.analyze.registry import PASSES
from landscape.analyze.settings import AnalysisSettings
from landscape.core.errors import LandscapeError
from landscape.store.results.names import ResultNames
from landscape.store.results.serial import to_plain

for _module in sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_")):
    importlib.import_module(f"{__name__}.{_module}")


class DeclaredSettings:
    """The defaults results are named against (``store.results.names.SettingsCatalog``): the analysis
    settings' and those of the options of every pass declared here."""

    def analysis_defaults(self) -> dict[str, Any]:
        return AnalysisSettings().record()

    def option_defaults(self, pass_name: str) -> dict[str, Any]:
        # A pass not declared (a result of a pass since removed) has no options to name.
        return to_plain(PASSES.get(pass_name).option_defaults()) if pass_name in PASSES else {}

    def options_recorded_before(self, pass_name: str) -> dict[str, Any]:
        return to_plain(dict(PASSES.get(pass_name).recorded_before)) if pass_name in PASSES else {}

    def option_names(self) -> dict[str, set[str]]:
        return {entry.name: set(entry.option_defaults()) for entry in PASSES.entries()}

    def output_name(self, pass_name: str, options: dict) -> str | None:
        try:
            made = PASSES.get(pass_name).make_options(options)
        except (LandscapeError, TypeError, ValueError, AttributeError):  # options of another type than their own
            return None
        return getattr(made, "output_name", pass_name)


RESULT_NAMES = ResultNames(DeclaredSettings())  # the names of results, and their settings told apart

__all__ = ["PASSES", "RESULT_NAMES"]
