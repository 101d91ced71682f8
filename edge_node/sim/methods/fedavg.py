"""FedAvg and FedAvg-FT: a server samples clients, they train its global model, it averages what they send.

FedAvg is judged on the new global model on every client's test data, FedAvg-FT on that model fine-tuned
locally for E epochs by each client (discarded after: the trajectory is FedAvg's).
"""

from __future__ import annotations

from dataclasses import dataclass

from edge_node.algorithm import load_weights, train_masked
from edge_node.algorithm.dense import dense_state
from edge_node.algorithm.dispfl import ClientState, train_local
from edge_node.algorithm.fedavg import sample_clients, weighted_average
from edge_node.seeding import Stream, torch_generator
from edge_node.sim.methods.base import Method, RoundResult, RunState, SimContext, score


@dataclass(frozen=True)
class FedAvg(Method):
    """The server's global model is the state's one entry; ``fine_tune`` adds FedAvg-FT's evaluation."""

    fine_tune: bool = False

    def state_densities(self, ctx: SimContext) -> list[float]:
        return [1.0]

    def initial_state(self, ctx: SimContext) -> RunState:
        return RunState([dense_state(ctx.init_weights)])

    def round(self, ctx: SimContext, t: int, state: RunState) -> tuple[RunState, RoundResult]:
        config = ctx.config
        n = config.clients
        (server,) = state.clients
        chosen = sample_clients(n, config.fedavg_clients, config.seed, t)
        trained_models, counts, losses, flops = [], [], [], []
        with ctx.phase("train"):
            for i in ctx.client_bar(t, len(chosen), chosen):
                with ctx.stopping_on_divergence(t):
                    trained = train_local(server, ctx.model, ctx.hooks(i).batches, t, ctx.params, seed=config.seed,
                                          client=i)  # fmt: skip
                trained_models.append(trained.state.weights)
                counts.append(ctx.data[i].num_train)
                losses.append(trained.stats.mean_loss)
                flops.append(ctx.training_flops(ctx.dense, ctx.data[i].num_train, False))
        with ctx.phase("aggregate"):
            server = dense_state(weighted_average(trained_models, counts))
        acc_before: list[float] = []
        acc_after: list[float] | None = [] if self.fine_tune else None
        with ctx.phase("train"):
            for i in range(n):  # evaluation of the new global model (and, for -ft, its local fine-tune)
                load_weights(ctx.model, server.weights)
                acc_before.append(score(ctx.model, ctx.data[i], config.eval_batch_size, ctx.params.task))
                if acc_after is not None:
                    acc_after.append(_fine_tuned_accuracy(ctx, t, i, server))
        dense = [dict(ctx.dense)] * len(chosen)  # the global model down, each trained one up
        received, sent, paper_mb, server_traffic = ctx.server_traffic(t, chosen, dense, dense)
        result = RoundResult(acc_before, acc_after, losses, flops, received, sent, paper_mb, server=server_traffic)
        return RunState([server], state.extra), result


def _fine_tuned_accuracy(ctx: SimContext, t: int, i: int, server: ClientState) -> float:
    """Client ``i``'s accuracy after fine-tuning ``server``'s model for E local epochs (discarded after)."""
    data, params = ctx.data[i], ctx.params
    generator = torch_generator(ctx.config.seed, Stream.FINETUNE, i, t)
    load_weights(ctx.model, server.weights)
    batches = ctx.train_batches(i, params.epochs, generator)
    train_masked(ctx.model, server.train_mask, batches, params.sgd(t))
    return score(ctx.model, data, ctx.config.eval_batch_size, ctx.params.task)


_GLOBAL = "global model after the server's average"
FEDAVG = FedAvg(
    name="fedavg", label="FedAvg", acc_before_is=_GLOBAL, acc_after_is=None, headline="before",
    uses=frozenset({"fedavg_clients"}),
)  # fmt: skip
FEDAVG_FT = FedAvg(
    name="fedavg-ft", label="FedAvg-FT", acc_before_is=_GLOBAL,
    acc_after_is="global model fine-tuned locally for E epochs", uses=frozenset({"fedavg_clients"}), fine_tune=True,
)  # fmt: skip
