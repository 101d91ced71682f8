"""Model and data factories for the plug-in tests, named as ``tests.plugin_factories:NAME``.

Good ones (``tiny_mlp``, ``blobs``) and each way a user's factory can break the contract of
docs/PLUGINS.md, so that the refusals are tested against real factories found by their path.
"""

from __future__ import annotations

import math
import random

import numpy as np
import torch
from torch import nn

FEATURES = 12  # blobs(): samples of shape (FEATURES,)
CLASSES = 3


class TinyMLP(nn.Module):
    def __init__(self, in_features: int, num_classes: int, width: int = 16) -> None:
        super().__init__()
        self.fc1 = nn.Linear(in_features, width)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.norm(self.fc1(torch.flatten(x, 1)))))


def tiny_mlp(num_classes: int, input_shape: tuple[int, ...]) -> nn.Module:
    return TinyMLP(math.prod(input_shape), num_classes)


def wide_mlp(num_classes: int, input_shape: tuple[int, ...]) -> nn.Module:
    """Same layer names as ``tiny_mlp``, other shapes: a different architecture id."""
    return TinyMLP(math.prod(input_shape), num_classes, width=24)


def batchnorm_mlp(num_classes: int, input_shape: tuple[int, ...]) -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), 16), nn.BatchNorm1d(16), nn.ReLU(),
                         nn.Linear(16, num_classes))  # fmt: skip


def double_mlp(num_classes: int, input_shape: tuple[int, ...]) -> nn.Module:
    return TinyMLP(math.prod(input_shape), num_classes).double()


class BranchyMLP(TinyMLP):
    """A forward whose path depends on the data: fine one client at a time, refused by ``torch.func.vmap``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)
        return out if out.sum() > -1e30 else -out


def branchy_mlp(num_classes: int, input_shape: tuple[int, ...]) -> nn.Module:
    return BranchyMLP(math.prod(input_shape), num_classes)


def raises(num_classes: int, input_shape: tuple[int, ...]) -> nn.Module:
    raise RuntimeError("the factory's own bug")


def not_a_module(num_classes: int, input_shape: tuple[int, ...]) -> object:
    return {"fc": "weights"}


def wrong_output(num_classes: int, input_shape: tuple[int, ...]) -> nn.Module:
    return TinyMLP(math.prod(input_shape), num_classes + 1)


def unseeded(num_classes: int, input_shape: tuple[int, ...]) -> nn.Module:
    """Initial weights from Python's RNG, which edge-node does not seed: builds differ."""
    model = TinyMLP(math.prod(input_shape), num_classes)
    with torch.no_grad():
        model.head.bias.fill_(random.random())
    return model


NOT_CALLABLE = 42


def blobs() -> tuple[list[tuple[torch.Tensor, int]], list[tuple[torch.Tensor, int]]]:
    """Three Gaussian blobs in 12 dimensions: 240 training and 60 test rows, learnable in a few steps."""
    rng = np.random.default_rng(7)
    centres = rng.normal(0.0, 3.0, (CLASSES, FEATURES))

    def split(n: int) -> list[tuple[torch.Tensor, int]]:
        labels = rng.integers(0, CLASSES, n)
        rows = centres[labels] + rng.normal(0.0, 1.0, (n, FEATURES))
        return [(torch.tensor(r, dtype=torch.float32), int(c)) for r, c in zip(rows, labels, strict=True)]

    return split(240), split(60)


GROWING = {"rows": 100, "fail": False}  # growing_blobs(): how many rows it returns now, and whether it raises


def growing_blobs() -> tuple[list[tuple[np.ndarray, int]], None]:
    """The first ``GROWING["rows"]`` rows of one fixed stream of blobs, unsplit (``(samples, None)``): a factory
    whose data grows between calls, split by content."""
    if GROWING["fail"]:
        raise OSError("the sensor is unplugged")
    rng = np.random.default_rng(11)
    centres = rng.normal(0.0, 3.0, (CLASSES, FEATURES))
    labels = np.arange(GROWING["rows"]) % CLASSES
    rows = (centres[labels] + rng.normal(0.0, 1.0, (GROWING["rows"], FEATURES))).astype(np.float32)
    return [(r, int(c)) for r, c in zip(rows, labels, strict=True)], None


def rgb_images() -> tuple[list[tuple[np.ndarray, int]], list[tuple[np.ndarray, int]]]:
    """uint8 (3, 32, 32) samples: images, which get the CIFAR augmentation."""
    rng = np.random.default_rng(1)
    pairs = [(rng.integers(0, 256, (3, 32, 32), dtype=np.uint8), i % 2) for i in range(20)]
    return pairs[:16], pairs[16:]


def ragged() -> tuple[list[tuple[torch.Tensor, int]], list[tuple[torch.Tensor, int]]]:
    return [(torch.zeros(4), 0), (torch.zeros(5), 1)], [(torch.zeros(4), 0)]


def text_labels() -> tuple[list[tuple[torch.Tensor, str]], list[tuple[torch.Tensor, str]]]:
    return [(torch.zeros(4), "cat"), (torch.zeros(4), "dog")], [(torch.zeros(4), "cat")]


def one_split() -> list[tuple[torch.Tensor, int]]:
    return [(torch.zeros(4), 0)]


def data_raises() -> None:
    raise OSError("sensor log not found")


class TinyBNConv(nn.Module):
    """A small conv net with BatchNorm (running statistics: FedBN's per-client buffers) for images."""

    def __init__(self, channels: int, num_classes: int, batch_norm: bool = True) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, 8, 3, stride=2, padding=1)
        self.norm: nn.Module = nn.BatchNorm2d(8) if batch_norm else nn.GroupNorm(2, 8)
        self.head = nn.Linear(8, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.norm(self.conv(x)))
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(out, 1), 1))


def bn_conv(num_classes: int, input_shape: tuple[int, ...]) -> nn.Module:
    return TinyBNConv(input_shape[0], num_classes)


def gn_conv(num_classes: int, input_shape: tuple[int, ...]) -> nn.Module:
    """``bn_conv`` with GroupNorm: no running statistics."""
    return TinyBNConv(input_shape[0], num_classes, batch_norm=False)


class RegisteredBuffer(TinyMLP):
    """A buffer that is not BatchNorm's running statistics: still refused."""

    def __init__(self, in_features: int, num_classes: int) -> None:
        super().__init__(in_features, num_classes)
        self.register_buffer("scale", torch.ones(1))


def buffer_mlp(num_classes: int, input_shape: tuple[int, ...]) -> nn.Module:
    return RegisteredBuffer(math.prod(input_shape), num_classes)


def nested_mlp(num_classes: int, input_shape: tuple[int, ...], width: float = 1.0) -> nn.Module:
    """Opts in to width tiers: hidden units ``ceil(16 * width)``, a prefix of the full model's."""
    return TinyMLP(math.prod(input_shape), num_classes, width=max(1, math.ceil(16 * width)))


def unnested_mlp(num_classes: int, input_shape: tuple[int, ...], width: float = 1.0) -> nn.Module:
    """Accepts ``width`` but grows its hidden layer as the width shrinks: not a prefix of the full model."""
    return TinyMLP(math.prod(input_shape), num_classes, width=16 if width >= 1.0 else 20)
