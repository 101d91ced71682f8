"""DisPFL (Dai et al., ICML 2022): every client runs the shared client round on the models its seeded
neighbours published at the round's start (:func:`edge_node.algorithm.dispfl.client_round`, the round a
device's daemon runs too)."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from edge_node.algorithm import nnz_per_tensor
from edge_node.algorithm.batched import groups_by_steps, train_local_batched
from edge_node.algorithm.dispfl import (
    ClientRound,
    ClientState,
    RoundHooks,
    client_round,
    keep_and_evaluate,
    published,
    screen_and_aggregate,
    start,
    update_mask,
)
from edge_node.algorithm.robust import StatsMemo
from edge_node.algorithm.training import load_weights
from edge_node.errors import ConfigError
from edge_node.sim.methods.base import BATCHED, GRAPHED, MASKS, NEIGHBOURHOOD, Method, RoundResult, RunState, SimContext

_LOGGER = logging.getLogger(__name__)
Keep = Callable[[ClientState], ClientState]


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
        clients = [start(ctx.init_weights, d, seed=config.seed, client=i, mask_init=config.mask_init)
                   for i, d in enumerate(ctx.densities)]  # fmt: skip
        return RunState(clients, self.initial_extra(ctx))

    def initial_extra(self, ctx: SimContext) -> dict[str, Any]:
        """A variant's own bookkeeping before round 0 (checkpointed in ``RunState.extra``)."""
        return {}

    def plan(self, ctx: SimContext, t: int, extra: dict[str, Any]) -> RoundPlan:
        """What a variant adds to round ``t`` (``extra``: the round's copy of the state's bookkeeping)."""
        return RoundPlan()

    def round(self, ctx: SimContext, t: int, state: RunState) -> tuple[RunState, RoundResult]:
        config, params = ctx.config, ctx.params
        at_start = state.clients  # every client aggregates the models as they were at the round's start
        nbrs = ctx.neighbours(t)
        traffic = ctx.traffic(t, at_start, nbrs)
        extra = dict(state.extra)
        plan = self.plan(ctx, t, extra)
        stats = StatsMemo()  # each round-start model's screen statistics, computed once for all its pullers

        def offers(i: int) -> list[tuple[str, Any, Any]]:
            return [(f"client-{j}", *published(at_start[j])) for j in nbrs[i]]

        def hooks(i: int) -> RoundHooks:
            return ctx.hooks(i, keep=plan.keep(i), stats_of=stats)

        batched = _BatchedRounds(ctx, t, at_start, offers, hooks) if config.batch_clients > 1 else None

        def one(i: int) -> tuple[ClientState, tuple[float, float, float, float, dict[str, str]]]:
            if batched is not None:
                done = batched.client(i)
            else:
                with ctx.stopping_on_divergence(t):
                    done = client_round(
                        at_start[i], offers(i), ctx.model, t, params, seed=config.seed, client=i, hooks=hooks(i),
                        screen=config.screen,
                    )  # fmt: skip
            for peer, reason in done.refused.items():
                _LOGGER.warning("round screen: client-%d refused %s: %s", i, peer, reason)
            flops = ctx.training_flops(nnz_per_tensor(done.trained.state.train_mask), ctx.data[i].num_train,
                                       params.regrow == "gradient")  # fmt: skip
            return done.state, (done.acc_before, done.acc_after, done.trained.stats.mean_loss, flops, done.refused)

        clients, outcomes = ctx.each_client(t, one)
        acc_before, acc_after = [o[0] for o in outcomes], [o[1] for o in outcomes]
        losses, flops = [o[2] for o in outcomes], [o[3] for o in outcomes]
        refused = {f"client-{i}": o[4] for i, o in enumerate(outcomes) if o[4]}
        result = RoundResult(acc_before, acc_after, losses, flops, traffic["received"], traffic["sent"],
                             traffic["paper_mb"], screen_refused=refused if config.screen else None,
                             fields=plan.fields())  # fmt: skip
        return RunState(clients, extra), result


