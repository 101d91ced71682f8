"""Calls per second per host: the token bucket and what a host is (pure), and a real server's refusals.

The server test floods Hello from 127.0.0.1 with a real gRPC client; the other host is a client on a
Unix socket of the same server (grpc names it ``unix:``, another host than ``ipv4:127.0.0.1``).
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import grpc
import pytest

from edge_node.net import PeerAddress, PeerServer, ServerLimits, create_server, hello, pull_model
from edge_node.net.admission import AdmissionGuard
from edge_node.net.host_rate import HostRates, host_key, refill
from edge_node.wire.messages import PEER_SERVICE_NAME, HelloReply, HelloRequest

_REPO = Path(__file__).resolve().parents[2]
if str(_REPO) not in sys.path:
    sys.path.insert(0, str(_REPO))

from tests.net.test_grpc_peer import FLEET, SPEC, snapshot  # noqa: E402

HELLO = f"/{PEER_SERVICE_NAME}/Hello"


@pytest.mark.parametrize(
    ("peer", "key"),
    [
        ("ipv4:10.0.0.2:5123", "ipv4:10.0.0.2"),
        ("ipv6:[2001:db8:1:2:aaaa::7]:5123", "ipv6:2001:db8:1:2::/64"),
        ("ipv6:%5B2001:db8:1:2:bbbb::9%5D:80", "ipv6:2001:db8:1:2::/64"),  # grpc may percent-encode
        ("ipv6:[::ffff:10.0.0.2]:1", "ipv4:10.0.0.2"),  # a dual-stack socket's IPv4 peer
        ("ipv6:[fe80::1%25eth0]:9", "ipv6:fe80::/64"),
        ("unix:/run/x.sock", "unix"),
        ("unknown", "unknown"),
    ],
)
def test_a_host_is_an_ipv4_address_or_an_ipv6_64(peer: str, key: str) -> None:
    assert host_key(peer) == key


def test_another_64_is_another_host() -> None:
    assert host_key("ipv6:[2001:db8:1:2::1]:1") != host_key("ipv6:[2001:db8:1:3::1]:1")


def test_a_bucket_allows_its_burst_then_its_rate() -> None:
    rates = HostRates(rate=2.0, burst=4.0)
    assert [rates.take("a", 0.0) for _ in range(5)] == [True] * 4 + [False]
    assert rates.take("b", 0.0)  # another host has its own bucket
    assert not rates.take("a", 0.4) and rates.take("a", 0.5)  # one token per 0.5 s
    assert refill(0.0, 100.0, 2.0, 4.0) == 4.0  # never beyond the burst
    assert [rates.take("a", 10.0) for _ in range(5)] == [True] * 4 + [False]


def test_the_buckets_kept_are_bounded_oldest_out() -> None:
    rates = HostRates(rate=1.0, burst=1.0, max_hosts=3)
    for i in range(1000):
        rates.take(f"h{i}", 0.0)
    assert len(rates) == 3
    assert not rates.take("h999", 0.0)  # kept: still empty
    assert rates.take("h0", 0.0)  # evicted long ago: a fresh bucket


def test_a_rate_of_zero_or_below_is_refused_quoting_it() -> None:
    for bad in (0, -1.0, float("nan")):
        with pytest.raises(ValueError, match=f"host_rate={bad!r} must be"):
            ServerLimits(host_rate=bad)
    with pytest.raises(ValueError, match="must be >= 1 call"):
        ServerLimits(host_rate=0.2, host_burst_s=2.0)
    with pytest.raises(ValueError, match="max_held_calls=65 must be <= max_concurrent_rpcs"):
        ServerLimits(max_held_calls=65)


def test_a_flood_from_one_host_is_refused_and_counted_and_another_host_is_served(tmp_path: Path) -> None:
    limits = ServerLimits(host_rate=2.0, host_burst_s=2.0, host_rate_hold_s=0.3)  # 4 at once, then 2 a second
    peer = PeerServer(SPEC, node_id="srv", fleet_id=FLEET)
    peer.publish(snapshot("srv", 1))
    server, port = create_server("127.0.0.1:0", peer, insecure=True, limits=limits)
    socket_path = tmp_path / "peer.sock"
    assert server.add_insecure_port(f"unix:{socket_path}") > 0
    server.start()
    request = HelloRequest(protocol_version="1.0", node_id="x", fleet_id=FLEET).SerializeToString()
    codes: list[grpc.StatusCode] = []
    lock = threading.Lock()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = channel.unary_unary(HELLO, request_serializer=bytes, response_deserializer=HelloReply.FromString)

            def flood() -> None:
                for _ in range(5):
                    try:
                        call(request, timeout=5)
                        code = grpc.StatusCode.OK
                    except grpc.RpcError as exc:
                        code = exc.code()
                    with lock:
                        codes.append(code)

            start = time.monotonic()
            threads = [threading.Thread(target=flood) for _ in range(4)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            seconds = time.monotonic() - start
        refused = codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED)
        assert codes.count(grpc.StatusCode.OK) + refused == 20
        # 4 at once, 2 a second after: at most 4 + 2 * seconds answered; each refusal held 0.3 s
        assert codes.count(grpc.StatusCode.OK) <= 4 + 2 * seconds + 1
        assert seconds >= 0.3 * refused / 4
        assert peer.refusals().get("host-rate") == refused >= 20 - 4 - 2 * seconds - 1
        # the flooding host is out of tokens; another host (a Unix socket) is answered at once, pulls included
        with grpc.insecure_channel(f"unix:{socket_path}") as other:
            started = time.monotonic()
            reply = other.unary_unary(HELLO, request_serializer=bytes, response_deserializer=HelloReply.FromString)(
                request, timeout=5
            )
            assert reply.node_id == "srv" and time.monotonic() - started < 0.3
        # and the flooder itself, once its bucket refills, is an honest peer again
        time.sleep(1.0)
        address = PeerAddress("srv", "127.0.0.1", port)
        assert hello(address, node_id="honest", fleet_id=FLEET, timeout_s=5, insecure=True).identity.round == 3
        assert pull_model(address, SPEC, FLEET, node_id="honest", deadline_s=5, insecure=True).header.round == 3
    finally:
        server.stop(None).wait(5)


class _Peer:
    """What the guard reads of a call: its peer string."""

    def __init__(self, peer: str) -> None:
        self._peer = peer

    def peer(self) -> str:
        return self._peer


def test_held_refusals_are_bounded_in_all_and_per_host_then_go_out_at_once() -> None:
    guard = AdmissionGuard(ServerLimits(host_rate=1.0, host_burst_s=1.0, max_held_calls=3, max_calls_per_host=2))
    a, b = _Peer("ipv4:10.0.0.1:1"), _Peer("ipv4:10.0.0.2:1")
    assert guard.over_rate(a) is None and guard.over_rate(b) is None  # each host's one token
    held = [guard.over_rate(a) for _ in range(3)]
    assert [h[1] if h else "" for h in held] == ["ipv4:10.0.0.1", "ipv4:10.0.0.1", None]  # 2 per host
    assert [h[1] if h else "" for h in (guard.over_rate(b), guard.over_rate(b))] == ["ipv4:10.0.0.2", None]  # 3 in all
    guard.unhold("ipv4:10.0.0.1")
    refusal = guard.over_rate(b)
    assert refusal is not None and refusal[1] == "ipv4:10.0.0.2"  # a slot came free
    assert refusal[0].code is grpc.StatusCode.RESOURCE_EXHAUSTED and "over its rate of 1 calls/s" in refusal[0].reason
    assert guard.refusals() == {"host-rate": 6}
