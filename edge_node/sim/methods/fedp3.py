"""FedP3 (Yi et al., ICLR 2024): a server; each client trains its owned layers dense and the rest pruned, and
uploads only its owned layers and the final layer (edge_node.algorithm.fedp3); with ``privacy = "ldp"``,
LDP-FedP3: every client trains with DP-SGD at the noise its (epsilon, delta) budget allows over the run.

The state's entries are the clients' personal models (their final layer is their own) followed by the
server's model. All clients take part in every round, as in the authors' code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from edge_node.algorithm import nnz_per_tensor
from edge_node.algorithm.dense import dense_state
from edge_node.algorithm.dispfl import ClientState, evaluate_and_train
from edge_node.algorithm.dp import DPConfig, check_budget, noise_multiplier_for, spent_epsilon
from edge_node.algorithm.fedp3 import layer_average, layer_groups, owned_layers, server_to_client, uploaded_names
from edge_node.errors import ConfigError
from edge_node.sim.methods.base import (
    GRAPHED,
    PAPER_BYTES_PER_VALUE,
    SERVER_ID,
    Method,
    RoundResult,
    RunState,
    SimContext,
)

if TYPE_CHECKING:
    from edge_node.sim.config import SimConfig

FEDP3_SETTINGS = frozenset({"fedp3_layers", "fedp3_keep", "fedp3_aggregation"})
PRIVACY_SETTINGS = frozenset({"privacy", "epsilon", "delta", "dp_clip"})


@dataclass(frozen=True)
class FedP3(Method):
    """FedP3's round over all clients, LDP-FedP3's when the config asks for privacy."""

    def check(self, config: SimConfig) -> None:
        if config.privacy == "dp-sgd":
            raise ConfigError("fedp3's privacy in the simulation is 'ldp' (dp-sgd is edge-node start's)")
        if config.privacy == "ldp":
            check_budget(config.epsilon, config.delta)

    def state_densities(self, ctx: SimContext) -> list[float]:
        return [1.0] * (ctx.config.clients + 1)

    def initial_state(self, ctx: SimContext) -> RunState:
        extra: dict[str, Any] = {}
        if ctx.config.privacy == "ldp":
            extra["dp_noise"] = [_noise_multiplier(ctx, i) for i in range(ctx.config.clients)]
            extra["dp_steps"] = [0] * ctx.config.clients
        return RunState([dense_state(ctx.init_weights) for _ in range(ctx.config.clients + 1)], extra)

    def round(self, ctx: SimContext, t: int, state: RunState) -> tuple[RunState, RoundResult]:
        config = ctx.config
        n = config.clients
        personal, server = list(state.clients[:n]), state.clients[n]
        groups = layer_groups(list(server.weights))
        hidden = len(groups) - 1
        private = config.privacy == "ldp"
        steps = list(state.extra.get("dp_steps", [0] * n))
        uploads, counts, acc_before, acc_after, losses, flops = [], [], [], [], [], []
        received, sent, paper_mb = [0] * n, [0] * n, [0.0] * n
        with ctx.phase("train"):
            for i in ctx.client_bar(t, n):
                owned = owned_layers(config.fedp3_layers, i, n, hidden, seed=config.seed, round_index=t)
                weights, mask = server_to_client(server.weights, personal[i].weights, groups, owned, config.fedp3_keep)
                params = ctx.params
                if private:
                    params = replace(params, dp=DPConfig(config.dp_clip, state.extra["dp_noise"][i]))
                with ctx.stopping_on_divergence(t):
                    done = evaluate_and_train(
                        ClientState(weights, mask, mask, 1.0), ctx.model, t, params, seed=config.seed, client=i,
                        hooks=ctx.hooks(i),
                    )  # fmt: skip
                steps[i] += done.trained.stats.steps
                personal[i] = done.kept
                names = uploaded_names(groups, owned)
                uploads.append({name: done.kept.weights[name] for name in names})
                counts.append(len(owned) + 1)
                acc_before.append(done.acc_before)
                acc_after.append(done.acc_after)
                losses.append(done.trained.stats.mean_loss)
                nnz = nnz_per_tensor(mask)
                flops.append(ctx.training_flops(nnz, ctx.data[i].num_train, False))
                down = {name: (0 if name in groups[-1] else count) for name, count in nnz.items()}
                up = {name: (ctx.dense[name] if name in names else 0) for name in ctx.dense}
                received[i] = ctx.model_bytes(down, SERVER_ID, t)
                sent[i] = ctx.model_bytes(up, f"client-{i}", t)
                paper_mb[i] = PAPER_BYTES_PER_VALUE * sum(up.values()) / 1e6
        with ctx.phase("aggregate"):
            server = dense_state(layer_average(server.weights, uploads, counts, config.fedp3_aggregation))
        extra = dict(state.extra)
        result = RoundResult(
            acc_before, acc_after, losses, flops, received, sent, paper_mb,
            server=(sum(sent), sum(received), sum(paper_mb)), fields={"privacy": config.privacy},
        )  # fmt: skip
        if private:
            extra["dp_steps"] = steps
            result.fields.update(_privacy_fields(ctx, extra))
        return RunState([*personal, server], extra), result


def _sample_rate(ctx: SimContext, i: int) -> float:
    return min(1.0, ctx.params.batch_size / max(ctx.data[i].num_train, 1))


def _noise_multiplier(ctx: SimContext, i: int) -> float:
    """Client ``i``'s z: the run's whole budget spent by its last round (E * ceil(n_i / B) steps a round)."""
    config = ctx.config
    assert config.epsilon is not None  # check() refused a private run without one
    per_round = ctx.params.epochs * math.ceil(ctx.data[i].num_train / ctx.params.batch_size)
    return noise_multiplier_for(config.epsilon, config.delta, _sample_rate(ctx, i), config.rounds * per_round)


def _privacy_fields(ctx: SimContext, extra: dict[str, Any]) -> dict[str, Any]:
    """The budget spent so far: the largest epsilon over the clients (each one's own data), at ``delta``."""
    spent = [
        spent_epsilon(z, _sample_rate(ctx, i), s, ctx.config.delta)
        for i, (z, s) in enumerate(zip(extra["dp_noise"], extra["dp_steps"], strict=True))
    ]
    return {
        "dp_epsilon_spent": max(spent),
        "dp_epsilon_target": ctx.config.epsilon,
        "dp_delta": ctx.config.delta,
        "dp_noise_multiplier": min(extra["dp_noise"]),
    }


FEDP3 = FedP3(
    name="fedp3", label="FedP3", acc_before_is="received model (owned layers dense, others pruned) before training",
    acc_after_is="after local training (the personal model)", headline="after",
    uses=FEDP3_SETTINGS | PRIVACY_SETTINGS | GRAPHED,
)  # fmt: skip
