"""The server cannot be starved by one host: real gRPC on 127.0.0.1, the attacker on 127.0.0.2.

The attacks are raw HTTP/2 (``tests/net/grpc_attack.py``) from another loopback address, so the
server sees another host than the honest client on 127.0.0.1; each test measures the honest Hello
and pull latency before and during the attack, side by side, and asserts the bounds.
"""

from __future__ import annotations

import math
import resource
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from edge_node.errors import ConfigError
from edge_node.net import PeerAddress, PeerServer, ServerLimits, hello, pull_model
from edge_node.net.server import FD_RESERVE, check_fd_limit
from edge_node.wire.messages import PEER_SERVICE_NAME, GetModelRequest

_REPO = Path(__file__).resolve().parents[2]
if str(_REPO) not in sys.path:
    sys.path.insert(0, str(_REPO))

from tests.net.grpc_attack import IdleConnections, UnreadStreams, WithheldCalls  # noqa: E402
from tests.net.hostile import connections_to  # noqa: E402
from tests.net.test_grpc_peer import FLEET, SPEC, serving, snapshot  # noqa: E402

ATTACKER = "127.0.0.2"
GET_MODEL = f"/{PEER_SERVICE_NAME}/GetModel"
HELLO = f"/{PEER_SERVICE_NAME}/Hello"
PLAIN = {"insecure": True}


def _latency_ms(action: Callable[[], object], n: int = 10) -> float:
    """Median wall time of ``action`` over ``n`` runs, in ms."""
    times = []
    for _ in range(n):
        start = time.perf_counter()
        action()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def _honest(port: int) -> tuple[Callable[[], object], Callable[[], object]]:
    address = PeerAddress("srv", "127.0.0.1", port)

    def do_hello() -> object:
        return hello(address, node_id="honest", fleet_id=FLEET, timeout_s=5, **PLAIN)

    def do_pull() -> object:
        return pull_model(address, SPEC, FLEET, node_id="honest", deadline_s=5, **PLAIN)

    return do_hello, do_pull


def _published(round: int = 3) -> PeerServer:
    peer = PeerServer(SPEC, node_id="srv", fleet_id=FLEET)
    peer.publish(snapshot("srv", 1, round=round))
    return peer


def _kept_latency(quiet: tuple[float, float], busy: tuple[float, float]) -> bool:
    """Honest Hello and pull (ms) during an attack within 5x their quiet latency (floors for a loaded machine)."""
    return busy[0] < max(50.0, 5 * quiet[0]) and busy[1] < max(100.0, 5 * quiet[1])


@pytest.mark.parametrize("method", [GET_MODEL, HELLO])
def test_withheld_requests_from_one_host_cannot_starve_honest_calls(method: str) -> None:
    """The probe sent 8 (then 16) such calls from one connection; here 64 over 8 connections."""
    limits = ServerLimits(max_calls_per_host=4, request_timeout_s=2.0)
    peer = _published()
    with serving(peer, limits=limits) as port:
        do_hello, do_pull = _honest(port)
        quiet = _latency_ms(do_hello), _latency_ms(do_pull)
        with WithheldCalls(ATTACKER, port, method, calls=64, connections=8) as attack:
            time.sleep(0.3)  # every call has arrived
            held = peer.open_calls().get(f"ipv4:{ATTACKER}", 0)
            busy = _latency_ms(do_hello), _latency_ms(do_pull)
            time.sleep(limits.request_timeout_s + 0.5)
            after_timeout = peer.open_calls().get(f"ipv4:{ATTACKER}", 0)
            ended = attack.ended()
        refusals = peer.refusals()
    print(
        f"\n{method}: honest Hello {quiet[0]:.1f} -> {busy[0]:.1f} ms, pull {quiet[1]:.1f} -> {busy[1]:.1f}"
        f" ms; attacker held {held} calls, {after_timeout} after {limits.request_timeout_s:g} s; ended {ended};"
        f" refusals {refusals}"
    )
    assert attack.sent == 64
    assert held <= limits.max_calls_per_host  # its share, whatever it sends
    assert after_timeout == 0  # calls without a request are ended in bounded time
    assert refusals["host-busy"] == 64 - limits.max_calls_per_host
    assert refusals["slow-request"] == limits.max_calls_per_host
    assert ended == 64  # every withheld call was ended by the server, none left hanging
    assert _kept_latency(quiet, busy)


