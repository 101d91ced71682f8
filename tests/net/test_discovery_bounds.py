"""The bounds of discovery without the network: the peer book fed crafted records on a fake clock,
the query budget, the address policy, TXT decoding, and static ``ID@HOST:PORT`` peers."""

from __future__ import annotations

import ipaddress
import socket

import pytest
from zeroconf import DNSAddress, DNSPointer, DNSRecord, DNSService, DNSText

from edge_node.errors import ConfigError, DiscoveryError
from edge_node.net.discovery import (
    MdnsDiscovery,
    PeerInfo,
    StaticDiscovery,
    StaticPeer,
    parse_peer,
    parse_peers,
)
from edge_node.net.discovery.bounds import (
    REFUSAL_REASONS,
    AddressPolicy,
    RefusalCounter,
    TokenBucket,
    own_networks,
)
from edge_node.net.discovery.peer_book import CHALLENGE_S, SERVICE_TYPE, BookLimits, PeerBook, Sweep
from edge_node.net.discovery.txt import decode_txt_record
from edge_node.protocol import NodeIdentity

_PTR, _SRV, _TXT, _A = 12, 33, 16, 1
_IN, _UNIQUE = 1, 0x8000


class Clock:
    """A monotonic clock the test moves; ``ms`` is the matching record time (zeroconf's milliseconds)."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    @property
    def ms(self) -> float:
        return self.t * 1000.0


def txt(**props: str) -> bytes:
    return b"".join(bytes([len(f"{k}={v}")]) + f"{k}={v}".encode() for k, v in props.items())


def announce(
    clock: Clock,
    node_id: str,
    *,
    address: str = "10.0.0.5",
    port: int = 7000,
    ttl: int = 120,
    fleet: str = "lab",
    ptr_only: bool = False,
    alias: str | None = None,
) -> list[DNSRecord]:
    name = alias or f"{node_id}.{SERVICE_TYPE}"
    host = f"{node_id}.local."
    ptr = DNSPointer(SERVICE_TYPE, _PTR, _IN, ttl, name, created=clock.ms)
    if ptr_only:
        return [ptr]
    props = {"v": "1.0", "id": node_id, "fleet": fleet, "arch": "", "tier": "t1", "density": "0.5", "round": "3"}
    return [
        ptr,
        DNSService(name, _SRV, _IN | _UNIQUE, ttl, 0, 0, port, host, created=clock.ms),
        DNSText(name, _TXT, _IN | _UNIQUE, ttl, txt(**props, fp=""), created=clock.ms),
        DNSAddress(host, _A, _IN | _UNIQUE, ttl, socket.inet_aton(address), created=clock.ms),
    ]


def goodbye(clock: Clock, node_id: str) -> list[DNSRecord]:
    return [DNSPointer(SERVICE_TYPE, _PTR, _IN, 0, f"{node_id}.{SERVICE_TYPE}", created=clock.ms)]


def fleet_filter(peer: PeerInfo) -> tuple[str, str] | None:
    if peer.name == "boom":
        raise RuntimeError("a bug that only this record triggers")
    fleet = peer.identity.fleet_id
    return None if fleet == "lab" else ("other_fleet", f"fleet {fleet!r}")


def make_book(clock: Clock, **limits: float) -> PeerBook:
    policy = AddressPolicy([ipaddress.ip_network("10.0.0.0/24")], allow_loopback=False)
    return PeerBook(
        BookLimits(**limits),  # type: ignore[arg-type]
        policy,
        RefusalCounter(),
        own_name=f"me.{SERVICE_TYPE}",
        peer_filter=fleet_filter,
        clock=clock,
    )


def sweep(book: PeerBook, clock: Clock, bucket: TokenBucket | None = None) -> Sweep:
    return book.sweep(clock.ms, bucket or TokenBucket(1000, 1000, clock))


def listed(book: PeerBook) -> set[str]:
    return {e.node_id for e in book._entries.values() if e.listed}


def asked(result: Sweep) -> set[str]:
    """The instance labels asked about in a sweep's query packets."""
    names: set[str] = set()
    for out in result.queries:
        for question in out.questions:
            if question.type in (_SRV, _TXT):
                names.add(question.name.split(".", 1)[0])
    return names


