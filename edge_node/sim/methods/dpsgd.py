"""D-PSGD and D-PSGD-FT: gossip averaging of dense models with the round's neighbours, then local SGD.

One trajectory, two headlines (:mod:`edge_node.algorithm.dpsgd`): D-PSGD is judged on the neighbourhood
average, D-PSGD-FT on that average fine-tuned by the round's E local epochs.
"""

from __future__ import annotations

from dataclasses import dataclass

from edge_node.algorithm.dispfl import published
from edge_node.algorithm.dpsgd import neighbourhood_average
from edge_node.sim.methods.base import GRAPHED, NEIGHBOURHOOD, Method, RoundResult, RunState, SimContext


@dataclass(frozen=True)
class DPSGD(Method):
    """Dense gossip: every client averages its neighbours' round-start models, then trains locally."""

    def round(self, ctx: SimContext, t: int, state: RunState) -> tuple[RunState, RoundResult]:
        start = state.clients
        nbrs = ctx.neighbours(t)
        traffic = ctx.traffic(t, start, nbrs)
        averaged = list(start)  # only this process's clients are trained (all of them without torchrun)
        with ctx.phase("aggregate"):
            for i in ctx.shard.clients(len(start)):
                averaged[i] = neighbourhood_average(start[i], [published(start[j]) for j in nbrs[i]])
        clients, result = ctx.train_dense(t, averaged)
        result.received, result.sent, result.paper_mb = traffic["received"], traffic["sent"], traffic["paper_mb"]
        return RunState(clients, state.extra), result


_AVERAGE = "neighbourhood average"
_FINE_TUNED = "neighbourhood average fine-tuned by the round's E local epochs"
DPSGD_PLAIN = DPSGD(
    name="dpsgd", label="D-PSGD", acc_before_is=_AVERAGE, acc_after_is=_FINE_TUNED, headline="before",
    uses=NEIGHBOURHOOD | GRAPHED, shardable=True, keeps_norm_stats=True,
)  # fmt: skip
DPSGD_FT = DPSGD(
    name="dpsgd-ft", label="D-PSGD-FT", acc_before_is=_AVERAGE, acc_after_is=_FINE_TUNED, uses=NEIGHBOURHOOD | GRAPHED,
    shardable=True, keeps_norm_stats=True,
)  # fmt: skip