def _raise_fd_limit(needed: int) -> tuple[int, int]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < needed:
        pytest.skip(f"needs a hard descriptor limit of {needed} for the attacker's sockets (have {hard})")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, needed), hard))
    return soft, hard


def _first_success_s(action: Callable[[], object], within_s: float) -> float:
    """Seconds until ``action`` first succeeds (polled every 20 ms); inf if not within ``within_s``."""
    start = time.monotonic()
    while time.monotonic() - start < within_s:
        try:
            action()
            return time.monotonic() - start
        except Exception:
            time.sleep(0.02)
    return math.inf


def test_idle_connections_cannot_exhaust_descriptors_and_are_closed_in_bounded_time() -> None:
    """The probe's 1,100 idle TCP connections against a 1,024 fd limit: the server keeps at most
    ``max_connections`` (grpc core closes the rest at accept) and closes each after
    ``handshake_timeout_s``; the node's descriptors stay bounded and the server serves afterwards."""
    soft, hard = _raise_fd_limit(4096)
    limits = ServerLimits(max_connections=200, handshake_timeout_s=2.0, max_connections_per_host=200)
    try:
        with serving(_published(), limits=limits) as port:
            do_hello, _ = _honest(port)
            with IdleConnections(ATTACKER, port, 1100) as idle:
                time.sleep(0.5)
                held = idle.open_count()
                time.sleep(limits.handshake_timeout_s + 1.0)
                left = idle.open_count()
                recovered_ms = _latency_ms(do_hello, n=3)
            print(f"\n1,100 idle connections: {held} held by the server, {left} after the handshake timeout")
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert held <= limits.max_connections + 8  # + the listen backlog's in-flight accepts
    assert left == 0
    assert recovered_ms < 1000


def test_one_host_holding_idle_connections_leaves_room_for_honest_calls() -> None:
    """1,100 idle connections from one host, held (the handshake timeout is long): the guard shuts
    that host's connections beyond ``max_connections_per_host`` down within a period or two, and
    honest Hellos and pulls from another host keep their latency while the attacker holds its cap."""
    soft, hard = _raise_fd_limit(4096)
    limits = ServerLimits(max_connections=200, max_connections_per_host=16, handshake_timeout_s=60.0)
    peer = _published()
    try:
        with serving(peer, limits=limits) as port:
            do_hello, do_pull = _honest(port)
            quiet = _latency_ms(do_hello), _latency_ms(do_pull)
            honest_held = connections_to(port)  # the honest pulls' kept channel: one of max_connections
            with IdleConnections(ATTACKER, port, 1100) as idle:
                first_s = _first_success_s(do_hello, 10.0)
                busy = _latency_ms(do_hello), _latency_ms(do_pull)
                held = idle.open_count()
            refusals = peer.refusals()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    print(
        f"\n1,100 idle connections from one host: first honest Hello {first_s:.2f} s into the attack; honest Hello"
        f" {quiet[0]:.1f} -> {busy[0]:.1f} ms, pull {quiet[1]:.1f} -> {busy[1]:.1f} ms; attacker holds"
        f" {held}; refusals {refusals}"
    )
    assert held <= limits.max_connections_per_host
    assert honest_held == 1
    assert refusals["host-connections"] >= limits.max_connections - limits.max_connections_per_host - honest_held
    assert first_s < 3.0  # a sweep every 0.2 s; generous for a loaded 2-core machine
    assert _kept_latency(quiet, busy)