# -- the book: listing, expiry, goodbye ------------------------------------------------------------
def test_a_complete_announcement_is_listed_and_expires_after_its_ttl() -> None:
    clock = Clock()
    book = make_book(clock)
    assert book.observe(announce(clock, "pi-1", ttl=10), clock.ms)
    result = sweep(book, clock)
    [(key, peer)] = result.upserts
    assert key == f"pi-1.{SERVICE_TYPE}" and peer.name == "pi-1" and peer.endpoint == "10.0.0.5:7000"
    assert peer.identity.round == 3 and peer.identity.density == 0.5 and not result.queries
    assert clock.t + 5.0 <= result.next_due_s <= clock.t + 6.0  # the refresh: from half the TTL, jittered
    clock.t += 6.01
    assert asked(sweep(book, clock)) == {"pi-1"}
    clock.t += 4.5
    result = sweep(book, clock)
    assert [(r.node_id, r.why) for r in result.removals] == [("pi-1", "its records expired (TTL)")]
    assert book.sizes()["tracked"] == 0


def test_a_goodbye_removes_after_an_unanswered_challenge_and_own_name_is_never_tracked() -> None:
    clock = Clock()
    book = make_book(clock)
    book.observe(announce(clock, "pi-1") + announce(clock, "me"), clock.ms)
    assert [p.name for _, p in sweep(book, clock).upserts] == ["pi-1"]
    book.observe(goodbye(clock, "pi-1"), clock.ms)
    result = sweep(book, clock)
    assert not result.removals and asked(result) == {"pi-1"}  # anyone may send a goodbye: ask the peer
    clock.t += CHALLENGE_S
    assert [(r.node_id, r.why) for r in sweep(book, clock).removals] == [
        ("pi-1", "said goodbye and did not answer the challenge")
    ]
    assert book.refusals.snapshot() == {"conflict": 1}


def test_a_goodbye_for_a_name_not_listed_yet_removes_it_at_once() -> None:
    clock = Clock()
    book = make_book(clock)
    book.observe(announce(clock, "pi-1", ptr_only=True), clock.ms)
    book.observe(goodbye(clock, "pi-1"), clock.ms)
    sweep(book, clock)
    assert book.sizes()["tracked"] == 0


def spoof_srv(clock: Clock, node_id: str, *, port: int, ttl: int, host: str | None = None) -> list[DNSRecord]:
    """One SRV record for ``node_id``'s instance name, as an attacker sends it."""
    name = f"{node_id}.{SERVICE_TYPE}"
    return [DNSService(name, _SRV, _IN | _UNIQUE, ttl, 0, 0, port, host or f"{node_id}.local.", created=clock.ms)]


@pytest.mark.parametrize(
    "spoof",
    [
        {"port": 6666, "ttl": 1},  # the probe's attack: another port, expiring after 1 s
        {"port": 6666, "ttl": 120, "host": "evil.local."},  # another host, long-lived
        {"port": 7000, "ttl": 1},  # the same record with a 1 s TTL
        {"port": 7000, "ttl": 0},  # an SRV goodbye
    ],
)
def test_a_spoofed_srv_cannot_drop_or_move_a_peer_that_answers(spoof: dict[str, object]) -> None:
    clock = Clock()
    book = make_book(clock)
    book.observe(announce(clock, "pi-1"), clock.ms)
    sweep(book, clock)
    clock.t += 1
    book.observe(spoof_srv(clock, "pi-1", **spoof), clock.ms)  # type: ignore[arg-type]
    result = sweep(book, clock)
    [(_, peer)] = result.upserts
    assert peer.endpoint == "10.0.0.5:7000" and not result.removals
    if spoof["port"] != 7000 or spoof["ttl"] == 0:
        assert asked(result) == {"pi-1"}
        clock.t += 0.2
        book.observe(announce(clock, "pi-1"), clock.ms)  # the real peer answers the query
    for _ in range(130):  # past the spoofed record's TTL, the challenge and the real record's refreshes
        clock.t += 1
        if int(clock.t) % 50 == 0:
            book.observe(announce(clock, "pi-1"), clock.ms)
        result = sweep(book, clock)
        assert not result.removals, result.removals
        assert [p.endpoint for _, p in result.upserts] == ["10.0.0.5:7000"]
    conflicts = book.refusals.snapshot().get("conflict", 0)
    assert conflicts == (0 if spoof == {"port": 7000, "ttl": 1} else 1)


