"""Sparse-to-sparser: DA-DPFL's further pruning on top of DisPFL (Long et al., "Decentralized Personalized
Federated Learning based on a Conditional 'Sparse-to-Sparser' Scheme", IEEE TNNLS 2025; docs/ALGORITHM.md
"Optional: sparse-to-sparser").

DisPFL keeps each client's density fixed; here masks shrink further, by the PQ index of each weight
tensor, until the model reaches a target density (0.2 for CIFAR), and never below it:

* **PQ index** of a tensor's active weights ``x`` (count ``n``), with ``p = 0.5``, ``q = 1``:
  ``I = 1 - n**(1/q - 1/p) * ||x||_p / ||x||_q``; keep ``k = ceil(n * (1 + eta)**(q/(p - q)) *
  (1 - I)**(q*p/(q - p)))`` (``eta = 0``) and prune the ``min(0.9, gamma * (1 - k/n)) * n`` (``gamma = 1``)
  smallest-``|w|`` weights. Only tensors with more than one dimension are pruned; when a prune would take
  the model below the target, every tensor's count is scaled down so that it lands on the target.
* **When**: each client tracks ``D_t = sum over tensors of ||w_t - w_init||_2`` after local training and
  ``s_t = |D_t - D_{t-1}| / D_0``; pruning starts the round after the first round ``V`` (0-based, at least
  1) in which at least half of the clients report ``s_t <= 0.02`` (in a fleet: a majority of the node and
  its neighbours, :func:`vote`). The prunes then fall in rounds ``1 + f_0 + f_1 + ... + f_k`` (k = 0, 1, ...),
  with ``f_0 = V`` and ``f_{k+1} = round(f_k / 1.3)`` (at least 1): the first in ``T_0 = V + 1``, the next
  ``round(V / 1.3)`` rounds later, and so on (``V = 9``: rounds 10, 17, 22, 26, 29, 31, 33, ...).
  docs/ALGORITHM.md's ``f_0 = T_0`` leaves ``T_0`` undefined; this is the DA-DPFL authors' code
  (``generate_pruning_freq`` in ``fedml_api/standalone/dadpfl/dadpfl_api*.py``, EricLoong/da-dpfl): its
  ``a`` is the vote round ``V``, the prune rounds it lists are ``cumsum([V, round(V/c), ...])``, and each
  listed round raises a flag that prunes in the *next* round's local training. Reading ``T_0`` as the
  first pruning round instead (gaps ``round((V+1)/1.3)``, ...) prunes less often: ``V = 1`` gives rounds
  2, 4, 6, ... there and 2, 3, 4, ... here. Also from that code: ``c = reconfig_reduce = 1.3`` in its
  CIFAR scripts, Python's ``round`` (halves to even). It differs in two respects that this module keeps
  on purpose: it stops after 21 listed rounds (the density floor stops pruning here), and its prune can
  overshoot the target (here it lands on it). (A gap that rounds to 0, which a decay of 1.3 never gives,
  would end its list; here gaps stay at least 1.)
* **Where in the round**: after local training, before DisPFL's prune-and-regrow (which keeps the new,
  smaller per-tensor counts): the model the client keeps, evaluates (its accuracy after local training)
  and publishes is the further-pruned one. The authors' code evaluates and publishes the trained model
  unpruned and lands the next aggregation on the smaller mask; here a prune round's accuracy, density and
  the bytes its model costs the next round all describe one model.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import torch

from edge_node.algorithm.dispfl import ClientState
from edge_node.algorithm.masks import check_density
from edge_node.algorithm.prune_regrow import drop_smallest
from edge_node.errors import ConfigError

TensorDict = Mapping[str, torch.Tensor]


@dataclass(frozen=True)
class S2SParams:
    """DA-DPFL's further-pruning settings (defaults: the paper's CIFAR values)."""

    target_density: float = 0.2  # never prune below this whole-model density
    stable_threshold: float = 0.02  # a client votes "stable" when s_t <= this
    vote_fraction: float = 0.5  # pruning starts once at least this fraction of voters is stable
    gap_decay: float = 1.3  # f_{k+1} = round(f_k / gap_decay)
    p: float = 0.5
    q: float = 1.0
    eta: float = 0.0
    gamma: float = 1.0
    max_prune_fraction: float = 0.9  # of a tensor's active weights in one prune

    def __post_init__(self) -> None:
        check_density(self.target_density)
        for name in ("stable_threshold", "gap_decay", "p", "q", "gamma"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ConfigError(f"{name}={value!r} must be a positive number")
        if not 0 < self.vote_fraction <= 1:
            raise ConfigError(f"vote_fraction={self.vote_fraction!r} must be in (0, 1]")
        if not 0 < self.max_prune_fraction < 1:
            raise ConfigError(f"max_prune_fraction={self.max_prune_fraction!r} must be in (0, 1)")
        if self.p >= self.q:
            raise ConfigError(f"p={self.p} must be less than q={self.q} (the PQ index needs p < q)")
        if self.eta < 0:
            raise ConfigError(f"eta={self.eta!r} must be >= 0")
        if self.gap_decay < 1:
            raise ConfigError(f"gap_decay={self.gap_decay!r} must be >= 1 (gaps shrink)")


def pq_index(x: torch.Tensor, p: float = 0.5, q: float = 1.0) -> float:
    """``1 - n**(1/q - 1/p) * ||x||_p / ||x||_q`` of the values ``x``: 0 for equal magnitudes, towards 1 when sparse.

    Returns 0 for an empty or all-zero ``x`` (nothing to say: nothing is pruned).
    """
    a = x.detach().reshape(-1).abs().double()
    n = a.numel()
    norm_q = float(a.pow(q).sum() ** (1.0 / q)) if n else 0.0
    if n == 0 or norm_q == 0.0:
        return 0.0
    norm_p = float(a.pow(p).sum() ** (1.0 / p))
    return 1.0 - n ** (1.0 / q - 1.0 / p) * norm_p / norm_q


def pq_prune_count(x: torch.Tensor, params: S2SParams) -> int:
    """How many of the active values ``x`` one PQ prune removes: ``floor(min(0.9, gamma * (1 - k/n)) * n)``."""
    n = x.numel()
    if n == 0:
        return 0
    index = pq_index(x, params.p, params.q)
    p, q = params.p, params.q
    keep = math.ceil(n * (1 + params.eta) ** (q / (p - q)) * max(1.0 - index, 0.0) ** (q * p / (q - p)))
    fraction = min(params.max_prune_fraction, params.gamma * (1.0 - min(keep, n) / n))
    return min(math.floor(fraction * n), n - 1)  # a tensor keeps at least one active weight


def further_prune(weights: TensorDict, masks: TensorDict, params: S2SParams) -> dict[str, torch.Tensor]:
    """One PQ-index prune of ``masks`` (bool, what ``weights`` were trained on); inputs untouched.

    The whole-model density never goes below ``params.target_density``: a mask already at or below it is
    returned as is, and a prune that would overshoot is scaled down to land exactly on
    ``ceil(target_density * numel)`` active weights (per-tensor counts shrink in proportion, largest
    remainders rounded up).
    """
    total = sum(m.numel() for m in masks.values())
    active = sum(int(m.sum()) for m in masks.values())
    floor_active = math.ceil(params.target_density * total)
    out = {name: m.clone() for name, m in masks.items()}
    if active <= floor_active:
        return out
    counts = {
        name: pq_prune_count(weights[name][m], params) for name, m in masks.items() if m.dim() > 1 and bool(m.any())
    }
    wanted = sum(counts.values())
    allowed = active - floor_active
    if wanted > allowed:  # scale down in proportion; the remainder goes to the largest fractions (ties: order)
        scaled = {name: c * allowed // wanted for name, c in counts.items()}
        order = sorted(counts, key=lambda name: -((counts[name] * allowed) % wanted))
        for name in order[: allowed - sum(scaled.values())]:
            scaled[name] += 1
        counts = scaled
    for name, count in counts.items():
        out[name] = drop_smallest(weights[name], masks[name], count)
    return out


def prune_state(state: ClientState, params: S2SParams) -> ClientState:
    """The client after one further prune of its trained model: weights zeroed outside the smaller mask,
    which becomes both its train mask (published) and the mask DisPFL's mask update starts from."""
    mask = further_prune(state.weights, state.train_mask, params)
    weights = {name: w * mask[name] for name, w in state.weights.items()}
    return ClientState(weights, mask, dict(mask), state.density, state.buffers)


