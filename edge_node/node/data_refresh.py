"""The node's data when it arrives while the node runs (``data_refresh = "round"``): re-read at each round boundary.

:func:`open_local_data` is what the daemon calls once at start: without ``data_refresh`` it is today's
read-once :func:`edge_node.node.local_data.load_local_data` (bit for bit); with it, a :class:`DataRefresh`
whose :meth:`DataRefresh.refresh` the daemon calls before each later round. A data folder is re-read through
:class:`edge_node.data.folder_watch.FolderWatch` (only new or changed files decoded, the newest N kept); a
data factory is called again (its last N samples kept).

What a re-read cannot use never stops the node: a file is skipped and counted by reason (the folder
watch's reasons); a whole read that fails keeps the data the node had, logged once until it recovers and
counted each round: ``folder_missing`` (the folder is gone or unmounted), ``no_samples`` (a side of the split
would be empty), ``factory_error`` (the factory raised or returned something unusable). Normalisation (an
image's per-channel mean and std) is fixed by the first read of a run, so a round's new samples do not move
the inputs the model was trained on.
"""

from __future__ import annotations

import hashlib
import logging
from collections import Counter
from pathlib import Path

import numpy as np
import torch

from edge_node.data.batches import ClientData, ImagePool
from edge_node.data.datasets import channel_stats
from edge_node.data.folder_watch import FolderRead, FolderWatch
from edge_node.errors import DataError
from edge_node.node.config import NodeConfig
from edge_node.node.local_data import LocalData, describe, load_local_data

_LOGGER = logging.getLogger(__name__)

# Why a whole re-read was not used (the data the node had is kept): see the module docstring.
READ_REFUSAL_REASONS = ("folder_missing", "no_samples", "factory_error")