def test_a_peer_that_moved_without_a_goodbye_is_moved_after_the_challenge() -> None:
    clock = Clock()
    book = make_book(clock)
    book.observe(announce(clock, "pi-1"), clock.ms)
    sweep(book, clock)
    clock.t += 1
    book.observe(announce(clock, "pi-1", port=7001), clock.ms)  # restarted on another port
    assert [p.endpoint for _, p in sweep(book, clock).upserts] == ["10.0.0.5:7000"]
    clock.t += CHALLENGE_S
    assert [p.endpoint for _, p in sweep(book, clock).upserts] == ["10.0.0.5:7001"]


def test_records_arriving_after_the_ptr_complete_a_pending_name() -> None:
    clock = Clock()
    book = make_book(clock)
    full = announce(clock, "pi-1")
    book.observe(full[:1], clock.ms)
    assert book.sizes()["pending"] == 1 and not sweep(book, clock).upserts
    book.observe(full[1:], clock.ms)
    assert book.sizes()["pending"] == 0
    assert [p.name for _, p in sweep(book, clock).upserts] == ["pi-1"]


def test_a_cache_flush_address_replaces_the_old_one() -> None:
    clock = Clock()
    book = make_book(clock)
    book.observe(announce(clock, "pi-1", address="10.0.0.5"), clock.ms)
    clock.t += 5
    moved = DNSAddress("pi-1.local.", _A, _IN | _UNIQUE, 120, socket.inet_aton("10.0.0.9"), created=clock.ms)
    book.observe([moved], clock.ms)
    [(_, peer)] = sweep(book, clock).upserts
    assert peer.addresses == ["10.0.0.9"]


def test_a_listed_peer_whose_address_is_withdrawn_keeps_its_listing_and_is_asked_again() -> None:
    clock = Clock()
    book = make_book(clock)
    book.observe(announce(clock, "pi-1", address="10.0.0.5"), clock.ms)
    sweep(book, clock)
    clock.t += 1
    gone = DNSAddress("pi-1.local.", _A, _IN | _UNIQUE, 0, socket.inet_aton("10.0.0.5"), created=clock.ms)
    assert book.observe([gone], clock.ms)
    result = sweep(book, clock)
    assert not result.upserts and not result.removals and asked(result) == {"pi-1"}


# -- the bound ---------------------------------------------------------------------------------------
def test_newcomers_beyond_the_bound_are_refused_and_never_resolved() -> None:
    clock = Clock()
    book = make_book(clock, max_peers=4, probation_s=60)
    for i in range(4):
        book.observe(announce(clock, f"real-{i}"), clock.ms)
    sweep(book, clock)
    for i in range(100):
        book.observe(announce(clock, f"fake-{i}", ptr_only=i % 2 == 0), clock.ms)
    clock.t += 30
    result = sweep(book, clock)
    assert listed(book) == {f"real-{i}" for i in range(4)} and book.sizes()["tracked"] == 4
    assert not asked(result) & {f"fake-{i}" for i in range(100)}
    assert book.refusals.snapshot() == {"table_full": 100}


