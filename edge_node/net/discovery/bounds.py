"""What keeps a hostile network from hurting discovery: refusal counters, a query budget, an address policy.

Nothing here opens a socket or starts a thread; :mod:`edge_node.net.discovery.peer_book` and the
discovery classes use these pieces, and the tests exercise them directly.
"""

from __future__ import annotations

import collections
import ipaddress
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterable, Sequence

import psutil

from edge_node.errors import ConfigError
from edge_node.net.host_rate import refill

_LOGGER = logging.getLogger(__name__)

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# Reasons a record, an advertisement or a peer was refused: the keys of ``Discovery.refusals()``.
REFUSAL_REASONS: dict[str, str] = {
    "bad_name": "a PTR alias that is not <node-id>._edge-node._tcp.local. (another service type, a bad label)",
    "table_full": "a newcomer while the table was full of peers that may not be evicted",
    "pending_full": "a newcomer while the bounded set of names being resolved was full",
    "cooldown": "a name dropped a moment ago (unresolved, evicted or broken) came back before its cooldown ended",
    "unresolved": "a name whose SRV/TXT/address never arrived after the bounded resolve attempts",
    "bad_txt": "a malformed TXT record, or a TXT id that does not match the instance name",
    "other_fleet": "a peer of another fleet",
    "other_version": "a peer of another protocol major version (or a malformed version)",
    "other_arch": "a peer of another model architecture",
    "bad_address": "an address that is not unicast (unspecified, multicast, broadcast, reserved, loopback)",
    "foreign_subnet": "an address outside the allowed subnets (by default the node's own interfaces' subnets)",
    "bad_port": "a port outside 1..65535",
    "evicted": "a listed peer that failed its pulls, made room for a newcomer",
    "evicted_unproven": "a name that never answered a pull, tracked longest past its probation, made room",
    "conflict": "a goodbye or an SRV naming another host/port for a listed peer: it was challenged (asked again)",
    "error": "a record whose processing raised; it was dropped and the pass went on",
    "query_budget": "a query (resolve, refresh, browse) deferred because the global query budget was spent",
    "self": "a static peer that turned out to be this node, or a learned entry naming this node",
    "id_mismatch": "a static ID@HOST:PORT peer whose Hello carried another node id; a learned entry whose Hello (or,"
    " under TLS, certificate) is another node's",
    "pex_too_many": "entries of one peer-exchange reply beyond the 64 read",
    "pex_bad_entry": "a learned entry with a malformed node id, fingerprint, or a host that is not an IP address",
    "pex_source_full": "a learned entry beyond the unverified ones one peer's lists may hold",
    "pex_host_full": "a learned entry beyond the unverified endpoints one IP address may have (a victim's ports)",
    "pex_dial_budget": "a learned entry that did not answer its bounded Hellos: dropped, then kept out a while",
}


class RefusalCounter:
    """Thread-safe counts of refusals by reason (see :data:`REFUSAL_REASONS`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: collections.Counter[str] = collections.Counter()

    def add(self, reason: str, n: int = 1) -> None:
        with self._lock:
            self._counts[reason] += n

    def snapshot(self) -> dict[str, int]:
        """A copy, sorted by reason; reasons never counted are absent."""
        with self._lock:
            return dict(sorted(self._counts.items()))


class TokenBucket:
    """A budget of ``rate_per_s`` tokens per second, at most ``burst`` saved up; not thread-safe.

    Args:
        rate_per_s: tokens added per second (> 0).
        burst: the most tokens held at once (>= 1); the bucket starts full.
        clock: seconds, monotonic.
    """

    def __init__(self, rate_per_s: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        if not (isinstance(rate_per_s, (int, float)) and 0 < rate_per_s <= 1000):
            raise ConfigError(f"query_rate={rate_per_s!r} must be a number of queries per second in (0, 1000]")
        if isinstance(burst, bool) or not isinstance(burst, int) or not 1 <= burst <= 1000:
            raise ConfigError(f"query_burst={burst!r} must be an integer in [1, 1000]")
        self.rate_per_s = float(rate_per_s)
        self.burst = burst
        self._clock = clock
        self._tokens = float(burst)
        self._at = clock()

    def _fill(self) -> None:
        now = self._clock()
        self._tokens = refill(self._tokens, now - self._at, self.rate_per_s, self.burst)
        self._at = now

    def take(self, n: int = 1) -> bool:
        """Spend ``n`` tokens if there are that many; False (nothing spent) otherwise."""
        self._fill()
        if self._tokens + 1e-9 < n:
            return False
        self._tokens -= n
        return True

    def available(self) -> float:
        self._fill()
        return self._tokens


class LogLimiter:
    """Say each (name, reason) once, and at most ``rate_per_s`` lines per second overall; thread-safe.

    The memory of what was said is bounded (``memory`` entries, oldest forgotten first), so a flood
    of distinct names costs at most that much and is logged at the budget's pace, not per packet.
    """

    def __init__(self, rate_per_s: float = 5.0, burst: int = 50, memory: int = 1024) -> None:
        self._lock = threading.Lock()
        self._bucket = TokenBucket(rate_per_s, burst)
        self._said: collections.OrderedDict[tuple[str, str], None] = collections.OrderedDict()
        self._memory = memory
        self.suppressed = 0

    def allow(self, name: str, reason: str) -> bool:
        key = (name.lower(), reason)
        with self._lock:
            if key in self._said:
                return False
            if not self._bucket.take():
                self.suppressed += 1
                return False
            self._said[key] = None
            if len(self._said) > self._memory:
                self._said.popitem(last=False)
            return True

    def forget(self, name: str) -> None:
        """Allow ``name``'s reasons to be said again (it was listed, so a new refusal is news)."""
        lowered = name.lower()
        with self._lock:
            for key in [k for k in self._said if k[0] == lowered]:
                del self._said[key]


