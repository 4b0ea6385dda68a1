"""The analysis passes, one module each: its options (a schema dataclass), its declaration in ``PASSES`` (opt-in,
needs, cost model, summary quantities) and its function. Adding a pass is adding a module here: importing this
package imports every module in it (``_``-prefixed ones are shared helpers), so every pass is declared and has its
function. A pass imports its computation (Lanczos, the ascent, the surface grid evaluation, ...) inside its
function, so importing the passes stays light: figures, reports and claims read their metadata from here and
load no computation.

A pass reads one checkpoint (``CheckpointContext``) and its options, and returns a ``PassOutput``: scalars
(for ``analysis/round-NNNN/<pass>.json``), arrays (``<pass>.npz``) and the few numbers of the summary table.
``scheduler.run_analysis`` runs them; ``results.py`` writes what they return.
"""

from __future__ import annotations

import importlib
import pkgutil

from landscape.analyze.registry import PASSES

for _module in sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_")):
    importlib.import_module(f"{__name__}.{_module}")

__all__ = ["PASSES"]