def test_after_a_burst_fills_the_table_a_newcomer_is_listed_once_the_burst_is_past_probation() -> None:
    clock = Clock()
    book = make_book(clock, max_peers=8, proven_for_s=100, probation_s=10)
    book.observe(announce(clock, "real-0", ttl=4500), clock.ms)
    sweep(book, clock)
    book.record_pull("real-0", True)  # answered a pull: never evicted for newcomers
    clock.t += 1
    for i in range(500):  # the burst: complete fake services of our fleet
        book.observe(announce(clock, f"fake-{i}", ttl=120), clock.ms)
    sweep(book, clock)
    assert book.sizes()["tracked"] == 8 and not book.has_room()
    clock.t += 5
    assert not book.observe(announce(clock, "real-1", ttl=120), clock.ms)  # within the burst's probation
    clock.t += 5  # the burst's names are past probation and never answered a pull
    assert book.has_room()
    book.observe(announce(clock, "real-1", ttl=120), clock.ms)
    sweep(book, clock)
    assert {"real-0", "real-1"} <= listed(book) and book.sizes()["tracked"] == 8
    counts = book.refusals.snapshot()
    assert counts["table_full"] == 500 - 7 + 1 and counts["evicted_unproven"] == 1, counts


def test_failed_pulls_make_unproven_peers_evictable_never_proven_or_unpulled_ones() -> None:
    clock = Clock()
    book = make_book(clock, max_peers=3, evict_after_failures=3, proven_for_s=100, cooldown_s=50, probation_s=1e5)
    for nid in ("proven", "failing", "unpulled"):
        book.observe(announce(clock, nid, ttl=4500), clock.ms)
    sweep(book, clock)
    book.record_pull("proven", True)
    for _ in range(5):
        book.record_pull("proven", False)  # a bad patch, but it answered within proven_for_s
    for _ in range(3):
        book.record_pull("failing", False)
    assert book.is_proven("proven") and not book.is_proven("failing")

    book.observe(announce(clock, "new-1", ttl=4500), clock.ms)  # takes the failing peer's slot
    result = sweep(book, clock)
    assert [(r.node_id, r.why.split(":")[0]) for r in result.removals] == [("failing", "evicted")]
    book.observe(announce(clock, "new-2", ttl=4500), clock.ms)  # nobody else may go
    sweep(book, clock)
    assert listed(book) == {"proven", "unpulled", "new-1"}
    book.observe(announce(clock, "failing", ttl=4500), clock.ms)  # back within its cooldown
    assert book.refusals.snapshot() == {"cooldown": 1, "evicted": 1, "table_full": 1}

    clock.t += 101  # the proven peer's last success is too old now, and it kept failing
    book.observe(announce(clock, "new-3", ttl=4500), clock.ms)
    sweep(book, clock)
    assert listed(book) == {"unpulled", "new-1", "new-3"}


def test_ptr_only_names_are_resolved_with_backoff_within_the_budget_then_dropped() -> None:
    clock = Clock()
    book = make_book(clock, max_pending=3, cooldown_s=60)
    bucket = TokenBucket(2.0, 2, clock)
    for i in range(50):
        book.observe(announce(clock, f"ghost-{i}", ptr_only=True), clock.ms)
    assert book.sizes()["pending"] == 3 and book.refusals.snapshot() == {"pending_full": 47}
    asks: dict[str, int] = {}
    packets = 0
    for _ in range(200):  # 20 s in 0.1 s steps
        clock.t += 0.1
        result = sweep(book, clock, bucket)
        packets += len(result.queries)
        for name in asked(result):
            asks[name] = asks.get(name, 0) + 1
    assert asks == {"ghost-0": 4, "ghost-1": 4, "ghost-2": 4}  # three names, four attempts each
    assert packets <= 2.0 * 20 + 2
    assert book.sizes() == {"tracked": 0, "listed": 0, "pending": 0, "cooldown": 3}
    book.observe(announce(clock, "ghost-0", ptr_only=True), clock.ms)
    refusals = book.refusals.snapshot()
    refusals.pop("query_budget", None)  # attempts the budget deferred a moment
    assert refusals == {"cooldown": 1, "pending_full": 47, "unresolved": 3}


