"""Width tiers: nested narrower sub-networks that run on dense kernels of their own, smaller shapes.

HeteroFL (Diao et al., "HeteroFL: Computation and Communication Efficient Federated Learning for
Heterogeneous Clients", ICLR 2021) trains, on a weaker client, the model whose every hidden layer keeps its
first ``ceil(w * C)`` channels; the first layer's inputs and the last layer's outputs stay whole. Unlike a
mask at the same density, the narrow model's kernels really are smaller: the tier buys compute, not only
bytes.

One coordinate space: a narrow model's parameters are *prefixes* of the full model's (the same names, each
dimension at most the full one, the first indices). A client of any width holds full-shape tensors that are
zero, and masked off, outside its prefix; it trains by slicing its prefix out (:func:`narrow`), running the
narrow model, and writing the prefix back (:func:`widen`). Aggregation, the wire and the FLOP count see only
full-shape tensors and masks, so DisPFL's per-coordinate, intersection-weighted average runs over the peers
that hold a coordinate, whatever their widths.

``w`` of a tier is chosen from dense FLOPs (:func:`choose_width`): the widest model whose dense forward FLOPs
are at most the tier's share of the full model's. A weight's FLOPs are its element count times the output
positions it is applied at (edge_node.algorithm.flops), which a width does not change; so a candidate width
needs only its parameter shapes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

Shape = tuple[int, ...]
Shapes = Mapping[str, Shape]
TensorDict = Mapping[str, torch.Tensor]
_SEARCH_STEPS = 24  # bisections of w in (0, 1]: 2**-24 is finer than one channel of any real layer


def prefix_problem(full: Shapes, narrow: Shapes) -> str | None:
    """Why ``narrow`` (parameter name -> shape) is not a prefix of ``full``, or None.

    A prefix has the same parameter names, the same number of dimensions, and each dimension in [1, full's].
    """
    if list(narrow) != list(full):
        missing = [n for n in full if n not in narrow]
        extra = [n for n in narrow if n not in full]
        what = f"lacks {missing[0]!r}" if missing else f"has {extra[0]!r}" if extra else "orders them differently"
        return f"its parameters are not the full model's (it {what})"
    for name, shape in narrow.items():
        whole = full[name]
        if len(shape) != len(whole) or any(not 1 <= n <= f for n, f in zip(shape, whole, strict=False)):
            if any(n < 1 for n in shape):
                return f"parameter {name!r} has shape {tuple(shape)}: a width left a layer with no channel"
            return f"parameter {name!r} has shape {tuple(shape)}, not a prefix of the full {tuple(whole)}"
    return None


def prefix_slices(shape: Sequence[int]) -> tuple[slice, ...]:
    """The index of a prefix of ``shape`` in a full tensor: the first ``shape[d]`` entries of each dimension."""
    return tuple(slice(0, n) for n in shape)


def narrow(tensors: TensorDict, shapes: Shapes) -> dict[str, torch.Tensor]:
    """Each tensor's prefix of ``shapes[name]`` (a contiguous copy: the narrow model's own parameter)."""
    return {name: t[prefix_slices(shapes[name])].contiguous() for name, t in tensors.items()}


def widen(full: TensorDict, narrowed: TensorDict) -> dict[str, torch.Tensor]:
    """``full``'s tensors (new ones) with each ``narrowed`` tensor written over its prefix; the rest as in ``full``."""
    out = {}
    for name, whole in full.items():
        part = narrowed[name]
        if tuple(part.shape) == tuple(whole.shape):
            out[name] = part
            continue
        grown = whole.clone()
        grown[prefix_slices(part.shape)] = part
        out[name] = grown
    return out


def prefix_masks(full: Shapes, narrow_shapes: Shapes, device: torch.device | None = None) -> dict[str, torch.Tensor]:
    """Bool masks of ``full``'s shapes (on ``device``), true exactly on each parameter's prefix."""
    masks = {}
    for name, shape in full.items():
        mask = torch.zeros(shape, dtype=torch.bool, device=device)
        mask[prefix_slices(narrow_shapes[name])] = True
        masks[name] = mask
    return masks


def outside_prefix(mask: torch.Tensor, shape: Sequence[int]) -> int:
    """How many active positions of a full-shape ``mask`` lie outside the prefix ``shape`` (0: within it)."""
    return int(mask.sum()) - int(mask[prefix_slices(shape)].sum())


def dense_flops(positions: Mapping[str, float], shapes: Shapes) -> float:
    """Dense forward FLOPs per sample of a model with parameter ``shapes``: 2 per weight per output position."""
    return sum(2.0 * positions[name] * math.prod(shape) for name, shape in shapes.items() if name in positions)


@dataclass(frozen=True)
class WidthChoice:
    """A tier's width: ``width``, and the dense FLOPs share of the full model its narrow model really has."""

    width: float
    flop_share: float


def choose_width(shapes_at: Callable[[float], Shapes], positions: Mapping[str, float], share: float) -> WidthChoice:
    """The largest width whose narrow model's dense forward FLOPs are at most ``share`` of the full model's.

    ``shapes_at(w)`` gives the narrow model's parameter shapes at width ``w`` (monotone in ``w``); ``positions``
    are the full model's weight positions (edge_node.algorithm.flops.weight_positions). Where even the
    narrowest model (one channel, one group per layer) exceeds ``share``, that narrowest model's width is
    returned with its real share: a tier never gets a width that does not exist.
    """
    if not 0.0 < share <= 1.0:
        raise ValueError(f"share={share!r} must be in (0, 1]")
    full = dense_flops(positions, shapes_at(1.0))
    if share >= 1.0 or full <= 0.0:
        return WidthChoice(1.0, 1.0)
    low, high = 0.0, 1.0  # flops(low) <= share * full (or low is the floor), flops(high) > share * full
    for _ in range(_SEARCH_STEPS):
        middle = (low + high) / 2
        if dense_flops(positions, shapes_at(middle)) <= share * full:
            low = middle
        else:
            high = middle
    width = low if low > 0.0 else high  # the narrowest model exceeds the share: take it
    return WidthChoice(width, dense_flops(positions, shapes_at(width)) / full)
