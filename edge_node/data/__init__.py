"""Data sets, client partitions and batch augmentation.

``load_dataset(name, data_dir)`` returns a :class:`Dataset` of uint8 NCHW arrays (CIFAR-10/100 python
batches, image-folder trees or tarballs, Tiny-ImageNet, or the built-in ``demo``), decoded once and cached;
``partition_dir`` / ``partition_path`` / ``client_test_indices`` split it among clients as ALGORITHM.md
specifies; ``augment_batch`` / ``normalize_batch`` turn uint8 batches into normalised float32 on their
device. The torch-based functions are imported on first use, so that decoding workers and array-only
users do not pay for importing torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from edge_node.data.cache import default_cache_dir
from edge_node.data.datasets import DATASET_NAMES, Dataset, channel_stats, default_data_dir, load_dataset
from edge_node.data.partition import client_test_indices, parse_partition, partition_dir, partition_path

if TYPE_CHECKING:
    from edge_node.data.augment import augment_batch, normalize_batch

__all__ = [
    "DATASET_NAMES",
    "Dataset",
    "augment_batch",
    "channel_stats",
    "client_test_indices",
    "default_cache_dir",
    "default_data_dir",
    "load_dataset",
    "normalize_batch",
    "parse_partition",
    "partition_dir",
    "partition_path",
]


def __getattr__(name: str) -> Any:
    if name in ("augment_batch", "normalize_batch"):
        from edge_node.data import augment

        return getattr(augment, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