@contextmanager
def _batching_errors(model: str, clients: int) -> Iterator[None]:
    """A group that does not fit the device, or a model ``torch.func.vmap`` cannot batch, as one ConfigError line
    (the run stops before recording the round; --batch-clients may change on resume)."""
    try:
        yield
    except torch.OutOfMemoryError as exc:
        raise ConfigError(
            f"batch_clients: {clients} clients of {model} at once ran out of device memory; resume with fewer"
            " (--batch-clients may change on resume) or 1"
        ) from exc
    except RuntimeError as exc:
        if "vmap" not in str(exc) and "functorch" not in str(exc):
            raise
        text = " ".join(str(exc).split()) or type(exc).__name__
        first = text.split(". ")[0][:200]  # torch's first sentence says what vmap could not do
        raise ConfigError(f"batch_clients: model {model} cannot be batched by torch.func.vmap ({first}); "
                          "run with --batch-clients 1") from exc  # fmt: skip


class _BatchedRounds:
    """The round of ``--batch-clients``: each client's round as :func:`client_round` runs it, but the local training
    of a group of clients with equal step counts as one batched step (edge_node.algorithm.batched). A group runs when
    its first client is asked for; the others' rounds are then ready."""

    def __init__(
        self, ctx: SimContext, t: int, at_start: list[ClientState], offers: Callable[[int], list[Any]],
        hooks: Callable[[int], RoundHooks],
    ) -> None:  # fmt: skip
        self.ctx, self.t, self.at_start, self.offers, self.hooks = ctx, t, at_start, offers, hooks
        config, params = ctx.config, ctx.params
        mine = list(ctx.shard.clients(config.clients))
        steps = [params.epochs * math.ceil(ctx.data[i].num_train / params.batch_size) for i in mine]
        self.groups = [[mine[k] for k in group] for group in groups_by_steps(steps, config.batch_clients)]
        self.group_of = {i: g for g, group in enumerate(self.groups) for i in group}
        self.done: dict[int, ClientRound] = {}

    def client(self, i: int) -> ClientRound:
        if i not in self.done:
            self._run(self.groups[self.group_of[i]])
        return self.done.pop(i)

    def _run(self, group: list[int]) -> None:
        ctx, t, config, params = self.ctx, self.t, self.ctx.config, self.ctx.params
        hooks = {i: self.hooks(i) for i in group}
        screened = {}
        with ctx.phase("aggregate"):
            for i in group:
                screened[i] = screen_and_aggregate(self.at_start[i], self.offers(i), hooks[i], screen=config.screen)
        with ctx.phase("train"):
            before = {}
            for i in group:
                load_weights(ctx.model, screened[i][0].weights)
                before[i] = hooks[i].evaluate(ctx.model)
            with ctx.stopping_on_divergence(t), _batching_errors(config.model, len(group)):
                trained = train_local_batched(
                    [screened[i][0] for i in group], ctx.model, [hooks[i].batches for i in group], t, params,
                    seed=config.seed, clients=group,
                )  # fmt: skip
            for i, result in zip(group, trained, strict=True):
                load_weights(ctx.model, result.state.weights)
                done = keep_and_evaluate(result, ctx.model, hooks[i], before[i])
                state = update_mask(done.kept, t, params, seed=config.seed, client=i, gradients=result.gradients)
                _, accepted, refused = screened[i]
                self.done[i] = ClientRound(state, result, done.acc_before, done.acc_after, accepted, refused)


DISPFL = DisPFL(
    name="dispfl", label="DisPFL", acc_before_is="aggregated personal model, before local training",
    acc_after_is="after local training", sparse=True, uses=NEIGHBOURHOOD | MASKS | GRAPHED | BATCHED | {"screen"},
    shardable=True,
)  # fmt: skip
