"""Local: every client trains only on its own data and sends nothing (the paper's lower bound)."""

from __future__ import annotations

from dataclasses import dataclass

from edge_node.sim.methods.base import GRAPHED, Method, RoundResult, RunState, SimContext


@dataclass(frozen=True)
class Local(Method):
    """Each client's dense model, trained for E local epochs a round; no communication."""

    def round(self, ctx: SimContext, t: int, state: RunState) -> tuple[RunState, RoundResult]:
        clients, result = ctx.train_dense(t, state.clients)
        return RunState(clients, state.extra), result


LOCAL = Local(
    name="local", label="Local", acc_before_is="before this round's local training",
    acc_after_is="after local training", uses=GRAPHED, shardable=True, keeps_norm_stats=True,
)  # fmt: skip
