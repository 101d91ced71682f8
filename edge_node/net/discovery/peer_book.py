"""The bounded book of mDNS peers: which names are tracked, what their records say, whom to ask what.

:class:`PeerBook` is fed the DNS records zeroconf receives (:meth:`PeerBook.observe`, on zeroconf's
event loop, O(1) work per record) and is swept by discovery's worker (:meth:`PeerBook.sweep`), which
gets back the table changes to apply and the queries to send. It keeps its own copy of the few
records of the names it tracks, so a flood that fills zeroconf's cache (which evicts the records
closest to expiry, i.e. short-TTL real peers first) cannot take a listed peer away.

Bounds (see :class:`BookLimits`):

* at most ``max_peers`` names are tracked (listed, being checked, or being resolved); a newcomer
  beyond that takes the slot of an evictable name, else it is refused (``table_full``). Evictable,
  in this order: a listed peer that failed its last ``evict_after_failures`` pulls (``evicted``,
  then kept out for ``cooldown_s``); else the name tracked longest among those that have not answered
  a pull within ``proven_for_s`` and were admitted at least ``probation_s`` ago (``evicted_unproven``,
  no cooldown: a real peer evicted so comes back at its next announcement). Peers that answered a
  pull recently are never evicted for newcomers. So a burst of fake services holds the table at most
  ``probation_s``: a real peer that announces itself (or answers a browse) after that is listed at
  once, and stays listed while it answers pulls.
* at most ``max_pending`` of them may lack their SRV/TXT/address (PTR-only names): each is asked for
  them a few times with backoff, then dropped (``unresolved``) and kept out for ``cooldown_s``.
* names that are refused are never resolved, and none of their records are kept here.
* every query (resolve, refresh, browse) spends a token of one global budget (a :class:`TokenBucket`).

A listed peer is not taken away or moved by one packet: mDNS records carry no proof of who sent
them. A goodbye (PTR or SRV with TTL 0), or an SRV for its name naming another host or port while its
current SRV is live, opens a *challenge* (counted as ``conflict``, logged): the name is queried at
once and again, and only if no fresh copy of the current SRV arrives within ``CHALLENGE_S`` is the
goodbye or the new record applied. A peer that answers keeps its listing; one that really left is
removed ``CHALLENGE_S`` later than before. A same-host SRV with a shorter remaining lifetime never
shortens the one held.

Nothing here opens a socket or starts a thread.
"""

from __future__ import annotations

import collections
import dataclasses
import ipaddress
import logging
import math
import random
import socket
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from zeroconf import DNSOutgoing, DNSPointer, DNSQuestion, DNSRecord

from edge_node.errors import ConfigError, DiscoveryError
from edge_node.net.discovery.bounds import AddressPolicy, LogLimiter, RefusalCounter, TokenBucket
from edge_node.net.discovery.peer_table import PeerInfo
from edge_node.net.discovery.txt import decode_txt_record, parse_txt
from edge_node.protocol import is_valid_node_id

_LOGGER = logging.getLogger(__name__)

SERVICE_TYPE = "_edge-node._tcp.local."

DEFAULT_MAX_PEERS = 64
DEFAULT_MAX_PENDING = 16
DEFAULT_EVICT_AFTER_FAILURES = 3
DEFAULT_PROVEN_FOR_S = 3600.0  # a successful pull protects a peer from eviction this long
DEFAULT_COOLDOWN_S = 300.0  # a name dropped as unresolved, evicted or broken is ignored this long
DEFAULT_PROBATION_S = 10.0  # an unproven name may be evicted for a newcomer once tracked this long
DEFAULT_QUERY_RATE = 4.0  # queries (packets) per second, over all peers
DEFAULT_QUERY_BURST = 8

