"""The model registry: CIFAR-sized ``cnn``, ``resnet18`` and ``vgg11``, all with GroupNorm.

``resnet18`` on Tiny-ImageNet (64x64) is the DisPFL paper's ``tiny_resnet18``: the same network (3x3
stride-1 stem, no max-pool) whose final average pool is global (adaptive to 1x1), so a 64x64 input ends in
an 8x8 map instead of 4x4; its parameters are the CIFAR count with a 200-class head (11,271,432) and every
convolution costs 4x the FLOPs. ``cnn`` takes 32x32 images only (its fc1 is sized for a 5x5 map).

GroupNorm, never BatchNorm: DisPFL masks every parameter tensor and models must carry no buffers
(running statistics cannot be averaged over personal masks). Parameter counts for 10 classes are
pinned by docs/ALGORITHM.md and by tests: cnn 797,962; resnet18 11,173,962; vgg11 9,231,114.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from edge_node.errors import ModelError

GN_GROUPS = 32  # GroupNorm(32, C), as in DisPFL's reference models


class CNN(nn.Module):
    """The 2-conv CNN of FedAvg/DisPFL (the default for small devices and tests)."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 5)  # 32 -> 28, pool -> 14
        self.conv2 = nn.Conv2d(64, 64, 5)  # 14 -> 10, pool -> 5
        self.fc1 = nn.Linear(64 * 5 * 5, 384)
        self.fc2 = nn.Linear(384, 192)
        self.fc3 = nn.Linear(192, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = torch.max_pool2d(torch.relu(self.conv2(x)), 2)
        x = torch.flatten(x, 1)  # (b, 1600)
        x = torch.relu(self.fc1(x))
        x = torch.relu(self.fc2(x))
        return self.fc3(x)


class BasicBlock(nn.Module):
    def __init__(self, in_planes: int, planes: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.norm1 = nn.GroupNorm(GN_GROUPS, planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.norm2 = nn.GroupNorm(GN_GROUPS, planes)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False), nn.GroupNorm(GN_GROUPS, planes)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.norm1(self.conv1(x)))
        out = self.norm2(self.conv2(out))
        return torch.relu(out + self.shortcut(x))


class ResNet18(nn.Module):
    """CIFAR ResNet-18: 3x3 stem, no max-pool, BasicBlocks [2,2,2,2], GroupNorm."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 3, stride=1, padding=1, bias=False)
        self.norm1 = nn.GroupNorm(GN_GROUPS, 64)
        layers: list[nn.Sequential] = []
        in_planes = 64
        for planes, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            layers.append(nn.Sequential(BasicBlock(in_planes, planes, stride), BasicBlock(planes, planes, 1)))
            in_planes = planes
        self.layer1, self.layer2, self.layer3, self.layer4 = layers
        self.linear = nn.Linear(512, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.norm1(self.conv1(x)))
        out = self.layer4(self.layer3(self.layer2(self.layer1(out))))  # (b, 512, 4, 4) for 32x32 input
        out = torch.flatten(nn.functional.adaptive_avg_pool2d(out, 1), 1)  # avg-pool 4 on 32x32 input
        return self.linear(out)


VGG11_CFG: tuple[int | str, ...] = (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M")


class VGG11(nn.Module):
    """VGG-11 for 32x32 input: conv3x3(bias) -> GN(32) -> ReLU blocks, one Linear(512, classes)."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        channels = 3
        for item in VGG11_CFG:
            if item == "M":
                layers.append(nn.MaxPool2d(2))
            else:
                assert isinstance(item, int)
                layers += [nn.Conv2d(channels, item, 3, padding=1), nn.GroupNorm(GN_GROUPS, item), nn.ReLU()]
                channels = item
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(512, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.features(x), 1))  # (b, 512, 1, 1) -> (b, 512)


MODELS: dict[str, Callable[[int], nn.Module]] = {"cnn": CNN, "resnet18": ResNet18, "vgg11": VGG11}
MODEL_NAMES = tuple(MODELS)


def build_model(name: str, num_classes: int = 10, *, seed: int | None = None) -> nn.Module:
    """Build a registered model; with ``seed`` its initial weights are reproducible.

    The seed is applied inside ``torch.random.fork_rng`` so library code never changes the caller's
    global RNG state (every client of a fleet must start from the same weights).
    """
    if name not in MODELS:
        raise ModelError(f"unknown model {name!r}; choose one of {', '.join(MODEL_NAMES)}")
    if num_classes < 2:
        raise ModelError(f"num_classes={num_classes} must be at least 2")
    if seed is None:
        return MODELS[name](num_classes)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return MODELS[name](num_classes)


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
