"""FedSpa and FedSpa-RSM: a server's dense model, every client's own sparse mask (:mod:`edge_node.algorithm.fedspa`).

Each round the server samples ``fedavg_clients`` clients (as FedAvg does); client ``k`` receives ``m_k * W``,
trains it for E epochs of masked SGD, and uploads its sparse update and its next mask (a raw bitmap in the
byte count); the server applies the mean update (Eq. 4). Clients not sampled keep their masks. Every client
is judged on its personal model ``m_k * W`` after the server's update, with the mask it holds then.

Masks start as the paper's Algorithms 2-3 start them: from the same seed for every client (one ERK mask,
``--mask-init``), each client's density its own in setting ii. FedSpa updates a trained client's mask by
magnitude drop and gradient regrowth at the cosine-annealed rate (``--prune-alpha``, planned over
``--planned-rounds``): the gradient rule always, as the paper's Algorithm 2 (``--regrow`` is DisPFL's).
FedSpa-RSM (Algorithm 3) never changes a mask.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from edge_node.algorithm import nnz_per_tensor
from edge_node.algorithm.dense import dense_state
from edge_node.algorithm.dispfl import ClientState, DisPFLParams, start, train_local, update_mask
from edge_node.algorithm.fedavg import sample_clients
from edge_node.algorithm.fedspa import apply_mean_update, personal_weights, sparse_update
from edge_node.algorithm.training import load_weights
from edge_node.sim.methods.base import Method, RoundResult, RunState, SimContext, score

if TYPE_CHECKING:
    from edge_node.sim.config import SimConfig

SAME_MASK_CLIENT = 0  # every client's initial mask is drawn from this client's mask stream (the same seed)


@dataclass(frozen=True)
class FedSpa(Method):
    """The server's dense model is ``RunState.server``; client ``k``'s entry holds ``m_k * W`` on its mask."""

    static_masks: bool = False  # RSM (Algorithm 3)

    def initial_state(self, ctx: SimContext) -> RunState:
        config = ctx.config
        masks = [start(ctx.init_weights, d, seed=config.seed, client=SAME_MASK_CLIENT, mask_init=config.mask_init)
                 .train_mask for d in ctx.densities]  # fmt: skip
        server = dense_state(ctx.init_weights)
        return RunState(_personal(server, masks, ctx.densities), {}, server)

    def prune_rate(self, config: SimConfig, params: DisPFLParams, t: int) -> float | None:
        return None if self.static_masks else params.prune_rate(t)

    def round(self, ctx: SimContext, t: int, state: RunState) -> tuple[RunState, RoundResult]:
        config = ctx.config
        assert state.server is not None
        params = replace(ctx.params, regrow="gradient")  # Algorithm 2 recovers weights by gradient
        chosen = sample_clients(config.clients, config.fedavg_clients, config.seed, t)
        masks = [c.train_mask for c in state.clients]
        updates, losses, flops, down = [], [], [], []
        with ctx.phase("train"):
            for i in ctx.client_bar(t, len(chosen), chosen):
                sent = state.clients[i]  # m_k * W on m_k
                with ctx.stopping_on_divergence(t):
                    trained = train_local(sent, ctx.model, ctx.hooks(i).batches, t, params, seed=config.seed,
                                          client=i)  # fmt: skip
                updates.append(sparse_update(sent.weights, trained.state.weights, sent.train_mask))
                if not self.static_masks:
                    masks[i] = update_mask(trained.state, t, params, seed=config.seed, client=i,
                                           gradients=trained.gradients).next_mask  # fmt: skip
                losses.append(trained.stats.mean_loss)
                nnz = nnz_per_tensor(sent.train_mask)
                down.append(nnz)
                flops.append(ctx.training_flops(nnz, ctx.data[i].num_train, not self.static_masks))
        with ctx.phase("aggregate"):
            server = dense_state(apply_mean_update(state.server.weights, updates))
            clients = _personal(server, masks, [c.density for c in state.clients])
        acc: list[float] = []
        with ctx.phase("train"):
            for i, client in enumerate(clients):
                load_weights(ctx.model, client.weights)
                acc.append(score(ctx.model, ctx.data[i], config.eval_batch_size, ctx.params.task))
        mask_bytes = 0 if self.static_masks else ctx.mask_bytes()  # the next mask, beside the update
        received, sent_bytes, paper_mb, server_traffic = ctx.server_traffic(t, chosen, down, down, mask_bytes)
        result = RoundResult(acc, None, losses, flops, received, sent_bytes, paper_mb, server=server_traffic)
        return RunState(clients, state.extra, server), result


def _personal(server: ClientState, masks: list[dict], densities: list[float]) -> list[ClientState]:
    """Every client's personal model ``m_k * W`` on its mask."""
    return [ClientState(personal_weights(server.weights, m), m, m, d) for m, d in zip(masks, densities, strict=True)]


_PERSONAL = "personal sparse model m_k * W after the server's update"
_FEDSPA_USES = frozenset({"fedavg_clients", "density", "mask_init"})
FEDSPA = FedSpa(
    name="fedspa", label="FedSpa", acc_before_is=_PERSONAL, acc_after_is=None, headline="before", sparse=True,
    uses=_FEDSPA_USES | {"prune_alpha", "planned_rounds"}, keeps_server=True,
)  # fmt: skip
FEDSPA_RSM = FedSpa(
    name="fedspa-rsm", label="FedSpa-RSM", acc_before_is=_PERSONAL, acc_after_is=None, headline="before",
    sparse=True, uses=_FEDSPA_USES, keeps_server=True, static_masks=True,
)  # fmt: skip
