"""DisPFL's intersection-weighted gossip average (Dai et al., ICML 2022, Alg. 1 line 6).

Per coordinate ``c``: ``agg[c] = (w_i[c] + sum_j w_j[c]) / (m_i_old[c] + sum_j m_j[c])`` (0 where
the denominator is 0), then ``w = agg * m_i_new``. Models are supported on their masks, so the sums
count only holders; a coordinate client i newly regrew gets the neighbours' mean (its own 0 is not
counted). No weighting by data size.

Finite inputs give a finite result: a mean of values lies between them, but a float32 sum of huge
ones (two peers at 3e38) overflows. The float32 computation runs as always, so ordinary inputs give
bit-identical results; only a tensor whose result came out non-finite is computed again in float64
and rounded back. (How far one peer may push the mean is ``robust.screen_peer_models``'s business.)

A BatchNorm model's running statistics, under ``norm_stats = "average"``, are aggregated beside the
weights by :func:`aggregate_buffers`: dense, over the client and the peers that sent them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from edge_node.errors import ConfigError

TensorDict = Mapping[str, torch.Tensor]


def aggregate(
    own_weights: TensorDict,
    own_train_mask: TensorDict,
    own_next_mask: TensorDict,
    neighbour_weights: Sequence[TensorDict],
    neighbour_masks: Sequence[TensorDict],
) -> dict[str, torch.Tensor]:
    """Return the aggregated model of one client, supported on ``own_next_mask``.

    Args:
        own_weights: the client's trained weights (zero outside ``own_train_mask``).
        own_train_mask: the mask the client trained with last round (``m_i_old``).
        own_next_mask: the mask its last mask update produced (``m_i_new``).
        neighbour_weights / neighbour_masks: published models of the neighbours, each zero outside
            its mask. Inputs are never modified.
    """
    if len(neighbour_weights) != len(neighbour_masks):
        raise ConfigError(f"{len(neighbour_weights)} neighbour models but {len(neighbour_masks)} neighbour masks")
    out: dict[str, torch.Tensor] = {}
    overflowed: list[torch.Tensor] = []
    with torch.no_grad():
        for name, w in own_weights.items():
            out[name] = _aggregate_tensor(name, w, own_train_mask, own_next_mask, neighbour_weights, neighbour_masks)
            overflowed.append(~torch.isfinite(out[name]).all())
        if overflowed and bool(torch.stack(overflowed).any()):  # one device sync per call
            for name, flag in zip(list(out), overflowed, strict=True):
                if bool(flag):
                    w = own_weights[name]
                    wide = _aggregate_tensor(
                        name, w.double(), own_train_mask, own_next_mask, neighbour_weights, neighbour_masks
                    )
                    limit = torch.finfo(w.dtype).max  # a mean of finite values is within range; rounding aside
                    out[name] = wide.clamp(-limit, limit).to(w.dtype)
    return out


def _aggregate_tensor(
    name: str,
    w: torch.Tensor,
    own_train_mask: TensorDict,
    own_next_mask: TensorDict,
    neighbour_weights: Sequence[TensorDict],
    neighbour_masks: Sequence[TensorDict],
) -> torch.Tensor:
    """The formula for one tensor, in ``w``'s dtype (neighbours' weights are converted to it).

    Sums in place, in the same order as out of place (the same bits; 14-23 % less time for a cnn client
    with 10 neighbours, docs/RESULTS.md); the holder count is an exact integer either way.
    """
    total = w * own_train_mask[name]  # guard: only the client's own support counts (a new tensor)
    count = own_train_mask[name].to(torch.int32)
    for nw, nm in zip(neighbour_weights, neighbour_masks, strict=True):
        total.add_(nw[name].to(w.dtype) * nm[name])
        count.add_(nm[name])
    agg = torch.where(count > 0, total / count.clamp_min(1), torch.zeros_like(total))
    return agg * own_next_mask[name]


def aggregate_buffers(own_buffers: TensorDict, peer_buffers: Sequence[TensorDict]) -> dict[str, torch.Tensor]:
    """BatchNorm's running statistics under ``norm_stats = "average"``: each buffer over its holders.

    The holders are the client (when ``own_buffers`` is not empty: it has trained) and every peer whose
    entry of ``peer_buffers`` is not empty (a peer that sent none, such as a ``local`` node, is not counted).
    A float buffer (``running_mean``, ``running_var``) becomes the holders' mean, summed in order (the client
    first) in its own dtype; an integer one (``num_batches_tracked``) their largest value. With no holder the
    result is ``{}`` (a new layer's statistics). Every holder must have the same names, shapes and dtypes
    (the decoder checked a peer's); inputs are never modified.
    """
    holders = [b for b in (own_buffers, *peer_buffers) if b]
    if not holders:
        return {}
    names = list(holders[0])
    out: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for held in holders[1:]:
            if list(held) != names:
                raise ConfigError(f"buffers {sorted(held)} do not match the client's {sorted(names)}")
        for name in names:
            first = holders[0][name]
            values = [held[name] for held in holders]
            for value in values[1:]:
                if value.shape != first.shape or value.dtype != first.dtype:
                    raise ConfigError(
                        f"buffer {name!r}: {tuple(value.shape)} {value.dtype} against"
                        f" {tuple(first.shape)} {first.dtype}"
                    )
            if first.is_floating_point():
                total = first.clone()
                for value in values[1:]:
                    total.add_(value.to(first.device))
                out[name] = total / len(values)
            else:
                out[name] = torch.stack([value.to(first.device) for value in values]).amax(dim=0)
    return out
