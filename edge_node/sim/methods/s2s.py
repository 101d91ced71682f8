"""DisPFL + sparse-to-sparser (DA-DPFL's further pruning, :mod:`edge_node.algorithm.sparse_to_sparser`).

DisPFL's round, where each client tracks how far its trained model moved, the clients vote on stability,
and from the round the vote picks, the trained model is pruned further on the rounds of the schedule: the
pruned model is the one the client keeps, evaluates and publishes (the round's ``keep`` hook).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from edge_node.algorithm.dispfl import ClientState
from edge_node.algorithm.sparse_to_sparser import (
    S2SParams,
    is_prune_round,
    prune_state,
    stability,
    vote,
    weight_distance,
)
from edge_node.errors import ConfigError
from edge_node.sim.methods.base import GRAPHED, MASKS, NEIGHBOURHOOD, SimContext
from edge_node.sim.methods.dispfl import DisPFL, Keep, RoundPlan

if TYPE_CHECKING:
    from edge_node.sim.config import SimConfig

_LOGGER = logging.getLogger(__name__)


def s2s_params(config: SimConfig) -> S2SParams:
    """The further-pruning settings of ``config``."""
    return S2SParams(target_density=config.target_density, stable_threshold=config.s2s_stable_threshold)


@dataclass
class _Plan(RoundPlan):
    """One round of sparse-to-sparser: each client's stability ``s_t`` and vote, and the prune if it is due."""

    ctx: SimContext
    t: int
    extra: dict[str, Any]  # first and last distances per client, the round pruning starts in
    params: S2SParams
    prunes: bool
    stable: list[bool] = field(default_factory=list)
    values: list[float] = field(default_factory=list)

    def keep(self, i: int) -> Keep:
        def keep(trained: ClientState) -> ClientState:
            s_t = _track_distance(self.ctx, self.t, i, trained, self.extra)  # of the trained model, as the authors'
            self.values.append(s_t)
            self.stable.append(s_t <= self.params.stable_threshold)
            return prune_state(trained, self.params) if self.prunes else trained  # kept, evaluated, published

        return keep

    def fields(self) -> dict[str, Any]:
        t, extra, n = self.t, self.extra, self.ctx.config.clients
        if extra.get("start_round") is None and t >= 1 and vote(self.stable, self.params.vote_fraction):
            extra["start_round"] = t + 1
            _LOGGER.info("sparse-to-sparser: %d of %d clients stable, pruning starts in round %d",
                         sum(self.stable), n, t + 1)  # fmt: skip
        return {
            "s2s_pruned": self.prunes,
            "s2s_start_round": extra.get("start_round"),
            "s2s_stable_fraction": sum(self.stable) / n if t >= 1 else None,
            "s2s_stability_median": float(np.median(self.values)) if t >= 1 else None,
        }


@dataclass(frozen=True)
class SparseToSparser(DisPFL):
    """DisPFL whose clients prune further, down to ``target_density``, once most of them are stable."""

    def check(self, config: SimConfig) -> None:
        s2s_params(config)
        if config.setting == "i" and config.target_density > config.density:
            raise ConfigError(f"target_density={config.target_density} must not exceed density={config.density}")

    def initial_extra(self, ctx: SimContext) -> dict[str, Any]:
        n = ctx.config.clients
        return {"first_distance": [0.0] * n, "last_distance": [0.0] * n, "start_round": None}

    def plan(self, ctx: SimContext, t: int, extra: dict[str, Any]) -> RoundPlan:
        params = s2s_params(ctx.config)
        return _Plan(ctx, t, extra, params, is_prune_round(t, extra.get("start_round"), params.gap_decay))


def _track_distance(ctx: SimContext, t: int, i: int, client: ClientState, extra: dict[str, Any]) -> float:
    """Record client ``i``'s ``D_t``; returns ``s_t`` (infinite in round 0, which only sets ``D_0``)."""
    distance = weight_distance(client.weights, ctx.init_weights)
    first, last = extra["first_distance"], extra["last_distance"]
    if t == 0 or first[i] <= 0:
        first[i] = distance
        last[i] = distance
        return math.inf
    s = stability(distance, last[i], first[i])
    last[i] = distance
    return s


DISPFL_S2S = SparseToSparser(
    name="dispfl-s2s", label="DisPFL + sparse-to-sparser",
    acc_before_is="aggregated personal model, before local training",
    acc_after_is="after local training and any further prune", sparse=True,
    uses=NEIGHBOURHOOD | MASKS | GRAPHED | {"screen", "aggregate", "target_density", "s2s_stable_threshold"},
    keeps_norm_stats=True,
    averages_norm_stats=True,
)  # fmt: skip
