"""ResNet-18 for small images (He et al. 2016), with the CIFAR stem used across the FL literature.

The stem is a 3x3 stride-1 convolution with no max-pool (as in the common CIFAR ResNets), followed by four
stages of two BasicBlocks (widths 64, 128, 256, 512; strides 1, 2, 2, 2), global average pooling and a linear
head. Normalisation is GroupNorm by default: BatchNorm's running statistics break under non-IID clients, so
Hsieh et al. 2020 ("The Non-IID Data Quagmire") and FedSAM (Caldarola et al. 2022) use GroupNorm, 2 groups.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

NormFactory = Callable[[int], nn.Module]


def norm_factory(norm: str, groups: int) -> NormFactory:
    """channels -> normalisation layer: GroupNorm(groups, channels) for 'gn', BatchNorm2d for 'bn'."""
    if norm == "gn":
        return lambda channels: nn.GroupNorm(groups, channels)
    return nn.BatchNorm2d


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with a residual connection; a 1x1 conv + norm shortcut when the shape changes."""

    def __init__(self, in_planes: int, planes: int, stride: int, make_norm: NormFactory) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.norm1 = make_norm(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.norm2 = make_norm(planes)
        self.relu = nn.ReLU()
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False), make_norm(planes)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.norm1(self.conv1(x)))
        out = self.norm2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


class ResNet18(nn.Module):
    """ResNet-18, CIFAR stem; parameters keep PyTorch's default initialisation (no re-init)."""

    WIDTHS = (64, 128, 256, 512)
    STRIDES = (1, 2, 2, 2)
    BLOCKS_PER_STAGE = 2

    def __init__(self, in_channels: int, num_classes: int, make_norm: NormFactory) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, self.WIDTHS[0], 3, stride=1, padding=1, bias=False)
        self.norm1 = make_norm(self.WIDTHS[0])
        self.relu = nn.ReLU()
        stages: list[nn.Module] = []
        in_planes = self.WIDTHS[0]
        for planes, stride in zip(self.WIDTHS, self.STRIDES, strict=True):
            blocks = []
            for i in range(self.BLOCKS_PER_STAGE):
                blocks.append(BasicBlock(in_planes, planes, stride if i == 0 else 1, make_norm))
                in_planes = planes
            stages.append(nn.Sequential(*blocks))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(self.WIDTHS[-1], num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.norm1(self.conv1(x)))
        out = self.layer4(self.layer3(self.layer2(self.layer1(out))))
        return self.fc(torch.flatten(self.pool(out), 1))
