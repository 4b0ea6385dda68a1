"""landscape: federated sharpness-aware training and loss-landscape analysis.

Notebook use: ``run = landscape.open_run("runs/x")`` (see ``landscape.runs.Run``).
"""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["__version__", "open_run"]


def __getattr__(name: str):
    # Imported on first use so that `landscape --help` does not wait for torch.
    if name == "open_run":
        from landscape.runs import open_run

        return open_run
    raise AttributeError(f"module 'landscape' has no attribute {name!r}")