def test_a_complete_announcement_is_not_held_up_by_ptr_only_names() -> None:
    clock = Clock()
    book = make_book(clock, max_pending=2)
    for i in range(10):
        book.observe(announce(clock, f"ghost-{i}", ptr_only=True), clock.ms)
    book.observe(announce(clock, "real"), clock.ms)  # SRV and TXT in its own packet: no resolving needed
    assert [p.name for _, p in sweep(book, clock).upserts] == ["real"]


# -- bad records ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "alias",
    [
        "printer._ipp._tcp.local.",
        "bad name._edge-node._tcp.local.",
        "-dash._edge-node._tcp.local.",
        "a.b._edge-node._tcp.local.",
        "x" * 64 + "._edge-node._tcp.local.",
        "_edge-node._tcp.local.",
    ],
)
def test_ptr_aliases_that_are_not_node_ids_are_refused(alias: str) -> None:
    clock = Clock()
    book = make_book(clock)
    assert not book.observe(announce(clock, "x", alias=alias), clock.ms)
    assert book.sizes()["tracked"] == 0 and book.refusals.snapshot() == {"bad_name": 1}


def test_one_record_that_raises_does_not_stop_the_sweep_and_others_still_expire() -> None:
    clock = Clock()
    book = make_book(clock)
    book.observe(announce(clock, "dying", ttl=5), clock.ms)
    sweep(book, clock)
    clock.t += 4
    book.observe(announce(clock, "boom") + announce(clock, "fine"), clock.ms)
    clock.t += 1.5
    result = sweep(book, clock)
    assert [p.name for _, p in result.upserts] == ["fine"]
    assert [r.node_id for r in result.removals] == ["dying"]
    assert book.refusals.snapshot() == {"error": 1}
    book.observe(announce(clock, "boom"), clock.ms)  # dropped for its cooldown, not retried every sweep
    assert book.refusals.snapshot() == {"cooldown": 1, "error": 1}


def test_malformed_txt_and_other_fleets_are_refused_by_reason() -> None:
    clock = Clock()
    book = make_book(clock)
    records = announce(clock, "alien", fleet="other") + announce(clock, "bad-txt")
    bad_txt = records[-2]
    assert isinstance(bad_txt, DNSText)
    records[-2] = DNSText(bad_txt.name, _TXT, _IN | _UNIQUE, 120, txt(v="1.0", id="bad-txt"), created=clock.ms)
    book.observe(records, clock.ms)
    assert not sweep(book, clock).upserts
    assert book.refusals.snapshot() == {"bad_txt": 1, "other_fleet": 1}


def test_unusable_addresses_and_ports_are_counted_and_never_listed() -> None:
    clock = Clock()
    book = make_book(clock)
    for nid, address in (("unspec", "0.0.0.0"), ("mcast", "224.0.0.251"), ("public", "8.8.8.8"), ("lo", "127.0.0.1")):
        book.observe(announce(clock, nid, address=address), clock.ms)
    book.observe(announce(clock, "port0", port=0), clock.ms)
    assert not sweep(book, clock).upserts and book.sizes()["tracked"] == 0
    assert book.refusals.snapshot() == {"bad_address": 3, "bad_port": 1, "foreign_subnet": 1}


