"""Data factories: CIFAR-10's classes 0-4 (the central pretraining set) and 5-9 (the fleet's new task).

Both read CIFAR-10 through edge-node's own loader (``EDGE_NODE_DATA_DIR``: the authors' python batches, an
image-folder tree, or a ``.tar.gz`` of either) and relabel the kept classes ``0..4``, so a fleet fine-tunes a
network pretrained on *airplane .. deer* to tell *dog .. truck* apart with a new head. Two settings for
smoke tests, read from the environment: ``MOBILENET_FINETUNE_SOURCE`` (default ``cifar10``; ``demo`` takes
edge-node's built-in synthetic set instead, no files needed) and ``MOBILENET_FINETUNE_LIMIT`` (at most this
many training samples, and a fifth as many test samples; default: all).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
import torch

from edge_node import load_dataset

FIRST_FIVE = (0, 1, 2, 3, 4)  # airplane, automobile, bird, cat, deer
LAST_FIVE = (5, 6, 7, 8, 9)  # dog, frog, horse, ship, truck

Pairs = list[tuple[torch.Tensor, int]]


def _limit() -> int | None:
    value = os.environ.get("MOBILENET_FINETUNE_LIMIT")
    return int(value) if value else None


def classes(kept: Sequence[int]) -> tuple[Pairs, Pairs]:
    """(train, test) of the source's samples of the classes ``kept``, relabelled ``0..len(kept)-1``."""
    data = load_dataset(os.environ.get("MOBILENET_FINETUNE_SOURCE", "cifar10"))
    table = {c: i for i, c in enumerate(kept)}
    limit = _limit()

    def pairs(x: np.ndarray, y: np.ndarray, cap: int | None) -> Pairs:
        idx = np.flatnonzero(np.isin(y, kept))[:cap]
        return [(torch.from_numpy(x[i]), table[int(y[i])]) for i in idx]

    return (pairs(data.train_x, data.train_y, limit),
            pairs(data.test_x, data.test_y, None if limit is None else max(limit // 5, 10)))  # fmt: skip


def first_five() -> tuple[Pairs, Pairs]:
    """CIFAR-10 classes 0-4 (airplane .. deer) as 0-4: what the network is pretrained on, centrally."""
    return classes(FIRST_FIVE)


def last_five() -> tuple[Pairs, Pairs]:
    """CIFAR-10 classes 5-9 (dog .. truck) as 0-4: the fleet's task."""
    return classes(LAST_FIVE)
