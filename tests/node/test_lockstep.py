"""The lock-step fleet's pieces without a network: membership, the seeded neighbours, a barrier that stops."""

from __future__ import annotations

import threading
import time

import pytest

from edge_node.algorithm.topology import round_neighbours
from edge_node.errors import ConfigError
from edge_node.node.lockstep import Lockstep
from edge_node.node.parallel import Stopped
from edge_node.node.peers import Caller

PEERS = [f"node{i}@127.0.0.1:{1 + i}" for i in range(5)]  # ports nobody listens on


def _lockstep(node_id: str, client_index: int, stop: threading.Event | None = None, **more) -> Lockstep:
    return Lockstep(
        Caller(node_id, "lab", None, True), PEERS, client_index=client_index, seed=3, neighbours=2,
        round_budget_s=more.pop("round_budget_s", 60.0), stop=stop or threading.Event(), beat=lambda: None,
    )  # fmt: skip


def test_a_node_must_be_listed_at_its_client_index():
    with pytest.raises(ConfigError, match="peers entry 1 .* is 'node1', not this node 'node2'"):
        _lockstep("node2", 1)


def test_neighbours_are_the_simulations_seeded_ones():
    lockstep = _lockstep("node3", 3)
    for t in range(4):
        want = round_neighbours("random", 5, 2, 3, t)[3]
        assert [a.node_id for a in lockstep.neighbours(t)] == [f"node{j}" for j in want]
        assert all(a.host == "127.0.0.1" and a.port == j + 1 for a, j in zip(lockstep.neighbours(t), want, strict=True))


def test_the_barrier_goes_on_after_its_budget_and_stops_when_told():
    started = time.monotonic()
    _lockstep("node0", 0, round_budget_s=0.3).wait_for(1)  # nobody answers: logged, then the round goes on
    assert time.monotonic() - started < 15
    stop = threading.Event()
    stop.set()
    with pytest.raises(Stopped):
        _lockstep("node0", 0, stop).wait_for(1)
