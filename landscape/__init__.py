"""landscape: federated sharpness-aware training and loss-landscape analysis.

Notebook use: ``run = landscape.open_run("runs/x")`` (see ``landscape.store.run.Run``, the one read model of a
run, which the figures read too; a folder of runs gives the list of its runs), ``run.results()`` (every
quantity the run's analysis measured, a pandas DataFrame) and ``landscape.results(paths)`` (the same for many
runs; both in ``landscape.api.runs``);
analysis of any model on any data, with no run directory: ``landscape.hessian_eigs(model, data, k=5)``,
``landscape.trace``, ``landscape.density``, ``landscape.sharpness``, ``landscape.surface``,
``landscape.flatness_distance``, and over a model's clients ``landscape.incompatibility(model, clients_data)``
and ``landscape.alignment`` (see ``landscape.api``), and their figures ``landscape.plot_surface``,
``landscape.plot_spectrum``, ``landscape.plot_sharpness`` (see ``landscape.api.plots``); a run recorded from a training loop of your own:
``landscape.RunWriter`` (see ``landscape.store.writer``); what reading a run may warn:
``landscape.LandscapeNote``, its ``RecipeEditedWarning`` and ``StaleResultWarning`` (the command line's ``note:``
lines). ``dir(landscape)`` lists exactly these names (``__all__``).
"""

from __future__ import annotations

__version__ = "0.1.0"

# Name -> the module it comes from, imported on first use so that `landscape --help` does not wait for torch.
_LAZY = {
    "LandscapeError": "landscape.core.errors",
    "LandscapeNote": "landscape.core.errors",
    "RecipeEditedWarning": "landscape.core.errors",
    "StaleResultWarning": "landscape.core.errors",
    "Run": "landscape.api.runs",
    "RunWriter": "landscape.store.writer",
    "open_run": "landscape.api.runs",
    "results": "landscape.api.runs",
    "Alignment": "landscape.api",
    "DEFAULT_THREADS": "landscape.api",
    "Problem": "landscape.api",
    "Surface": "landscape.api",
    "alignment": "landscape.api",
    "density": "landscape.api",
    "flatness_distance": "landscape.api",
    "hessian_eigs": "landscape.api",
    "incompatibility": "landscape.api",
    "plot_sharpness": "landscape.api.plots",
    "plot_spectrum": "landscape.api.plots",
    "plot_surface": "landscape.api.plots",
    "problem": "landscape.api",
    "sharpness": "landscape.api",
    "surface": "landscape.api",
    "trace": "landscape.api",
}
__all__ = ["__version__", *sorted(_LAZY)]


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module == "landscape.api":
        from landscape import api as module  # static imports, which the import contracts see
    elif module == "landscape.api.plots":
        from landscape.api import plots as module
    elif module == "landscape.api.runs":
        from landscape.api import runs as module
    elif module == "landscape.store.run":
        from landscape.store import run as module
    elif module == "landscape.store.writer":
        from landscape.store import writer as module
    elif module == "landscape.core.errors":
        from landscape.core import errors as module
    else:
        raise AttributeError(f"module 'landscape' has no attribute {name!r}")
    return getattr(module, name)


def __dir__() -> list[str]:
    """The public API (``__all__``), for ``dir(landscape)`` and tab completion."""
    return list(__all__)
