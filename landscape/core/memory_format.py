"""The memory layout of a model's 4-D tensors in training and evaluation (``train.memory_format``,
``analyze.memory_format``), and the rule that resolves "auto".

Why: on the CPU a convolution given channels-last (NHWC) weights or input produces channels-last activations,
and the convolution and max-pooling kernels of that layout can be much faster than the NCHW ones on small
images (issue 23; the surface path uses it for its cells, ``landscape.measure.surface.evaluation``).
``FlatModel.channels_last`` switches it on for every forward of a model (``_call_module``): the 4-D input and
every 4-D parameter (a 2-D convolution's weight) are copied into channels-last layout first. The copies are
differentiable, so gradients reach w as before, in w's own layout. What changes is the order of float
operations inside the kernels: losses, gradients and so every trained number equal the NCHW ones to float
rounding, not bit for bit.

So the layout is part of what a run computes, and no number may depend on a clock (issue 43): "auto" is
resolved from the model and the device alone (``choose_memory_format``): channels-last on the CPU for a model
with 4-D convolution weights (on the CPU it was faster for every kind of work measured but the products:
benchmarks/memory_format.py, the table in docs/results), contiguous off the CPU and for a model without them.
An earlier release timed both layouts at start-up; two runs of one recipe and seed on one machine then
differed under other load (a claims verdict with them). The trainer resolves the setting when a run's state
begins and records the choice in every checkpoint; a resume and a rerun take it from there
(``landscape.train.trainer.Trainer.settle_memory_format``). The analysis resolves it per checkpoint
and records it in every result beside its threads (``landscape.analyze.context``), and the function API resolves
"auto" by the same rule for its copy of the model (``landscape.api.checks.analysis_model``); its Hessian-vector
products are contiguous in every case: channels-last ones measured close to them, a little faster for some
models and slower for others (the table).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from landscape.core.errors import LandscapeError

# ``flat`` below is a ``landscape.core.flat.FlatModel`` (not imported: flat imports this module's copy)
FlatModel = Any

CHANNELS_LAST, CONTIGUOUS = "channels-last", "contiguous"
LAYOUTS = (CHANNELS_LAST, CONTIGUOUS)  # what a choice resolves to ("auto" is resolved by the rule above)
AUTO_RULE = "channels-last on the CPU for a model with 2-D convolutions, contiguous otherwise"  # what "auto" means


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
    """The layout a run trains and evaluates in (``name``: "channels-last" or "contiguous") and why (both
    recorded in every checkpoint and result)."""

    name: str
    reason: str

    @property
    def channels_last(self) -> bool:
        return self.name == CHANNELS_LAST

    def record(self) -> dict[str, str]:
        """The checkpoint's ``memory_format`` entry (a resume takes it as it is)."""
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


def choose_memory_format(setting: str, flat: FlatModel, device: torch.device, *,
                         name: str = "train.memory_format") -> MemoryFormatChoice:
    """The layout ``setting`` ("auto", "channels-last" or "contiguous") of the setting ``name`` means for
    ``flat`` on ``device``: "auto" is channels-last on the CPU for a model with 4-D convolution weights and
    contiguous otherwise, from the model and the device alone (module docstring)."""
    if setting in LAYOUTS:
        return MemoryFormatChoice(setting, f'{name} = "{setting}"')
    if setting != "auto":
        raise LandscapeError(f"{name} must be one of auto, {', '.join(LAYOUTS)} (got {setting!r})")
    if device.type != "cpu":
        return MemoryFormatChoice(CONTIGUOUS, f"auto on {device.type}: contiguous")
    if not has_convolutions(flat):
        return MemoryFormatChoice(CONTIGUOUS, "auto: the model has no 4-D convolution weights")
    return MemoryFormatChoice(CHANNELS_LAST, "auto on the CPU: channels-last for a model with 4-D convolution "
                                             "weights")  # AUTO_RULE
