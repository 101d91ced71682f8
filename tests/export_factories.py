"""Model factories that train in torch but break the ONNX export, named as ``tests.export_factories:NAME``."""

from __future__ import annotations

import math

import torch
from torch import nn


class FftMLP(nn.Module):
    """An MLP whose hidden layer goes through ``torch.fft.rfft``: it trains, and the exporter has no ONNX
    form for ``aten::fft_rfft``."""

    def __init__(self, in_features: int, num_classes: int, width: int = 16) -> None:
        super().__init__()
        self.fc1 = nn.Linear(in_features, width)
        self.head = nn.Linear(width // 2 + 1, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.fft.rfft(torch.relu(self.fc1(torch.flatten(x, 1)))).abs())


def fft_mlp(num_classes: int, input_shape: tuple[int, ...]) -> nn.Module:
    return FftMLP(math.prod(input_shape), num_classes)


def batchnorm_without_stats(num_classes: int, input_shape: tuple[int, ...]) -> nn.Module:
    """BatchNorm with ``track_running_stats=False``: no buffers, so accepted; it normalises every batch by
    its own statistics, also in eval mode, so the export's one-sample batch raises."""
    norm = nn.BatchNorm1d(16, track_running_stats=False)
    return nn.Sequential(
        nn.Flatten(), nn.Linear(math.prod(input_shape), 16), norm, nn.ReLU(), nn.Linear(16, num_classes)
    )
