"""The lock-step fleet: real daemons running the synchronous algorithm of docs/ALGORITHM.md, round by round.

The fleet is the static ``peers`` list in client-index order (this node included). Round ``t`` starts
once every other node has published snapshot ``t`` (a barrier of Hellos, bounded by ``round_budget_s``),
and pulls exactly the neighbours the simulation's seeded topology gives this client in round ``t``: so
the fleet computes what ``edge-node simulate`` computes with the same seed and settings.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from edge_node.algorithm.topology import round_neighbours
from edge_node.errors import ConfigError
from edge_node.net import PeerAddress
from edge_node.net.discovery import parse_peers
from edge_node.node.barrier import wait_for_round
from edge_node.node.peers import Caller

_LOGGER = logging.getLogger(__name__)


class Lockstep:
    """This node's view of a lock-step fleet: its seeded neighbours per round and the round barrier."""

    def __init__(
        self,
        caller: Caller,
        peers: list[str],
        *,
        client_index: int,
        seed: int,
        neighbours: int,
        round_budget_s: float,
        stop: threading.Event,
        beat: Callable[[], None],
    ) -> None:
        """ConfigError when ``peers`` (checked by the config: ``ID@HOST:PORT`` each) does not list this node
        at ``client_index``."""
        self.caller = caller
        self.fleet = [PeerAddress(node_id=p.node_id or "", host=p.host, port=p.port) for p in parse_peers(peers)]
        self.client_index = client_index
        self.seed = seed
        self.k = min(neighbours, len(self.fleet) - 1)
        self.round_budget_s = round_budget_s
        self.stop = stop
        self.beat = beat
        listed = self.fleet[client_index].node_id
        if listed != caller.node_id:
            raise ConfigError(
                f"lockstep: peers entry {client_index} (this node's client index) is {listed!r}, "
                f"not this node {caller.node_id!r}"
            )

    def neighbours(self, t: int) -> list[PeerAddress]:
        """Whom this node pulls in round ``t``: the simulation's seeded random topology."""
        lists = round_neighbours("random", len(self.fleet), self.k, self.seed, t)
        return [self.fleet[j] for j in lists[self.client_index]]

    def wait_for(self, t: int, gone_is_done: bool = False) -> None:
        """Wait until every other node has published snapshot ``t``; after ``round_budget_s`` go on (logged).

        ``gone_is_done``: a peer that does not answer counts as done (the barrier after the last round: a
        peer leaves only once every node has published its last round, so one that left needs nothing).

        Raises:
            Stopped: the daemon was told to stop while waiting.
        """
        others = [a for a in self.fleet if a.node_id != self.caller.node_id]
        behind = wait_for_round(
            self.caller, lambda: others, t, budget_s=self.round_budget_s, stop=self.stop, beat=self.beat,
            gone_after_s=0.0 if gone_is_done else None,
        )  # fmt: skip
        if behind:
            _LOGGER.warning("lockstep: %s not at round %d after %.0f s; going on", behind, t, self.round_budget_s)
