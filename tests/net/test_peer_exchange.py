"""Peer exchange (protocol 1.4): the bounded table of learned entries, and a real exchange over gRPC on loopback.

The table's tests feed it the hostile lists of the issue (10,000 fake entries, entries outside the allowed
subnets, a victim's many ports) and check every bound and count; the gRPC tests run real servers on 127.0.0.x
and a real :class:`PeerExchange` against them: a learned peer is listed only after its own Hello verified it.
"""

from __future__ import annotations

import contextlib
import ipaddress
import time
from collections import Counter
from collections.abc import Iterator

import pytest

from edge_node.errors import ConfigError, PeerUnreachable
from edge_node.net import PeerAddress, PeerServer, TlsConfig, create_server, hello, list_peers
from edge_node.net.discovery import AddressPolicy, RefusalCounter, StaticDiscovery
from edge_node.net.discovery.exchange import (
    MAX_CANDIDATES,
    MAX_CANDIDATES_PER_HOST,
    MAX_CANDIDATES_PER_SOURCE,
    MAX_DIALS_PER_CYCLE,
    MAX_DIALS_PER_ENTRY,
    STALE_INTERVALS,
    Hint,
    LearnedTable,
    PeerExchange,
    check_interval,
    exchange_policy,
)
from edge_node.net.server import PEX_HOST_BURST, PEX_HOST_INTERVAL_S
from edge_node.net.tls import create_ca, issue_certificate
from edge_node.node.config import NodeConfig
from edge_node.protocol import MAX_PEER_ENTRIES
from edge_node.wire.messages import PeerEntry
from tests.wire_models import PEER_FLEET as FLEET
from tests.wire_models import PEER_SPEC as SPEC

SITE = "10.1.0.0/24"


def table(interval_s: float = 1.0) -> tuple[LearnedTable, RefusalCounter]:
    counter = RefusalCounter()
    policy = AddressPolicy([ipaddress.ip_network(SITE), ipaddress.ip_network("10.2.0.0/24")], allow_loopback=False)
    return LearnedTable(policy, "me", interval_s, counter.add), counter


def hint(i: int, host: str = "10.1.0.7", port: int | None = None) -> Hint:
    return Hint(f"n{i}", host, 7000 + i if port is None else port, "")


def test_ten_thousand_fake_entries_from_one_peer_are_bounded_and_counted():
    learned, counts = table()
    added = learned.offer("liar", [hint(i, f"10.1.0.{i % 250 + 1}") for i in range(10_000)], set(), 0.0)
    assert added == MAX_CANDIDATES_PER_SOURCE == len(learned)
    refused = counts.snapshot()
    assert refused["pex_too_many"] == 10_000 - MAX_PEER_ENTRIES
    assert refused["pex_source_full"] == MAX_PEER_ENTRIES - MAX_CANDIDATES_PER_SOURCE
    # many liars together fill the candidates, never more; a verified peer keeps its place
    learned.confirmed(learned.entries()[0], 0.0)
    for source in range(200):
        learned.offer(f"liar{source}", [hint(50 * source + i, f"10.2.0.{i + 1}") for i in range(50)], set(), 0.0)
    assert len([e for e in learned.entries() if e.verified is None]) == MAX_CANDIDATES
    assert len(learned.verified()) == 1 and counts.snapshot()["table_full"] > 0


def test_entries_outside_the_subnets_malformed_of_this_node_or_known_are_not_taken():
    learned, counts = table()
    hints = [
        Hint("far", "10.9.0.1", 7878, ""),  # outside allowed_subnets
        Hint("multi", "224.0.0.251", 7878, ""),  # not unicast
        Hint("named", "pi.example.org", 7878, ""),  # a name: never looked up
        Hint("bad id", "10.1.0.2", 7878, ""),
        Hint("badfp", "10.1.0.3", 7878, "md5:00"),
        Hint("port0", "10.1.0.4", 0, ""),
        Hint("me", "10.1.0.5", 7878, ""),  # this node
        Hint("seen", "10.1.0.6", 7878, ""),  # another discovery lists it already
        Hint("ok", "10.1.0.8", 7878, "sha256:" + "ab" * 32),
    ]
    assert learned.offer("peer", hints, {"seen"}, 0.0) == 1
    assert [e.hint.node_id for e in learned.entries()] == ["ok"]
    assert counts.snapshot() == {"bad_address": 1, "bad_port": 1, "foreign_subnet": 1, "pex_bad_entry": 3, "self": 1}


