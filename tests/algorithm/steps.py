"""A captured-step double for tests on the CPU: edge_node.algorithm.graphed's step function run uncaptured."""

from __future__ import annotations

import torch

from edge_node.algorithm.graphed import GraphedStep


class RecordingStep(GraphedStep):
    """``GraphedStep(..., capture=False)`` that records the size of each batch it replayed."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **{**kwargs, "capture": False})
        self.replayed: list[int] = []

    def replay(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.replayed.append(int(y.shape[0]))
        super().replay(x, y)
