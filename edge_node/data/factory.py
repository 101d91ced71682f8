"""A user's data set from a factory ``package.module:function``: any labelled samples, not only images.

The factory takes no arguments and returns ``(train, test)``, each a sequence (or iterable) of
``(sample, label)`` pairs: a sample is a tensor (or array) of one fixed shape, a label an integer class
in ``0..C-1``. A ``torch.utils.data.Dataset`` or a list of pairs both qualify. The class count ``C`` is
the largest label plus one; every sample is converted once into one array, so the rest of edge-node
(partitions, batches, capacity probe) treats it like a built-in data set.

Samples that are uint8 ``(3, H, W)`` are images: they get the CIFAR augmentation (random crop, flip) and
per-channel normalisation. Any other samples become float32 and are batched exactly as given (the factory
scales them; nothing is augmented), which is what audio features, sensor windows or tabular rows need.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

from edge_node.data.datasets import Dataset, channel_stats
from edge_node.errors import DataError
from edge_node.plugins import load_factory, one_line

_LOG = logging.getLogger(__name__)

MAX_SAMPLES = 10_000_000  # a split larger than this is not a device's data set (memory: it is stacked once)


def _stack(path: str, split: str, pairs: Iterable[Any]) -> tuple[np.ndarray, np.ndarray]:
    """(samples, labels) arrays of one split; DataError names the first bad pair."""
    xs: list[np.ndarray] = []
    ys: list[int] = []
    try:
        for i, pair in enumerate(pairs):
            if i >= MAX_SAMPLES:
                raise DataError(f"data factory {path}: {split} set has more than {MAX_SAMPLES} samples")
            if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                raise DataError(f"data factory {path}: {split} item {i} is not a (sample, label) pair")
            sample, label = pair
            x = sample.detach().cpu().numpy() if isinstance(sample, torch.Tensor) else np.asarray(sample)
            if xs and x.shape != xs[0].shape:
                raise DataError(f"data factory {path}: {split} sample {i} has shape {x.shape}, sample 0 {xs[0].shape}")
            if x.ndim == 0:
                raise DataError(f"data factory {path}: {split} sample {i} is a scalar; a sample needs a shape")
            if x.dtype.kind not in "fiub":
                raise DataError(f"data factory {path}: {split} sample {i} is {x.dtype}, not numbers")
            label_value = label.item() if isinstance(label, (torch.Tensor, np.ndarray)) and label.size == 1 else label
            if isinstance(label_value, bool) or not isinstance(label_value, (int, np.integer)) or label_value < 0:
                raise DataError(f"data factory {path}: {split} label {i} is {label!r}, not a class number >= 0")
            xs.append(x)
            ys.append(int(label_value))
    except DataError:
        raise
    except Exception as exc:  # the user's iterable raised while producing samples
        raise DataError(f"data factory {path}: reading its {split} set raised {one_line(exc)}") from None
    if not xs:
        raise DataError(f"data factory {path}: its {split} set is empty")
    return np.stack(xs), np.asarray(ys, dtype=np.int64)


def _is_image(x: np.ndarray) -> bool:
    return x.dtype == np.uint8 and x.ndim == 4 and x.shape[1] == 3


def load_factory_dataset(path: str) -> Dataset:
    """Call the data factory ``path`` and turn its ``(train, test)`` into a :class:`Dataset`.

    Raises:
        DataError: one line for a factory that cannot be found, raises, or returns anything but two
            non-empty splits of same-shaped numeric samples with integer labels (at least 2 classes).
    """
    factory = load_factory(path, "data factory", DataError)
    try:
        splits = factory()
    except Exception as exc:  # the user's code: one line, not its traceback
        raise DataError(f"data factory {path} raised {one_line(exc)}") from None
    if not isinstance(splits, (tuple, list)) or len(splits) != 2:
        raise DataError(f"data factory {path} must return (train, test), got a {type(splits).__name__}")
    train_x, train_y = _stack(path, "train", splits[0])
    test_x, test_y = _stack(path, "test", splits[1])
    if train_x.shape[1:] != test_x.shape[1:]:
        raise DataError(f"data factory {path}: train samples {train_x.shape[1:]} but test {test_x.shape[1:]}")
    num_classes = int(max(train_y.max(), test_y.max())) + 1
    if num_classes < 2:
        raise DataError(f"data factory {path}: labels name {num_classes} class; at least 2 are needed")
    if _is_image(train_x) and _is_image(test_x):
        mean, std = channel_stats(train_x)
        stats: tuple[tuple[float, ...], tuple[float, ...]] = (mean, std)
    else:
        train_x, test_x = train_x.astype(np.float32), test_x.astype(np.float32)
        if not (np.isfinite(train_x).all() and np.isfinite(test_x).all()):
            raise DataError(f"data factory {path}: samples hold NaN or infinite values")
        stats = ((), ())
    kind = "images" if stats[0] else "float32 samples"
    _LOG.info("data factory %s: %d train / %d test %s of shape %s, %d classes", path, len(train_y), len(test_y),
              kind, train_x.shape[1:], num_classes)  # fmt: skip
    return Dataset(
        name=path,
        train_x=np.ascontiguousarray(train_x),
        train_y=train_y,
        test_x=np.ascontiguousarray(test_x),
        test_y=test_y,
        num_classes=num_classes,
        class_names=tuple(str(c) for c in range(num_classes)),
        mean=stats[0],
        std=stats[1],
    )
