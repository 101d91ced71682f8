"""A user's data set from a factory ``package.module:function``: any labelled samples, not only images.

The factory takes no arguments and returns ``(train, test)``, each a sequence (or iterable) of
``(sample, label)`` pairs, or ``(samples, None)``: then each sample goes to the test set when the digest of
its bytes says so (:func:`edge_node.data.content_split.is_test_sample`, a share ``test_fraction``), the same
side every time it is returned. In a pair, a sample is a tensor (or array) of one fixed shape, a label an
integer class in ``0..C-1`` (a Python int, a numpy integer or a 0-dim integer tensor, as ``TensorDataset`` gives), or
what another task reads (a float target, a 0/1 vector: edge_node.algorithm.tasks). A
``torch.utils.data.Dataset`` or a list of pairs both qualify. The class count ``C`` is the largest label
plus one; every sample is converted once into one array, so the rest of edge-node
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

from edge_node.algorithm.tasks import resolve_task
from edge_node.data.content_split import is_test_sample
from edge_node.data.datasets import Dataset, channel_stats
from edge_node.errors import DataError
from edge_node.plugins import load_factory, one_line

_LOG = logging.getLogger(__name__)

MAX_SAMPLES = 10_000_000  # a split larger than this is not a device's data set (memory: it is stacked once)


def _label_array(label: Any) -> np.ndarray:
    """A label as a numpy value: a Python or numpy number, a 0-dim or 1-D tensor (``TensorDataset``), a list."""
    if isinstance(label, torch.Tensor):
        return label.detach().cpu().numpy()
    return np.asarray(label)


def _stack(path: str, split: str, pairs: Iterable[Any]) -> tuple[np.ndarray, np.ndarray]:
    """(samples, raw labels) arrays of one split; DataError names the first bad pair.

    The labels keep their own dtype and shape (``[N]`` or ``[N, K]``): the task reads them.
    """
    xs: list[np.ndarray] = []
    ys: list[np.ndarray] = []
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
            y = _label_array(label)
            if y.dtype.kind not in "biuf" or y.ndim > 1:
                raise DataError(f"data factory {path}: {split} label {i} is {label!r}, not a number or a 1-D vector")
            if ys and y.shape != ys[0].shape:
                raise DataError(f"data factory {path}: {split} label {i} has shape {y.shape}, label 0 {ys[0].shape}")
            xs.append(x)
            ys.append(y)
    except DataError:
        raise
    except Exception as exc:  # the user's iterable raised while producing samples
        raise DataError(f"data factory {path}: reading its {split} set raised {one_line(exc)}") from None
    if not xs:
        raise DataError(f"data factory {path}: its {split} set is empty")
    return np.stack(xs), np.stack(ys)


def _split_by_content(
    path: str, pairs: Iterable[Any], test_fraction: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(train samples, train labels, test samples, test labels) of one set of pairs, split by each sample's bytes."""
    x, raw = _stack(path, "(unsplit)", pairs)
    test = np.fromiter((is_test_sample(row.tobytes(), test_fraction) for row in x), dtype=bool, count=len(x))
    if test.all() or not test.any():
        side = "test" if test.all() else "training"
        raise DataError(f"data factory {path}: all {len(x)} samples fell on the {side} side of the content split "
                        f"(test share {test_fraction:g}); return more samples, or (train, test)")  # fmt: skip
    return x[~test], raw[~test], x[test], raw[test]


def _is_image(x: np.ndarray) -> bool:
    return x.dtype == np.uint8 and x.ndim == 4 and x.shape[1] == 3


def load_factory_dataset(path: str, task: str = "classification", test_fraction: float = 0.2) -> Dataset:
    """Call the data factory ``path`` and turn its ``(train, test)`` into a :class:`Dataset`.

    ``task`` (edge_node.algorithm.tasks) reads the labels: integer classes, float targets, 0/1 vectors.
    ``test_fraction``: the test share of a factory that returns ``(samples, None)``, split by content.

    Raises:
        DataError: one line for a factory that cannot be found, raises, or returns anything but two
            non-empty splits of same-shaped numeric samples with labels the task accepts.
    """
    reader = resolve_task(task)
    factory = load_factory(path, "data factory", DataError)
    try:
        splits = factory()
    except Exception as exc:  # the user's code: one line, not its traceback
        raise DataError(f"data factory {path} raised {one_line(exc)}") from None
    if not isinstance(splits, (tuple, list)) or len(splits) != 2:
        raise DataError(f"data factory {path} must return (train, test), got a {type(splits).__name__}")
    if splits[1] is None:
        train_x, train_raw, test_x, test_raw = _split_by_content(path, splits[0], test_fraction)
    else:
        train_x, train_raw = _stack(path, "train", splits[0])
        test_x, test_raw = _stack(path, "test", splits[1])
    if train_x.shape[1:] != test_x.shape[1:]:
        raise DataError(f"data factory {path}: train samples {train_x.shape[1:]} but test {test_x.shape[1:]}")
    labels = reader.labels(train_raw, test_raw, f"data factory {path}")
    if _is_image(train_x) and _is_image(test_x):
        mean, std = channel_stats(train_x)
        stats: tuple[tuple[float, ...], tuple[float, ...]] = (mean, std)
    else:
        train_x, test_x = train_x.astype(np.float32), test_x.astype(np.float32)
        if not (np.isfinite(train_x).all() and np.isfinite(test_x).all()):
            raise DataError(f"data factory {path}: samples hold NaN or infinite values")
        stats = ((), ())
    kind = "images" if stats[0] else "float32 samples"
    _LOG.info("data factory %s: %d train / %d test %s of shape %s, %s: %d outputs", path, len(train_raw),
              len(test_raw), kind, train_x.shape[1:], reader.name, labels.num_outputs)  # fmt: skip
    return Dataset(
        name=path,
        train_x=np.ascontiguousarray(train_x),
        train_y=labels.train_keys,
        test_x=np.ascontiguousarray(test_x),
        test_y=labels.test_keys,
        num_classes=labels.num_keys,
        class_names=labels.key_names,
        mean=stats[0],
        std=stats[1],
        train_t=labels.train_targets,
        test_t=labels.test_targets,
    )
