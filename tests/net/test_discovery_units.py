"""Discovery without the network: TXT validation, the peer table, static peers, argument checks, CLI."""

from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edge_node.cli._app import main
from edge_node.cli.peers import DEFAULT_MAX_PEERS as CLI_DEFAULT_MAX_PEERS
from edge_node.cli.peers import DEFAULT_TTL_S as CLI_DEFAULT_TTL_S
from edge_node.cli.peers import format_static, format_table
from edge_node.errors import ConfigError, DiscoveryError
from edge_node.net.discovery import (
    DEFAULT_MAX_PEERS,
    DEFAULT_TTL_S,
    TXT_KEYS,
    MdnsDiscovery,
    PeerEvent,
    PeerInfo,
    PeerTable,
    StaticDiscovery,
    TxtFields,
    encode_txt,
    parse_peers,
    parse_txt,
    read_peers_file,
    resolve_interfaces,
)
from edge_node.net.discovery.mdns import parse_default_routes
from edge_node.net.discovery.peer_book import usable_order as _usable_order
from edge_node.net.tls import certificate_fingerprint, create_ca, issue_certificate
from edge_node.protocol import PROTOCOL_VERSION, NodeIdentity, protocol_major

ARCH = "cnn/10/3f2a0b1c"  # NAME/CLASSES/HASH8, as ModelSpec.arch_id writes it
FIELDS = TxtFields(
    NodeIdentity(
        protocol_version=PROTOCOL_VERSION,
        node_id="pi-07",
        fleet_id="lab",
        arch_id=ARCH,
        tier="t3",
        density=0.6,
        round=42,
    ),
    fingerprint="sha256:" + "ab" * 32,
)


def _fields(**identity: object) -> TxtFields:
    """``FIELDS`` with some values of its identity replaced."""
    return dataclasses.replace(FIELDS, identity=dataclasses.replace(FIELDS.identity, **identity))  # type: ignore[arg-type]


def _raw(props: dict[str, str | None]) -> dict[bytes, bytes | None]:
    """TXT properties as python-zeroconf hands them over."""
    return {k.encode(): (None if v is None else v.encode()) for k, v in props.items()}


def _peer(node_id: str = "p1", **over: object) -> PeerInfo:
    """A peer as discovery lists it; ``over`` replaces values of its identity or of where it is."""
    identity: dict[str, object] = dict(
        node_id=node_id, fleet_id="lab", arch_id=ARCH, tier="t3", density=0.6, round=1, protocol_version="1.0"
    )
    place: dict[str, object] = dict(addresses=["10.0.0.2"], port=7000, fingerprint=None, last_seen=time.monotonic())
    for key, value in over.items():
        (identity if key in identity else place)[key] = value
    return PeerInfo(NodeIdentity(**identity), **place)  # type: ignore[arg-type]


# -- TXT -------------------------------------------------------------------------------------------
def test_txt_round_trip_carries_every_key() -> None:
    props = encode_txt(FIELDS)
    assert tuple(props) == TXT_KEYS
    assert props["density"] == "0.6" and props["round"] == "42" and props["v"] == PROTOCOL_VERSION
    assert parse_txt(_raw(props)) == FIELDS


def test_txt_carries_the_wire_architecture_id() -> None:
    """Discovery filters on the same arch id the wire's stream header carries (``ModelSpec.arch_id``)."""
    from edge_node.wire import ModelSpec

    arch = ModelSpec("cnn", 10, {"fc.weight": (10, 64), "fc.bias": (10,)}).arch_id
    props = encode_txt(_fields(arch_id=arch))
    assert props["arch"] == arch and parse_txt(_raw(props)).identity.arch_id == arch
    disc = MdnsDiscovery("n1", 7000, fleet="lab", arch=arch, interfaces=["127.0.0.1"])  # opens no socket
    assert disc.rejection(_peer(arch_id=arch)) is None
    assert "architecture" in (disc.rejection(_peer(arch_id=arch.replace("cnn/", "vgg11/"))) or "")


def test_txt_without_tls_has_empty_fp_and_parses_to_none() -> None:
    props = encode_txt(dataclasses.replace(FIELDS, fingerprint=None))
    assert props["fp"] == ""
    assert parse_txt(_raw(props)).fingerprint is None


