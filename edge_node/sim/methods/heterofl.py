"""HeteroFL (Diao et al., ICLR 2021): a server samples clients, each trains the global model's narrow prefix at its
tier's width, the server averages every coordinate over the clients holding it
(:func:`edge_node.algorithm.heterofl.aggregate_nested`).

The server-based anchor of width tiers (``--tier-mode width``, whose widths it shares): each client is judged on
the new global model at its own width, the model it would run.
"""

from __future__ import annotations

from dataclasses import dataclass

from edge_node.algorithm import load_weights
from edge_node.algorithm.dense import dense_state
from edge_node.algorithm.dispfl import narrow_state, train_local
from edge_node.algorithm.fedavg import sample_clients
from edge_node.algorithm.heterofl import aggregate_nested
from edge_node.algorithm.width import narrow
from edge_node.sim.methods.base import RoundResult, RunState, SimContext, score
from edge_node.sim.methods.fedavg import FedAvg


@dataclass(frozen=True)
class HeteroFL(FedAvg):
    """FedAvg's server and sampling, with nested widths: the server's global model (full width) is the state's
    one entry, as FedAvg's (its state densities and initial state)."""

    def round(self, ctx: SimContext, t: int, state: RunState) -> tuple[RunState, RoundResult]:
        config = ctx.config
        (server,) = state.clients
        chosen = sample_clients(config.clients, config.fedavg_clients, config.seed, t)
        trained_models, losses, flops, sizes = [], [], [], []
        with ctx.phase("train"):
            for i in ctx.client_bar(t, len(chosen), chosen):
                within = ctx.within(i)
                start = server if within is None else narrow_state(server, within)
                with ctx.stopping_on_divergence(t):
                    trained = train_local(start, ctx.model_of(i), ctx.hooks(i).batches, t, ctx.params,
                                          seed=config.seed, client=i)  # fmt: skip
                trained_models.append(trained.state.weights)
                losses.append(trained.stats.mean_loss)
                sizes.append(ctx.dense_of(i))
                flops.append(ctx.training_flops(ctx.dense_of(i), ctx.data[i].num_train, False, ctx.dense_of(i)))
        with ctx.phase("aggregate"):
            server = dense_state(aggregate_nested(server.weights, trained_models))
        acc_before = []
        with ctx.phase("train"):
            for i in range(config.clients):  # the new global model at each client's width
                within = ctx.within(i)
                model = ctx.model_of(i)
                load_weights(model, server.weights if within is None else narrow(server.weights, within))
                acc_before.append(score(model, ctx.data[i], config.eval_batch_size, ctx.params.task))
        received, sent, paper_mb, server_traffic = ctx.server_traffic(t, chosen, sizes, sizes)  # its prefix down and up
        result = RoundResult(acc_before, None, losses, flops, received, sent, paper_mb, server=server_traffic)
        return RunState([server], state.extra), result


HETEROFL = HeteroFL(
    name="heterofl", label="HeteroFL", acc_before_is="global model at the client's width, after the server's average",
    acc_after_is=None, headline="before", width_tiers=True, uses=frozenset({"fedavg_clients", "tier_mode"}),
)  # fmt: skip