_RESOLVE_FIRST_S = 0.25  # a newcomer's records usually arrive with its PTR; ask only if they did not
_RESOLVE_GAPS_S = (1.0, 2.0, 4.0)  # then ask again after these gaps (per-name backoff) ...
_RESOLVE_GIVE_UP_S = 3.0  # ... and drop the name this long after the last attempt
_REFRESH_FROM = 0.5  # fraction of a peer's TTL after which its records are re-queried ...
_REFRESH_JITTER = 0.1  # ... plus a random part of up to this fraction, drawn per record (RFC 6762 5.2): the
# first node to ask refreshes every listener on the link, so the others, later, need not ask at all
_REFRESH_EVERY = 0.1  # ... and again every this fraction of the TTL until they are fresh
_MIN_QUERY_GAP_S = 0.5  # never query one peer more often than this
_NAMES_PER_QUERY = 6  # names asked in one query packet (4 questions each; < 1460 bytes with 63-char ids)
_MAX_ADDRESSES = 8  # addresses kept per peer (newest win)
_COOLDOWN_MEMORY = 1024  # names remembered in cooldown (oldest forgotten first)
_FLUSH_AFTER_MS = 1000  # RFC 6762 10.2: a cache-flush record replaces same-type records older than 1 s
CHALLENGE_S = 3.0  # a listed peer has this long to re-announce its SRV after a goodbye or conflicting SRV
_CHALLENGE_QUERY_GAP_S = 0.9  # and is asked this often meanwhile (a responder multicasts a record at most 1/s)

# DNS numbers (RFC 1035, 2782, 3596): zeroconf keeps its constants private.
_TYPE_A = 1
_TYPE_PTR = 12
_TYPE_TXT = 16
_TYPE_AAAA = 28
_TYPE_SRV = 33
_CLASS_IN = 1
_FLAGS_QUERY = 0x0000

_SERVICE_KEY = SERVICE_TYPE.lower()
_SUFFIX = "." + _SERVICE_KEY

# what a removal looks like in the log, by refusal reason
_WHY = {
    "bad_txt": "its TXT is malformed",
    "other_fleet": "another fleet",
    "other_version": "another protocol major version",
    "other_arch": "another architecture",
    "bad_address": "no usable address (not unicast)",
    "foreign_subnet": "no address in the allowed subnets",
    "bad_port": "its port is not in 1..65535",
    "unresolved": "its records never arrived",
    "evicted": "evicted: it failed its pulls and a newcomer needed the slot",
    "evicted_unproven": "evicted: it never answered a pull and a newcomer needed the slot",
    "conflict": "a goodbye or another host/port for its name, and it did not answer within the challenge",
    "error": "processing its records failed",
}

PeerFilter = Callable[[PeerInfo], "tuple[str, str] | None"]


