"""Random masked models and stream lookups shared by the wire codec and peer service tests."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch

from edge_node.wire import ModelSpec
from edge_node.wire.messages import ProtoModelChunk, ProtoSparseTensor

# The tiny model the peer service tests serve and pull (several messages at a 4 KiB message budget).
PEER_SHAPES: dict[str, tuple[int, ...]] = {
    "conv1.weight": (8, 3, 3, 3),
    "conv1.bias": (8,),
    "fc1.weight": (40, 72),
    "fc1.bias": (40,),
    "fc2.weight": (10, 40),
    "fc2.bias": (10,),
}
PEER_SPEC = ModelSpec("tiny", 10, PEER_SHAPES)
PEER_FLEET = "fleet-1"


def random_model(
    shapes: Mapping[str, tuple[int, ...]], seed: int, density: float = 0.5
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Gaussian weights and masks keeping about ``density`` of each matrix/kernel (1-D tensors dense)."""
    gen = torch.Generator().manual_seed(seed)
    weights = {name: torch.randn(shape, generator=gen) for name, shape in shapes.items()}
    masks = {
        name: (torch.rand(shape, generator=gen) < density) if len(shape) > 1 else torch.ones(shape, dtype=torch.bool)
        for name, shape in shapes.items()
    }
    return weights, masks


def kept_fraction(masks: Mapping[str, torch.Tensor]) -> float:
    """The fraction of weights ``masks`` keep: the density a stream header must carry for them."""
    return sum(int(m.sum()) for m in masks.values()) / sum(m.numel() for m in masks.values())


def find_tensor(messages: Iterable[ProtoModelChunk], name: str) -> ProtoSparseTensor:
    """The first chunk of tensor ``name`` in a stream (to edit it in place)."""
    return next(t for m in messages for t in m.tensors if t.name == name)