def test_txt_keys_are_case_insensitive_and_unknown_keys_ignored() -> None:
    props = {k.upper(): v for k, v in encode_txt(FIELDS).items()}
    props["future-key"] = "whatever"
    assert parse_txt(_raw(props)) == FIELDS


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"density": "fast"}, "density"),
        ({"density": "nan"}, "density"),
        ({"density": "0"}, "density"),
        ({"density": "1.5"}, "density"),
        ({"round": "-1"}, "round"),
        ({"round": "1e3"}, "round"),
        ({"round": None}, "round"),
        ({"fleet": "f" * 240}, "fleet"),
        ({"arch": "a" * 240}, "arch"),
        ({"arch": "cnn:10:3f2a"}, "arch_id='cnn:10:3f2a'"),  # TXT's old, wider rule took it: the wire's rule wins
        ({"tier": ""}, "tier"),
        ({"tier": "fast"}, "tier='fast'"),  # TXT's old rule took any 1-32 of [A-Za-z0-9_.-]: the Hello's rule wins
        ({"v": "one"}, "MAJOR.MINOR"),
        ({"id": "no spaces"}, "node_id"),
        ({"round": "\u0661\u0662"}, "round"),  # Arabic-Indic "12": int() reads it, the contract does not
        ({"round": "12\n"}, "round"),
        ({"density": "0.\u0665"}, "density"),  # "0.5" in Arabic-Indic digits
        ({"fleet": "lab.1"}, "fleet"),
        ({"fp": "A" * 200}, "fingerprint"),  # the right alphabet, not the format net/tls.py produces
        ({"fp": "sha256:" + "AB" * 32}, "fingerprint"),  # upper case: tls.py writes lower
        ({"fp": "sha256:" + "ab" * 31}, "fingerprint"),
        ({"fp": "sha256:" + "ab" * 32 + "\n"}, "fingerprint"),
    ],
)
def test_malformed_txt_values_are_refused_with_the_reason(override: dict[str, str | None], message: str) -> None:
    props: dict[str, str | None] = {**encode_txt(FIELDS), **override}
    with pytest.raises(DiscoveryError, match=message):
        parse_txt(_raw(props))


@pytest.mark.parametrize("key", ["v", "id", "fleet", "arch", "tier", "density", "round"])
def test_txt_missing_a_key_is_refused(key: str) -> None:
    props = dict(encode_txt(FIELDS))
    del props[key]
    with pytest.raises(DiscoveryError, match=f"lacks key.*{key}"):
        parse_txt(_raw(props))


def test_txt_non_utf8_and_oversize_values_are_refused() -> None:
    raw = _raw(dict(encode_txt(FIELDS)))
    with pytest.raises(DiscoveryError, match="not UTF-8"):
        parse_txt({**raw, b"tier": b"t\xe9"})
    with pytest.raises(DiscoveryError, match="longer than 255"):
        parse_txt({**raw, b"fp": b"a" * 300})


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from([k.encode() for k in TXT_KEYS] + [b"x", b"\xff"]),
        st.one_of(st.none(), st.binary(max_size=300), st.sampled_from([b"0.5", b"7", b"1.0", b"lab", b""])),
    )
)
def test_any_txt_either_parses_or_raises_discovery_error(raw: dict[bytes, bytes | None]) -> None:
    try:
        fields = parse_txt(raw)
    except DiscoveryError:
        return
    identity = fields.identity
    assert identity.density is not None and identity.round is not None
    assert 0 < identity.density <= 1 and math.isfinite(identity.density) and identity.round >= 0


@pytest.mark.parametrize(
    "override",
    [
        {"node_id": "a.b"},
        {"node_id": ""},
        {"fleet_id": "x" * 64},
        {"density": 0.0},
        {"density": float("nan")},
        {"density": True},
        {"round": -1},
        {"round": 1.5},
        {"tier": "two words"},
        {"protocol_version": "1"},
        {"arch_id": "cnn:10:3f2a"},
    ],
)
def test_own_bad_values_are_config_errors_quoting_the_value(override: dict[str, object]) -> None:
    with pytest.raises(ConfigError, match="=|version"):
        encode_txt(_fields(**override))