# -- budget, address policy, TXT -------------------------------------------------------------------------
def test_token_bucket_spends_its_burst_then_the_rate() -> None:
    clock = Clock()
    bucket = TokenBucket(4.0, 8, clock)
    assert sum(bucket.take() for _ in range(20)) == 8
    clock.t += 1.0
    assert sum(bucket.take() for _ in range(20)) == 4
    clock.t += 100.0
    assert bucket.available() == 8
    with pytest.raises(ConfigError, match="query_rate=0"):
        TokenBucket(0, 1)
    with pytest.raises(ConfigError, match="query_burst=0"):
        TokenBucket(1, 0)


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("10.0.0.7", None),
        ("fe80::1%3", None),
        ("0.0.0.0", "bad_address"),
        ("0.1.2.3", "bad_address"),
        ("224.0.0.251", "bad_address"),
        ("239.1.2.3", "bad_address"),
        ("255.255.255.255", "bad_address"),
        ("240.0.0.1", "bad_address"),
        ("10.0.0.255", "bad_address"),  # the subnet's broadcast
        ("10.0.0.0", "bad_address"),
        ("127.0.0.1", "bad_address"),
        ("::", "bad_address"),
        ("::1", "bad_address"),
        ("::ffff:10.0.0.7", "bad_address"),
        ("ff02::fb", "bad_address"),
        ("8.8.8.8", "foreign_subnet"),
        ("10.0.1.7", "foreign_subnet"),
        ("fd00::7", "foreign_subnet"),
        ("not-an-address", "bad_address"),
    ],
)
def test_address_policy(address: str, reason: str | None) -> None:
    policy = AddressPolicy(
        [ipaddress.ip_network("10.0.0.0/24"), ipaddress.ip_network("fe80::/64")], allow_loopback=False
    )
    assert policy.check(address) == reason


def test_address_policy_for_a_node_on_loopback_and_without_subnet_limits() -> None:
    assert ipaddress.ip_network("127.0.0.0/8") in own_networks(["127.0.0.1"])
    on_lo = AddressPolicy.for_addresses(["127.0.0.1"], allowed_subnets=None, own_subnets_only=True)
    assert on_lo.check("127.0.0.1") is None and on_lo.check("10.0.0.7") == "foreign_subnet"
    anywhere = AddressPolicy.for_addresses(["127.0.0.1"], allowed_subnets=None, own_subnets_only=False)
    assert anywhere.check("8.8.8.8") is None and anywhere.check("224.0.0.1") == "bad_address"
    listed_subnets = AddressPolicy.for_addresses(
        ["127.0.0.1"], allowed_subnets=["192.168.7.0/24"], own_subnets_only=True
    )
    assert listed_subnets.check("192.168.7.9") is None and listed_subnets.check("127.0.0.1") == "foreign_subnet"
    assert AddressPolicy.check_port(0) == "bad_port" and AddressPolicy.check_port(65535) is None


def test_decode_txt_record_like_zeroconf() -> None:
    raw = txt(a="1", b="") + b"\x04flag" + txt(a="2")
    assert decode_txt_record(raw) == {b"a": b"1", b"b": b"", b"flag": None}
    assert decode_txt_record(b"") == {}
    with pytest.raises(DiscoveryError, match="truncated"):
        decode_txt_record(b"\x09short")
    with pytest.raises(DiscoveryError, match="more than 128"):
        decode_txt_record(b"\x01x" * 129)