@dataclass(frozen=True)
class BookLimits:
    """The bounds of a :class:`PeerBook`; checked once here (ConfigError quoting the value)."""

    max_peers: int = DEFAULT_MAX_PEERS
    max_pending: int = DEFAULT_MAX_PENDING
    evict_after_failures: int = DEFAULT_EVICT_AFTER_FAILURES
    proven_for_s: float = DEFAULT_PROVEN_FOR_S
    cooldown_s: float = DEFAULT_COOLDOWN_S
    probation_s: float = DEFAULT_PROBATION_S

    def __post_init__(self) -> None:
        integers = (("max_peers", 1, 100_000), ("max_pending", 1, 100_000), ("evict_after_failures", 1, 1000))
        for name, low, high in integers:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ConfigError(f"{name}={value!r} must be an integer in [{low}, {high}]")
        for name in ("proven_for_s", "cooldown_s", "probation_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 86400 * 7:
                raise ConfigError(f"{name}={value!r} must be a number of seconds in [0, 604800]")


def instance_node_id(alias: str) -> str | None:
    """The node id of ``<node-id>._edge-node._tcp.local.`` (any case), or None for any other name."""
    if len(alias) > 255 or not alias.lower().endswith(_SUFFIX):
        return None
    label = alias[: -len(_SUFFIX)]
    return label if is_valid_node_id(label) else None


def usable_order(addresses: Iterable[str], scope: str | None = None) -> list[str]:
    """Routable addresses first (IPv4 before IPv6), link-local ones last, scoped with ``%scope``.

    An IPv6 link-local address is only usable with the interface it was seen on; ``scope`` is that
    interface when discovery runs on one. A stable order also keeps a refresh, whose records come
    in any order, from looking like an update.
    """

    def scoped(address: str) -> str:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
        return f"{ip}%{scope}" if ip.version == 6 and ip.is_link_local and "%" not in address and scope else address

    def key(address: str) -> tuple[bool, int, str]:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
        return (ip.is_link_local, ip.version, address)

    return sorted(dict.fromkeys(scoped(a) for a in addresses), key=key)


def _address_text(address: bytes, scope_id: int | None) -> str:
    if len(address) == 4:
        return socket.inet_ntop(socket.AF_INET, address)
    text = socket.inet_ntop(socket.AF_INET6, address)
    if scope_id and ipaddress.IPv6Address(text).is_link_local:
        return f"{text}%{scope_id}"
    return text


@dataclass
class _Entry:
    """One tracked name: its records (copied, never zeroconf's objects) and its bookkeeping."""

    name: str  # the instance name as first seen (the table key)
    node_id: str
    admitted_s: float
    listed: bool = False
    goodbye: bool = False
    server: str | None = None
    server_key: str | None = None
    port: int = 0
    srv_created_ms: float = 0.0
    srv_ttl_s: int = 0
    refresh_from: float = _REFRESH_FROM  # this SRV record's refresh point, a fraction of its TTL
    txt: bytes | None = None
    addresses: dict[str, float] = field(default_factory=dict)  # address -> created (ms)
    address_refusal: str | None = None  # why the last refused address was refused
    ptr_created_ms: float = 0.0
    ptr_ttl_s: int = 0
    attempts: int = 0
    next_query_s: float = 0.0
    last_refresh_s: float = -1e18
    last_ok_s: float | None = None
    failures: int = 0
    challenged_ms: float | None = None  # when a goodbye or conflicting SRV challenged this listed name
    challenger: tuple[str, str, int, float, int] | None = (
        None  # that SRV (server, key, port, created, ttl); None: goodbye
    )

    def srv_live(self, now_ms: float) -> bool:
        return self.server is not None and now_ms < self.srv_created_ms + self.srv_ttl_s * 1000.0

    def complete(self) -> bool:
        return self.server is not None and self.txt is not None and bool(self.addresses)


@dataclass
class Removal:
    """A listed peer to take off the table, and why (for the log)."""

    key: str
    node_id: str
    why: str


@dataclass
class Sweep:
    """What one sweep decided: table upserts and removals, and the query packets to send."""

    upserts: list[tuple[str, PeerInfo]] = field(default_factory=list)
    removals: list[Removal] = field(default_factory=list)
    queries: list[DNSOutgoing] = field(default_factory=list)
    next_due_s: float = math.inf  # when (monotonic) the next resolve, refresh or expiry falls due

    def due(self, at_s: float) -> None:
        self.next_due_s = min(self.next_due_s, at_s)


class PeerBook:
    """The bounded, thread-safe record book behind mDNS discovery (see the module docstring).

    Args:
        limits: the bounds.
        policy: which addresses and ports may be listed.
        refusals: where refusals are counted.
        own_name: this node's instance name (never tracked), or None.
        peer_filter: ``(reason, text)`` when a peer is not ours (fleet, version, architecture), else None.
        scope: the interface name IPv6 link-local addresses are scoped with, or None.
        clock: seconds, monotonic.
    """

    def __init__(
        self,
        limits: BookLimits,
        policy: AddressPolicy,
        refusals: RefusalCounter,
        *,
        own_name: str | None = None,
        peer_filter: PeerFilter | None = None,
        scope: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limits = limits
        self.policy = policy
        self.refusals = refusals
        self._own_key = own_name.lower() if own_name else None
        self._filter = peer_filter
        self._scope = scope
        self._clock = clock
        self._lock = threading.RLock()
        self._entries: dict[str, _Entry] = {}
        self._pending: set[str] = set()  # tracked keys still lacking SRV, TXT or an address
        self._failing: set[str] = set()  # listed keys with >= evict_after_failures failed pulls in a row
        self._by_server: dict[str, set[str]] = {}  # server key -> tracked keys (routes A/AAAA records)
        self._cooldown: collections.OrderedDict[str, float] = collections.OrderedDict()
        self._removals: list[Removal] = []
        self._log = LogLimiter()
        self.capacity_refusals = 0  # table_full / pending_full since the last browse (see wants_browse)

    # -- sizes -------------------------------------------------------------------------------------
    def sizes(self) -> dict[str, int]:
        """``tracked``, ``listed``, ``pending`` and ``cooldown`` counts."""
        with self._lock:
            listed = sum(1 for e in self._entries.values() if e.listed)
            return {
                "tracked": len(self._entries),
                "listed": listed,
                "pending": len(self._pending),
                "cooldown": len(self._cooldown),
            }

    def has_room(self) -> bool:
        """Whether a newcomer would be admitted now (a free slot or an evictable name)."""
        with self._lock:
            if len(self._entries) < self.limits.max_peers:
                return True
            now_s = self._clock()
            return self._evictable(now_s) is not None or self._unproven(now_s) is not None

    # -- fed by zeroconf's loop --------------------------------------------------------------------
    def observe(self, records: Sequence[DNSRecord], now_ms: float) -> bool:
        """Take in the records of one incoming packet; True when a tracked name changed.

        O(1) per record: PTRs of our service type may admit a name (bounded), SRV/TXT/A/AAAA records
        are kept only for tracked names. A record that raises is counted (``error``) and skipped.
        """
        ptrs: list[DNSRecord] = []
        others: list[DNSRecord] = []
        addresses: list[DNSRecord] = []
        srv_keys: set[str] = set()
        txt_keys: set[str] = set()
        for record in records:
            kind = record.type
            if kind == _TYPE_PTR:
                if record.key == _SERVICE_KEY:
                    ptrs.append(record)
            elif kind == _TYPE_SRV:
                others.append(record)
                srv_keys.add(record.key)
            elif kind == _TYPE_TXT:
                others.append(record)
                txt_keys.add(record.key)
            elif kind in (_TYPE_A, _TYPE_AAAA):
                addresses.append(record)
        if not (ptrs or others or addresses):
            return False
        changed = False
        with self._lock:
            now_s = self._clock()
            announced = srv_keys & txt_keys  # names whose SRV and TXT came in this very packet
            for record in ptrs:
                changed |= self._guard(self._on_ptr, record, now_ms, now_s, announced)
            for record in others:
                if record.key in self._entries:
                    changed |= self._guard(self._on_record, record, now_ms, now_s, announced)
            for record in addresses:
                if record.key in self._by_server:
                    changed |= self._guard(self._on_address, record, now_ms, now_s, announced)
            for key in [k for k in self._pending if self._entries[k].complete()]:
                self._pending.discard(key)  # complete: the worker checks it now
                changed = True
        return changed

    def _guard(
        self,
        handler: Callable[[DNSRecord, float, float, set[str]], bool],
        record: DNSRecord,
        now_ms: float,
        now_s: float,
        announced: set[str],
    ) -> bool:
        try:
            return handler(record, now_ms, now_s, announced)
        except Exception as exc:  # one bad record must not cost the others of its packet
            self.refusals.add("error")
            if self._log.allow(record.name, "error"):
                _LOGGER.warning(
                    "mDNS record %r could not be processed (%s: %s); skipped", record, type(exc).__name__, exc
                )
            return False

    def _refuse(self, name: str, reason: str, text: str | None = None) -> None:
        self.refusals.add(reason)
        if reason in ("table_full", "pending_full"):
            self.capacity_refusals += 1
        if self._log.allow(name, reason):
            _LOGGER.debug("ignoring advertisement %r: %s", name, text or reason)

    def _on_ptr(self, record: DNSRecord, now_ms: float, now_s: float, announced: set[str]) -> bool:
        alias: str = record.alias  # type: ignore[attr-defined]
        key = alias.lower()
        entry = self._entries.get(key)
        if record.is_expired(now_ms):  # a goodbye
            if entry is None:
                return False
            if entry.listed:
                self._challenge(entry, None, now_ms, "a PTR goodbye")
            else:
                entry.goodbye = True
            return True
        if entry is not None:
            entry.ptr_created_ms, entry.ptr_ttl_s = record.created, record.ttl
            return False
        if key == self._own_key:
            return False
        node_id = instance_node_id(alias)
        if node_id is None:
            self._refuse(alias[:300], "bad_name", f"{alias[:80]!r} is not <node-id>.{SERVICE_TYPE}")
            return False
        until = self._cooldown.get(key)
        if until is not None:
            if until > now_s:
                self._refuse(alias, "cooldown")
                return False
            del self._cooldown[key]
        if key not in announced and len(self._pending) >= self.limits.max_pending:
            self._refuse(alias, "pending_full", f"{len(self._pending)} names are being resolved already")
            return False
        if len(self._entries) >= self.limits.max_peers:
            victim = self._evictable(now_s)
            if victim is not None:
                self._drop(victim, "evicted", now_s, cooldown=True)
            else:
                victim = self._unproven(now_s)
                if victim is None:
                    self._refuse(alias, "table_full", f"the table holds {len(self._entries)} peers, none evictable")
                    return False
                self._drop(victim, "evicted_unproven", now_s)
        entry = _Entry(name=alias, node_id=node_id, admitted_s=now_s, next_query_s=now_s + _RESOLVE_FIRST_S)
        entry.ptr_created_ms, entry.ptr_ttl_s = record.created, record.ttl
        self._entries[key] = entry
        self._pending.add(key)
        return True

    def _on_record(self, record: DNSRecord, now_ms: float, now_s: float, announced: set[str]) -> bool:
        entry = self._entries[record.key]
        if record.type == _TYPE_SRV:
            server: str = record.server  # type: ignore[attr-defined]
            server_key: str = record.server_key  # type: ignore[attr-defined]
            port: int = record.port  # type: ignore[attr-defined]
            same = entry.server_key == server_key and entry.port == port
            if entry.listed and entry.srv_live(now_ms):
                if record.is_expired(now_ms) or not same:
                    offer = (
                        None if record.is_expired(now_ms) else (server, server_key, port, record.created, record.ttl)
                    )
                    if same or offer is not None:  # a goodbye for another host/port than the held one: moot
                        self._challenge(entry, offer, now_ms, "an SRV goodbye" if offer is None else f"{server}:{port}")
                    return True
                expires_ms = record.created + record.ttl * 1000.0
                if entry.challenged_ms is not None and record.created > entry.challenged_ms:
                    _LOGGER.info("peer %s re-announced itself: challenge dismissed", entry.node_id)
                    entry.challenged_ms, entry.challenger = None, None
                if expires_ms < entry.srv_created_ms + entry.srv_ttl_s * 1000.0:
                    return False  # a copy that would expire sooner: never shortens the held record
            elif record.is_expired(now_ms):
                entry.goodbye = True
                return True
            material = entry.server_key != server_key or entry.port != port or not entry.listed
            if entry.server_key != server_key:
                self._unindex(record.key, entry)
                entry.addresses.clear()
                self._by_server.setdefault(server_key, set()).add(record.key)
            entry.server, entry.server_key, entry.port = server, server_key, port
            if record.created != entry.srv_created_ms:
                entry.refresh_from = _REFRESH_FROM + random.uniform(0.0, _REFRESH_JITTER)
            entry.srv_created_ms, entry.srv_ttl_s = record.created, record.ttl
            return material
        if record.is_expired(now_ms):  # a TXT goodbye: the SRV's (or PTR's) decides
            return False
        text: bytes = record.text  # type: ignore[attr-defined]
        if text == entry.txt:
            return False
        entry.txt = bytes(text)
        return True

    def _challenge(
        self, entry: _Entry, offer: tuple[str, str, int, float, int] | None, now_ms: float, what: str
    ) -> None:
        """A goodbye (``offer`` None) or another SRV for a listed name: count it, ask the name at once."""
        self.refusals.add("conflict")
        if self._log.allow(entry.name, "conflict"):
            _LOGGER.warning(
                "conflicting mDNS record for listed peer %s (holds %s:%s, got %s): asking it, %.0f s to answer",
                entry.node_id, entry.server, entry.port, what, CHALLENGE_S,
            )  # fmt: skip
        if entry.challenged_ms is None:
            entry.challenged_ms = now_ms
            entry.last_refresh_s = -1e18  # ask now (within the query budget)
        entry.challenger = offer

    def _settle(self, key: str, entry: _Entry, now_ms: float, now_s: float) -> bool:
        """Apply an unanswered challenge once ``CHALLENGE_S`` passed; True when ``key`` was dropped."""
        assert entry.challenged_ms is not None
        if now_ms - entry.challenged_ms < CHALLENGE_S * 1000.0:
            return False
        offer, entry.challenged_ms, entry.challenger = entry.challenger, None, None
        if offer is None or now_ms >= offer[3] + offer[4] * 1000.0:
            self._drop(key, None, now_s, why="said goodbye and did not answer the challenge")
            return True
        server, server_key, port, created_ms, ttl_s = offer
        _LOGGER.warning("peer %s moved to %s:%s (it did not answer the challenge)", entry.node_id, server, port)
        if entry.server_key != server_key:
            self._unindex(key, entry)
            entry.addresses.clear()
            self._by_server.setdefault(server_key, set()).add(key)
        entry.server, entry.server_key, entry.port = server, server_key, port
        entry.srv_created_ms, entry.srv_ttl_s = created_ms, ttl_s
        return False

    def _on_address(self, record: DNSRecord, now_ms: float, now_s: float, announced: set[str]) -> bool:
        address = _address_text(record.address, getattr(record, "scope_id", None))  # type: ignore[attr-defined]
        keys = self._by_server.get(record.key, set())
        if record.is_expired(now_ms):
            changed = False
            for key in keys:
                changed |= self._entries[key].addresses.pop(address, None) is not None
            return changed
        reason = self.policy.check(address)
        if reason is not None:
            for key in keys:
                self._entries[key].address_refusal = reason
            self._refuse(record.name, reason, f"address {address} refused")
            return bool(keys)
        family_v4 = len(record.address) == 4  # type: ignore[attr-defined]
        changed = False
        for key in keys:
            entry = self._entries[key]
            if record.unique:
                for old, created in list(entry.addresses.items()):
                    if (":" not in old) == family_v4 and created < now_ms - _FLUSH_AFTER_MS and old != address:
                        del entry.addresses[old]
                        changed = True
            changed |= address not in entry.addresses
            entry.addresses[address] = record.created
            if len(entry.addresses) > _MAX_ADDRESSES:
                oldest = min(entry.addresses, key=entry.addresses.__getitem__)
                del entry.addresses[oldest]
        return changed

    # -- pulls ---------------------------------------------------------------------------------------
    def record_pull(self, node_id: str, ok: bool) -> None:
        """A pull from ``node_id`` succeeded (the peer is proven) or failed (one more failure in a row)."""
        key = f"{node_id}{_SUFFIX}".lower()
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return
            if ok:
                entry.last_ok_s = self._clock()
                entry.failures = 0
                self._failing.discard(key)
            else:
                entry.failures += 1
                if entry.failures >= self.limits.evict_after_failures and entry.listed:
                    self._failing.add(key)

    def is_proven(self, node_id: str) -> bool:
        """Whether ``node_id`` answered a pull within ``proven_for_s``."""
        with self._lock:
            entry = self._entries.get(f"{node_id}{_SUFFIX}".lower())
            return entry is not None and self._proven(entry, self._clock())

    def _proven(self, entry: _Entry, now_s: float) -> bool:
        return entry.last_ok_s is not None and now_s - entry.last_ok_s <= self.limits.proven_for_s

    def _evictable(self, now_s: float) -> str | None:
        """A listed key that failed its last pulls and is not proven (most failures first), or None."""
        best: tuple[int, str] | None = None
        for key in self._failing:
            entry = self._entries[key]
            if not self._proven(entry, now_s) and (best is None or entry.failures > best[0]):
                best = (entry.failures, key)
        return None if best is None else best[1]

    def _unproven(self, now_s: float) -> str | None:
        """The key tracked longest among names not proven and past their probation, or None.

        Entries are kept in admission order (a dict), so this walks only the proven or young ones first.
        """
        for key, entry in self._entries.items():
            if now_s - entry.admitted_s < self.limits.probation_s:
                return None  # every later one was admitted later still
            if not self._proven(entry, now_s):
                return key
        return None

    # -- removal -----------------------------------------------------------------------------------
    def _unindex(self, key: str, entry: _Entry) -> None:
        if entry.server_key is not None:
            keys = self._by_server.get(entry.server_key)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._by_server[entry.server_key]

    def _drop(self, key: str, reason: str | None, now_s: float, *, cooldown: bool = False, why: str = "") -> None:
        """Stop tracking ``key``; count ``reason`` (a refusal key), remember it in cooldown if asked."""
        entry = self._entries.pop(key)
        self._pending.discard(key)
        self._failing.discard(key)
        self._unindex(key, entry)
        if reason is not None:
            self.refusals.add(reason)
        if cooldown and self.limits.cooldown_s > 0:
            self._cooldown[key] = now_s + self.limits.cooldown_s
            self._cooldown.move_to_end(key)
            while len(self._cooldown) > _COOLDOWN_MEMORY:
                self._cooldown.popitem(last=False)
        text = why or _WHY.get(reason or "", reason or "dropped")
        if entry.listed:
            self._removals.append(Removal(entry.name, entry.node_id, text))
            self._log.forget(entry.name)
        elif reason is not None and self._log.allow(entry.name, reason):
            _LOGGER.debug("ignoring advertisement %r: %s", entry.name, text)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._pending.clear()
            self._failing.clear()
            self._by_server.clear()
            self._removals.clear()

    # -- the worker's sweep --------------------------------------------------------------------------
    def sweep(self, now_ms: float, bucket: TokenBucket) -> Sweep:
        """Decide table changes (list, update, expire, refuse) and the queries due, within ``bucket``.

        Each name is handled on its own: one that raises is counted (``error``), dropped for
        ``cooldown_s`` and logged (rate-limited), and the sweep goes on with the others.
        """
        out = Sweep()
        refresh: list[_Entry] = []
        resolve: list[_Entry] = []
        with self._lock:
            now_s = self._clock()
            for key in list(self._entries):
                entry = self._entries[key]
                try:
                    self._sweep_one(key, entry, now_ms, now_s, out, refresh, resolve)
                except Exception as exc:
                    if self._log.allow(entry.name, "error"):
                        _LOGGER.warning(
                            "peer record %r could not be processed (%s: %s); dropped",
                            entry.name,
                            type(exc).__name__,
                            exc,
                        )
                    if key in self._entries:
                        self._drop(key, "error", now_s, cooldown=True)
            out.removals.extend(self._removals)
            self._removals.clear()
            out.queries = self._queries(refresh, resolve, now_ms, now_s, bucket, out)
        return out

    def _sweep_one(
        self,
        key: str,
        entry: _Entry,
        now_ms: float,
        now_s: float,
        out: Sweep,
        refresh: list[_Entry],
        resolve: list[_Entry],
    ) -> None:
        if entry.goodbye:
            self._drop(key, None, now_s, why="said goodbye")
            return
        if entry.challenged_ms is not None:
            if self._settle(key, entry, now_ms, now_s):
                return
            if entry.challenged_ms is not None:
                if now_s - entry.last_refresh_s >= _CHALLENGE_QUERY_GAP_S:
                    refresh.append(entry)
                out.due(
                    min(
                        now_s + _CHALLENGE_QUERY_GAP_S,
                        now_s + (entry.challenged_ms / 1000.0 + CHALLENGE_S - now_ms / 1000.0),
                    )
                )
        live = entry.srv_live(now_ms)
        if entry.listed:
            if not live:
                self._drop(key, None, now_s, why="its records expired (TTL)")
                return
            if not entry.addresses:  # withdrawn (TTL 0) or its server changed: keep what was listed, ask
                if self._refresh_due(entry, now_ms, now_s, now=True):
                    refresh.append(entry)
                return
        elif not (live and entry.txt is not None and entry.addresses):
            if live and entry.txt is not None and entry.address_refusal is not None:
                self._drop(key, None, now_s, why=_WHY[entry.address_refusal])  # counted as each came
                return
            if now_s >= entry.next_query_s:
                if entry.attempts > len(_RESOLVE_GAPS_S):
                    self._drop(key, "unresolved", now_s, cooldown=True)
                    return
                resolve.append(entry)
            else:
                out.due(entry.next_query_s)
            return
        peer, refusal = self._peer(entry, now_ms, now_s)
        if refusal is not None:
            reason, text = refusal
            self._drop(key, reason, now_s, why=text)
            return
        assert peer is not None
        if not entry.listed:
            entry.listed = True
            self._pending.discard(key)
        out.upserts.append((entry.name, peer))
        if self._refresh_due(entry, now_ms, now_s):
            refresh.append(entry)
        ttl_ms = entry.srv_ttl_s * 1000.0
        expires_s = now_s + (entry.srv_created_ms + ttl_ms - now_ms) / 1000.0
        refresh_s = now_s + (entry.srv_created_ms + ttl_ms * entry.refresh_from - now_ms) / 1000.0
        out.due(expires_s if refresh_s <= now_s else min(expires_s, refresh_s))

    def _peer(self, entry: _Entry, now_ms: float, now_s: float) -> tuple[PeerInfo | None, tuple[str, str] | None]:
        assert entry.txt is not None
        try:
            fields = parse_txt(decode_txt_record(entry.txt))
        except DiscoveryError as exc:
            return None, ("bad_txt", f"malformed TXT: {exc}")
        identity = fields.identity
        assert identity.node_id is not None  # a TXT record always names its node
        if identity.node_id.lower() != entry.node_id.lower():
            return None, ("bad_txt", f"TXT id={identity.node_id!r} does not match the instance name")
        if self.policy.check_port(entry.port) is not None:
            return None, ("bad_port", f"port {entry.port} is not in 1..65535")
        addresses = usable_order(entry.addresses, self._scope)
        age_s = max(0.0, (now_ms - entry.srv_created_ms) / 1000.0)
        peer = PeerInfo(identity, addresses, entry.port, fields.fingerprint, last_seen=now_s - age_s)
        rejection = self._filter(peer) if self._filter is not None else None
        return (None, rejection) if rejection is not None else (peer, None)

    @staticmethod
    def _refresh_due(entry: _Entry, now_ms: float, now_s: float, *, now: bool = False) -> bool:
        """Past the entry's refresh point (or ``now``), and not asked within the last tenth of its TTL."""
        ttl_ms = entry.srv_ttl_s * 1000.0
        if ttl_ms <= 0 or (not now and now_ms - entry.srv_created_ms < ttl_ms * entry.refresh_from):
            return False
        gap_s = max(_MIN_QUERY_GAP_S, entry.srv_ttl_s * _REFRESH_EVERY)
        return now_s - entry.last_refresh_s >= gap_s * random.uniform(0.9, 1.0)

    def _queries(
        self,
        refresh: list[_Entry],
        resolve: list[_Entry],
        now_ms: float,
        now_s: float,
        bucket: TokenBucket,
        out: Sweep,
    ) -> list[DNSOutgoing]:
        """Query packets for the due names (refreshes of listed peers first), one token each.

        Names the budget cannot cover now are due again when the next token is; each packet that
        could not be sent counts once as ``query_budget``.
        """
        packets: list[DNSOutgoing] = []
        due = list({entry.name: entry for entry in refresh + resolve}.values())  # a challenged name is due twice
        for start in range(0, len(due), _NAMES_PER_QUERY):
            chunk = due[start : start + _NAMES_PER_QUERY]
            if not bucket.take():
                self.refusals.add("query_budget", math.ceil((len(due) - start) / _NAMES_PER_QUERY))
                out.due(now_s + max(0.0, 1.0 - bucket.available()) / bucket.rate_per_s)
                break
            query = DNSOutgoing(_FLAGS_QUERY)
            for entry in chunk:
                query.add_question(DNSQuestion(entry.name, _TYPE_SRV, _CLASS_IN))
                query.add_question(DNSQuestion(entry.name, _TYPE_TXT, _CLASS_IN))
                if entry.server is not None:
                    query.add_question(DNSQuestion(entry.server, _TYPE_A, _CLASS_IN))
                    query.add_question(DNSQuestion(entry.server, _TYPE_AAAA, _CLASS_IN))
                if entry.listed:
                    entry.last_refresh_s = now_s
                else:
                    gaps = _RESOLVE_GAPS_S
                    gap = gaps[entry.attempts] if entry.attempts < len(gaps) else _RESOLVE_GIVE_UP_S
                    entry.attempts += 1
                    entry.next_query_s = now_s + gap * random.uniform(0.9, 1.1)
                    out.due(entry.next_query_s)
            packets.append(query)
        return packets

    def browse_query(self, now_ms: float) -> DNSOutgoing:
        """A PTR query for the service type, listing the listed peers as known answers (RFC 6762 7.1)."""
        out = DNSOutgoing(_FLAGS_QUERY)
        out.add_question(DNSQuestion(SERVICE_TYPE, _TYPE_PTR, _CLASS_IN))
        with self._lock:
            for entry in self._entries.values():
                if entry.listed and entry.ptr_ttl_s > 0:
                    known = DNSPointer(
                        SERVICE_TYPE, _TYPE_PTR, _CLASS_IN, entry.ptr_ttl_s, entry.name, created=entry.ptr_created_ms
                    )
                    out.add_answer_at_time(known, now_ms)
            self.capacity_refusals = 0
        return out

    def limits_dict(self) -> dict[str, float]:
        return {k: float(v) for k, v in dataclasses.asdict(self.limits).items()}
