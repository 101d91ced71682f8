"""DisPFL's intersection-weighted gossip average (Dai et al., ICML 2022, Alg. 1 line 6).

Per coordinate ``c``: ``agg[c] = (w_i[c] + sum_j w_j[c]) / (m_i_old[c] + sum_j m_j[c])`` (0 where
the denominator is 0), then ``w = agg * m_i_new``. Models are supported on their masks, so the sums
count only holders; a coordinate client i newly regrew gets the neighbours' mean (its own 0 is not
counted). No weighting by data size.

Finite inputs give a finite result: a mean of values lies between them, but a float32 sum of huge
ones (two peers at 3e38) overflows. The float32 computation runs as always, so ordinary inputs give
bit-identical results; only a tensor whose result came out non-finite is computed again in float64
and rounded back. (How far one peer may push the mean is ``robust.screen_peer_models``'s business.)
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
