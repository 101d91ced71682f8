"""Robust aggregation: coordinate-wise median and trimmed mean over the holders, and a distance check.

DisPFL's aggregate (``aggregation.py``) is a per-coordinate mean over the models holding the coordinate
(the client's own included). The receive-path screen (``robust.py``) bounds how *large* a peer's model may
be, but a peer of ordinary size that is wrong (sign-flipped, scaled down, zero, trained on flipped labels,
stale) moves a mean by its share. The robust setting (``aggregate = "median"`` or ``"trimmed:BETA"``)
replaces the mean by an order statistic and refuses, before aggregating, a peer that points away from the
others:

- **Coordinate-wise median** (Yin et al., "Byzantine-robust distributed learning", ICML 2018), per
  coordinate over its holders: the holders' values sorted, the middle one (the mean of the two middle ones
  when their number is even: with two holders, their mean).
- **Coordinate-wise trimmed mean** ``trimmed:BETA`` (same paper), per coordinate over its ``k`` holders:
  drop the ``floor(BETA * k)`` smallest and as many largest values, average the rest. ``BETA`` in
  ``[0, 0.5)``; ``trimmed:0`` is the holders' mean (summed in another order than ``mean``'s).
- Holders are as in the mean: the client where its trained mask is true, each peer where its mask is
  true; a coordinate nobody holds is 0; the result is supported on the client's next mask.
- **Distance check** (:func:`distance_check`): peer ``j``'s score is the median (of an even number of
  values the upper middle one: with the own model and one other peer, the larger cosine), over the other models
  (the client's own and the other peers'), of the cosine between ``j``'s active weights and theirs, each
  cosine taken over the coordinates both hold (a model with no weight there counts as 0: a zero model has
  no direction). A peer scoring below ``min_cosine`` is refused with the reason ``distance``. Every model
  starts from the fleet's shared initial weights and is averaged with its neighbours each round, so honest
  models point the same way; a sign-flipped one scores near minus an honest one, a noise or zero model
  near 0. While fewer than half of the others collude with ``j``, the median is an honest model's cosine
  (an honest peer whose others are the own model and one attacker is kept; the attacker, whose others are
  two honest models, is refused).

``aggregate = "mean"`` is DisPFL's mean, bit for bit, with no distance check.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch

from edge_node.algorithm.robust import ScreenResult
from edge_node.errors import ConfigError
from edge_node.robust_names import (  # re-exported: the settings' names live without torch
    AGGREGATE_HELP,
    AGGREGATES,
    DEFAULT_AGGREGATE,
    check_aggregate,
    parse_aggregate,
)

__all__ = [
    "AGGREGATES",
    "AGGREGATE_HELP",
    "DEFAULT_AGGREGATE",
    "DEFAULT_MIN_COSINE",
    "DISTANCE",
    "check_aggregate",
    "distance_check",
    "pairwise_cosines",
    "parse_aggregate",
    "refusal_kind",
    "robust_aggregate",
]

TensorDict = Mapping[str, torch.Tensor]

# Sign-flipped models score negative, noise and zero models near 0; the clean runs of docs/RESULTS.md ("Poisoned
# peers") refused no honest model at this bound (how far above it honest models stay was not measured).
DEFAULT_MIN_COSINE = 0.2
DISTANCE = "distance"  # the refusal kind of the distance check (every refusal is counted by kind)


def robust_aggregate(
    own_weights: TensorDict,
    own_train_mask: TensorDict,
    own_next_mask: TensorDict,
    neighbour_weights: Sequence[TensorDict],
    neighbour_masks: Sequence[TensorDict],
    spec: str,
) -> dict[str, torch.Tensor]:
    """The coordinate-wise median or trimmed mean over each coordinate's holders, supported on ``own_next_mask``.

    Arguments as :func:`edge_node.algorithm.aggregation.aggregate`; ``spec`` is ``"median"`` or
    ``"trimmed:BETA"`` (``"mean"`` is that function's business). Inputs are never modified.
    """
    rule, beta = parse_aggregate(spec)
    if rule == "mean":
        raise ConfigError("robust_aggregate: aggregate 'mean' is edge_node.algorithm.aggregation.aggregate")
    if len(neighbour_weights) != len(neighbour_masks):
        raise ConfigError(f"{len(neighbour_weights)} neighbour models but {len(neighbour_masks)} neighbour masks")
    out: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for name, w in own_weights.items():
            values = torch.stack([w, *(nw[name].to(w.device, w.dtype) for nw in neighbour_weights)])
            held = torch.stack([own_train_mask[name], *(nm[name].to(w.device) for nm in neighbour_masks)]).bool()
            out[name] = _order_statistic(values, held, rule, beta) * own_next_mask[name]
    return out


def _order_statistic(values: torch.Tensor, held: torch.Tensor, rule: str, beta: float) -> torch.Tensor:
    """Per coordinate (dims 1..), the median or trimmed mean of ``values`` over dim 0 where ``held``; 0 if none."""
    wide = values.double()  # the order statistic of float32 values; sums without overflow
    ordered = torch.where(held, wide, torch.full_like(wide, math.inf)).sort(dim=0).values  # holders first
    k = held.sum(dim=0)  # holders per coordinate
    position = torch.arange(values.shape[0], device=values.device).view(-1, *([1] * (values.dim() - 1)))
    if rule == "median":
        lower = ((k - 1).clamp_min(0) // 2).unsqueeze(0)
        upper = (k // 2).clamp_max(values.shape[0] - 1).unsqueeze(0)
        middle = (ordered.gather(0, lower) + ordered.gather(0, upper)).squeeze(0) / 2
        result = torch.where(k > 0, middle, torch.zeros_like(middle))
    else:
        cut = torch.floor(k.double() * beta).long()  # dropped at each end
        keep = (position >= cut) & (position < k - cut)
        kept = torch.where(keep, ordered, torch.zeros_like(ordered)).sum(dim=0)
        count = (k - 2 * cut).clamp_min(1)
        result = torch.where(k > 0, kept / count, torch.zeros_like(kept))
    limit = torch.finfo(values.dtype).max  # a median or mean of finite values lies between them; rounding aside
    return result.clamp(-limit, limit).to(values.dtype)


def pairwise_cosines(models: Sequence[tuple[TensorDict, TensorDict]], names: Sequence[str]) -> torch.Tensor:
    """``cos[a, b]`` between models ``a`` and ``b``'s active weights over the coordinates both hold (float64).

    0 where either has no weight there (a zero model has no direction); 1 on the diagonal of a nonzero model.
    """
    n = len(models)
    dots = torch.zeros(n, n, dtype=torch.float64)
    squares = torch.zeros(n, n, dtype=torch.float64)  # squares[a, b]: a's sum of squares where b holds
    with torch.no_grad():
        for name in names:
            vectors = torch.stack([torch.where(m[name], w[name], 0).reshape(-1).double() for w, m in models])
            holds = torch.stack([m[name].reshape(-1).double() for _, m in models])
            dots += (vectors @ vectors.T).cpu()
            squares += (vectors.square() @ holds.T).cpu()
    norms = (squares * squares.T).sqrt()
    return torch.where(norms > 0, dots / norms.clamp_min(1e-300), torch.zeros_like(dots))


def _upper_median(values: list[float]) -> float:
    """The middle value; of an even number, the upper of the two (a tie goes the peer's way)."""
    return sorted(values)[len(values) // 2]


def distance_check(
    own_weights: TensorDict,
    own_mask: TensorDict,
    peers: Sequence[tuple[str, TensorDict, TensorDict]],
    *,
    min_cosine: float = DEFAULT_MIN_COSINE,
) -> ScreenResult:
    """Refuse every peer whose median cosine to the other models (the module's rule) is below ``min_cosine``.

    Args:
        own_weights, own_mask: this node's model (what it published: trained weights and their mask).
        peers: ``(peer_id, weights, mask)``, already through the receive-path screen (names and shapes checked).
        min_cosine: the least median cosine a peer may have, in [-1, 1].
    """
    if not (math.isfinite(min_cosine) and -1.0 <= min_cosine <= 1.0):
        raise ConfigError(f"min_cosine={min_cosine!r} must be in [-1, 1]")
    if not peers:
        return ScreenResult([])
    names = list(own_weights)
    cos = pairwise_cosines([(own_weights, own_mask), *((w, m) for _, w, m in peers)], names).tolist()
    accepted: list[str] = []
    refused: dict[str, str] = {}
    for j, (peer, _, _) in enumerate(peers, start=1):
        others = [cos[j][b] for b in range(len(cos)) if b != j]
        score = _upper_median(others)
        if score < min_cosine:
            refused[peer] = (
                f"{DISTANCE}: median cosine {score:.3g} to the node's and its other peers' models is below"
                f" {min_cosine:g} (to the node's own: {cos[j][0]:.3g})"
            )
        else:
            accepted.append(peer)
    return ScreenResult(accepted, refused)


def refusal_kind(reason: str) -> str:
    """The kind a screen refusal is counted under: ``distance`` for the distance check's, else ``screened``."""
    return DISTANCE if reason.startswith(f"{DISTANCE}:") else "screened"
