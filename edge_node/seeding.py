"""Reproducible random streams derived from (seed, stream, ids...), never from global state.

A node of a fleet and a simulated client derive the same generators from the same keys, whatever
the device: streams are drawn on the CPU and results moved to the device by the caller. Every
stream the project draws from is named once, in :class:`Stream`; its value is part of the derived
seed, so renaming one changes every result drawn from it.
"""

from __future__ import annotations

import enum
import zlib

import numpy as np
import torch


class Stream(enum.Enum):
    """The named random streams, with the ids each is keyed by after the seed."""

    PARTITION = "partition"  # (): which samples each client of a benchmark partition holds
    TEST_SPLIT = "test-split"  # (): each client's test samples
    TOPOLOGY = "topology"  # (round,): the seeded neighbour choice of the synchronous algorithm
    MASK = "mask"  # (client,): the client's initial mask positions
    TRAIN = "train"  # (client, round): shuffles and augmentation of local training (and the regrowth batch)
    REGROW = "regrow"  # (client, round): positions of random regrowth
    PEERS = "peers"  # (client, round): which live peers an asynchronous node pulls from
    FEDAVG_SAMPLE = "fedavg-sample"  # (round,): which clients a FedAvg server trains in a round
    FINETUNE = "finetune"  # (client, round): shuffles and augmentation of an evaluation-only fine-tune (-ft baselines)
    FEDP3_LAYERS = "fedp3-layers"  # (client, round): the layers a FedP3 client owns under the random schedule (opr2)
    DP_NOISE = "dp-noise"  # (client, round): a simulated client's DP-SGD noise (a device draws its own secretly)
    ATTACK = "attack"  # (client, round): a loopback fleet's noise attacker's published noise (algorithm/poison.py)
    RETIER = "retier"  # (client, round): positions a move to a denser tier regrows (capacity auto, node/capacity_watch)


def _entropy(seed: int, stream: Stream, ids: tuple[int, ...]) -> list[int]:
    if not isinstance(stream, Stream):
        raise TypeError(f"stream={stream!r} must be an edge_node.seeding.Stream")
    return [int(seed), zlib.crc32(stream.value.encode()), *(int(i) for i in ids)]


def derive_seed(seed: int, stream: Stream, *ids: int) -> int:
    """A 63-bit seed for ``stream`` and ``ids`` (client, round, ...)."""
    state = np.random.SeedSequence(_entropy(seed, stream, ids)).generate_state(1, np.uint64)[0]
    return int(state) & ((1 << 63) - 1)


def torch_generator(seed: int, stream: Stream, *ids: int) -> torch.Generator:
    """A CPU ``torch.Generator`` for (``stream``, ``ids``) of ``seed``."""
    return torch.Generator().manual_seed(derive_seed(seed, stream, *ids))


def numpy_generator(seed: int, stream: Stream, *ids: int) -> np.random.Generator:
    """A numpy ``Generator`` for (``stream``, ``ids``) of ``seed``."""
    return np.random.default_rng(np.random.SeedSequence(_entropy(seed, stream, ids)))