def test_a_victim_gets_a_bounded_number_of_dials():
    """Entries naming one address's many ports (a victim): at most 4 candidates on it, each dialled at most once
    per interval and 3 times in all, then kept out; at most 16 dials per interval over every address."""
    learned, counts = table()
    victim = [hint(i, "10.1.0.99", 1 + i) for i in range(1000)]
    others = [hint(1000 + i, f"10.2.0.{i + 1}") for i in range(100)]
    dials: Counter[str] = Counter()
    for cycle in range(10):
        now = float(cycle)
        for source in range(20):  # twenty liars re-list everything every interval
            learned.offer(
                f"liar{source}", victim[50 * source : 50 * source + 50] + others[5 * source :][:5], set(), now
            )
        due, verified = learned.due(now)
        assert not verified and len(due) <= MAX_DIALS_PER_CYCLE
        assert sum(e.hint.host == "10.1.0.99" for e in due) <= MAX_CANDIDATES_PER_HOST
        for entry in due:
            dials[entry.hint.host] += 1
            learned.unanswered(entry, now)
    assert dials["10.1.0.99"] <= MAX_CANDIDATES_PER_HOST * 10
    assert sum(dials.values()) <= MAX_DIALS_PER_CYCLE * 10
    refused = counts.snapshot()
    assert refused["pex_host_full"] > 0 and refused["pex_dial_budget"] >= MAX_CANDIDATES_PER_HOST
    dropped = refused["pex_dial_budget"]
    assert dropped * MAX_DIALS_PER_ENTRY <= sum(dials.values())
    assert refused["cooldown"] > 0  # a dropped entry listed again is kept out


def test_a_lie_about_a_real_endpoint_does_not_keep_the_real_peer_out():
    learned, counts = table()
    learned.offer("liar", [Hint("ghost", "10.1.0.5", 7878, "")], set(), 0.0)
    learned.offer("honest", [Hint("real", "10.1.0.5", 7878, "")], set(), 0.0)
    assert counts.snapshot() == {"conflict": 1}
    (entry,) = learned.entries()
    learned.refuted(entry, "id_mismatch", 0.5)  # its Hello said "real"
    learned.offer("honest", [Hint("real", "10.1.0.5", 7878, "")], set(), 1.0)
    assert [e.hint.node_id for e in learned.entries()] == ["real"]
    learned.offer("liar", [Hint("ghost", "10.1.0.5", 7878, "")], set(), 1.0)
    assert counts.snapshot() == {"conflict": 2, "id_mismatch": 1}


def test_nothing_stale_outlives_its_bound():
    learned, _ = table(interval_s=2.0)
    learned.offer("peer", [hint(1), hint(2)], set(), 0.0)
    due, _ = learned.due(0.0)
    learned.confirmed(due[0], 0.0)  # verified once, then never again
    stale_s = STALE_INTERVALS * 2.0
    assert learned.expire(stale_s) == [] and len(learned) == 2
    gone = learned.expire(stale_s + 0.01)
    assert [e.hint for e in gone] == [due[0].hint] and len(learned) == 0  # the unverified one too


def test_settings_are_checked_at_start():
    with pytest.raises(ConfigError, match="peer_exchange_s"):
        check_interval(0.5)
    with pytest.raises(ConfigError, match="allowed_subnets item '10.0.0.0/33'"):
        NodeConfig(fleet="f", allowed_subnets=("10.0.0.0/33",))
    with pytest.raises(ConfigError, match="more than 1024"):
        NodeConfig(
            fleet="f", discovery="static", peers=tuple(f"10.0.{i // 250}.{i % 250 + 1}:7878" for i in range(1025))
        )
    policy = exchange_policy("10.1.0.1", ["10.2.0.1", "pi.example.org"], [])
    assert policy.check("10.2.0.77") is None and policy.check("10.3.0.1") == "foreign_subnet"
    assert exchange_policy("10.1.0.1", [], ["10.3.0.0/16"]).check("10.3.9.9") is None


# -- over gRPC, on 127.0.0.x ------------------------------------------------------------------------


@contextlib.contextmanager
def serving(server: PeerServer, host: str = "127.0.0.1") -> Iterator[int]:
    grpc_server, port = create_server(f"{host}:0", server, insecure=True)
    grpc_server.start()
    try:
        yield port
    finally:
        grpc_server.stop(None).wait(5)


def node(node_id: str, fleet: str = FLEET) -> PeerServer:
    return PeerServer(SPEC, node_id=node_id, fleet_id=fleet)


def entry(node_id: str, host: str, port: int) -> PeerEntry:
    return PeerEntry(node_id=node_id, host=host, port=port)


