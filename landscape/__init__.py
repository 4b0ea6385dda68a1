"""landscape: federated sharpness-aware training and loss-landscape analysis.

Notebook use: ``run = landscape.open_run("runs/x")`` (see ``landscape.store.run.Run``, the one read model of a
run, which the figures read too); analysis of any model on any data, with no run directory:
``landscape.hessian_eigs(model, data, k=5)``, ``landscape.trace``, ``landscape.density``, ``landscape.sharpness``,
``landscape.surface``, ``landscape.flatness_distance`` (see ``landscape.api``).
"""

from __future__ import annotations

__version__ = "0.1.0"
_API = ("hessian_eigs", "trace", "density", "sharpness", "surface", "flatness_distance", "problem")
__all__ = [
    "__version__",
    "density",
    "flatness_distance",
    "hessian_eigs",
    "open_run",
    "problem",
    "sharpness",
    "surface",
    "trace",
]


def __getattr__(name: str):
    # Imported on first use so that `landscape --help` does not wait for torch.
    if name == "open_run":
        from landscape.store.run import open_run

        return open_run
    if name in _API:
        from landscape import api

        return getattr(api, name)
    raise AttributeError(f"module 'landscape' has no attribute {name!r}")
