"""Ditto (:mod:`edge_node.algorithm.ditto`): FedAvg's global model, and every client's own dense personal model.

Each round the server samples ``fedavg_clients`` clients (as FedAvg does). A sampled client draws one
round's batch stream of E epochs (its ``Stream.TRAIN`` of the round, as every method's): the first
``global`` steps train the global model it received (uploaded, averaged by sample count as FedAvg), the rest
train its personal model with the proximal pull ``ditto_lambda * (v - w)`` towards the global model it
received. Clients not sampled keep their personal models. The headline is every client's personal model
after the round; ``acc_before`` is the new global model on each client's test data (FedAvg's headline).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import islice
from typing import TYPE_CHECKING

import torch

from edge_node.algorithm.dense import dense_state
from edge_node.algorithm.dispfl import ClientState, check_trained
from edge_node.algorithm.ditto import split_steps, steps_per_epoch
from edge_node.algorithm.fedavg import sample_clients, weighted_average
from edge_node.algorithm.training import TensorDict, load_weights, read_weights, train_masked
from edge_node.errors import ConfigError
from edge_node.seeding import Stream, torch_generator
from edge_node.sim.methods.base import Method, RoundResult, RunState, SimContext, score

if TYPE_CHECKING:
    from edge_node.sim.config import SimConfig


@dataclass(frozen=True)
class Ditto(Method):
    """The global model is ``RunState.server``; client ``k``'s entry is its personal model ``v_k``."""

    def check(self, config: SimConfig) -> None:
        if not 0.0 < config.ditto_personal_share < 1.0:
            raise ConfigError(f"ditto_personal_share={config.ditto_personal_share!r} must be in (0, 1)")
        if not config.ditto_lambda >= 0.0:  # NaN fails too
            raise ConfigError(f"ditto_lambda={config.ditto_lambda!r} must be >= 0")

    def initial_state(self, ctx: SimContext) -> RunState:
        return RunState([dense_state(ctx.init_weights) for _ in ctx.densities], {}, dense_state(ctx.init_weights))

    def round(self, ctx: SimContext, t: int, state: RunState) -> tuple[RunState, RoundResult]:
        config = ctx.config
        server = state.server
        assert server is not None
        chosen = sample_clients(config.clients, config.fedavg_clients, config.seed, t)
        clients = list(state.clients)
        trained_models, counts, losses, flops = [], [], [], []
        with ctx.phase("train"):
            for i in ctx.client_bar(t, len(chosen), chosen):
                with ctx.stopping_on_divergence(t):
                    global_weights, clients[i], loss = _client_update(ctx, t, i, server, clients[i].weights)
                trained_models.append(global_weights)
                counts.append(ctx.data[i].num_train)
                losses.append(loss)
                flops.append(ctx.training_flops(ctx.dense, ctx.data[i].num_train, False))  # E epochs in all
        with ctx.phase("aggregate"):
            server = dense_state(weighted_average(trained_models, counts))
        acc_global, acc_personal = [], []
        with ctx.phase("train"):
            for i in range(config.clients):
                load_weights(ctx.model, server.weights)
                acc_global.append(score(ctx.model, ctx.data[i], config.eval_batch_size, ctx.params.task))
                load_weights(ctx.model, clients[i].weights)
                acc_personal.append(score(ctx.model, ctx.data[i], config.eval_batch_size, ctx.params.task))
        dense = [dict(ctx.dense)] * len(chosen)
        received, sent, paper_mb, server_traffic = ctx.server_traffic(t, chosen, dense, dense)
        result = RoundResult(acc_global, acc_personal, losses, flops, received, sent, paper_mb, server=server_traffic)
        return RunState(clients, state.extra, server), result


def _client_update(
    ctx: SimContext, t: int, i: int, received: ClientState, personal: TensorDict
) -> tuple[dict[str, torch.Tensor], ClientState, float]:
    """Client ``i``'s two updates from one batch stream: (trained global weights, new personal state, mean loss).

    Raises:
        TrainingDiverged: either update diverged; nothing of the client's round is kept.
    """
    config, params = ctx.config, ctx.params
    data = ctx.data[i]
    global_steps, personal_steps = split_steps(
        params.epochs * steps_per_epoch(data.num_train, params.batch_size), config.ditto_personal_share
    )
    stream = ctx.train_batches(i, params.epochs, torch_generator(config.seed, Stream.TRAIN, i, t))
    sgd = params.sgd(t)
    load_weights(ctx.model, received.weights)
    global_stats = train_masked(ctx.model, received.train_mask, islice(stream, global_steps), sgd)
    trained_global = read_weights(ctx.model)
    check_trained(global_stats, trained_global, t, i, sgd.lr)
    load_weights(ctx.model, personal)
    personal_stats = train_masked(ctx.model, received.train_mask, islice(stream, personal_steps), sgd,
                                  proximal=(received.weights, config.ditto_lambda))  # fmt: skip
    trained_personal = read_weights(ctx.model)
    check_trained(personal_stats, trained_personal, t, i, sgd.lr)
    parts = [(s.mean_loss, s.samples) for s in (global_stats, personal_stats) if s.samples]
    loss = sum(m * n for m, n in parts) / sum(n for _, n in parts)
    return trained_global, dense_state(trained_personal), loss


DITTO = Ditto(
    name="ditto", label="Ditto", acc_before_is="global model after the server's average",
    acc_after_is="personal model v_k after the round (trained if sampled)", headline="after",
    uses=frozenset({"fedavg_clients", "ditto_lambda", "ditto_personal_share"}), keeps_server=True,
)  # fmt: skip