def test_list_peers_is_bounded_per_host_and_of_the_callers_fleet():
    server = node("srv")
    server.reached = lambda: [entry(f"n{i}", "10.1.0.1", 1000 + i) for i in range(100)]
    with serving(server) as port:
        address = PeerAddress("srv", "127.0.0.1", port)
        entries, dropped = list_peers(address, node_id="me", fleet_id=FLEET, insecure=True)
        assert len(entries) == MAX_PEER_ENTRIES and dropped == 0
        for _ in range(PEX_HOST_BURST - 1):  # nodes behind one address (a NAT, one machine) ask at once
            list_peers(address, node_id="me", fleet_id=FLEET, insecure=True)
        with pytest.raises(PeerUnreachable, match="RESOURCE_EXHAUSTED"):
            list_peers(address, node_id="me", fleet_id=FLEET, insecure=True)
        time.sleep(PEX_HOST_INTERVAL_S)
        assert len(list_peers(address, node_id="me", fleet_id=FLEET, insecure=True)[0]) == MAX_PEER_ENTRIES
        with pytest.raises(PeerUnreachable, match="FAILED_PRECONDITION"):
            list_peers(address, node_id="me", fleet_id="fleet-2", insecure=True)
    assert server.refusals() == {"fleet": 1, "pex-rate": 1}


class _Hostile(PeerServer):
    """A peer whose ListPeers reply holds ``n`` entries, ignoring the bound an honest server keeps."""

    n = 0

    def _list_peers(self, request, context):  # type: ignore[no-untyped-def]
        from edge_node.wire.messages import ListPeersReply

        return ListPeersReply(protocol_version="1.4", peers=[entry(f"f{i}", "10.1.0.1", 1) for i in range(self.n)])


def test_an_oversized_reply_is_refused_whole_and_a_long_one_cut():
    server = _Hostile(SPEC, node_id="bad", fleet_id=FLEET)
    with serving(server) as port:
        address = PeerAddress("bad", "127.0.0.1", port)
        server.n = 10_000
        with pytest.raises(PeerUnreachable) as caught:
            list_peers(address, fleet_id=FLEET, insecure=True)
        assert caught.value.kind == "limit"
        server.n = 200  # under the reply's byte limit: the first 64 read, the rest counted by the receiver
        entries, dropped = list_peers(address, fleet_id=FLEET, insecure=True)
        assert (len(entries), dropped) == (MAX_PEER_ENTRIES, 200 - MAX_PEER_ENTRIES)


def test_a_learned_peer_is_listed_only_once_its_own_hello_verified_it():
    """A seed lists an honest peer, one of another fleet, a false id at a real node, an address outside the
    subnets and a victim's ports: only the honest peer is listed; each other entry is refused and counted."""
    seed, honest, other, real = node("seed"), node("honest"), node("other", "fleet-2"), node("real")
    with contextlib.ExitStack() as stack:
        seed_port = stack.enter_context(serving(seed, "127.0.0.1"))
        honest_port = stack.enter_context(serving(honest, "127.0.0.2"))
        other_port = stack.enter_context(serving(other, "127.0.0.3"))
        real_port = stack.enter_context(serving(real, "127.0.0.4"))
        victim = [entry(f"v{i}", "127.0.0.5", 1 + i) for i in range(20)]  # nothing listens there
        seed.reached = lambda: [
            entry("honest", "127.0.0.2", honest_port), entry("other", "127.0.0.3", other_port),
            entry("ghost", "127.0.0.4", real_port), entry("far", "10.9.9.9", 7878), *victim,
        ]  # fmt: skip
        static = StaticDiscovery([f"seed@127.0.0.1:{seed_port}"], node_id="me", fleet=FLEET)
        static.start()
        stack.callback(static.stop)
        dialled: Counter[str] = Counter()

        def counted_hello(address: PeerAddress):  # type: ignore[no-untyped-def]
            dialled[address.host] += 1
            return hello(address, node_id="me", fleet_id=FLEET, timeout_s=0.5, insecure=True)

        policy = AddressPolicy([ipaddress.ip_network("127.0.0.0/8")], allow_loopback=True)
        exchange = PeerExchange(
            node_id="me", fleet=FLEET, arch=SPEC.arch_id, sources=[static], hello=counted_hello,
            ask=lambda a: list_peers(a, node_id="me", fleet_id=FLEET, timeout_s=0.5, insecure=True),
            policy=policy, interval_s=1.0,
        )  # fmt: skip
        stack.callback(exchange.stop)
        exchange.run_once()
        assert exchange.learned() == ["honest"]
        assert sorted(e.node_id for e in exchange.reached_entries()) == ["honest", "seed"]
        for _ in range(MAX_DIALS_PER_ENTRY):
            time.sleep(1.0)
            exchange.run_once()
        assert exchange.learned() == ["honest"]
        refused = exchange.refusals()
        assert refused["other_fleet"] == 1 and refused["id_mismatch"] == 1 and refused["foreign_subnet"] >= 1
        assert refused["pex_host_full"] >= 20 - MAX_CANDIDATES_PER_HOST
        assert refused["pex_dial_budget"] == MAX_CANDIDATES_PER_HOST
        stats = exchange.to_json()
        assert stats["learned"] == ["honest"] and stats["asks_failed"] == 0 and stats["cycles"] == 4
        # four candidates on the victim at a time, each dialled once per interval: 4 intervals, 16 dials
        assert dialled["127.0.0.5"] == MAX_CANDIDATES_PER_HOST * (1 + MAX_DIALS_PER_ENTRY)
        assert dialled["10.9.9.9"] == 0
        assert seed.refusals() == {} and honest.refusals() == {}