class UnusableRead(DataError):
    """A whole read that cannot be used; ``reason`` is one of :data:`READ_REFUSAL_REASONS`."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def open_local_data(
    config: NodeConfig, client_index: int, device: torch.device
) -> tuple[LocalData, DataRefresh | None]:
    """This node's data at start, and what re-reads it at each round boundary (None: ``data_refresh`` off).

    Raises:
        DataError: no usable data at start (a folder that is missing or holds no sample of a side).
        ConfigError: as :func:`load_local_data`.
    """
    if config.data_refresh == "off":
        return load_local_data(config, client_index, device), None
    refresh = DataRefresh(config, device)
    return refresh.local, refresh


class DataRefresh:
    """Re-reads the node's data source; :attr:`local` is the data of the last usable read."""

    def __init__(self, config: NodeConfig, device: torch.device) -> None:
        self.config = config
        self.device = device
        self.num_classes = config.num_classes or len(config.classes)
        self.watch: FolderWatch | None = None
        if config.data is not None:
            data = Path(config.data).expanduser()
            if data.exists() and not data.is_dir():
                raise DataError(f'data_refresh = "round" re-reads a folder of images; {data} is a file')
            self.watch = FolderWatch(
                data, config.classes, test_fraction=config.data_test_fraction,
                max_train=config.max_train_samples or None, max_test=config.max_test_samples or None,
            )  # fmt: skip
        # Since start, by reason (status, metrics); replaced, never changed in place: other threads read it.
        self.refused_total: dict[str, int] = {}
        self._unreported: Counter[str] = Counter()  # since the last round record
        self.arrived = 0  # samples the last read kept that the one before did not (0 after the first)
        self._factory_kept: set[bytes] = set()
        self._stats: tuple[tuple[float, ...], tuple[float, ...]] | None = None
        self._failing: str | None = None  # the reason the last read was not used, until one is again
        self.local = self._read(first=True)

    def refresh(self) -> LocalData:
        """The data at this round boundary: a new read, or the last usable one when this one cannot be used."""
        try:
            self.local = self._read(first=False)
        except UnusableRead as exc:
            reason = exc.reason
            self._count({reason: 1})
            if self._failing != reason:
                _LOGGER.warning("%s; training on the %d training / %d test samples it had", exc,
                                self.local.data.num_train, self.local.data.num_test)  # fmt: skip
            self._failing = reason
            self.arrived = 0
            return self.local
        if self._failing is not None:
            _LOGGER.info("local data is readable again: %s", self.local.description)
            self._failing = None
        return self.local

    def take_refused(self) -> dict[str, int]:
        """Refusals since the last call, by reason (each round's record holds its own)."""
        out = dict(sorted(self._unreported.items()))
        self._unreported.clear()
        return out

    # -- reads --------------------------------------------------------------------------------------------
    def _read(self, *, first: bool) -> LocalData:
        if self.watch is not None:
            try:
                read = self.watch.read()
            except DataError as exc:  # the folder is gone
                raise UnusableRead("folder_missing", str(exc)) from None
            self._count(read.refused)
            x = (read.train_x, read.test_x)
            y = (read.train_y, read.test_y)
            arrived, where = read.arrived, str(self.watch.root)
            kept = _kept_text(read, self.config)
        else:
            x, y, arrived = self._factory_read()
            where, kept = self.config.dataset, ""
        if len(y[0]) == 0 or len(y[1]) == 0:
            raise UnusableRead("no_samples", f"{where}: {len(y[0])} training and {len(y[1])} test samples usable; a "
                               "node needs both")  # fmt: skip
        image = x[0].dtype == np.uint8
        if self._stats is None:  # fixed by the first read: new samples must not move the model's inputs
            self._stats = channel_stats(x[0]) if image else ((), ())
        mean, std = self._stats
        dev = self.device
        pool = ImagePool(
            torch.as_tensor(x[0]).to(dev), torch.as_tensor(y[0]).to(dev), torch.as_tensor(x[1]).to(dev),
            torch.as_tensor(y[1]).to(dev), mean, std, self.num_classes,
        )  # fmt: skip
        data = ClientData.from_indices(pool, np.arange(len(y[0])), np.arange(len(y[1])))
        self.arrived = 0 if first else arrived
        names = tuple(self.config.classes) if self.config.task == "classification" else None
        local = LocalData(data, self.num_classes, describe(f"{where}{kept}", data, self.num_classes, self.config.task),
                          names)  # fmt: skip
        if first or arrived:
            _LOGGER.info("local data%s: %s%s", "" if first else " re-read", local.description,
                         "" if first else f", {arrived} new")  # fmt: skip
        return local

    def _factory_read(self) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray], int]:
        """(x, y) of each side from the data factory now (its last N of each), and how many samples are new."""
        from edge_node.data.factory import load_factory_dataset  # imports torch: only for a factory

        config = self.config
        try:
            ds = load_factory_dataset(config.dataset, config.task, config.data_test_fraction)
        except DataError as exc:
            raise UnusableRead("factory_error", str(exc)) from None
        sides = []
        for split_x, keys, targets, limit in (
            (ds.train_x, ds.train_y, ds.train_t, config.max_train_samples),
            (ds.test_x, ds.test_y, ds.test_t, config.max_test_samples),
        ):
            y = keys if targets is None else targets
            if targets is None:  # classes: a label beyond the fleet's is refused, not a new output
                known = keys < self.num_classes
                if not known.all():
                    self._count({"unknown_class": int((~known).sum())})
                split_x, y = split_x[known], y[known]
            elif targets.shape[1] != self.num_classes:
                raise UnusableRead("factory_error", f"data factory {config.dataset} now gives {targets.shape[1]} "
                                   f"targets per sample; the model has {self.num_classes} outputs")  # fmt: skip
            if limit:
                split_x, y = split_x[-limit:], y[-limit:]
            sides.append((np.ascontiguousarray(split_x), np.ascontiguousarray(y)))
        digests = {hashlib.blake2b(row.tobytes(), digest_size=16).digest() for x, _ in sides for row in x}
        arrived = len(digests - self._factory_kept)
        self._factory_kept = digests
        (train_x, train_y), (test_x, test_y) = sides
        return (train_x, test_x), (train_y, test_y), arrived

    def _count(self, refused: dict[str, int]) -> None:
        total = dict(self.refused_total)
        for reason, n in refused.items():
            total[reason] = total.get(reason, 0) + n
            self._unreported[reason] += n
        self.refused_total = dict(sorted(total.items()))


def _kept_text(read: FolderRead, config: NodeConfig) -> str:
    """``, newest 20000 of 25000 files`` when the bound left files out."""
    kept = read.num_train + read.num_test
    if read.listed <= kept:
        return ""
    bound = f"max_train_samples {config.max_train_samples}, max_test_samples {config.max_test_samples}"
    return f" (the newest {kept} of {read.listed} image files: {bound})"
