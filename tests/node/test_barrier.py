"""Waiting for peers to publish a round, against real peer servers on loopback: who is waited for, how long."""

from __future__ import annotations

import threading
import time

import pytest

from edge_node.net import PeerAddress, ServerLimits
from edge_node.node.barrier import wait_for_round
from edge_node.node.parallel import Stopped
from edge_node.node.peers import Caller
from tests.net.hostile import HostileServer
from tests.node.peer_servers import FLEET, ServedPeer, served_peer

CALLER = Caller("me", FLEET, None, True)


def address(peer: ServedPeer) -> PeerAddress:
    return PeerAddress(node_id=peer.node_id, host="127.0.0.1", port=peer.port)


def wait(peers: list[PeerAddress] | None = None, t: int = 2, **settings: object) -> tuple[list[str], float]:
    started = time.monotonic()
    settings = {"budget_s": 30.0, "stop": threading.Event(), "beat": lambda: None, "gone_after_s": 1.0, **settings}
    listed = settings.pop("listed", None) or (lambda: peers)
    behind = wait_for_round(CALLER, listed, t, **settings)  # type: ignore[arg-type]
    return behind, time.monotonic() - started


def later(seconds: float, action: object) -> threading.Timer:
    timer = threading.Timer(seconds, action)  # type: ignore[arg-type]
    timer.start()
    return timer


def test_a_peer_behind_is_waited_for_until_it_publishes_the_round():
    with served_peer("slow", 1, client=1) as slow, served_peer("done", 2, client=2) as done:
        later(1.0, lambda: slow.publish(2))
        behind, took = wait([address(slow), address(done)])
    assert behind == [] and 1.0 <= took < 3.0, took


def test_a_peer_that_stops_answering_is_gone_after_gone_after_s_and_not_before():
    with served_peer("killed", 1, client=1) as killed:
        later(0.5, killed.stop)
        behind, took = wait([address(killed)], gone_after_s=1.5)
    assert behind == [] and 2.0 <= took < 4.5, took  # 0.5 s answering, then 1.5 s of silence
    with served_peer("killed", 1, client=1) as killed:
        later(0.5, killed.stop)
        behind, took = wait([address(killed)], gone_after_s=0.0)  # the lock-step barrier's last one
    assert behind == [] and 0.5 <= took < 2.0, took


def test_the_budget_bounds_the_wait_for_a_peer_that_never_gets_there():
    with served_peer("stuck", 1, client=1) as stuck:
        behind, took = wait([address(stuck)], budget_s=1.0)
    assert behind == ["stuck"] and 1.0 <= took < 3.0, took
    behind, took = wait([PeerAddress("nobody", "127.0.0.1", 1)], budget_s=1.0, gone_after_s=None)
    assert behind == ["nobody"] and 1.0 <= took < 3.0, took  # the lock-step barrier before a round


def test_a_peer_over_its_host_rate_is_asked_again_not_taken_as_done():
    """A busy refusal (RESOURCE_EXHAUSTED, here ``host-rate``: 1 Hello a second) is no answer about the round."""
    with served_peer("rated", 1, client=1, limits=ServerLimits(host_rate=1.0, host_burst_s=1.0)) as rated:
        later(1.5, lambda: rated.publish(2))
        behind, took = wait([address(rated)], gone_after_s=10.0)
        refused = rated.state.refusals().get("host-rate", 0)
    assert behind == [] and 1.5 <= took < 5.0 and refused > 0, (took, refused)


def test_a_peer_that_answers_without_a_hello_is_not_waited_for():
    with HostileServer(get_model=lambda request, context: iter(())) as server:  # Hello: UNIMPLEMENTED
        behind, took = wait([PeerAddress("rogue", "127.0.0.1", server.port)], gone_after_s=10.0)
    assert behind == [] and took < 2.0, took


def test_the_peers_are_asked_anew_each_poll_so_one_that_left_discovery_is_not_waited_for():
    with served_peer("leaving", 1, client=1) as leaving:
        listed = [address(leaving)]
        later(0.5, listed.clear)  # discovery heard its goodbye
        behind, took = wait(listed=lambda: list(listed))
    assert behind == [] and 0.5 <= took < 2.0, took


def test_a_stop_ends_the_wait_at_once():
    stop = threading.Event()
    with served_peer("stuck", 1, client=1) as stuck:
        later(0.3, stop.set)
        started = time.monotonic()
        with pytest.raises(Stopped):
            wait([address(stuck)], stop=stop)
    assert time.monotonic() - started < 1.5
