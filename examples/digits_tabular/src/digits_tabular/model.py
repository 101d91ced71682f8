"""The model factory: ``mlp(num_classes, input_shape) -> nn.Module``.

What edge-node asks of it: parameters only (LayerNorm, not BatchNorm: no running statistics), float32,
weights drawn from torch's RNG (edge-node seeds it, so every node starts from the same weights), and a batch
``(B, *input_shape)`` in, ``(B, num_classes)`` logits out.
"""

from __future__ import annotations

import math

import torch
from torch import nn

HIDDEN = 128


class MLP(nn.Module):
    """Flatten -> Linear -> LayerNorm -> ReLU -> Linear -> ReLU -> Linear."""

    def __init__(self, in_features: int, num_classes: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(in_features, HIDDEN)
        self.norm = nn.LayerNorm(HIDDEN)
        self.fc2 = nn.Linear(HIDDEN, HIDDEN // 2)
        self.head = nn.Linear(HIDDEN // 2, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.flatten(x, 1)  # (B, in_features)
        x = torch.relu(self.norm(self.fc1(x)))
        return self.head(torch.relu(self.fc2(x)))  # (B, num_classes)


def mlp(num_classes: int, input_shape: tuple[int, ...]) -> nn.Module:
    """An MLP for samples of ``input_shape`` (any shape: it is flattened) and ``num_classes`` classes."""
    return MLP(math.prod(input_shape), num_classes)