def test_unread_model_streams_are_ended_at_the_connection_age() -> None:
    """A caller that asks for a model and never reads holds its slots only until its connection's
    age plus grace (grpc core closes the connection, ending its streams); honest calls go on meanwhile."""
    limits = ServerLimits(max_connection_age_s=1.0, connection_age_grace_s=1.0)
    request = GetModelRequest(protocol_version="1.0", node_id="reader", fleet_id=FLEET, arch_id=SPEC.arch_id)
    peer = _published()
    with serving(peer, limits=limits) as port:
        do_hello, do_pull = _honest(port)
        quiet = _latency_ms(do_hello), _latency_ms(do_pull)
        start = time.monotonic()
        with UnreadStreams(ATTACKER, port, request.SerializeToString(), calls=2) as attack:
            time.sleep(0.3)
            held = peer.open_calls().get(f"ipv4:{ATTACKER}", 0)
            busy = _latency_ms(do_hello, n=5), _latency_ms(do_pull, n=5)
            bound_s = 1.1 * limits.max_connection_age_s + limits.connection_age_grace_s  # grpc jitters the age 10 %

            # The caller sees its streams end a moment before the server's handlers unwind and give the
            # slots back (a run saw both ended and both still held): the slots are the claim, so wait for both.
            def released() -> bool:
                return attack.ended() == attack.sent and peer.open_calls().get(f"ipv4:{ATTACKER}", 0) == 0

            while not released() and time.monotonic() - start < bound_s + 5:
                time.sleep(0.05)
            ended_s = time.monotonic() - start
            ended, left = attack.ended(), peer.open_calls().get(f"ipv4:{ATTACKER}", 0)
        unfinished = peer.unfinished_streams()
    print(
        f"\nunread streams: attacker held {held} calls, ended {ended} of {attack.sent} and released {held - left} after"
        f" {ended_s:.2f} s"
        f" (bound {bound_s:.1f} s); honest Hello {quiet[0]:.1f} -> {busy[0]:.1f} ms, pull {quiet[1]:.1f} ->"
        f" {busy[1]:.1f} ms; unfinished streams {unfinished}"
    )
    assert held == 2  # the streams were open, their writes held by flow control
    assert ended == 2 and left == 0
    assert ended_s < bound_s + 1.5  # the loop's slack on a loaded machine
    assert unfinished == 2
    assert _kept_latency(quiet, busy)


def test_the_fd_limit_is_raised_to_the_hard_limit_and_refused_when_too_low() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(1024, hard), hard))
        if hard == resource.RLIM_INFINITY or hard >= 512 + FD_RESERVE:
            assert check_fd_limit(ServerLimits(max_connections=512)) == hard
            assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == hard
        if hard != resource.RLIM_INFINITY:
            with pytest.raises(ConfigError, match=r"file-descriptor limit is \d+ .*server_max_connections="):
                check_fd_limit(ServerLimits(max_connections=hard))
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_server_limits_are_checked_once_quoting_the_value() -> None:
    with pytest.raises(ValueError, match="request_timeout_s=0 must be"):
        ServerLimits(request_timeout_s=0)
    with pytest.raises(ValueError, match="max_calls_per_host=0 must be"):
        ServerLimits(max_calls_per_host=0)


def test_a_lockstep_wait_outlives_several_connection_ages() -> None:
    """An honest pull that polls for a round not published yet keeps polling across the server's
    GOAWAYs (connection age 0.5 s + grace 0.5 s) and gets the round when it comes, 3 s later."""
    limits = ServerLimits(max_connection_age_s=0.5, connection_age_grace_s=0.5)
    peer = _published(round=1)
    publisher = threading.Timer(3.0, lambda: peer.publish(snapshot("srv", 2, round=2)))
    with serving(peer, limits=limits) as port:
        try:
            publisher.start()
            start = time.monotonic()
            model = pull_model(PeerAddress("srv", "127.0.0.1", port), SPEC, FLEET, round=2, deadline_s=15, **PLAIN)
            waited_s = time.monotonic() - start
        finally:
            publisher.cancel()
            publisher.join()
    assert model.header.round == 2
    assert 2.5 < waited_s < 15
