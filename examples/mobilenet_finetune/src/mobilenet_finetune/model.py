"""A MobileNetV2-style network for 32x32 images (Sandler et al., CVPR 2018), with BatchNorm or GroupNorm.

Written here because PyPI's torchvision is a CUDA build that fails against the CPU torch. The layout is
MobileNetV2's: a 3x3 stem, 17 inverted-residual blocks (1x1 expand, 3x3 depthwise, 1x1 linear project;
a residual where the shape allows), a 1x1 conv to the last width, global average pooling and one linear
head. For CIFAR's 32x32 images the stem and the second stage keep stride 1 (as CIFAR ports of the network
do), and ``WIDTH`` (0.5) halves every width so a Raspberry Pi trains it. Parameter names are
``features.<i>...`` (0: stem, 1-17: the blocks, 18: the last conv) and ``classifier.*``: fine-tune the last
blocks with ``--trainable 'features.16.*,features.17.*,features.18.*,classifier.*'``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

WIDTH = 0.5
# (expansion t, output channels c, repeats n, first stride s), MobileNetV2's table with CIFAR strides
SETTINGS = ((1, 16, 1, 1), (6, 24, 2, 1), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1))
STEM, LAST = 32, 1280

Norm = Callable[[int], nn.Module]


def _width(channels: int) -> int:
    """``channels * WIDTH`` rounded to a multiple of 8 (MobileNetV2's rule), at least 8."""
    return max(8, int(channels * WIDTH + 4) // 8 * 8)


def group_norm(channels: int) -> nn.Module:
    """GroupNorm with 8 channels a group (every width here is a multiple of 8): no running statistics."""
    return nn.GroupNorm(channels // 8, channels)


def _conv_norm_relu(cin: int, cout: int, kernel: int, stride: int, groups: int, norm: Norm) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups, bias=False), norm(cout), nn.ReLU6()]


class InvertedResidual(nn.Module):
    """1x1 expand (unless t = 1) -> 3x3 depthwise -> 1x1 project (no activation); residual when shapes match."""

    def __init__(self, cin: int, cout: int, stride: int, expand: int, norm: Norm) -> None:
        super().__init__()
        hidden = cin * expand
        layers: list[nn.Module] = []
        if expand != 1:
            layers += _conv_norm_relu(cin, hidden, 1, 1, 1, norm)
        layers += _conv_norm_relu(hidden, hidden, 3, stride, hidden, norm)
        layers += [nn.Conv2d(hidden, cout, 1, bias=False), norm(cout)]
        self.conv = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv(x) if self.residual else self.conv(x)


class MobileNetV2(nn.Module):
    def __init__(self, num_classes: int, norm: Norm = nn.BatchNorm2d) -> None:
        super().__init__()
        cin = _width(STEM)
        blocks: list[nn.Module] = [nn.Sequential(*_conv_norm_relu(3, cin, 3, 1, 1, norm))]
        for t, c, n, s in SETTINGS:
            cout = _width(c)
            for i in range(n):
                blocks.append(InvertedResidual(cin, cout, s if i == 0 else 1, t, norm))
                cin = cout
        last = _width(LAST)
        blocks.append(nn.Sequential(*_conv_norm_relu(cin, last, 1, 1, 1, norm)))
        self.features = nn.Sequential(*blocks)  # 0: stem, 1..17: blocks, 18: last conv
        self.classifier = nn.Linear(last, num_classes)
        for m in self.modules():  # MobileNetV2's initialisation
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out")
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0, 0.01)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.features(x)  # (b, 640, 4, 4) for 32x32 input
        return self.classifier(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


def _check(input_shape: tuple[int, ...]) -> None:
    if len(input_shape) != 3 or input_shape[0] != 3 or min(input_shape[1:]) < 8:
        raise ValueError(f"mobilenet_v2 takes (3, H, W) images of at least 8x8, not {input_shape}")


def mobilenet_v2(num_classes: int, input_shape: tuple[int, ...]) -> nn.Module:
    """The model factory with BatchNorm (``--model mobilenet_finetune:mobilenet_v2``)."""
    _check(input_shape)
    return MobileNetV2(num_classes)


def mobilenet_v2_gn(num_classes: int, input_shape: tuple[int, ...]) -> nn.Module:
    """The same network with GroupNorm instead of BatchNorm (no running statistics), for comparison."""
    _check(input_shape)
    return MobileNetV2(num_classes, group_norm)


def parameter_count(model: nn.Module) -> int:
    return sum(math.prod(p.shape) for p in model.parameters())
