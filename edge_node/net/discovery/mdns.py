"""mDNS / DNS-SD discovery on python-zeroconf: advertise this node, browse for peers, keep the table live.

The node is ``<node-id>._edge-node._tcp.local.`` with SRV/A(AAAA) records for ``<node-id>.local.`` and
the TXT keys of :mod:`edge_node.net.discovery.txt`. zeroconf receives and parses the packets and
answers for this node; every record it receives is handed (on its event loop, O(1) work per record)
to a bounded :class:`~edge_node.net.discovery.peer_book.PeerBook`, and a worker thread sweeps the
book every ``sweep_interval_s`` or when it changed:

* a peer is listed while its SRV record is live and its TXT parses and passes the filter (fleet,
  protocol major, architecture) and it has a usable unicast address (by default in one of the
  node's own subnets) and port;
* a goodbye (TTL 0) removes it at once;
* a crashed peer is removed when its SRV record expires. Live peers are kept by re-querying their
  SRV/TXT/address from half of the TTL on (RFC 6762 5.2 does the same from 80 %); any node's query
  refreshes every listener on the link, so the traffic does not grow with the number of listeners.

A hostile network cannot grow the work or the memory: the book tracks at most ``max_peers`` names
(peers that answered pulls, see :meth:`MdnsDiscovery.record_pull`, are never evicted for
newcomers), resolves at most ``max_pending`` names at a time with per-name backoff, and every query
this node sends (resolve, refresh, browse) spends a token of one budget of ``query_rate`` per
second. Refusals are counted by reason (:meth:`MdnsDiscovery.refusals`).

Own TXT changes (``update``) are coalesced and re-announced at most once per ``min_update_interval_s``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import ipaddress
import logging
import random
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import psutil
from zeroconf import (
    DNSOutgoing,
    IPVersion,
    NonUniqueNameException,
    RecordUpdate,
    RecordUpdateListener,
    ServiceInfo,
    Zeroconf,
    current_time_millis,
)
from zeroconf import (
    Error as ZeroconfError,
)

from edge_node.errors import ConfigError, DiscoveryError
from edge_node.net.discovery.bounds import AddressPolicy, TokenBucket
from edge_node.net.discovery.peer_book import (
    DEFAULT_COOLDOWN_S,
    DEFAULT_EVICT_AFTER_FAILURES,
    DEFAULT_MAX_PEERS,
    DEFAULT_MAX_PENDING,
    DEFAULT_PROBATION_S,
    DEFAULT_PROVEN_FOR_S,
    DEFAULT_QUERY_BURST,
    DEFAULT_QUERY_RATE,
    SERVICE_TYPE,
    BookLimits,
    PeerBook,
    Sweep,
)
from edge_node.net.discovery.peer_table import Discovery
from edge_node.net.discovery.txt import TxtFields, check_fingerprint, check_identity, check_port, encode_txt
from edge_node.protocol import PROTOCOL_VERSION, NodeIdentity

_LOGGER = logging.getLogger(__name__)

DEFAULT_TTL_S = 120  # RFC 6762's TTL for host records; a crashed peer is listed at most this long
DEFAULT_MIN_UPDATE_INTERVAL_S = 5.0  # at most one TXT re-announcement per this many seconds
MAX_TTL_S = 4500  # RFC 6762's TTL for other records
_STOP_TIMEOUT_S = 5.0  # bound on joining the worker thread at stop()
_MIN_SWEEP_GAP_S = 0.05  # sweeps woken by records come at most this often (a flood wakes it per packet)
_BROWSE_AT_S = (1.0, 4.0, 9.0)  # after the first browse (20-120 ms after start), as zeroconf's browser does
_BROWSE_EVERY_S = 900.0  # then once per this (finds peers whose announcement was lost)
_ROOM_BROWSE_GAP_S = 10.0  # and, after newcomers were refused for room, once the table has room again
_SUMMARY_EVERY_S = 60.0  # refusals are summarised in the log at most this often


def parse_default_routes(route_table: str, *, ipv6: bool = False) -> list[str]:
    """Interface names with a default route in ``/proc/net/route`` (or ``/proc/net/ipv6_route``) text."""
    names: set[str] = set()
    for line in route_table.splitlines():
        fields = line.split()
        if ipv6:  # dest, dest prefix len, src, src prefix len, next hop, metric, refcnt, use, flags, iface
            if len(fields) >= 10 and fields[0] == "0" * 32 and fields[1] == "00" and fields[9] != "lo":
                names.add(fields[9])
        elif len(fields) >= 8 and fields[1] == "00000000" and fields[7] == "00000000":  # dest and mask 0
            names.add(fields[0])
    return sorted(names)


def default_route_interfaces(*, ipv6: bool = False) -> list[str]:
    """Names of the interfaces that carry a default route (the device's LAN)."""
    path = Path("/proc/net/ipv6_route" if ipv6 else "/proc/net/route")
    try:
        return parse_default_routes(path.read_text(), ipv6=ipv6)
    except OSError as exc:
        raise DiscoveryError(f"cannot read {path} to pick interfaces: {exc}") from None


def resolve_interfaces(interfaces: Sequence[str] | None, *, ipv6: bool = False) -> list[str]:
    """The IP addresses mDNS binds to and advertises.

    Args:
        interfaces: interface names or IP addresses; None picks the interfaces with a default route.
        ipv6: take IPv6 addresses of named interfaces (and of the default ones) instead of IPv4.

    Raises:
        ConfigError: an unknown interface, a name without an address of the asked family, or
            no interface at all.
    """
    family = socket.AF_INET6 if ipv6 else socket.AF_INET
    names = list(interfaces) if interfaces is not None else default_route_interfaces(ipv6=ipv6)
    if not names:
        raise ConfigError("no interface with a default route; name one with --interface NAME|ADDR")
    nic_addrs = psutil.net_if_addrs()
    out: list[str] = []
    for item in names:
        if not isinstance(item, str) or not item:
            raise ConfigError(f"interface={item!r} must be an interface name or an IP address")
        try:
            literal = ipaddress.ip_address(item.split("%", 1)[0])
        except ValueError:
            literal = None
        if literal is not None:
            found = [str(literal)]
        elif item in nic_addrs:
            found = [a.address.split("%", 1)[0] for a in nic_addrs[item] if a.family == family]
            if not found:
                kind = "IPv6" if ipv6 else "IPv4"
                raise ConfigError(f"interface {item!r} has no {kind} address")
        else:
            raise ConfigError(f"interface {item!r} is neither an IP address nor a network interface here")
        out.extend(a for a in found if a not in out)
    return out


def _ip_version(addresses: Sequence[str]) -> IPVersion:
    versions = {ipaddress.ip_address(a).version for a in addresses}
    if versions == {4}:
        return IPVersion.V4Only
    if versions == {6}:
        return IPVersion.V6Only
    return IPVersion.All


def _interface_of(addresses: Sequence[str]) -> str | None:
    """The one interface holding all the given IPv6 addresses, or None (none, or several)."""
    wanted = {ipaddress.ip_address(a) for a in addresses if ipaddress.ip_address(a).version == 6}
    if not wanted:
        return None
    owners = set()
    for name, nic_addrs in psutil.net_if_addrs().items():
        for nic_addr in nic_addrs:
            if nic_addr.family == socket.AF_INET6 and ipaddress.ip_address(nic_addr.address.split("%", 1)[0]) in wanted:
                owners.add(name)
    return owners.pop() if len(owners) == 1 else None


class _BookListener(RecordUpdateListener):
    """Hands every record zeroconf receives to the book (on zeroconf's loop) and wakes the worker."""

    def __init__(self, book: PeerBook, wake: threading.Event) -> None:
        super().__init__()
        self._book = book
        self._wake = wake

    def async_update_records(self, zc: Zeroconf, now: float, records: list[RecordUpdate]) -> None:
        try:
            changed = self._book.observe([update.new for update in records], now)
        except Exception:  # never break zeroconf's record processing
            self._book.refusals.add("error")
            _LOGGER.exception("mDNS records could not be taken in; skipped")
            return
        if changed:
            self._wake.set()

    def async_update_records_complete(self) -> None:
        return None


class MdnsDiscovery(Discovery):
    """Advertise this node (when ``node_id`` is given) and browse the same service type.

    Args:
        node_id: this node's id (DNS-SD instance name); None only browses (``edge-node peers``).
        port: the gRPC port peers connect to (needed with ``node_id``).
        fleet: fleet id; peers of other fleets are ignored. None (browse only) lists every fleet.
        arch: model architecture id; when set, peers with another one are ignored.
        tier, density, round, fingerprint: the rest of this node's TXT record.
        interfaces: interface names or addresses to bind; None: those with a default route.
        ipv6: use IPv6 addresses of named interfaces (IPv4 by default).
        ttl_s: TTL of this node's records, so the time a crashed node stays in others' tables.
        min_update_interval_s: at most one TXT re-announcement per this many seconds.
        sweep_interval_s: how often the table is reconciled with the records; default from ``ttl_s``.
        max_peers: the most peers tracked (listed or being checked); newcomers beyond it are refused.
        max_pending: the most names at a time whose SRV/TXT/address are being asked for.
        query_rate, query_burst: the budget of every query this node sends for discovery (packets
            per second, and how many may be saved up); PTR floods never make it query faster.
        allowed_subnets: CIDR subnets peers' addresses must be in (replaces ``own_subnets_only``).
        own_subnets_only: list only peers with an address in the subnets of the bound interfaces.
        evict_after_failures: failed pulls in a row that make an unproven listed peer evictable.
        proven_for_s: how long a successful pull protects a peer from eviction.
        cooldown_s: how long a name dropped as unresolved, evicted or broken is ignored.
        probation_s: how long a name that never answered a pull keeps its slot against newcomers
            (the longest a burst of fake services can keep a real newcomer out, plus one room browse).
    """

    def __init__(
        self,
        node_id: str | None = None,
        port: int | None = None,
        *,
        fleet: str | None = None,
        arch: str | None = None,
        tier: str | None = None,
        density: float = 1.0,
        round: int = 0,
        fingerprint: str | None = None,
        interfaces: Sequence[str] | None = None,
        ipv6: bool = False,
        ttl_s: int = DEFAULT_TTL_S,
        min_update_interval_s: float = DEFAULT_MIN_UPDATE_INTERVAL_S,
        sweep_interval_s: float | None = None,
        protocol_version: str = PROTOCOL_VERSION,
        max_peers: int = DEFAULT_MAX_PEERS,
        max_pending: int = DEFAULT_MAX_PENDING,
        query_rate: float = DEFAULT_QUERY_RATE,
        query_burst: int = DEFAULT_QUERY_BURST,
        allowed_subnets: Sequence[str] | None = None,
        own_subnets_only: bool = True,
        evict_after_failures: int = DEFAULT_EVICT_AFTER_FAILURES,
        proven_for_s: float = DEFAULT_PROVEN_FOR_S,
        cooldown_s: float = DEFAULT_COOLDOWN_S,
        probation_s: float = DEFAULT_PROBATION_S,
    ) -> None:
        identity = check_identity(
            NodeIdentity(protocol_version, node_id, fleet, arch or None, round=round, density=density, tier=tier)
        )
        if node_id is not None:
            if fleet is None:
                raise ConfigError(f"node_id={node_id!r} is advertised, so it needs a fleet")
            check_port(port)
        if isinstance(ttl_s, bool) or not isinstance(ttl_s, int) or not 1 <= ttl_s <= MAX_TTL_S:
            raise ConfigError(f"ttl_s={ttl_s!r} must be an integer number of seconds in [1, {MAX_TTL_S}]")
        if not (isinstance(min_update_interval_s, (int, float)) and 0 <= min_update_interval_s <= 3600):
            raise ConfigError(f"min_update_interval_s={min_update_interval_s!r} must be in [0, 3600]")
        if sweep_interval_s is None:
            sweep_interval_s = min(2.0, max(0.25, ttl_s / 8))
        if not (isinstance(sweep_interval_s, (int, float)) and 0.05 <= sweep_interval_s <= 60):
            raise ConfigError(f"sweep_interval_s={sweep_interval_s!r} must be in [0.05, 60]")
        if not isinstance(own_subnets_only, bool):
            raise ConfigError(f"own_subnets_only={own_subnets_only!r} must be true or false")
        self.limits = BookLimits(
            max_peers=max_peers,
            max_pending=max_pending,
            evict_after_failures=evict_after_failures,
            proven_for_s=proven_for_s,
            cooldown_s=cooldown_s,
            probation_s=probation_s,
        )
        TokenBucket(query_rate, query_burst)  # checks both values here, at the entry
        super().__init__(fleet=fleet, arch=arch or None, protocol_version=protocol_version)
        self.node_id = node_id
        self.port = port
        self.ttl_s = ttl_s
        self.min_update_interval_s = float(min_update_interval_s)
        self.sweep_interval_s = float(sweep_interval_s)
        self.query_rate = float(query_rate)
        self.query_burst = query_burst
        self.addresses = resolve_interfaces(interfaces, ipv6=ipv6)
        self.policy = AddressPolicy.for_addresses(
            self.addresses, allowed_subnets=allowed_subnets, own_subnets_only=own_subnets_only
        )
        self._ipv6_scope = _interface_of(self.addresses)
        self._fields: TxtFields | None = None
        if node_id is not None:
            self._fields = TxtFields(identity, check_fingerprint(fingerprint))
            encode_txt(self._fields)  # the 255-byte limit, checked once here
        self._own_name = f"{node_id}.{SERVICE_TYPE}" if node_id else None
        self._book = self._new_book()
        self._zc: Zeroconf | None = None
        self._listener: _BookListener | None = None
        self._info: ServiceInfo | None = None
        self._worker: threading.Thread | None = None
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._update_pending = False
        self._last_announce = 0.0
        self._announcing: concurrent.futures.Future[None] | None = None
        self._queries_sent = 0  # packets, all kinds (only the worker writes it)

    def _new_book(self) -> PeerBook:
        return PeerBook(
            self.limits,
            self.policy,
            self._refusals,
            own_name=self._own_name,
            peer_filter=self.rejection_reason,
            scope=self._ipv6_scope,
        )

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> None:
        """Open the sockets, start browsing, then probe for and announce this node's name.

        Raises:
            DiscoveryError: the sockets cannot be opened on the interfaces, or another node already
                uses this node id.
        """
        if self._zc is not None:
            return
        try:
            self._zc = Zeroconf(interfaces=list(self.addresses), ip_version=_ip_version(self.addresses))
        except (OSError, RuntimeError, ValueError) as exc:
            raise DiscoveryError(f"cannot open mDNS sockets on {', '.join(self.addresses)}: {exc}") from exc
        self._stopping.clear()
        try:
            self._book = self._new_book()
            self._listener = _BookListener(self._book, self._wake)
            self._zc.add_listener(self._listener, None)
            self._worker = threading.Thread(
                target=self._run, name=f"edge-node-discovery-{self.node_id or 'browser'}", daemon=True
            )
            self._worker.start()
            if self._fields is not None:
                self._info = self._service_info(self._fields)
                with self._lock:
                    self._update_pending = False  # registering announces the latest values anyway
                try:
                    self._zc.register_service(self._info)
                except NonUniqueNameException:
                    self._info = None
                    raise DiscoveryError(f"node id {self.node_id!r} is already advertised in this network") from None
                except ZeroconfError as exc:
                    self._info = None
                    raise DiscoveryError(f"cannot advertise {self.node_id!r}: {exc!r}") from exc
                self._last_announce = time.monotonic()
                _LOGGER.info(
                    "advertising %s on %s port %s (ttl %ss)",
                    self.node_id,
                    ", ".join(self.addresses),
                    self.port,
                    self.ttl_s,
                )
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Send goodbye packets, stop browsing and close the sockets; safe to call twice."""
        zc = self._zc
        if zc is None:
            return
        self._stopping.set()
        self._wake.set()
        if self._worker is not None:
            self._worker.join(_STOP_TIMEOUT_S)
            if self._worker.is_alive():  # a daemon thread: it cannot keep the process from exiting
                _LOGGER.warning("discovery worker did not end within %s s; stopping without it", _STOP_TIMEOUT_S)
            self._worker = None
        if self._listener is not None:
            zc.remove_listener(self._listener)
            self._listener = None
        if self._announcing is not None:
            self._announcing.cancel()  # queued on the loop before the goodbye below: no announcement after it
            self._announcing = None
        if self._info is not None:
            try:
                zc.unregister_service(self._info)  # the goodbye: our records with TTL 0
            except Exception as exc:  # a blocked loop must not keep the node from exiting
                _LOGGER.warning("goodbye for %s not sent: %s", self.node_id, exc)
            self._info = None
        zc.close()
        self._zc = None
        self._table.clear(notify=False)
        self._book.clear()

    def update(
        self,
        *,
        round: int | None = None,
        density: float | None = None,
        tier: str | None = None,
        fingerprint: str | None = None,
    ) -> None:
        """Change this node's TXT values; re-announced at most once per ``min_update_interval_s``.

        Several calls within one interval are coalesced into one announcement of the latest values.
        """
        if self._fields is None:
            raise ConfigError("update() needs a node_id: a browse-only discovery advertises nothing")
        with self._lock:
            fields = self._fields
            own = fields.identity
            new = TxtFields(
                check_identity(
                    replace(
                        own,
                        round=own.round if round is None else round,
                        density=own.density if density is None else density,
                        tier=own.tier if tier is None else tier,
                    )
                ),
                fields.fingerprint if fingerprint is None else check_fingerprint(fingerprint),
            )
            encode_txt(new)
            if new == fields:
                return
            self._fields = new
            self._update_pending = True
        self._wake.set()

    def record_pull(self, node_id: str, ok: bool) -> None:
        """How a pull from ``node_id`` went: success proves the peer, failures make it evictable."""
        if not isinstance(node_id, str) or not isinstance(ok, bool):
            raise TypeError(f"record_pull(node_id={node_id!r}, ok={ok!r}) needs a str and a bool")
        self._book.record_pull(node_id, ok)

    def is_proven(self, node_id: str) -> bool:
        """Whether ``node_id`` is listed and answered a pull within ``proven_for_s``."""
        return self._book.is_proven(node_id)

    def stats(self) -> dict[str, int]:
        """Sizes of the book (``tracked``, ``listed``, ``pending``, ``cooldown``) and ``queries_sent`` (packets)."""
        return {**self._book.sizes(), "queries_sent": self._queries_sent}

    # -- zeroconf glue -----------------------------------------------------------------------------
    def _service_info(self, fields: TxtFields) -> ServiceInfo:
        assert self.node_id is not None
        return ServiceInfo(
            SERVICE_TYPE,
            f"{self.node_id}.{SERVICE_TYPE}",
            port=self.port,
            properties=encode_txt(fields),
            server=f"{self.node_id}.local.",
            host_ttl=self.ttl_s,
            other_ttl=self.ttl_s,
            parsed_addresses=list(self.addresses),
        )

    def _run(self) -> None:
        """Worker thread: re-announce pending updates, sweep the book, browse, summarise refusals."""
        bucket = TokenBucket(self.query_rate, self.query_burst)
        start = time.monotonic()
        browse_at = [start + random.uniform(0.02, 0.12)]
        browse_at += [browse_at[0] + offset for offset in _BROWSE_AT_S]
        last_browse = -1e18
        next_sweep = start
        last_sweep = -1e18
        last_summary = start
        summarised = self._refusals.snapshot()
        while not self._stopping.is_set():
            now = time.monotonic()
            wake = min(next_sweep, browse_at[0] if browse_at else last_browse + _BROWSE_EVERY_S)
            if self._update_pending:
                wake = min(wake, self._last_announce + self.min_update_interval_s)
            woken = self._wake.wait(max(0.0, wake - now))
            self._wake.clear()
            if self._stopping.is_set():
                return
            try:
                now = time.monotonic()
                if self._update_pending and now >= self._last_announce + self.min_update_interval_s:
                    self._announce()
                if now >= next_sweep or woken:
                    if now - last_sweep >= _MIN_SWEEP_GAP_S:
                        sweep = self._book.sweep(current_time_millis(), bucket)
                        self._apply(sweep)
                        last_sweep = now
                        # at the interval, or sooner when a resolve, refresh or expiry falls due
                        next_sweep = max(now + _MIN_SWEEP_GAP_S, min(now + self.sweep_interval_s, sweep.next_due_s))
                    else:
                        next_sweep = min(next_sweep, last_sweep + _MIN_SWEEP_GAP_S)
                due = browse_at[0] if browse_at else last_browse + _BROWSE_EVERY_S
                room = self._book.capacity_refusals > 0 and now - last_browse >= _ROOM_BROWSE_GAP_S
                wanted = now >= due or (room and not browse_at and self._book.has_room())
                if wanted and self._browse(bucket):
                    last_browse = now
                    if browse_at and now >= browse_at[0]:
                        browse_at.pop(0)
                if now - last_summary >= _SUMMARY_EVERY_S:
                    summarised = self._summarise(summarised)
                    last_summary = now
            except Exception:  # discovery must outlive one bad record or a closing zeroconf
                if self._stopping.is_set():
                    return
                _LOGGER.exception("discovery worker step failed; continuing")
                next_sweep = time.monotonic() + self.sweep_interval_s

    def _apply(self, sweep: Sweep) -> None:
        for removal in sweep.removals:
            if self._table.remove(removal.key) is not None:
                _LOGGER.info("peer %s removed: %s", removal.node_id, removal.why)
        for key, peer in sweep.upserts:
            event = self._table.upsert(key, peer)
            if event is not None:
                _LOGGER.info("peer %s %s at %s (round %s)", peer.name, event.value, peer.endpoint, peer.identity.round)
        for out in sweep.queries:
            self._send(out)

    def _send(self, out: DNSOutgoing) -> None:
        zc = self._zc
        if zc is None:
            return
        self._queries_sent += len(out.packets())
        zc.send(out)

    def _browse(self, bucket: TokenBucket) -> bool:
        """Ask for the service type (known answers: the listed peers) if the budget allows."""
        out = self._book.browse_query(current_time_millis())
        if not bucket.take(len(out.packets())):
            self._refusals.add("query_budget")
            return False
        self._send(out)
        return True

    def _summarise(self, before: dict[str, int]) -> dict[str, int]:
        now = self._refusals.snapshot()
        delta = {k: v - before.get(k, 0) for k, v in now.items() if v != before.get(k, 0)}
        if delta:
            _LOGGER.info(
                "discovery refused in the last %.0f s: %s (table %s)",
                _SUMMARY_EVERY_S,
                ", ".join(f"{k}={v}" for k, v in delta.items()),
                self._book.sizes(),
            )
        return now

    def _announce(self) -> None:
        with self._lock:
            fields = self._fields
            self._update_pending = False
            self._last_announce = time.monotonic()
        zc = self._zc
        if zc is None or self._info is None or fields is None:
            return
        info = self._service_info(fields)
        if self._announcing is not None:
            self._announcing.cancel()  # the newer values supersede the rest of the older announcement
        assert zc.loop is not None
        # Not waited for: its three broadcasts take ~0.5 s, during which goodbyes and updates of
        # peers must still be applied. stop() cancels it before sending our goodbye.
        self._announcing = asyncio.run_coroutine_threadsafe(self._async_announce(zc, info), zc.loop)
        self._info = info
        own = fields.identity
        _LOGGER.debug("re-announcing %s: round %s density %s tier %s", own.node_id, own.round, own.density, own.tier)

    @staticmethod
    async def _async_announce(zc: Zeroconf, info: ServiceInfo) -> None:
        broadcasts = await zc.async_update_service(info)
        await broadcasts
