"""Data sets, client partitions and batches.

``load_dataset(name, data_dir)`` returns a :class:`Dataset` of uint8 NCHW arrays (CIFAR-10/100 python
batches, image-folder trees or tarballs, Tiny-ImageNet, or the built-in ``demo``), decoded once and
cached, or of any labelled samples a data factory ``package.module:function`` returns
(:mod:`edge_node.data.factory`); ``partition_reference`` (the DisPFL reference code's procedure, the
default) or ``partition_dir`` /
``partition_path`` (the balanced variants) and ``client_test_indices`` split it among clients as
docs/ALGORITHM.md specifies (``partition_clients`` all clients, ``client_slice`` one of them);
``ClientData`` is one client's slice on a device with its training and evaluation batches;
``augment_batch`` / ``normalize_batch`` turn uint8 batches into normalised float32 on their device.
The torch-based names are imported on first use, so that decoding workers and array-only users do
not pay for importing torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from edge_node.data.cache import default_cache_dir
from edge_node.data.datasets import (
    DATASET_NAMES,
    Dataset,
    channel_stats,
    check_dataset_name,
    default_data_dir,
    load_dataset,
)
from edge_node.data.partition import (
    PARTITION_NAMES,
    PartitionSpec,
    client_slice,
    client_test_indices,
    dir_priors,
    parse_partition,
    parse_partition_spec,
    partition_clients,
    partition_dir,
    partition_path,
    partition_reference,
    path_priors,
)

if TYPE_CHECKING:
    from edge_node.data.augment import augment_batch, normalize_batch
    from edge_node.data.batches import ClientData, ImagePool

__all__ = [
    "DATASET_NAMES",
    "PARTITION_NAMES",
    "ClientData",
    "Dataset",
    "ImagePool",
    "PartitionSpec",
    "augment_batch",
    "channel_stats",
    "check_dataset_name",
    "client_slice",
    "client_test_indices",
    "default_cache_dir",
    "default_data_dir",
    "dir_priors",
    "load_dataset",
    "normalize_batch",
    "parse_partition",
    "parse_partition_spec",
    "partition_clients",
    "partition_dir",
    "partition_path",
    "partition_reference",
    "path_priors",
]


def __getattr__(name: str) -> Any:
    if name in ("augment_batch", "normalize_batch"):
        from edge_node.data import augment

        return getattr(augment, name)
    if name in ("ClientData", "ImagePool"):
        from edge_node.data import batches

        return getattr(batches, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