def weight_distance(weights: TensorDict, init_weights: TensorDict) -> float:
    """``D = sum over tensors of ||w - w_init||_2``."""
    with torch.no_grad():
        return float(sum(torch.linalg.vector_norm((w - init_weights[name]).double()) for name, w in weights.items()))


def stability(distance: float, previous: float, first: float) -> float:
    """``s_t = |D_t - D_{t-1}| / D_0`` (infinite while ``D_0`` is 0)."""
    return abs(distance - previous) / first if first > 0 else math.inf


def vote(stable: Sequence[bool], fraction: float = 0.5) -> bool:
    """True when at least ``fraction`` of the voters report a stable model (none voting: False)."""
    return bool(stable) and sum(bool(s) for s in stable) >= fraction * len(stable)


def prune_rounds(start_round: int, gap_decay: float = 1.3) -> Iterator[int]:
    """The rounds that prune, from the first one ``T_0 = start_round`` (the round after the vote round
    ``V = T_0 - 1``): gaps ``f_0 = V``, ``f_{k+1} = round(f_k / gap_decay)``, at least 1; the round after ``T_0``
    that prunes is ``T_0 + f_1`` (see the module docstring). Endless: the density floor stops the pruning."""
    if start_round < 1:
        raise ValueError(f"start_round={start_round} must be >= 1 (the round after a vote)")
    t, gap = start_round, start_round - 1
    while True:
        yield t
        gap = max(1, round(gap / gap_decay))
        t += gap


def is_prune_round(round_index: int, start_round: int | None, gap_decay: float = 1.3) -> bool:
    """Whether ``round_index`` prunes, for pruning that starts at ``start_round`` (None: not started)."""
    if start_round is None or round_index < start_round:
        return False
    for t in prune_rounds(start_round, gap_decay):
        if t >= round_index:
            return t == round_index
    return False  # pragma: no cover - prune_rounds is endless
