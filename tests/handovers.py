"""Small handovers for tests, without a daemon: a linear model on 4 features (or a tiny conv net on 8x8 RGB
images), weights that score 100 % or 0 % on a test set where the class is the sign of the first feature, and
a :class:`~edge_node.node.handover.Handover` writing into a state dir."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from edge_node.algorithm.tasks import CLASSIFICATION, TASKS, Task
from edge_node.data.batches import ClientData, ImagePool
from edge_node.node.handover import OUTPUT_NAME, Handover, RawSpec

FEATURES = 4
IMAGE_SHAPE = (3, 8, 8)
MEAN, STD = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)


def linear() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(FEATURES, 2))


def linear_weights(sign: float, feature: int = 0) -> dict[str, torch.Tensor]:
    """The class is (``feature`` > 0) for sign 1: every sample of :func:`sign_data` right; sign -1: every one wrong."""
    weight = torch.zeros(2, FEATURES)
    weight[0, feature], weight[1, feature] = -sign, sign
    return {"1.weight": weight, "1.bias": torch.zeros(2)}


def features_data(x: np.ndarray, y: np.ndarray) -> ClientData:
    tx, ty = torch.from_numpy(x.astype(np.float32)), torch.from_numpy(y.astype(np.int64))
    pool = ImagePool(tx, ty, tx, ty, (), (), 2)
    return ClientData.from_indices(pool, np.arange(len(y)), np.arange(len(y)))


def sign_features(n: int, seed: int = 0) -> np.ndarray:
    """Normal features, none near 0 (no sample on a boundary)."""
    x = np.random.default_rng(seed).normal(size=(n, FEATURES))
    return np.where(np.abs(x) < 0.1, 0.5, x)


def sign_data(n_test: int, *, seed: int = 0) -> ClientData:
    """Features whose class is the sign of the first one."""
    x = sign_features(n_test, seed)
    return features_data(x, (x[:, 0] > 0).astype(np.int64))


def image_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
                         nn.Linear(4 * 8 * 8, 3))  # fmt: skip


def image_data(n_test: int = 6) -> ClientData:
    generator = torch.Generator().manual_seed(1)
    x = torch.randint(0, 256, (n_test, *IMAGE_SHAPE), dtype=torch.uint8, generator=generator)
    y = torch.arange(n_test) % 3
    pool = ImagePool(x, y, x, y, MEAN, STD, 3)
    return ClientData.from_indices(pool, np.arange(n_test), np.arange(n_test))


def handover(state_dir: Path, model: nn.Module, *, image: bool = False, task: Task = CLASSIFICATION,
             class_names: list[str] | None = None, **options: Any) -> Handover:  # fmt: skip
    raw = RawSpec(IMAGE_SHAPE, MEAN, STD) if image else RawSpec((FEATURES,))
    width = 3 if image else (1 if task is TASKS["regression"] else 2)
    about = {"node_id": "n0", "fleet": "lab", "arch_id": "test/1", "class_names": class_names,
             "output": {"name": OUTPUT_NAME, "shape": ["batch", width]}}  # fmt: skip
    return Handover(state_dir, model, raw, task, about, **options)