def test_every_counted_reason_is_documented() -> None:
    for reason in ("bad_name", "table_full", "pending_full", "cooldown", "unresolved", "bad_txt", "other_fleet",
                   "other_version", "other_arch", "bad_address", "foreign_subnet", "bad_port", "evicted", "error",
                   "query_budget", "self", "id_mismatch"):  # fmt: skip
        assert reason in REFUSAL_REASONS


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_peers": 0}, "max_peers=0"),
        ({"max_pending": 1.5}, "max_pending=1.5"),
        ({"query_rate": 0}, "query_rate=0"),
        ({"query_burst": 0}, "query_burst=0"),
        ({"allowed_subnets": ["10.0.0.0/33"]}, "10.0.0.0/33"),
        ({"allowed_subnets": "10.0.0.0/8"}, "list of CIDR"),
        ({"own_subnets_only": "yes"}, "own_subnets_only='yes'"),
        ({"proven_for_s": -1}, "proven_for_s=-1"),
    ],
)
def test_mdns_checks_its_bounds_at_the_entry(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        MdnsDiscovery(interfaces=["127.0.0.1"], **kwargs)  # type: ignore[arg-type]


def test_mdns_record_pull_of_an_unknown_peer_is_ignored_and_refusals_start_empty() -> None:
    disc = MdnsDiscovery(interfaces=["127.0.0.1"])  # opens no socket
    disc.record_pull("nobody", True)
    assert disc.refusals() == {} and not disc.is_proven("nobody")
    with pytest.raises(TypeError):
        disc.record_pull("nobody", "yes")  # type: ignore[arg-type]


# -- static ID@HOST:PORT -------------------------------------------------------------------------------
def test_parse_peer_reads_an_optional_node_id() -> None:
    assert parse_peer("pi-1@10.0.0.2:7000") == StaticPeer("10.0.0.2", 7000, "pi-1")
    assert parse_peer("pi-1@[fd00::4]:7002") == StaticPeer("fd00::4", 7002, "pi-1")
    assert parse_peer("Pi_2@pi-2.lan:7000").node_id == "Pi_2"
    assert parse_peer("10.0.0.2:7000") == StaticPeer("10.0.0.2", 7000, None)
    assert str(parse_peer("pi-1@[fd00::4]:7002")) == "pi-1@[fd00::4]:7002"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("@10.0.0.2:7000", "invalid node id ''"),
        ("-x@10.0.0.2:7000", "invalid node id '-x'"),
        ("a.b@10.0.0.2:7000", "invalid node id 'a.b'"),
        ("x" * 64 + "@10.0.0.2:7000", "invalid node id"),
        ("a@b@10.0.0.2:7000", "invalid host"),
        ("pi-1@fd00::4:7000", "brackets"),
        ("pi-1@10.0.0.2", "must be"),
    ],
)
def test_parse_peer_refuses_bad_ids_quoting_them(spec: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_peer(spec)


def test_parse_peers_refuses_conflicting_ids() -> None:
    assert parse_peers("a@10.0.0.2:7000 a@10.0.0.2:7000") == [StaticPeer("10.0.0.2", 7000, "a")]
    with pytest.raises(ConfigError, match="given twice"):
        parse_peers("a@10.0.0.2:7000, b@10.0.0.2:7000")
    with pytest.raises(ConfigError, match="given twice"):
        parse_peers("a@10.0.0.2:7000, 10.0.0.2:7000")
    with pytest.raises(ConfigError, match="two peers"):
        parse_peers("a@10.0.0.2:7000, a@10.0.0.3:7000")


def _hello(node_id: str) -> PeerInfo:
    return PeerInfo(NodeIdentity("1.0", node_id, "lab", None, 1, 0.5, "t1"), ["10.0.0.2"], 7000, None, 0.0)


def test_static_peer_with_an_id_is_known_by_it_from_the_start_and_checked_against_its_hello() -> None:
    with StaticDiscovery("pi-2@10.0.0.2:7000, 10.0.0.3:7000", node_id="me", fleet="lab") as disc:
        assert [(p.name, p.endpoint) for p in disc.peers()] == [
            ("10.0.0.3:7000", "10.0.0.3:7000"),
            ("pi-2", "10.0.0.2:7000"),
        ]
        disc.record_pull("pi-2", True)
        assert disc.is_proven("pi-2")
        assert disc.record_hello("10.0.0.2", 7000, _hello("impostor")) is False
        assert [p.name for p in disc.peers()] == ["10.0.0.3:7000"]
        assert disc.refusals() == {"id_mismatch": 1}
        assert disc.record_hello("10.0.0.3", 7000, _hello("me")) is False
        assert disc.refusals() == {"id_mismatch": 1, "self": 1}


def test_static_discovery_under_tls_needs_ids() -> None:
    with pytest.raises(ConfigError, match=r"ID@HOST:PORT under TLS.*10\.0\.0\.3:7000"):
        StaticDiscovery("pi-2@10.0.0.2:7000, 10.0.0.3:7000", require_node_ids=True)
    StaticDiscovery("pi-2@10.0.0.2:7000", require_node_ids=True)