def test_under_mutual_tls_a_learned_id_must_be_the_certificates():
    """A seed lists the real node under a false id, and under its own: only the id its certificate carries is
    listed (the false one fails the handshake's name check and is counted as ``id_mismatch``)."""
    ca_cert, ca_key = create_ca(FLEET)
    tls = {name: TlsConfig(ca_cert, *issue_certificate(ca_cert, ca_key, name)) for name in ("me", "seed", "real")}
    seed, real = node("seed"), node("real")
    with contextlib.ExitStack() as stack:
        ports = {}
        for name, server in (("seed", seed), ("real", real)):
            grpc_server, ports[name] = create_server("127.0.0.1:0", server, tls=tls[name])
            grpc_server.start()
            stack.callback(lambda s=grpc_server: s.stop(None).wait(5))
        fp = tls["real"].fingerprint
        seed.reached = lambda: [
            PeerEntry(node_id="ghost", host="127.0.0.2", port=ports["real"]),  # nothing there under that id
            PeerEntry(node_id="impostor", host="127.0.0.1", port=ports["real"], fingerprint=fp),
        ]
        static = StaticDiscovery([f"seed@127.0.0.1:{ports['seed']}"], node_id="me", fleet=FLEET, require_node_ids=True)
        static.start()
        stack.callback(static.stop)
        exchange = PeerExchange(
            node_id="me", fleet=FLEET, arch=SPEC.arch_id, sources=[static],
            hello=lambda a: hello(a, node_id="me", fleet_id=FLEET, timeout_s=1.0, tls=tls["me"]),
            ask=lambda a: list_peers(a, node_id="me", fleet_id=FLEET, timeout_s=1.0, tls=tls["me"]),
            policy=AddressPolicy([ipaddress.ip_network("127.0.0.0/8")], allow_loopback=True), interval_s=1.0, tls=True,
        )  # fmt: skip
        stack.callback(exchange.stop)
        exchange.run_once()
        assert exchange.learned() == [] and exchange.refusals() == {"id_mismatch": 1}
        seed.reached = lambda: [PeerEntry(node_id="real", host="127.0.0.1", port=ports["real"], fingerprint=fp)]
        time.sleep(1.0)
        exchange.run_once()
        assert exchange.learned() == ["real"]


def test_a_seed_that_never_answers_is_one_line_then_counted(caplog):
    static = StaticDiscovery(["ghost@127.0.0.1:1"], node_id="me", fleet=FLEET)  # nothing listens on port 1
    static.start()
    exchange = PeerExchange(
        node_id="me", fleet=FLEET, arch=SPEC.arch_id, sources=[static],
        hello=lambda a: hello(a, node_id="me", fleet_id=FLEET, timeout_s=0.5, insecure=True),
        ask=lambda a: list_peers(a, node_id="me", fleet_id=FLEET, timeout_s=0.5, insecure=True),
        policy=AddressPolicy(None, allow_loopback=True), interval_s=1.0,
    )  # fmt: skip
    try:
        with caplog.at_level("WARNING", logger="edge_node.net.discovery.exchange"):
            exchange.run_once()
            exchange.run_once()
    finally:
        exchange.stop()
        static.stop()
    lines = [r.getMessage() for r in caplog.records if "does not answer" in r.getMessage()]
    assert len(lines) == 1 and "ghost at 127.0.0.1:1" in lines[0], lines
    stats = exchange.to_json()
    assert (stats["asks"], stats["asks_failed"], stats["learned"]) == (2, 2, [])
    assert exchange.refusals() == {}  # a peer that is down is no bad input