def test_values_not_known_yet_travel_in_txt_as_today() -> None:
    """No architecture is ``arch=``, no tier ``tier=unknown`` (``probe``: an older ``--announce``): None inside."""
    props = encode_txt(_fields(arch_id=None, tier=None))
    assert (props["arch"], props["tier"]) == ("", "unknown")
    assert parse_txt(_raw(props)).identity == dataclasses.replace(FIELDS.identity, arch_id=None, tier=None)
    assert parse_txt(_raw({**props, "tier": "probe"})).identity.tier is None


# -- peer table ------------------------------------------------------------------------------------
def test_peer_table_tells_listeners_about_real_changes_only() -> None:
    table = PeerTable()
    events: list[tuple[PeerEvent, str, int]] = []
    table.add_listener(lambda event, peer: events.append((event, peer.name, peer.identity.round)))
    first = _peer(round=1)
    assert table.upsert("k", first) is PeerEvent.ADDED
    assert table.upsert("k", dataclasses.replace(first, last_seen=first.last_seen + 5)) is None  # a refresh
    assert table.upsert("k", _peer(round=2)) is PeerEvent.UPDATED
    assert table.remove("k") is not None and table.remove("k") is None
    assert events == [(PeerEvent.ADDED, "p1", 1), (PeerEvent.UPDATED, "p1", 2), (PeerEvent.REMOVED, "p1", 2)]


def test_a_failing_listener_does_not_break_the_table() -> None:
    table = PeerTable()
    seen: list[str] = []

    def broken(event: PeerEvent, peer: PeerInfo) -> None:
        raise RuntimeError("listener bug")

    table.add_listener(broken)
    table.add_listener(lambda event, peer: seen.append(peer.name))
    table.upsert("k", _peer())
    assert seen == ["p1"] and [p.name for p in table.snapshot()] == ["p1"]


def test_wait_for_is_bounded_and_wakes_on_change() -> None:
    table = PeerTable()
    t0 = time.monotonic()
    assert table.wait_for(lambda peers: len(peers) == 1, 0.2) == []
    assert 0.15 < time.monotonic() - t0 < 2.0
    table.upsert("k", _peer())
    assert len(table.wait_for(lambda peers: len(peers) == 1, 5.0)) == 1


def test_peer_endpoint_and_json() -> None:
    assert _peer().endpoint == "10.0.0.2:7000"
    assert _peer(addresses=["fd00::2"]).endpoint == "[fd00::2]:7000"
    data = _peer().to_json()
    assert data["endpoint"] == "10.0.0.2:7000" and "last_seen" not in data and data["age_s"] >= 0
    json.dumps(data)


def test_format_table_lists_the_operator_columns() -> None:
    text = format_table([_peer("pi-1", round=3, density=0.25), _peer("pi-2")])
    header, row1, row2 = text.splitlines()
    assert header.split() == ["ID", "ADDRESS", "FLEET", "TIER", "DENSITY", "ROUND", "VERSION"]
    assert row1.split() == ["pi-1", "10.0.0.2:7000", "lab", "t3", "0.25", "3", "1.0"]
    assert row2.split()[0] == "pi-2"


def test_format_static_prints_peers_in_the_syntax_of_peers_files() -> None:
    peers = [_peer("pi-1"), _peer("pi-2", addresses=["fd00::4", "10.0.0.9"], port=7002)]
    text = format_static(peers)
    assert text.splitlines() == ["pi-1@10.0.0.2:7000", "pi-2@[fd00::4]:7002"]
    assert [str(p) for p in parse_peers(text.splitlines())] == text.splitlines()


# -- static discovery ------------------------------------------------------------------------------
def test_parse_peers_accepts_hosts_ipv4_and_bracketed_ipv6() -> None:
    assert parse_peers("pi-1.lan:7000, 10.0.0.3:7001,[fd00::4]:7002 10.0.0.3:7001") == [
        ("pi-1.lan", 7000, None),
        ("10.0.0.3", 7001, None),
        ("fd00::4", 7002, None),
    ]


@pytest.mark.parametrize(
    "spec", ["pi-1", "pi-1:", "pi-1:0", "pi-1:70000", "pi-1:x", "fd00::4:7000", "[fd00::zz]:1", "bad_host:1", ":7"]
)
def test_parse_peers_refuses_bad_items_quoting_them(spec: str) -> None:
    with pytest.raises(ConfigError, match="peer"):
        parse_peers(spec)


