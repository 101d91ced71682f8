"""The data factory: ``digits() -> (train, test)``, lists of ``(float32 tensor of shape (64,), label)``.

scikit-learn's copy of the UCI optical handwritten digits (1,797 samples, 8x8 pixel counts 0..16,
10 classes) ships inside the scikit-learn wheel, so nothing is downloaded. Each sample is used as a row of
64 numeric features scaled to [0, 1], the way a sensor or tabular data set would be: edge-node does
not treat it as an image (no crop, no flip). A fixed, stratified 80/20 split keeps train and test apart.
"""

from __future__ import annotations

import numpy as np
import torch
from sklearn.datasets import load_digits

TEST_FRACTION = 0.2
SPLIT_SEED = 0  # the split is part of the data set: the same on every node and in every run

Pairs = list[tuple[torch.Tensor, int]]


def digits() -> tuple[Pairs, Pairs]:
    """(train, test): 1,438 and 359 rows of 64 features in [0, 1] with their digit 0..9."""
    bunch = load_digits()
    x = (bunch.data / 16.0).astype(np.float32)  # pixel counts 0..16 -> [0, 1]
    y = bunch.target.astype(np.int64)
    rng = np.random.default_rng(SPLIT_SEED)
    test = np.zeros(len(y), dtype=bool)
    for label in np.unique(y):  # stratified: 20 % of every digit
        members = rng.permutation(np.flatnonzero(y == label))
        test[members[: round(TEST_FRACTION * len(members))]] = True

    def pairs(mask: np.ndarray) -> Pairs:
        return [(torch.from_numpy(row), int(label)) for row, label in zip(x[mask], y[mask], strict=True)]

    return pairs(~test), pairs(test)
