"""The data a node trains and evaluates on: its own folder, or its slice of a benchmark set.

With ``data`` set, the device's own files (CIFAR python batches, or an image-folder tree whose class
folders are mapped onto the fleet's ``classes`` when given); without it, ``dataset`` (default: the
built-in demo set) split by ``partition`` among ``num_clients``, of which this node holds slice
``client_index`` — the slice the simulation gives the client of that index.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch

from edge_node.data import Dataset, client_slice, load_dataset
from edge_node.data.batches import ClientData, ImagePool
from edge_node.data.datasets import load_local_dataset
from edge_node.errors import ConfigError, DataError
from edge_node.node.config import NodeConfig

_LOGGER = logging.getLogger(__name__)


@dataclass(frozen=True)
class LocalData:
    data: ClientData  # this node's samples only
    num_classes: int  # the model's output size: the fleet's class count, or a task's target width
    description: str  # one line for the log and status
    class_names: tuple[str, ...] | None = None  # the model's outputs by name (classification), where known


def _remap(dataset: Dataset, classes: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Labels of ``dataset`` as indices into the fleet's ``classes`` (its folder names must be among them)."""
    unknown = [c for c in dataset.class_names if c not in classes]
    if unknown:
        raise DataError(f"class folders {unknown[:5]} are not among the fleet's classes {list(classes)[:10]}")
    table = np.array([classes.index(c) for c in dataset.class_names], dtype=np.int64)
    return table[dataset.train_y], table[dataset.test_y]


def describe(where: str, data: ClientData, num_classes: int, task: str) -> str:
    """One line for the log and status: where the data is, how many samples of each side, the outputs."""
    outputs = f"{num_classes} classes" if task == "classification" else f"{task}, {num_classes} outputs"
    return f"{where}: {data.num_train} training / {data.num_test} test samples, {outputs}"


def load_local_data(config: NodeConfig, client_index: int, device: torch.device) -> LocalData:
    """This node's training and test samples on ``device``, and the fleet's class count.

    Raises:
        DataError: the data is missing, corrupt or does not fit the fleet's classes.
        ConfigError: a partition that cannot be made (e.g. more clients than samples).
    """
    if config.data is not None:
        dataset = load_local_dataset(config.data)
        train_y, test_y = dataset.train_y, dataset.test_y
        num_classes = config.num_classes or (len(config.classes) or dataset.num_classes)
        if config.classes:
            train_y, test_y = _remap(dataset, config.classes)
        elif dataset.num_classes != num_classes:
            raise DataError(
                f"{config.data} has {dataset.num_classes} classes but the fleet has num_classes={num_classes}; "
                "list the fleet's class names in `classes` so that folders map onto them"
            )
        pool = ImagePool.from_dataset(dataset, device)
        pool = ImagePool(
            pool.train_x, torch.as_tensor(train_y).to(device), pool.test_x, torch.as_tensor(test_y).to(device),
            pool.mean, pool.std, num_classes,
        )  # fmt: skip
        data = ClientData.from_indices(pool, np.arange(len(train_y)), np.arange(len(test_y)))
        where = f"{config.data} ({dataset.name})"
    else:
        dataset = load_dataset(config.dataset, config.data_dir, task=config.task,
                               test_fraction=config.data_test_fraction)  # fmt: skip
        num_classes = config.num_classes or dataset.num_outputs
        if num_classes != dataset.num_outputs:
            raise ConfigError(f"num_classes={num_classes} but {config.dataset} has {dataset.num_outputs} outputs")
        if config.num_clients == 1:
            train_idx, test_idx = np.arange(len(dataset.train_y)), np.arange(len(dataset.test_y))
            where = f"all of {config.dataset}"
        else:
            train_idx, test_idx = client_slice(
                dataset.train_y, dataset.test_y, dataset.num_classes, config.partition, config.num_clients,
                client_index, config.seed,
            )  # fmt: skip
            where = f"{config.dataset} slice {client_index} of {config.num_clients} ({config.partition})"
        data = ClientData.from_indices(ImagePool.from_dataset(dataset, device), train_idx, test_idx).compact()
    if data.num_train == 0 or data.num_test == 0:
        raise DataError(f"{where}: {data.num_train} training and {data.num_test} test samples; a node needs both")
    description = describe(where, data, num_classes, config.task)
    _LOGGER.info("local data: %s", description)
    names = tuple(config.classes) or tuple(dataset.class_names)
    named = config.task == "classification" and len(names) == num_classes
    return LocalData(data, num_classes, description, names if named else None)
