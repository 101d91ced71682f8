"""Data factories for the other built-in tasks: a regression (``--task regression``) and a multi-label one
(``--task multilabel``), both on data sets that ship inside scikit-learn (nothing is downloaded).

- ``diabetes``: scikit-learn's diabetes data (442 patients, 10 standardised features), the target a
  measure of disease progression one year later (25..346), as a float; a fixed 80/20 split.
- ``digit_traits``: the handwritten digits of :func:`digits_tabular.data.digits` with three 0/1 labels
  each instead of the digit: *even*, *five or more*, *prime*. A sample may carry none, one or several.

The model is the same MLP (``digits_tabular:mlp``): edge-node asks it for one output per target
(regression) or per label (multi-label).
"""

from __future__ import annotations

import numpy as np
import torch
from sklearn.datasets import load_diabetes

from digits_tabular.data import digits

TEST_FRACTION = 0.2
SPLIT_SEED = 0
PRIMES = (2, 3, 5, 7)

Pairs = list[tuple[torch.Tensor, object]]


def diabetes() -> tuple[Pairs, Pairs]:
    """(train, test): 354 and 88 rows of 10 features with their float target (disease progression)."""
    bunch = load_diabetes()
    x = bunch.data.astype(np.float32)
    x = (x - x.mean(axis=0)) / x.std(axis=0)  # standardised features
    y = bunch.target.astype(np.float64)  # floats: a regression target, never a class
    order = np.random.default_rng(SPLIT_SEED).permutation(len(y))
    test = np.zeros(len(y), dtype=bool)
    test[order[: round(TEST_FRACTION * len(y))]] = True

    def pairs(mask: np.ndarray) -> Pairs:
        return [(torch.from_numpy(row), float(target)) for row, target in zip(x[mask], y[mask], strict=True)]

    return pairs(~test), pairs(test)


def traits(digit: int) -> list[int]:
    """The 0/1 labels of a digit: even, five or more, prime."""
    return [int(digit % 2 == 0), int(digit >= 5), int(digit in PRIMES)]


def digit_traits() -> tuple[Pairs, Pairs]:
    """(train, test) of :func:`digits_tabular.data.digits`, each label replaced by its three traits."""
    train, test = digits()
    return [(x, traits(d)) for x, d in train], [(x, traits(d)) for x, d in test]
