"""Sub-FedAvg, unstructured (:mod:`edge_node.algorithm.sub_fedavg`): every client prunes its own sub-network
of a server's model, down to ``--density`` (the final density; clients start dense).

Each round the server samples ``fedavg_clients`` clients (as FedAvg does); client ``k`` receives the server's
model on its mask, trains it for E epochs of masked SGD (one batch stream, epoch by epoch), may adopt a
pruned mask (the module's three conditions; the accuracy is the pruned model's on the client's test data,
as the authors' code measures it), keeps what it trained as its personal model and uploads it; the server
averages each coordinate over the sampled clients holding it. Every client is judged on its personal
model, the one it last trained (the initial dense model until it is first sampled).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from edge_node.algorithm import nnz_per_tensor
from edge_node.algorithm.dense import dense_state
from edge_node.algorithm.dispfl import ClientState, DisPFLParams, check_trained
from edge_node.algorithm.fedavg import sample_clients
from edge_node.algorithm.fedspa import personal_weights
from edge_node.algorithm.sub_fedavg import candidate_mask, holder_average, mask_distance, prunable_density, round_rate
from edge_node.algorithm.training import TrainStats, load_weights, read_weights, train_masked
from edge_node.errors import ConfigError
from edge_node.seeding import Stream, torch_generator
from edge_node.sim.methods.base import Method, RoundResult, RunState, SimContext, score

if TYPE_CHECKING:
    from edge_node.sim.config import SimConfig


@dataclass(frozen=True)
class SubFedAvg(Method):
    """The server's model is ``RunState.server``; client ``k``'s entry is its personal sparse model."""

    def check(self, config: SimConfig) -> None:
        if config.task != "classification":  # its prune is kept on an accuracy threshold
            raise ConfigError(f"method sub-fedavg keeps a prune by test accuracy: --task {config.task} is not "
                              "classification; use another method")  # fmt: skip
        if not 0.0 < config.subfedavg_prune_rate < 1.0:
            raise ConfigError(f"subfedavg_prune_rate={config.subfedavg_prune_rate!r} must be in (0, 1)")
        for name in ("subfedavg_dist_threshold", "subfedavg_acc_threshold"):
            if not 0.0 <= getattr(config, name) <= 1.0:  # NaN fails too
                raise ConfigError(f"{name}={getattr(config, name)!r} must be in [0, 1]")

    def prune_rate(self, config: SimConfig, params: DisPFLParams, t: int) -> float | None:
        return config.subfedavg_prune_rate  # the most a client prunes in a round; its conditions decide

    def initial_state(self, ctx: SimContext) -> RunState:
        clients = [replace_density(dense_state(ctx.init_weights), d) for d in ctx.densities]
        return RunState(clients, {}, dense_state(ctx.init_weights))

    def round(self, ctx: SimContext, t: int, state: RunState) -> tuple[RunState, RoundResult]:
        config = ctx.config
        server = state.server
        assert server is not None
        chosen = sample_clients(config.clients, config.fedavg_clients, config.seed, t)
        clients = list(state.clients)
        losses, flops, down, up = [], [], [], []
        with ctx.phase("train"):
            for i in ctx.client_bar(t, len(chosen), chosen):
                mask = clients[i].train_mask
                with ctx.stopping_on_divergence(t):
                    clients[i], loss = _client_round(ctx, t, i, server, clients[i])
                losses.append(loss)
                down.append(nnz_per_tensor(mask))
                up.append(nnz_per_tensor(clients[i].train_mask))
                flops.append(ctx.training_flops(down[-1], ctx.data[i].num_train, False))
        with ctx.phase("aggregate"):
            trained = [clients[i] for i in chosen]
            server = dense_state(holder_average(server.weights, [c.weights for c in trained],
                                                [c.train_mask for c in trained]))  # fmt: skip
        acc: list[float] = []
        with ctx.phase("train"):
            for i, client in enumerate(clients):
                load_weights(ctx.model, client.weights)
                acc.append(score(ctx.model, ctx.data[i], config.eval_batch_size, ctx.params.task))
        received, sent, paper_mb, server_traffic = ctx.server_traffic(t, chosen, down, up)
        result = RoundResult(acc, None, losses, flops, received, sent, paper_mb, server=server_traffic)
        return RunState(clients, state.extra, server), result


def replace_density(state: ClientState, density: float) -> ClientState:
    """``state`` with target density ``density`` (Sub-FedAvg's clients start dense and prune towards it)."""
    return ClientState(state.weights, state.train_mask, state.next_mask, density)


def _client_round(
    ctx: SimContext, t: int, i: int, server: ClientState, client: ClientState
) -> tuple[ClientState, float]:
    """Client ``i``'s training from the server's model on its mask, and the prune it may adopt; its mean loss.

    Raises:
        TrainingDiverged: its training diverged; nothing of its round is kept.
    """
    config, params = ctx.config, ctx.params
    data, mask = ctx.data[i], client.train_mask
    rate = round_rate(prunable_density(mask), client.density, config.subfedavg_prune_rate)
    generator = torch_generator(config.seed, Stream.TRAIN, i, t)
    sgd = params.sgd(t)
    load_weights(ctx.model, personal_weights(server.weights, mask))
    first = mask
    steps = samples = 0
    loss_sum = 0.0
    for epoch in range(params.epochs):
        stats = train_masked(ctx.model, mask, ctx.train_batches(i, 1, generator), sgd)
        steps, samples, loss_sum = (
            steps + stats.steps,
            samples + stats.samples,
            loss_sum + stats.mean_loss * stats.samples,
        )
        if epoch == 0 and params.epochs > 1 and rate > 0:
            first = candidate_mask(read_weights(ctx.model), mask, rate)
    trained = read_weights(ctx.model)
    total = TrainStats(steps, samples, loss_sum / samples if samples else float("nan"))
    check_trained(total, trained, t, i, sgd.lr)
    kept = ClientState(trained, mask, mask, client.density)
    if rate > 0:
        last = candidate_mask(trained, mask, rate)
        if mask_distance(first, last) > config.subfedavg_dist_threshold:
            pruned = personal_weights(trained, last)
            load_weights(ctx.model, pruned)
            if score(ctx.model, data, config.eval_batch_size, ctx.params.task) >= config.subfedavg_acc_threshold:
                kept = ClientState(pruned, last, last, client.density)
    return kept, total.mean_loss


SUB_FEDAVG = SubFedAvg(
    name="sub-fedavg", label="Sub-FedAvg", acc_before_is="personal sparse model, as the client last trained it",
    acc_after_is=None, headline="before", sparse=True,
    uses=frozenset({"fedavg_clients", "density", "subfedavg_prune_rate", "subfedavg_dist_threshold",
                    "subfedavg_acc_threshold"}), keeps_server=True,
)  # fmt: skip
