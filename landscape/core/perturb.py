"""Perturbation helpers of SAM-type rules (one global L2 norm over all parameters): the client rules of
training and the rho-ball sharpness of analysis both use them."""

from __future__ import annotations

import torch
from torch import Tensor


def normalized(v: Tensor) -> Tensor:
    """v / ||v|| (global L2 norm); the zero vector stays zero."""
    norm = v.norm()
    return v / torch.where(norm > 0, norm, torch.ones_like(norm))  # no host sync on the device


def sam_perturbation(g: Tensor, rho: float) -> Tensor:
    """SAM ascent step e = rho * g / ||g|| (Foret et al. 2021)."""
    return rho * normalized(g)


def asam_perturbation(g: Tensor, w: Tensor, rho: float, eta: float, weight_mask: Tensor) -> Tensor:
    """Adaptive SAM step e = rho * T^2 g / ||T g||, T = |w| + eta on weights, 1 on biases (Kwon et al. 2021)."""
    t = torch.where(weight_mask.bool(), w.abs() + eta, torch.ones_like(w))
    return rho * t * normalized(t * g)


def is_weight(name: str, shape: tuple[int, ...]) -> bool:
    """The tensors ASAM rescales: those named ``weight`` (the reference's rule; biases keep T = 1)."""
    return name.endswith("weight")
