"""Reproducible random streams derived from (seed, purpose, ids...), never from global state.

A node of a fleet and a simulated client derive the same generators from the same keys, whatever
the device: streams are drawn on the CPU and results moved to the device by the caller.
"""

from __future__ import annotations

import zlib

import numpy as np
import torch


def _entropy(seed: int, purpose: str, ids: tuple[int, ...]) -> list[int]:
    return [int(seed), zlib.crc32(purpose.encode()), *(int(i) for i in ids)]


def derive_seed(seed: int, purpose: str, *ids: int) -> int:
    """A 63-bit seed for the stream named ``purpose`` and ``ids`` (client, round, ...)."""
    state = np.random.SeedSequence(_entropy(seed, purpose, ids)).generate_state(1, np.uint64)[0]
    return int(state) & ((1 << 63) - 1)


def torch_generator(seed: int, purpose: str, *ids: int) -> torch.Generator:
    """A CPU ``torch.Generator`` for the stream (``purpose``, ``ids``) of ``seed``."""
    return torch.Generator().manual_seed(derive_seed(seed, purpose, *ids))


def numpy_generator(seed: int, purpose: str, *ids: int) -> np.random.Generator:
    """A numpy ``Generator`` for the stream (``purpose``, ``ids``) of ``seed``."""
    return np.random.default_rng(np.random.SeedSequence(_entropy(seed, purpose, ids)))
