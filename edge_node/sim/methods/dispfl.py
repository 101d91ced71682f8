"""DisPFL (Dai et al., ICML 2022): every client runs the shared client round on the models its seeded
neighbours published at the round's start (:func:`edge_node.algorithm.dispfl.client_round`, the round a
device's daemon runs too)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from edge_node.algorithm import nnz_per_tensor
from edge_node.algorithm.dispfl import (
    ClientState,
    RoundHooks,
    client_round,
    published,
    start,
)
from edge_node.algorithm.robust import StatsMemo
from edge_node.sim.methods.base import GRAPHED, MASKS, NEIGHBOURHOOD, Method, RoundResult, RunState, SimContext

_LOGGER = logging.getLogger(__name__)
Keep = Callable[[ClientState], ClientState]
Published = tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]  # a client's published weights and mask


class RoundPlan:
    """A DisPFL variant's part of one round: what each client keeps of its trained model, its record fields."""

    def keep(self, i: int) -> Keep | None:
        """What client ``i`` keeps of its trained model (None: all of it; see ``RoundHooks.keep``)."""
        return None

    def fields(self) -> dict[str, Any]:
        """The variant's record fields, once every client's round is done."""
        return {}


@dataclass(frozen=True)
class DisPFL(Method):
    """Sparse personalised models on each client's own mask, gossiped with the round's neighbours."""

    def initial_state(self, ctx: SimContext) -> RunState:
        config = ctx.config
        clients = [start(ctx.init_weights, ctx.mask_density(i), seed=config.seed, client=i,
                         mask_init=config.mask_init, frozen=ctx.params.frozen, within=ctx.within(i))
                   for i in range(len(ctx.densities))]  # fmt: skip
        return RunState(clients, self.initial_extra(ctx))

    def initial_extra(self, ctx: SimContext) -> dict[str, Any]:
        """A variant's own bookkeeping before round 0 (checkpointed in ``RunState.extra``)."""
        return {}

    def plan(self, ctx: SimContext, t: int, extra: dict[str, Any]) -> RoundPlan:
        """What a variant adds to round ``t`` (``extra``: the round's copy of the state's bookkeeping)."""
        return RoundPlan()

    def published_models(self, ctx: SimContext, t: int, at_start: list[ClientState]) -> list[Published]:
        """What each client published at round ``t``'s start (a seam: bench/poisoning.py poisons some of them)."""
        return [published(c, ctx.params.frozen) for c in at_start]

    def client_hooks(self, ctx: SimContext, i: int, **more: Any) -> RoundHooks:
        """Client ``i``'s round hooks (a seam: bench/poisoning.py's label-flip attackers train on flipped labels)."""
        return ctx.hooks(i, **more)

    def round(self, ctx: SimContext, t: int, state: RunState) -> tuple[RunState, RoundResult]:
        config, params = ctx.config, ctx.params
        at_start = state.clients  # every client aggregates the models as they were at the round's start
        nbrs = ctx.neighbours(t)
        traffic = ctx.traffic(t, at_start, nbrs)
        extra = dict(state.extra)
        plan = self.plan(ctx, t, extra)
        stats = StatsMemo()  # each round-start model's screen statistics, computed once for all its pullers
        models = self.published_models(ctx, t, at_start)  # the same dicts for every puller (the memo's key)

        def offers(i: int) -> list[tuple[str, Any, Any]]:
            return [(f"client-{j}", *models[j]) for j in nbrs[i]]

        def hooks(i: int) -> RoundHooks:
            return self.client_hooks(ctx, i, keep=plan.keep(i), stats_of=stats)

        def one(i: int) -> tuple[ClientState, tuple[float, float, float, float | None, dict[str, str]]]:
            with ctx.stopping_on_divergence(t):
                done = client_round(
                    at_start[i], offers(i), ctx.model_of(i), t, params, seed=config.seed, client=i, hooks=hooks(i),
                    screen=config.screen, peer_buffers={f"client-{j}": at_start[j].buffers for j in nbrs[i]},
                )  # fmt: skip
            for peer, reason in done.refused.items():
                _LOGGER.warning("round screen: client-%d refused %s: %s", i, peer, reason)
            flops = ctx.training_flops(nnz_per_tensor(done.trained.state.train_mask), ctx.data[i].num_train,
                                       params.regrow == "gradient", ctx.dense_of(i))  # fmt: skip
            return done.state, (done.acc_before, done.acc_after, done.trained.stats.mean_loss, flops, done.refused)

        clients, outcomes = ctx.each_client(t, one)
        acc_before, acc_after = [o[0] for o in outcomes], [o[1] for o in outcomes]
        losses, flops = [o[2] for o in outcomes], [o[3] for o in outcomes]
        refused = {f"client-{i}": o[4] for i, o in enumerate(outcomes) if o[4]}
        screened = config.screen or params.aggregate != "mean"  # the distance check refuses too
        result = RoundResult(acc_before, acc_after, losses, flops, traffic["received"], traffic["sent"],
                             traffic["paper_mb"], screen_refused=refused if screened else None,
                             fields=plan.fields())  # fmt: skip
        return RunState(clients, extra), result


DISPFL = DisPFL(
    name="dispfl", label="DisPFL", acc_before_is="aggregated personal model, before local training",
    acc_after_is="after local training", sparse=True, shardable=True, keeps_norm_stats=True, averages_norm_stats=True,
    uses=NEIGHBOURHOOD | MASKS | GRAPHED | {"screen", "trainable", "tier_mode", "aggregate"},
)  # fmt: skip