def parse_networks(subnets: Iterable[str]) -> list[IPNetwork]:
    """CIDR strings (``10.0.0.0/24``, ``fd00::/64``) as networks; ConfigError quoting a bad one."""
    if isinstance(subnets, str):
        raise ConfigError(f"allowed_subnets={subnets!r} must be a list of CIDR strings, not one string")
    out: list[IPNetwork] = []
    for item in subnets:
        try:
            out.append(ipaddress.ip_network(item, strict=False))
        except (TypeError, ValueError):
            raise ConfigError(f"allowed_subnets item {item!r} is not a subnet like 10.0.0.0/24 or fd00::/64") from None
    return out


def _network_of(address: str, netmask: str | None) -> IPNetwork | None:
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return None
    if netmask is None:
        prefix: int = 64 if ip.version == 6 and ip.is_link_local else ip.max_prefixlen
        return ipaddress.ip_network(f"{ip}/{prefix}", strict=False)
    try:
        return ipaddress.ip_network(f"{ip}/{netmask}", strict=False)
    except ValueError:  # psutil gives IPv6 masks as ffff:ffff::, which ip_network does not take
        try:
            prefix = bin(int(ipaddress.ip_address(netmask))).count("1")
        except ValueError:
            return None
        return ipaddress.ip_network(f"{ip}/{prefix}", strict=False)


def own_networks(bound_addresses: Sequence[str]) -> list[IPNetwork]:
    """The subnets of the interfaces that hold ``bound_addresses`` (all their IPv4 and IPv6 addresses)."""
    wanted = set()
    for address in bound_addresses:
        try:
            wanted.add(ipaddress.ip_address(address.split("%", 1)[0]))
        except ValueError:
            continue
    out: list[IPNetwork] = []
    for nic_addrs in psutil.net_if_addrs().values():
        ips = []
        for nic_addr in nic_addrs:
            if nic_addr.family not in (socket.AF_INET, socket.AF_INET6):
                continue
            ips.append(nic_addr)
        holds = False
        for nic_addr in ips:
            try:
                holds = holds or ipaddress.ip_address(nic_addr.address.split("%", 1)[0]) in wanted
            except ValueError:
                continue
        if not holds:
            continue
        for nic_addr in ips:
            network = _network_of(nic_addr.address, nic_addr.netmask)
            if network is not None and network not in out:
                out.append(network)
    return out


class AddressPolicy:
    """Which peer addresses and ports discovery may list.

    Only unicast addresses: never unspecified (0.0.0.0, ::), multicast, broadcast, reserved, the
    "this network" block 0.0.0.0/8, nor a subnet's own network or broadcast address; loopback only
    when ``allow_loopback`` (the node itself is bound to loopback). With ``networks`` (not None),
    only addresses inside one of them.
    """

    def __init__(self, networks: Sequence[IPNetwork] | None, *, allow_loopback: bool) -> None:
        self.networks = None if networks is None else list(networks)
        self.allow_loopback = allow_loopback
        self._edges: set[IPAddress] = set()
        for network in self.networks or ():
            if network.version == 4 and network.prefixlen <= 30:
                self._edges.update((network.network_address, network.broadcast_address))

    @classmethod
    def for_addresses(
        cls,
        bound_addresses: Sequence[str],
        *,
        allowed_subnets: Sequence[str] | None,
        own_subnets_only: bool,
    ) -> AddressPolicy:
        """The policy of a node bound to ``bound_addresses``.

        ``allowed_subnets`` (CIDR strings), when given, are the subnets peers may be in; otherwise,
        with ``own_subnets_only``, the subnets of the bound interfaces; otherwise any unicast address.
        """
        allow_loopback = any(_is_loopback(a) for a in bound_addresses)
        if allowed_subnets is not None:
            return cls(parse_networks(allowed_subnets), allow_loopback=allow_loopback)
        if not own_subnets_only:
            return cls(None, allow_loopback=allow_loopback)
        networks = own_networks(bound_addresses)
        if not networks:
            _LOGGER.warning(
                "no subnet found for %s; peers are not limited to the node's own subnets", ", ".join(bound_addresses)
            )
            return cls(None, allow_loopback=allow_loopback)
        return cls(networks, allow_loopback=allow_loopback)

    def check(self, address: str) -> str | None:
        """The refusal reason for ``address`` (``bad_address``, ``foreign_subnet``), or None if usable."""
        try:
            ip = ipaddress.ip_address(address.split("%", 1)[0])
        except ValueError:
            return "bad_address"
        if ip.is_unspecified or ip.is_multicast:
            return "bad_address"
        if ip.is_loopback:
            if not self.allow_loopback:
                return "bad_address"
        elif isinstance(ip, ipaddress.IPv4Address):
            if ip.is_reserved or ip in _THIS_NETWORK or ip == _BROADCAST:
                return "bad_address"
        elif ip in _V6_RESERVED:
            return "bad_address"
        if ip in self._edges:
            return "bad_address"
        if self.networks is not None and not any(ip in network for network in self.networks):
            return "foreign_subnet"
        return None

    @staticmethod
    def check_port(port: object) -> str | None:
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            return "bad_port"
        return None


_THIS_NETWORK = ipaddress.ip_network("0.0.0.0/8")
_BROADCAST = ipaddress.ip_address("255.255.255.255")
_V6_RESERVED = ipaddress.ip_network("::/8")  # unspecified, loopback (handled first), v4-compatible, mapped


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.split("%", 1)[0]).is_loopback
    except ValueError:
        return False