def test_peers_file_with_comments(tmp_path: Path) -> None:
    path = tmp_path / "peers.txt"
    path.write_text("# the lab fleet\npi-1:7000\n\n10.0.0.3:7001  # spare\n[fd00::4]:7002,pi-5:7000\n")
    assert read_peers_file(path) == [
        ("pi-1", 7000, None),
        ("10.0.0.3", 7001, None),
        ("fd00::4", 7002, None),
        ("pi-5", 7000, None),
    ]
    path.write_text("pi-1:7000\nnonsense\n")
    with pytest.raises(ConfigError, match="peers.txt.*nonsense"):
        read_peers_file(path)
    with pytest.raises(DiscoveryError, match="cannot read"):
        read_peers_file(tmp_path / "absent.txt")


def test_static_discovery_lists_configured_peers_and_learns_from_hello(tmp_path: Path) -> None:
    path = tmp_path / "peers"
    path.write_text("10.0.0.3:7000\n10.0.0.9:7000\n")
    events: list[tuple[PeerEvent, str]] = []
    with StaticDiscovery("10.0.0.2:7000", peers_file=path, node_id="me", fleet="lab", arch=ARCH) as disc:
        disc.add_listener(lambda event, peer: events.append((event, peer.name)))
        assert [p.endpoint for p in disc.peers()] == ["10.0.0.2:7000", "10.0.0.3:7000", "10.0.0.9:7000"]
        assert {p.identity for p in disc.peers()} == {NodeIdentity()}  # not heard from: nothing known yet
        assert disc.record_hello("10.0.0.2", 7000, _peer("pi-2")) is True
        assert disc.record_hello("10.0.0.3", 7000, _peer("pi-3", fleet_id="other")) is False
        assert disc.record_hello("10.0.0.9", 7000, _peer("me")) is False  # a fleet-wide file lists us too
        assert [p.name for p in disc.peers()] == ["pi-2"]
        assert disc.record_hello("10.0.0.2", 7000, _peer("pi-2", protocol_version="2.0")) is False
        assert disc.peers() == []
        with pytest.raises(ConfigError, match="not one of the configured"):
            disc.record_hello("10.9.9.9", 1, _peer())
        disc.update(round=5, density=0.4)
        assert disc.identity.round == 5 and disc.identity.density == 0.4
    assert events == [
        (PeerEvent.UPDATED, "pi-2"),
        (PeerEvent.REMOVED, "10.0.0.3:7000"),
        (PeerEvent.REMOVED, "10.0.0.9:7000"),
        (PeerEvent.REMOVED, "pi-2"),
    ]
    assert disc.peers() == []


def test_static_filter_on_architecture_and_empty_config() -> None:
    disc = StaticDiscovery(["10.0.0.2:7000"], fleet="lab", arch=ARCH)
    disc.start()
    assert disc.record_hello("10.0.0.2", 7000, _peer("pi-2", arch_id="vgg11/10/00000000")) is False
    disc.stop()
    with pytest.raises(ConfigError, match="at least one peer"):
        StaticDiscovery("")


# -- mDNS arguments (no sockets are opened) --------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"node_id": "bad id", "port": 7000, "fleet": "lab"}, "node_id='bad id'"),
        ({"node_id": "n1", "fleet": "lab"}, "port=None"),
        ({"node_id": "n1", "port": 70000, "fleet": "lab"}, "port=70000"),
        ({"node_id": "n1", "port": 7000}, "needs a fleet"),
        ({"ttl_s": 0}, "ttl_s=0"),
        ({"ttl_s": 2.5}, "ttl_s=2.5"),
        ({"min_update_interval_s": -1}, "min_update_interval_s=-1"),
        ({"interfaces": ["no-such-nic0"]}, "'no-such-nic0'"),
        ({"interfaces": ["lo"], "ipv6": True, "node_id": "n1", "port": 1, "fleet": "lab", "density": 2}, "density=2"),
    ],
)
def test_mdns_checks_arguments_at_the_entry(kwargs: dict[str, object], message: str) -> None:
    kwargs.setdefault("interfaces", ["127.0.0.1"])
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        MdnsDiscovery(**kwargs)  # type: ignore[arg-type]


