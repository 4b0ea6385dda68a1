"""The memory layout of a model's 4-D tensors in training and evaluation (``train.memory_format``,
``analyze.memory_format``), and the one-off timing that chooses it.

Why: on the CPU a convolution given channels-last (NHWC) weights or input produces channels-last activations,
and the convolution and max-pooling kernels of that layout can be much faster than the NCHW ones on small
images (issue 23; the surface path uses it for its cells, ``landscape.analyze.surface.evaluation``).
``FlatModel.channels_last`` switches it on for every forward of a model (``_call_module``): the 4-D input and
every 4-D parameter (a 2-D convolution's weight) are copied into channels-last layout first. The copies are
differentiable, so gradients reach w as before, in w's own layout. What changes is the order of float
operations inside the kernels: losses, gradients and so every trained number equal the NCHW ones to float
rounding, not bit for bit.

Whether it pays depends on the model, the work and the machine (benchmarks/memory_format.py measures it; the
table is in docs/results). So ``"auto"`` measures: a few steps (a training step, ``FlatModel.loss_and_grad``
on one training batch; in the analysis a loss and gradient of one analysis batch) each way, interleaved
(``time_formats``); channels-last is taken unless it is clearly slower, in its fastest step and in its
median one (``DECISIVE``). The default side is channels-last because on the CPU it was faster for every kind
of work measured but the products (the table): a model near the old "clearly faster" line, such as the
digits CNN's training step, flipped between processes, and two runs of one recipe then differed in their
last bits; the line now lies where no measured model is. Off the CPU, and for a model without 4-D
parameters, it is contiguous without a timing. A process keeps its choice per model, batch shape, dtype and
threads (``choose_memory_format``: a sweep's runs of one model share one timing and one layout). The trainer
decides when a run's state begins and records the choice in every checkpoint; a resume takes it from there
(``landscape.train.state.TrainerCheckpoints.settle_memory_format``). The analysis decides per checkpoint and
records the choice in every result beside its threads (``landscape.analyze.context``); its Hessian-vector
products are contiguous in every case: channels-last ones measured close to them, a little faster for some
models and slower for others (the table), and so no Hessian number depends on a timing.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from landscape.core.errors import LandscapeError

# ``flat`` below is a ``landscape.core.flat.FlatModel`` (not imported: flat imports this module's copy)
FlatModel = Any

CHANNELS_LAST, CONTIGUOUS = "channels-last", "contiguous"
LAYOUTS = (CHANNELS_LAST, CONTIGUOUS)  # what a choice resolves to ("auto" is the setting that times)
DECISIVE = 0.9  # contiguous is chosen when its steps take at most this fraction of the channels-last ones'
REPEATS = 5  # timed steps per layout, after one warm-up step each

# A process's choices, by (model layout, batch shape, dtype, device, threads, autocast): measured once each
_CHOSEN: dict[Hashable, MemoryFormatChoice] = {}


def channels_last_copy(tensor: Tensor) -> Tensor:
    """A 4-D tensor (N, C, H, W) with the strides of channels-last layout, (HWC, 1, WC, C) (a differentiable
    copy, or the tensor itself when it has them); any other tensor as it is.

    Not ``contiguous(memory_format=torch.channels_last)``: for C = 1 (a grey-scale input, a first convolution's
    weight) that returns the NCHW tensor itself, whose strides are those of both layouts, and PyTorch then runs
    the first convolution, and the pooling after it, in NCHW. The NHWC tensor is made by views and one
    reshape instead (no copy at all for C = 1), out of place, so that it works under ``torch.func.vmap`` too
    (the surface's vmapped cells)."""
    if tensor.dim() != 4:
        return tensor
    n, c, h, w = tensor.shape
    if tensor.stride() == (h * w * c, 1, w * c, c):
        return tensor
    return tensor.permute(0, 2, 3, 1).reshape(n, h * w * c).view(n, h, w, c).permute(0, 3, 1, 2)


def has_convolutions(flat: FlatModel) -> bool:
    """Whether the model has a 4-D trainable parameter (a 2-D convolution's weight): without one the layout
    changes nothing but the input's copy."""
    return any(len(shape) == 4 for shape in flat.shapes)


@dataclass(frozen=True)
class MemoryFormatChoice:
    """The layout a run trains and evaluates in (``name``: "channels-last" or "contiguous"), why, and auto's
    timing: (contiguous, channels-last) seconds of one training step, the fastest of ``REPEATS`` each (kept
    in memory only: a checkpoint records ``name`` and ``reason``, so that two runs that chose alike write the
    same bytes, and a resumed run the same record as the run it continues)."""

    name: str
    reason: str
    seconds: tuple[float, float] | None = None

    @property
    def channels_last(self) -> bool:
        return self.name == CHANNELS_LAST

    def record(self) -> dict[str, str]:
        """The checkpoint's ``memory_format`` entry (a resume takes it as it is, never timing again)."""
        return {"name": self.name, "reason": self.reason}


def recorded_choice(record: Any, where: str) -> MemoryFormatChoice:
    """The choice a checkpoint recorded (``MemoryFormatChoice.record``); a checkpoint without one was written
    before the setting existed, by a run that trained contiguous. Anything else: a one-line error."""
    if record is None:
        return MemoryFormatChoice(CONTIGUOUS, "written before train.memory_format: contiguous")
    name = record.get("name") if isinstance(record, dict) else None
    if name not in LAYOUTS:
        raise LandscapeError(f"{where} records an unknown memory format {name if name is not None else record!r} "
                             f"(one of {', '.join(LAYOUTS)} expected)")
    return MemoryFormatChoice(name, str(record.get("reason", name)))


def time_formats(time_step: Callable[[bool], float], repeats: int = REPEATS) -> tuple[list[float], list[float]]:
    """The seconds of ``repeats`` steps (contiguous, channels-last), after one warm-up step each (allocations,
    kernel choice), interleaved so that a change in the machine's load reaches both.
    ``time_step(channels_last)`` runs one step and returns its seconds."""
    seconds: dict[bool, list[float]] = {False: [], True: []}
    for layout in (False, True):
        time_step(layout)
    for _ in range(repeats):
        for layout in (False, True):
            seconds[layout].append(time_step(layout))
    return seconds[False], seconds[True]


def training_step_timer(flat: FlatModel, x: Tensor, y: Tensor, buffers: dict[str, Tensor],
                        context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
                        clock: Callable[[], float] = time.perf_counter) -> Callable[[bool], float]:
    """``time_step`` of ``time_formats`` for one training step of ``flat`` at its module's parameters: forward
    and backward of the batch (x, y) through ``FlatModel.loss_and_grad`` in train mode, inside ``context()``
    (the trainer's autocast). Nothing the run computes is touched: BatchNorm statistics move in copies, the
    global RNG (dropout's masks) is restored, and the model's layout and mode are set back."""
    w = flat.vector()

    def time_step(channels_last: bool) -> float:
        with flat.mode(True), flat.layout(channels_last), torch.random.fork_rng(devices=[]), context():
            stats = {k: v.clone() for k, v in buffers.items()}
            start = clock()
            flat.loss_and_grad(w, x, y, stats)
            return clock() - start

    return time_step


def choose_memory_format(setting: str, flat: FlatModel, device: torch.device,
                         time_step: Callable[[bool], float] | None = None, key: Hashable | None = None,
                         repeats: int = REPEATS, *, name: str = "train.memory_format",
                         steps: str = "training steps") -> MemoryFormatChoice:
    """The layout ``setting`` ("auto", "channels-last" or "contiguous") of the setting ``name`` means for
    ``flat`` on ``device``.

    "auto" times ``time_step`` (``time_formats``; ``steps`` says what it runs) on the CPU for a model with 4-D
    parameters, and keeps the answer for ``key`` (the model's layout and batch shape) for the rest of the
    process, so runs of one model in one process compute alike; a test injects ``time_step`` to force either
    choice."""
    if setting in LAYOUTS:
        return MemoryFormatChoice(setting, f'{name} = "{setting}"')
    if setting != "auto":
        raise LandscapeError(f"{name} must be one of auto, {', '.join(LAYOUTS)} (got {setting!r})")
    if device.type != "cpu":
        return MemoryFormatChoice(CONTIGUOUS, f"auto on {device.type}: contiguous (timed on the CPU only)")
    if not has_convolutions(flat):
        return MemoryFormatChoice(CONTIGUOUS, "auto: the model has no 4-D convolution weights")
    if key is not None and key in _CHOSEN:
        return _CHOSEN[key]
    if time_step is None:
        raise LandscapeError(f"{name} = \"auto\" needs a step to time")
    contiguous, channels_last = time_formats(time_step, repeats)
    slower = all(pick(contiguous) <= DECISIVE * pick(channels_last) for pick in (min, statistics.median))
    verdict = "at least" if slower else "not"
    choice = MemoryFormatChoice(CONTIGUOUS if slower else CHANNELS_LAST,
                                f"auto: contiguous {verdict} {1 - DECISIVE:.0%} faster than channels-last in a "
                                f"start-up timing of {steps}", (min(contiguous), min(channels_last)))
    if key is not None:
        _CHOSEN[key] = choice
    return choice
