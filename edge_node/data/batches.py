"""One client's data on a device, and its training and evaluation batches (shared by simulation and daemon).

An :class:`ImagePool` holds a decoded data set's samples and labels on a device, once; a
:class:`ClientData` is a client's slice of it (training and test indices). Training batches are
shuffled from the caller's generator; images (uint8) are also augmented (docs/ALGORITHM.md: random 32x32 crop
of the zero-padded image, horizontal flip, then per-channel normalisation), an epoch's order and offsets
crossing to the device in one copy; evaluation batches are normalised only, in index order. Other samples
(a data factory's float32 features) are batched as they are: no augmentation, no normalisation.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from edge_node.data.augment import crop_flip, draw_crop_flip, normalize_batch
from edge_node.data.datasets import Dataset

Batch = tuple[torch.Tensor, torch.Tensor]
CROP_PADDING = 4  # CIFAR augmentation: random crop of the image zero-padded by 4, plus flips
EVAL_BATCH_SIZE = 1000
# Training images are cropped, flipped and normalised this many at a time (whole batches; at least one), then
# handed out a batch at a time: the same values as batch by batch (each step is per element) with a tenth of
# the kernel launches on a GPU, and at most ~12 MB of CIFAR floats at once on a small device.
AUGMENT_SAMPLES = 1024


@dataclass(frozen=True, eq=False)
class ImagePool:
    """A data set's samples and targets on one device: uint8 NCHW images with their normalisation, or
    float32 samples of any shape (empty ``mean``/``std``); int64 class labels, or a task's float32 [N, K]
    targets (regression, multi-label)."""

    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    mean: tuple[float, ...]  # images: per channel; other samples: ()
    std: tuple[float, ...]
    num_classes: int

    @classmethod
    def from_dataset(cls, dataset: Dataset, device: torch.device | str = "cpu") -> ImagePool:
        """Move ``dataset``'s arrays to ``device`` once (its targets where the task has its own, else labels)."""
        train_y = dataset.train_y if dataset.train_t is None else dataset.train_t
        test_y = dataset.test_y if dataset.test_t is None else dataset.test_t
        return cls(
            torch.as_tensor(dataset.train_x).to(device),
            torch.as_tensor(train_y).to(device),
            torch.as_tensor(dataset.test_x).to(device),
            torch.as_tensor(test_y).to(device),
            dataset.mean,
            dataset.std,
            dataset.num_classes,
        )

    @property
    def device(self) -> torch.device:
        return self.train_x.device

    @property
    def input_shape(self) -> tuple[int, ...]:
        """The shape of one sample: (C, H, W) of an image."""
        return tuple(int(d) for d in self.train_x.shape[1:])

    @property
    def is_image(self) -> bool:
        """uint8 images are augmented and normalised; other samples are used as they are."""
        return self.train_x.dtype == torch.uint8


@dataclass(frozen=True, eq=False)
class ClientData:
    """One client's training and test samples: indices into a shared :class:`ImagePool`."""

    pool: ImagePool
    train_idx: torch.Tensor  # int64, on the pool's device
    test_idx: torch.Tensor

    @classmethod
    def from_indices(cls, pool: ImagePool, train_idx: np.ndarray, test_idx: np.ndarray) -> ClientData:
        device = pool.device
        return cls(
            pool,
            torch.as_tensor(train_idx, dtype=torch.long, device=device),
            torch.as_tensor(test_idx, dtype=torch.long, device=device),
        )

    def compact(self) -> ClientData:
        """A copy holding only this client's samples (a device keeps its slice, not the whole set).

        Batches are the same as the full pool's: batch ``k`` of an epoch picks the same samples.
        """
        pool = ImagePool(
            self.pool.train_x[self.train_idx].clone(),
            self.pool.train_y[self.train_idx].clone(),
            self.pool.test_x[self.test_idx].clone(),
            self.pool.test_y[self.test_idx].clone(),
            self.pool.mean,
            self.pool.std,
            self.pool.num_classes,
        )
        device = pool.device
        n_train, n_test = self.train_idx.numel(), self.test_idx.numel()
        return ClientData(pool, torch.arange(n_train, device=device), torch.arange(n_test, device=device))

    @property
    def num_train(self) -> int:
        return int(self.train_idx.numel())

    @property
    def num_test(self) -> int:
        return int(self.test_idx.numel())

    def train_batches(self, epochs: int, generator: torch.Generator, batch_size: int) -> Iterator[Batch]:
        """Shuffled (images: augmented) mini-batches over ``epochs`` epochs, drawn from ``generator`` (a CPU one)."""
        pool, idx = self.pool, self.train_idx
        n = idx.numel()
        for _ in range(epochs):
            order = idx[torch.randperm(n, generator=generator).to(idx.device)]
            if not pool.is_image:
                for start in range(0, n, batch_size):
                    batch = order[start : start + batch_size]
                    yield pool.train_x[batch], pool.train_y[batch]
                continue
            top, left, mirror = (v.to(idx.device) for v in draw_crop_flip(n, generator, crop_padding=CROP_PADDING))
            chunk = batch_size * max(1, AUGMENT_SAMPLES // batch_size)
            for first in range(0, n, chunk):  # augmented a chunk of batches at a time: fewer kernel launches
                sl = slice(first, first + chunk)
                x = crop_flip(pool.train_x[order[sl]], top[sl], left[sl], mirror[sl], CROP_PADDING)
                x, y = normalize_batch(x, pool.mean, pool.std), pool.train_y[order[sl]]
                for start in range(0, x.shape[0], batch_size):
                    yield x[start : start + batch_size], y[start : start + batch_size]

    def eval_batches(self, batch_size: int = EVAL_BATCH_SIZE) -> Iterator[Batch]:
        """The client's test samples (images normalised), in index order."""
        pool, idx = self.pool, self.test_idx
        for start in range(0, idx.numel(), batch_size):
            batch = idx[start : start + batch_size]
            x = pool.test_x[batch]
            yield (normalize_batch(x, pool.mean, pool.std) if pool.is_image else x), pool.test_y[batch]