def test_browse_only_discovery_cannot_update() -> None:
    disc = MdnsDiscovery(interfaces=["127.0.0.1"])
    with pytest.raises(ConfigError, match="needs a node_id"):
        disc.update(round=1)
    disc.stop()  # never started: a no-op


def test_resolve_interfaces_expands_names_and_keeps_addresses() -> None:
    assert resolve_interfaces(["lo"]) == ["127.0.0.1"]
    assert resolve_interfaces(["127.0.0.1", "lo"]) == ["127.0.0.1"]
    assert resolve_interfaces(["fd00::1"]) == ["fd00::1"]
    with pytest.raises(ConfigError, match="interface"):
        resolve_interfaces([])


ROUTE = """Iface	Destination	Gateway 	Flags	RefCnt	Use	Metric	Mask		MTU	Window	IRTT
eth0	00000000	0100A8C0	0003	0	0	100	00000000	0	0	0
eth0	0000A8C0	00000000	0001	0	0	100	00FFFFFF	0	0	0
wlan0	00000000	0101A8C0	0003	0	0	600	00000000	0	0	0
"""
IPV6_ROUTE = (
    "00000000000000000000000000000000 00 00000000000000000000000000000000 00 fe800000000000000000000000000001"
    " 00000400 00000001 00000000 00000003     eth0\n"
    "fe800000000000000000000000000000 40 00000000000000000000000000000000 00 00000000000000000000000000000000"
    " 00000100 00000001 00000000 00000001     eth0\n"
    "00000000000000000000000000000000 00 00000000000000000000000000000000 00 00000000000000000000000000000000"
    " ffffffff 00000001 00000000 00200200       lo\n"
)


def test_peer_addresses_come_routable_first_in_a_stable_order() -> None:
    newest_first = ["fe80::1%3", "fd00::2", "10.0.0.2", "fd00::2"]
    assert _usable_order(newest_first) == ["10.0.0.2", "fd00::2", "fe80::1%3"]
    assert _usable_order(list(reversed(newest_first))) == _usable_order(newest_first)
    assert _usable_order(["fe80::1", "10.0.0.2"], scope="eth0") == ["10.0.0.2", "fe80::1%eth0"]


def test_default_route_interfaces_from_recorded_route_tables() -> None:
    assert parse_default_routes(ROUTE) == ["eth0", "wlan0"]
    assert parse_default_routes(IPV6_ROUTE, ipv6=True) == ["eth0"]
    assert parse_default_routes("Iface\tDestination\n") == []


def test_protocol_version_and_defaults_agree() -> None:
    assert protocol_major(PROTOCOL_VERSION) == 1
    assert CLI_DEFAULT_TTL_S == DEFAULT_TTL_S
    assert CLI_DEFAULT_MAX_PEERS == DEFAULT_MAX_PEERS


# -- CLI argument errors (exit 2, one line, nothing opened) ----------------------------------------
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--timeout", "1", "--watch"], "--timeout and --watch exclude each other"),
        (["--json", "--static"], "--json and --static exclude each other"),
        (["--max-peers", "0"], "--max-peers"),
        (["--announce", "A", "--fleet", "lab"], "--announce needs --fleet ID and --port P"),
        (["--port", "7000"], "--port is only used with --announce"),
        (["--interface", "no-such-nic0", "--timeout", "1"], "no-such-nic0"),
        (["--announce", "bad id", "--fleet", "lab", "--port", "1", "--interface", "127.0.0.1"], "bad id"),
    ],
)
def test_cli_peers_refuses_bad_arguments(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["peers", *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_the_fingerprint_tls_produces_is_what_txt_accepts(tmp_path: Path) -> None:
    """One rule: the ``fp`` a TLS node advertises parses, so the exact format refuses nobody honest."""
    ca_cert, ca_key = create_ca("lab")
    cert, _key = issue_certificate(ca_cert, ca_key, "pi-07")
    fingerprint = certificate_fingerprint(cert)
    props = encode_txt(dataclasses.replace(FIELDS, fingerprint=fingerprint))
    assert parse_txt(_raw(props)).fingerprint == fingerprint
