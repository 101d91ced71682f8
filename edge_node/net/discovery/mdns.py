"""mDNS / DNS-SD discovery on python-zeroconf: advertise this node, browse for peers, keep the table live.

The node is ``<node-id>._edge-node._tcp.local.`` with SRV/A(AAAA) records for ``<node-id>.local.`` and
the TXT keys of :mod:`edge_node.net.discovery.txt`. A worker thread reconciles the peer table with
zeroconf's record cache on every browser event and every ``sweep_interval_s``:

* a peer is listed while its SRV record is live and its TXT parses and passes the filter;
* a goodbye (TTL 0) removes it at once (the browser reports it);
* a crashed peer is removed when its SRV record expires. Receivers stretch PTR TTLs to at least
  1125 s (zeroconf's guard against refresh floods), so the SRV record, which keeps the advertiser's
  TTL, is what bounds the time a dead peer stays listed. Live peers are kept by re-querying their
  SRV/TXT from half of the TTL on (RFC 6762 5.2 does the same from 80 %); any node's query refreshes
  every cache on the link, so the traffic does not grow with the number of listeners.

Own TXT changes (``update``) are coalesced and re-announced at most once per ``min_update_interval_s``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import ipaddress
import logging
import math
import queue
import random
import socket
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import psutil
from zeroconf import (
    DNSOutgoing,
    DNSPointer,
    DNSQuestion,
    DNSService,
    IPVersion,
    NonUniqueNameException,
    ServiceBrowser,
    ServiceInfo,
    ServiceStateChange,
    Zeroconf,
    current_time_millis,
)
from zeroconf import (
    Error as ZeroconfError,
)

from edge_node.errors import ConfigError, DiscoveryError
from edge_node.net.discovery.peer_table import Discovery, PeerInfo
from edge_node.net.discovery.txt import (
    TxtFields,
    check_arch,
    check_density,
    check_fingerprint,
    check_fleet,
    check_node_id,
    check_port,
    check_protocol_version,
    check_round,
    check_tier,
    encode_txt,
    parse_txt,
)
from edge_node.protocol import PROTOCOL_VERSION

_LOGGER = logging.getLogger(__name__)

SERVICE_TYPE = "_edge-node._tcp.local."
DEFAULT_TTL_S = 120  # RFC 6762's TTL for host records; a crashed peer is listed at most this long
DEFAULT_MIN_UPDATE_INTERVAL_S = 5.0  # at most one TXT re-announcement per this many seconds
MAX_TTL_S = 4500  # RFC 6762's TTL for other records
_RESOLVE_TIMEOUT_MS = 3000  # how long one attempt to fetch a new peer's SRV/TXT/A waits
_REFRESH_FROM = 0.5  # fraction of a peer's TTL after which its records are re-queried
_REFRESH_EVERY = 0.1  # ... and again every this fraction of the TTL until they are fresh
_MIN_QUERY_GAP_S = 0.5  # never query one peer more often than this
_STOP_TIMEOUT_S = 5.0  # bound on joining the worker thread at stop()

# DNS numbers (RFC 1035, 2782, 3596): zeroconf keeps its constants private.
_TYPE_A = 1
_TYPE_PTR = 12
_TYPE_TXT = 16
_TYPE_AAAA = 28
_TYPE_SRV = 33
_CLASS_IN = 1
_FLAGS_QUERY = 0x0000


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


def _usable_order(addresses: list[str], scope: str | None = None) -> list[str]:
    """Routable addresses first (IPv4 before IPv6), link-local ones last, scoped with ``%scope``.

    An IPv6 link-local address is only usable with the interface it was seen on; ``scope`` is that
    interface when discovery runs on one. A stable order also keeps a refresh, whose records zeroconf
    lists newest first, from looking like an update.
    """

    def scoped(address: str) -> str:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
        return f"{ip}%{scope}" if ip.version == 6 and ip.is_link_local and "%" not in address and scope else address

    def key(address: str) -> tuple[bool, int, str]:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
        return (ip.is_link_local, ip.version, address)

    return sorted(dict.fromkeys(scoped(a) for a in addresses), key=key)


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
        sweep_interval_s: how often the table is reconciled with the cache; default from ``ttl_s``.
    """

    def __init__(
        self,
        node_id: str | None = None,
        port: int | None = None,
        *,
        fleet: str | None = None,
        arch: str | None = None,
        tier: str = "unknown",
        density: float = 1.0,
        round: int = 0,
        fingerprint: str | None = None,
        interfaces: Sequence[str] | None = None,
        ipv6: bool = False,
        ttl_s: int = DEFAULT_TTL_S,
        min_update_interval_s: float = DEFAULT_MIN_UPDATE_INTERVAL_S,
        sweep_interval_s: float | None = None,
        protocol_version: str = PROTOCOL_VERSION,
    ) -> None:
        check_protocol_version(protocol_version)
        if fleet is not None:
            check_fleet(fleet)
        if arch is not None and arch != "":
            check_arch(arch)
        if node_id is not None:
            check_node_id(node_id)
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
        super().__init__(fleet=fleet, arch=arch or None, protocol_version=protocol_version)
        self.node_id = node_id
        self.port = port
        self.ttl_s = ttl_s
        self.min_update_interval_s = float(min_update_interval_s)
        self.sweep_interval_s = float(sweep_interval_s)
        self.addresses = resolve_interfaces(interfaces, ipv6=ipv6)
        self._ipv6_scope = _interface_of(self.addresses)
        self._fields: TxtFields | None = None
        if node_id is not None:
            assert fleet is not None
            self._fields = TxtFields(
                protocol_version=protocol_version,
                node_id=node_id,
                fleet=fleet,
                arch=arch or "",
                tier=check_tier(tier),
                density=check_density(density),
                round=check_round(round),
                fingerprint=check_fingerprint(fingerprint),
            )
            encode_txt(self._fields)  # every value and the 255-byte limit, checked once here
        self._own_name = f"{node_id}.{SERVICE_TYPE}" if node_id else None
        self._zc: Zeroconf | None = None
        self._browser: ServiceBrowser | None = None
        self._info: ServiceInfo | None = None
        self._worker: threading.Thread | None = None
        self._events: queue.SimpleQueue[tuple[str, str]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._update_pending = False
        self._last_announce = 0.0
        self._last_query: dict[str, float] = {}
        self._last_resolve: dict[str, float] = {}
        self._resolving: dict[str, concurrent.futures.Future[bool]] = {}
        self._announcing: concurrent.futures.Future[None] | None = None
        self._rejected: dict[str, object] = {}

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
            self._browser = ServiceBrowser(self._zc, SERVICE_TYPE, handlers=[self._on_state_change])
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
        self._events.put(("stop", ""))
        if self._worker is not None:
            self._worker.join(_STOP_TIMEOUT_S)
            if self._worker.is_alive():  # a daemon thread: it cannot keep the process from exiting
                _LOGGER.warning("discovery worker did not end within %s s; stopping without it", _STOP_TIMEOUT_S)
            self._worker = None
        if self._browser is not None:
            self._browser.cancel()
            self._browser = None
        for future in list(self._resolving.values()):
            future.cancel()
        self._resolving.clear()
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
            new = TxtFields(
                protocol_version=fields.protocol_version,
                node_id=fields.node_id,
                fleet=fields.fleet,
                arch=fields.arch,
                tier=fields.tier if tier is None else check_tier(tier),
                density=fields.density if density is None else check_density(density),
                round=fields.round if round is None else check_round(round),
                fingerprint=fields.fingerprint if fingerprint is None else check_fingerprint(fingerprint),
            )
            encode_txt(new)
            if new == fields:
                return
            self._fields = new
            self._update_pending = True
        self._events.put(("update", ""))

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

    def _on_state_change(
        self, zeroconf: Zeroconf, service_type: str, name: str, state_change: ServiceStateChange
    ) -> None:
        """Browser thread: hand the event to the worker (never block zeroconf here)."""
        kind = "removed" if state_change is ServiceStateChange.Removed else "changed"
        self._events.put((kind, name))

    def _run(self) -> None:
        """Worker thread: apply events, re-announce pending updates, reconcile the table."""
        next_sweep = time.monotonic()
        while not self._stopping.is_set():
            now = time.monotonic()
            wake = next_sweep
            if self._update_pending:
                wake = min(wake, self._last_announce + self.min_update_interval_s)
            try:
                kind, name = self._events.get(timeout=max(0.0, wake - now))
                batch = [(kind, name)]
                while True:
                    try:
                        batch.append(self._events.get_nowait())
                    except queue.Empty:
                        break
            except queue.Empty:
                batch = []
            if self._stopping.is_set():
                return
            try:
                for kind, name in batch:
                    if kind == "removed":
                        self._remove(name, "said goodbye")
                if self._update_pending and time.monotonic() >= self._last_announce + self.min_update_interval_s:
                    self._announce()
                if time.monotonic() >= next_sweep or any(kind != "update" for kind, _ in batch):
                    self._reconcile()
                    next_sweep = time.monotonic() + self.sweep_interval_s
            except Exception:  # discovery must outlive one bad record or a closing zeroconf
                if self._stopping.is_set():
                    return
                _LOGGER.exception("discovery worker step failed; continuing")
                next_sweep = time.monotonic() + self.sweep_interval_s

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
        _LOGGER.debug(
            "re-announcing %s: round %s density %s tier %s", fields.node_id, fields.round, fields.density, fields.tier
        )

    @staticmethod
    async def _async_announce(zc: Zeroconf, info: ServiceInfo) -> None:
        broadcasts = await zc.async_update_service(info)
        await broadcasts

    def _remove(self, name: str, why: str) -> None:
        self._rejected.pop(name, None)
        self._last_query.pop(name, None)
        peer = self._table.remove(name)
        if peer is not None:
            _LOGGER.info("peer %s removed: %s", peer.node_id, why)

    def _reconcile(self) -> None:
        """Make the table match the live records in zeroconf's cache (thread-safe cache reads)."""
        zc = self._zc
        if zc is None:
            return
        cache = zc.cache
        now_ms = current_time_millis()
        names = {
            record.alias
            for record in cache.get_all_by_details(SERVICE_TYPE, _TYPE_PTR, _CLASS_IN)
            if isinstance(record, DNSPointer) and not record.is_expired(now_ms)  # PTR: always a DNSPointer
        }
        known = names | set(self._table.keys())
        for bookkeeping in (self._last_query, self._last_resolve, self._rejected):
            for name in [n for n in bookkeeping if n not in known]:
                del bookkeeping[name]
        own = self._own_name.lower() if self._own_name else None
        for name in known:
            if name.lower() == own:
                continue
            srv = cache.get_by_details(name, _TYPE_SRV, _CLASS_IN)
            if not isinstance(srv, DNSService) or srv.is_expired(now_ms):
                if self._table.get(name) is not None:
                    self._remove(name, "its records expired (TTL)")
                elif name in names:
                    self._resolve(name)
                continue
            self._maybe_refresh(zc, name, srv, now_ms)
            info = ServiceInfo(SERVICE_TYPE, name)
            if not info.load_from_cache(zc, now_ms):
                self._resolve(name)  # TXT or address missing: ask; keep what we had meanwhile
                continue
            self._accept(name, info, srv.created)

    def _accept(self, name: str, info: ServiceInfo, created_ms: float) -> None:
        text = info.text
        try:
            fields = parse_txt(info.properties)
            if f"{fields.node_id}.{SERVICE_TYPE}".lower() != name.lower():
                raise DiscoveryError(f"TXT id={fields.node_id!r} does not match the instance name")
        except DiscoveryError as exc:
            if self._rejected.get(name) != text:
                self._rejected[name] = text
                _LOGGER.debug("ignoring advertisement %r with malformed TXT: %s", name, exc)
            self._remove(name, "its TXT became malformed")
            return
        addresses = _usable_order(info.parsed_scoped_addresses(), self._ipv6_scope)
        if not addresses or info.port is None:
            return
        age_s = max(0.0, (current_time_millis() - created_ms) / 1000.0)
        peer = PeerInfo(
            node_id=fields.node_id,
            addresses=addresses,
            port=info.port,
            fleet=fields.fleet,
            arch=fields.arch,
            tier=fields.tier,
            density=fields.density,
            round=fields.round,
            protocol_version=fields.protocol_version,
            fingerprint=fields.fingerprint,
            last_seen=time.monotonic() - age_s,
        )
        reason = self.rejection(peer)
        if reason is not None:
            if self._rejected.get(name) != text:
                self._rejected[name] = text
                _LOGGER.debug("ignoring peer %s: %s", fields.node_id, reason)
            self._remove(name, reason)
            return
        self._rejected.pop(name, None)
        event = self._table.upsert(name, peer)
        if event is not None:
            _LOGGER.info("peer %s %s at %s (round %s)", peer.node_id, event.value, peer.endpoint, peer.round)

    def _maybe_refresh(self, zc: Zeroconf, name: str, srv: DNSService, now_ms: float) -> None:
        """Re-query a peer's SRV/TXT/address once past half its TTL, so only dead peers expire."""
        ttl_ms = srv.ttl * 1000.0
        age_ms = now_ms - srv.created
        if ttl_ms <= 0 or age_ms < ttl_ms * _REFRESH_FROM:
            return
        gap_s = max(_MIN_QUERY_GAP_S, srv.ttl * _REFRESH_EVERY)
        now = time.monotonic()
        if now - self._last_query.get(name, -math.inf) < gap_s * random.uniform(0.9, 1.0):
            return
        self._last_query[name] = now
        out = DNSOutgoing(_FLAGS_QUERY)
        out.add_question(DNSQuestion(name, _TYPE_SRV, _CLASS_IN))
        out.add_question(DNSQuestion(name, _TYPE_TXT, _CLASS_IN))
        server = srv.server
        out.add_question(DNSQuestion(server, _TYPE_A, _CLASS_IN))
        out.add_question(DNSQuestion(server, _TYPE_AAAA, _CLASS_IN))
        zc.send(out)

    def _resolve(self, name: str) -> None:
        """Ask the network for a peer's SRV/TXT/address (at most one attempt in flight per peer)."""
        zc = self._zc
        if zc is None or zc.loop is None or name in self._resolving:
            return
        now = time.monotonic()
        if now - self._last_resolve.get(name, -math.inf) < max(2.0, self.sweep_interval_s):
            return
        self._last_resolve[name] = now
        info = ServiceInfo(SERVICE_TYPE, name)
        future = asyncio.run_coroutine_threadsafe(info.async_request(zc, _RESOLVE_TIMEOUT_MS), zc.loop)
        self._resolving[name] = future

        def done(_: concurrent.futures.Future[bool]) -> None:
            self._resolving.pop(name, None)
            self._events.put(("changed", name))

        future.add_done_callback(done)
