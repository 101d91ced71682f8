"""Small data factories for the tasks' tests (``--task regression``, ``multilabel``, ``TensorDataset`` labels)."""

from __future__ import annotations

import torch
from torch.utils.data import TensorDataset

FEATURES = 6


def _features(n: int, seed: int) -> torch.Tensor:
    return torch.randn(n, FEATURES, generator=torch.Generator().manual_seed(seed))


def linear_target() -> tuple[TensorDataset, TensorDataset]:
    """y = x @ w + 3 as float64 0-dim tensors (a regression a model learns in a few steps)."""
    w = torch.arange(1, FEATURES + 1, dtype=torch.float64) / FEATURES

    def split(n: int, seed: int) -> TensorDataset:
        x = _features(n, seed)
        return TensorDataset(x, x.double() @ w + 3.0)

    return split(240, 0), split(80, 1)


def two_targets() -> tuple[TensorDataset, TensorDataset]:
    """Two float targets a sample (a regression of width 2)."""

    def split(n: int, seed: int) -> TensorDataset:
        x = _features(n, seed)
        return TensorDataset(x, torch.stack([x[:, 0], x[:, 1] - x[:, 2]], dim=1))

    return split(200, 2), split(60, 3)


def sign_labels() -> tuple[TensorDataset, TensorDataset]:
    """Three 0/1 labels a sample: the signs of its first three features (a multi-label task)."""

    def split(n: int, seed: int) -> TensorDataset:
        x = _features(n, seed)
        return TensorDataset(x, (x[:, :3] > 0).to(torch.uint8))

    return split(240, 4), split(80, 5)


def int32_classes() -> tuple[TensorDataset, TensorDataset]:
    """A TensorDataset whose labels are 0-dim int32 tensors (three classes by the first feature's sign and size)."""

    def split(n: int, seed: int) -> TensorDataset:
        x = _features(n, seed)
        return TensorDataset(x, (x[:, 0] > 0).to(torch.int32) + (x[:, 1] > 1).to(torch.int32))

    return split(240, 6), split(80, 7)


def rounded_targets() -> tuple[list[tuple[torch.Tensor, int]], list[tuple[torch.Tensor, int]]]:
    """Regression targets rounded to integers: as many "classes" as samples (refused as classification)."""
    x = _features(100, 8)
    return [(x[i], 100 + 3 * i) for i in range(80)], [(x[i], 100 + 3 * i) for i in range(80, 100)]


def nan_target() -> tuple[list[tuple[torch.Tensor, float]], list[tuple[torch.Tensor, float]]]:
    x = _features(30, 9)
    train = [(x[i], float("nan") if i == 7 else 1.0 * i) for i in range(20)]
    return train, [(x[i], 1.0 * i) for i in range(20, 30)]


def ragged_label_vectors() -> tuple[list[tuple[torch.Tensor, list[int]]], list[tuple[torch.Tensor, list[int]]]]:
    x = _features(30, 10)
    return [(x[i], [1, 0, 1]) for i in range(20)], [(x[i], [1, 0]) for i in range(20, 30)]


def mlp(num_outputs: int, input_shape: tuple[int, ...]) -> torch.nn.Module:
    """A two-layer MLP with ``num_outputs`` outputs."""
    return torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(input_shape[0], 16), torch.nn.ReLU(), torch.nn.Linear(16, num_outputs)
    )


def huber() -> object:
    """A task of one's own: regression with the Huber loss (``--task tests.task_factories:huber``)."""
    from edge_node.algorithm.tasks import Regression

    class Huber(Regression):
        name = "huber-regression"

        def loss(self, outputs: torch.Tensor, targets: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
            per_sample = torch.nn.functional.huber_loss(outputs, targets, reduction="none").mean(dim=1)
            return per_sample.mean() if reduction == "mean" else per_sample.sum()

    return Huber()


def not_a_task() -> object:
    return "regression"
