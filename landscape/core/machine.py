"""What this machine can hold, for the checks that refuse a size before anything is allocated (a synthetic data
set's dimension, a model's width, a Hessian's top_k): the CPU memory free now, and the one line that refuses a
need above it.

``landscape.measure.products.free_memory`` answers for a CUDA device too; the CPU's answer is this one.
"""

from __future__ import annotations

import os

from landscape.core.errors import LandscapeError


def free_cpu_memory() -> int | None:
    """Bytes of CPU memory free now (MemAvailable of /proc/meminfo, else the free pages); None where unknown."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def gib(n: float) -> str:
    """Bytes as GiB for a message: '1.5 GiB', '7.2e+08 GiB' for sizes past any machine."""
    value = n / 2**30
    return f"{value:,.1f} GiB" if value < 1e6 else f"{value:.1e} GiB"


_CPU = object()


def require_memory(needed: float, what: str, advice: str, free: int | None | object = _CPU) -> None:
    """Refuse in one line when ``needed`` bytes are more than are free: '<what> needs about X GiB of memory, Y GiB
    are free: <advice>'. ``free``: the bytes free where the memory is wanted (a device's), by default the CPU's
    (``free_cpu_memory()``); unknown (None) passes."""
    free = free_cpu_memory() if free is _CPU else free
    if isinstance(free, int) and needed > free:
        raise LandscapeError(f"{what} needs about {gib(needed)} of memory, {gib(free)} are free: {advice}")
