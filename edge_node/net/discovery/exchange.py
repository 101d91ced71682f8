"""Peer exchange (protocol 1.4): learn the fleet beyond one link from the peers a node already reaches.

mDNS stops at the link and a static list must name every peer on every device. With peer exchange a node
starts from a few seed addresses (``peers``) and its mDNS neighbours, asks each peer it reaches for the peers
*that* peer has itself reached lately (``Peer.ListPeers``), and lists a learned peer only once it has verified
it: a Hello at the learned address answers with the learned id, in this node's fleet, protocol major and
architecture (under mutual TLS the certificate must be issued for that id by the fleet CA, and carry the
learned fingerprint when one came with it).

A learned entry is a hint from a peer that may lie, so everything it can cost is bounded (:class:`LearnedTable`,
pure bookkeeping without I/O; the numbers are module constants):

* one reply: at most ``MAX_PEER_ENTRIES`` (64) entries are read, the rest counted (``pex_too_many``); an entry
  must be a valid node id, an IP address (never a name: no DNS lookup), a port and an empty or valid
  fingerprint (``pex_bad_entry``), and its address must pass the node's address policy (``allowed_subnets``:
  ``bad_address``, ``foreign_subnet``);
* the table: at most ``MAX_LEARNED`` entries, of them at most ``MAX_CANDIDATES`` unverified (``table_full``:
  candidates never crowd out verified peers); at most ``MAX_CANDIDATES_PER_SOURCE`` unverified ones from any
  one source (``pex_source_full``) and ``MAX_CANDIDATES_PER_HOST`` on any one IP address (``pex_host_full``);
  an endpoint held under one id is not taken under another until the first is refuted (``conflict``);
* dials: an unverified entry is dialled (one Hello) at most once per interval and ``MAX_DIALS_PER_ENTRY`` times
  in all; then it is dropped (``pex_dial_budget``) and kept out (its id at its endpoint) for
  ``COOLDOWN_INTERVALS`` intervals (``cooldown``), as is one whose Hello says another id (``id_mismatch``) or
  another fleet (keyed by id too, so that a liar naming a real peer's endpoint under a false id does not keep
  the real one out). At most
  ``MAX_DIALS_PER_CYCLE`` unverified entries are dialled per interval. So a node is no reflector: whatever its
  peers list, it sends at most 16 Hellos per interval to addresses it has not verified, at most 4 per interval
  to any one IP address, and at most 3 to any one endpoint per cooldown.
* staleness: a verified peer is asked again every interval; one not re-verified for ``STALE_INTERVALS``
  intervals is removed, and an unverified entry no peer has listed for that long is forgotten. A node only
  lists (answers ListPeers with) peers it has itself reached within ``STALE_INTERVALS`` intervals, so a peer
  that stops is gone from every table within ``(STALE_INTERVALS + 1.1) * interval`` (the intervals are jittered
  by +-10 %) plus what the next exchange's calls take before it expires it (``HELLO_TIMEOUT_S`` per call that gets
  no answer, ``WORKERS`` at a time).
"""

from __future__ import annotations

import collections
import ipaddress
import logging
import random
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import NamedTuple

from edge_node.errors import ConfigError, PeerUnreachable
from edge_node.net.client import PeerAddress, PeerHello
from edge_node.net.discovery.bounds import AddressPolicy, IPNetwork, own_networks, parse_networks
from edge_node.net.discovery.peer_table import Discovery, PeerEvent, PeerInfo
from edge_node.protocol import MAX_PEER_ENTRIES, PROTOCOL_VERSION, is_valid_fingerprint, is_valid_node_id
from edge_node.wire.messages import PeerEntry

_LOGGER = logging.getLogger(__name__)

DEFAULT_EXCHANGE_S = 30.0  # seconds between two asks of one peer
MIN_EXCHANGE_S = 1.0  # a server refuses one host's second ListPeers within 0.5 s (``PEX_HOST_INTERVAL_S``)
STALE_INTERVALS = 3  # an entry not re-confirmed for this many intervals is dropped
MAX_LEARNED = 256  # entries in the table, verified or not
MAX_CANDIDATES = 64  # of them unverified
MAX_CANDIDATES_PER_SOURCE = 16  # unverified entries one peer's lists may hold in the table
MAX_CANDIDATES_PER_HOST = 4  # unverified endpoints on one IP address (a victim's ports)
MAX_DIALS_PER_ENTRY = 3  # Hellos an unverified entry may cause, one per interval
MAX_DIALS_PER_CYCLE = 16  # Hellos to unverified entries per interval, all together
COOLDOWN_INTERVALS = 10  # a dropped endpoint is not taken again for this many intervals
COOLDOWN_MEMORY = 1024  # endpoints remembered in cooldown (the oldest forgotten first)
HELLO_TIMEOUT_S = 2.0  # one Hello or ListPeers call
SILENT_MEMORY = 4096  # peers remembered as not answering (their next failure is not logged again)
WORKERS = 8  # calls in flight at once
# A seed given as an address adds its subnet to the default ``allowed_subnets`` (a remote subnet's mask is
# not known here: IPv4 /24, IPv6 /64, the usual site sizes; set ``allowed_subnets`` for others).
SEED_PREFIX_V4 = 24
SEED_PREFIX_V6 = 64

Endpoint = tuple[str, int]


class Hint(NamedTuple):
    """One learned entry as a peer sent it: nothing in it is trusted until a Hello at ``host:port`` confirms it."""

    node_id: str
    host: str
    port: int
    fingerprint: str  # "" when the lister knew none

    @classmethod
    def of(cls, entry: PeerEntry) -> Hint:
        return cls(entry.node_id, entry.host, int(entry.port), entry.fingerprint)


@dataclass
class Learned:
    """An entry of the table: a candidate (``verified`` None) or a peer this node verified itself."""

    hint: Hint
    source: str  # the peer whose list brought it first
    offered: float  # when a peer last listed it
    verified: float | None = None  # when a Hello last confirmed it
    checked: float = -1e18  # when it was last dialled
    dials: int = 0  # dials without an answer while a candidate

    @property
    def endpoint(self) -> Endpoint:
        return self.hint.host, self.hint.port


class LearnedTable:
    """The bounded table of learned entries (see the module docstring); no I/O, not thread-safe.

    Args:
        policy: which addresses may be dialled (``allowed_subnets``).
        own_id: this node's id (an entry naming it is refused, ``self``).
        interval_s: the exchange interval, which the staleness, dial and cooldown bounds are counted in.
        refuse: counts ``n`` refusals of a reason (``RefusalCounter.add``).
    """

    def __init__(
        self, policy: AddressPolicy, own_id: str, interval_s: float, refuse: Callable[[str, int], None]
    ) -> None:
        self.policy = policy
        self.own_id = own_id
        self.interval_s = interval_s
        self.stale_s = STALE_INTERVALS * interval_s
        self._refuse = refuse
        self._entries: dict[Endpoint, Learned] = {}
        self._cooldown: collections.OrderedDict[tuple[str, str, int], float] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def entries(self) -> list[Learned]:
        return list(self._entries.values())

    def verified(self) -> list[Learned]:
        return [e for e in self._entries.values() if e.verified is not None]

    def offer(self, source: str, hints: Sequence[Hint], known: set[str], now: float, dropped: int = 0) -> int:
        """Take a peer's list: at most ``MAX_PEER_ENTRIES`` hints, each checked; returns the new candidates.

        ``known``: ids another discovery lists already (not learned again, not counted). ``dropped``: entries
        of the same reply that the client already left out (counted with those beyond the bound here).
        """
        beyond = dropped + max(0, len(hints) - MAX_PEER_ENTRIES)
        if beyond:
            self._refuse("pex_too_many", beyond)
        added = 0
        for hint in hints[:MAX_PEER_ENTRIES]:
            reason = self._check(hint)
            if reason is None and hint.node_id in known:
                continue
            if reason is None:
                reason = self._admit(source, hint, now)
                added += reason == "added"
                reason = None if reason in ("added", "refreshed") else reason
            if reason is not None:
                self._refuse(reason, 1)
        return added

    def _check(self, hint: Hint) -> str | None:
        """Why ``hint`` cannot be taken whatever the table holds, or None."""
        if not (is_valid_node_id(hint.node_id) and _is_ip(hint.host)):
            return "pex_bad_entry"
        if hint.fingerprint and not is_valid_fingerprint(hint.fingerprint):
            return "pex_bad_entry"
        if hint.node_id == self.own_id:
            return "self"
        return self.policy.check_port(hint.port) or self.policy.check(hint.host)

    def _admit(self, source: str, hint: Hint, now: float) -> str:
        endpoint = (hint.host, hint.port)
        entry = self._entries.get(endpoint)
        if entry is not None:
            if entry.hint.node_id != hint.node_id:
                return "conflict"  # the endpoint is held under another id: the first stays until it is refuted
            entry.offered = now
            return "refreshed"
        until = self._cooldown.get(hint[:3])
        if until is not None:
            if until > now:
                return "cooldown"
            del self._cooldown[hint[:3]]
        candidates = [e for e in self._entries.values() if e.verified is None]
        if len(self._entries) >= MAX_LEARNED or len(candidates) >= MAX_CANDIDATES:
            return "table_full"
        if sum(e.source == source for e in candidates) >= MAX_CANDIDATES_PER_SOURCE:
            return "pex_source_full"
        if sum(e.hint.host == hint.host for e in candidates) >= MAX_CANDIDATES_PER_HOST:
            return "pex_host_full"
        self._entries[endpoint] = Learned(hint, source, offered=now)
        return "added"

    def due(self, now: float) -> tuple[list[Learned], list[Learned]]:
        """``(candidates, verified)`` to dial now: each at most once per interval; candidates within their
        budget, at most ``MAX_DIALS_PER_CYCLE``, the longest waiting first."""
        ready = [e for e in self._entries.values() if now - e.checked >= self.interval_s * 0.8]  # once a cycle
        candidates = sorted((e for e in ready if e.verified is None), key=lambda e: e.offered)
        verified = [e for e in ready if e.verified is not None]
        chosen = candidates[:MAX_DIALS_PER_CYCLE]
        for entry in chosen + verified:
            entry.checked = now
        return chosen, verified

    def confirmed(self, entry: Learned, now: float) -> None:
        """A Hello at the entry's endpoint answered with its id, in this fleet."""
        entry.verified = now
        entry.dials = 0

    def refuted(self, entry: Learned, reason: str, now: float) -> None:
        """A Hello at the entry's endpoint answered as another node or fleet: drop it, count, cool down."""
        self._drop(entry, reason, now)

    def unanswered(self, entry: Learned, now: float) -> None:
        """A dial without an answer: a candidate out of dials is dropped (``pex_dial_budget``)."""
        if entry.verified is None:
            entry.dials += 1
            if entry.dials >= MAX_DIALS_PER_ENTRY:
                self._drop(entry, "pex_dial_budget", now)

    def expire(self, now: float) -> list[Learned]:
        """Drop what was not re-confirmed for ``stale_s``: verified peers not verified again, candidates no
        peer listed again. Returns the verified ones dropped (their listing ends)."""
        gone = []
        for endpoint, entry in list(self._entries.items()):
            last = entry.verified if entry.verified is not None else entry.offered
            if now - last > self.stale_s:
                del self._entries[endpoint]
                if entry.verified is not None:
                    gone.append(entry)
        return gone

    def _drop(self, entry: Learned, reason: str, now: float) -> None:
        if self._entries.pop(entry.endpoint, None) is None:
            return
        self._refuse(reason, 1)
        key = entry.hint[:3]
        self._cooldown.pop(key, None)
        self._cooldown[key] = now + COOLDOWN_INTERVALS * self.interval_s
        while len(self._cooldown) > COOLDOWN_MEMORY:
            self._cooldown.popitem(last=False)


def _is_ip(host: object) -> bool:
    if not isinstance(host, str) or not host or len(host) > 45:
        return False
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def seed_networks(hosts: Iterable[str]) -> list[IPNetwork]:
    """The subnets the seeds given as IP addresses are in: ``/SEED_PREFIX_V4`` or ``/SEED_PREFIX_V6`` around each."""
    out: list[IPNetwork] = []
    for host in hosts:
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            continue  # a name: no subnet (set allowed_subnets to reach its site)
        prefix = SEED_PREFIX_V4 if ip.version == 4 else SEED_PREFIX_V6
        network = ipaddress.ip_network(f"{ip}/{prefix}", strict=False)
        if network not in out:
            out.append(network)
    return out


def exchange_policy(listen_host: str, seed_hosts: Sequence[str], allowed_subnets: Sequence[str]) -> AddressPolicy:
    """The addresses peer exchange may dial: ``allowed_subnets`` when given, else the node's own networks (the
    interfaces holding ``listen_host``; every interface for 0.0.0.0 or ::) plus the seeds' subnets.

    Loopback only when the node listens there or a seed is there (a fleet on one machine).
    """
    loopback = any(_loopback(h) for h in (listen_host, *seed_hosts))
    if allowed_subnets:
        return AddressPolicy(parse_networks(allowed_subnets), allow_loopback=loopback)
    if listen_host in ("0.0.0.0", "::", ""):
        import psutil

        bound = [a.address for addrs in psutil.net_if_addrs().values() for a in addrs]
    else:
        bound = [listen_host]
    networks = own_networks(bound)
    for network in seed_networks(seed_hosts):
        if network not in networks:
            networks.append(network)
    if not networks:
        raise ConfigError(
            f"peer exchange: no subnet found for {listen_host!r} nor any seed address; set allowed_subnets"
        )
    return AddressPolicy(networks, allow_loopback=loopback)


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"


class _Reached(NamedTuple):
    entry: PeerEntry
    at: float


class PeerExchange(Discovery):
    """Learns peers from the peers the node's other discoveries list (``sources``) and from those it learned and
    verified, and lists the ones it verified.

    Args:
        node_id, fleet, arch: this node (learned peers of another fleet or architecture are refused).
        sources: the node's other discoveries (static seeds, mDNS): their peers are asked first.
        hello: a Hello to one address, validated (``Caller.hello``); raises PeerUnreachable.
        ask: a ListPeers to one address (``net.client.list_peers`` with the node's TLS); ``(entries, dropped)``.
        policy: the addresses that may be dialled (:func:`exchange_policy`).
        interval_s: seconds between two asks of one peer (>= ``MIN_EXCHANGE_S``).
        tls: under TLS a learned fingerprint must match the certificate the peer shows.
    """

    def __init__(
        self,
        *,
        node_id: str,
        fleet: str,
        arch: str | None,
        sources: Sequence[Discovery],
        hello: Callable[[PeerAddress], PeerHello],
        ask: Callable[[PeerAddress], tuple[list[PeerEntry], int]],
        policy: AddressPolicy,
        interval_s: float = DEFAULT_EXCHANGE_S,
        tls: bool = False,
        protocol_version: str = PROTOCOL_VERSION,
    ) -> None:
        super().__init__(fleet=fleet, arch=arch, protocol_version=protocol_version)
        check_interval(interval_s)
        self.node_id = node_id
        self.sources = list(sources)
        self.interval_s = float(interval_s)
        self.tls = tls
        self._hello = hello
        self._ask = ask
        self._lock = threading.Lock()
        self.book = LearnedTable(policy, node_id, self.interval_s, self._refusals.add)
        self._reached: dict[str, _Reached] = {}  # node id -> where this node last reached it, and when
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._counts: collections.Counter[str] = collections.Counter()  # asks, asks_failed, dials, cycles
        self._silent: set[str] = set()  # sources whose last ask failed (logged once until they answer again)

    # -- Discovery ---------------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="edge-node-pex", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(HELLO_TIMEOUT_S * 2 + 1)
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        self._table.clear(notify=False)

    def update(self, *, round: int | None = None, density: float | None = None, tier: str | None = None) -> None:
        """Nothing to advertise: peers learn this node from their own asks."""

    def record_pull(self, node_id: str, ok: bool) -> None:
        """A successful pull of a listed peer counts as reaching it (it is listed to others a while longer)."""
        if not ok:
            return
        peer = next((p for p in self._table.snapshot() if p.identity.node_id == node_id), None)
        if peer is not None:
            self._note_reached(peer, time.monotonic())

    # -- what the server answers -------------------------------------------------------------------
    def reached_entries(self) -> list[PeerEntry]:
        """The peers this node reached within ``STALE_INTERVALS`` intervals, the most recent first, at most 64."""
        now = time.monotonic()
        with self._lock:
            fresh = [r for r in self._reached.values() if now - r.at <= self.book.stale_s]
        fresh.sort(key=lambda r: r.at, reverse=True)
        return [r.entry for r in fresh[:MAX_PEER_ENTRIES]]

    def learned(self) -> list[str]:
        """The ids of the peers listed through exchange (verified), sorted."""
        return sorted(p.name for p in self._table.snapshot())

    def to_json(self) -> dict[str, object]:
        """What ``edge-node status`` shows of exchange: the peers it lists, candidates, calls made and failed."""
        with self._lock:
            counts = dict(self._counts)
            candidates = len(self.book) - len(self.book.verified())
        return {
            "interval_s": self.interval_s, "learned": self.learned(), "candidates": candidates,
            "reached": sorted(e.node_id for e in self.reached_entries()), "cycles": counts.get("cycles", 0),
            "asks": counts.get("asks", 0), "asks_failed": counts.get("asks_failed", 0), "dials": counts.get("dials", 0),
        }  # fmt: skip

    def _count(self, what: str) -> None:
        with self._lock:
            self._counts[what] += 1

    # -- one exchange --------------------------------------------------------------------------------
    def run_once(self) -> None:
        """Ask every reachable peer for its list, dial the candidates due, expire what went stale (the thread
        started by :meth:`start` calls it every interval; a test may call it directly instead)."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="edge-node-pex")
        pool = self._pool
        now = time.monotonic()
        with self._lock:
            for entry in self.book.expire(now):
                if self._table.remove(entry.hint.node_id) is not None:
                    _LOGGER.info("peer exchange: %s not verified for %.0f s, no longer listed", entry.hint.node_id,
                                 now - (entry.verified or 0.0))  # fmt: skip
            for node_id in [k for k, r in self._reached.items() if now - r.at > self.book.stale_s]:
                del self._reached[node_id]
        sources = self._source_peers()
        asks = [pool.submit(self._ask_source, peer) for peer in sources]
        for future in asks:
            future.result()
        with self._lock:
            candidates, verified = self.book.due(time.monotonic())
        known = {p.identity.node_id for p in sources}
        dials = [pool.submit(self._verify, entry) for entry in candidates if entry.hint.node_id not in known]
        dials += [pool.submit(self._verify, entry, True) for entry in verified]
        for future in dials:
            future.result()
        with self._lock:
            self._counts["cycles"] += 1

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.run_once()
            except Exception:  # one bad cycle must not end exchange
                _LOGGER.exception("peer exchange cycle failed")
            # +-10 %: nodes started together (a fleet on one machine) drift apart instead of asking at once
            self._stop.wait(self.interval_s * random.uniform(0.9, 1.1))

    def _source_peers(self) -> list[PeerInfo]:
        """The other discoveries' identified peers with an address (not this node), by id."""
        out: dict[str, PeerInfo] = {}
        for discovery in self.sources:
            for peer in discovery.peers():
                node_id = peer.identity.node_id
                if node_id and node_id != self.node_id and peer.addresses:
                    out.setdefault(node_id, peer)
        return list(out.values())

    def _ask_source(self, peer: PeerInfo) -> None:
        """Hello (the peer is reached and ours), then ListPeers; the entries go to the table."""
        assert peer.identity.node_id is not None
        address = PeerAddress(peer.identity.node_id, peer.addresses[0], peer.port,
                              peer.fingerprint if self.tls else None)  # fmt: skip
        self._count("asks")
        try:
            answer = self._hello(address)
            if self.rejection_reason(replace(peer, identity=answer.identity)) is not None:
                return  # the discovery that lists it drops it on its own terms
            self._note_reached(peer, time.monotonic())
        except PeerUnreachable as exc:  # down, or not ours any more: no refusal of input
            self._count("asks_failed")
            with self._lock:
                first = address.node_id not in self._silent
                if len(self._silent) >= SILENT_MEMORY:  # bounded: forgetting costs one more log line each
                    self._silent.clear()
                self._silent.add(address.node_id)
            if first:  # a seed that never answers: one line, then counted (``asks_failed``) until it does
                _LOGGER.warning("peer exchange: %s at %s does not answer (%s); asked again every %g s",
                                address.node_id, address.target, exc.kind, self.interval_s)  # fmt: skip
            return
        with self._lock:
            back = address.node_id in self._silent
            self._silent.discard(address.node_id)
        if back:
            _LOGGER.info("peer exchange: %s at %s answers again", address.node_id, address.target)
        self._list_from(address)

    def _list_from(self, address: PeerAddress) -> None:
        """ListPeers of a peer that has just answered its Hello; the entries go to the table."""
        try:
            entries, dropped = self._ask(address)
        except PeerUnreachable as exc:  # before 1.4 (UNIMPLEMENTED), asked too soon, gone: no refusal of input
            self._count("asks_failed")
            _LOGGER.debug("peer exchange with %s: %s", address.node_id, exc)
            return
        hints = [Hint.of(e) for e in entries]
        with self._lock:
            known = {p.identity.node_id for p in self._source_peers() if p.identity.node_id}
            self.book.offer(address.node_id, hints, known, time.monotonic(), dropped)

    def _verify(self, entry: Learned, ask: bool = False) -> None:
        """Dial a learned entry: list it when its Hello is its id in this fleet; count and drop it otherwise.

        ``ask``: a verified peer is asked for its own list too (so the fleet stays learnable when seeds go).
        """
        hint = entry.hint
        fingerprint = hint.fingerprint or None
        address = PeerAddress(hint.node_id, hint.host, hint.port, fingerprint if self.tls else None)
        self._count("dials" if entry.verified is None else "asks")
        try:
            answer = self._hello(address)
        except PeerUnreachable as exc:
            with self._lock:
                if exc.kind in ("identity", "tls"):  # another id, or a certificate not issued for it
                    self.book.refuted(entry, "id_mismatch", time.monotonic())
                else:
                    self.book.unanswered(entry, time.monotonic())
            if entry.verified is not None:
                self._count("asks_failed")
            return
        peer = PeerInfo(answer.identity, [hint.host], hint.port, fingerprint, last_seen=time.monotonic())
        refusal = self.rejection_reason(peer)
        now = time.monotonic()
        with self._lock:
            if refusal is not None:
                self.book.refuted(entry, refusal[0], now)
                if self._table.get(hint.node_id) is not None:
                    self._table.remove(hint.node_id)
                return
            self.book.confirmed(entry, now)
        if self._table.upsert(hint.node_id, peer) is PeerEvent.ADDED:
            _LOGGER.info("peer exchange: listed %s at %s (learned from %s)", hint.node_id, peer.endpoint, entry.source)
        self._note_reached(peer, now)
        if ask:
            self._list_from(address)

    def _note_reached(self, peer: PeerInfo, now: float) -> None:
        node_id = peer.identity.node_id
        host = peer.addresses[0] if peer.addresses else ""
        if not node_id or not _is_ip(host):
            return  # a seed given by name is not listed to others (they would not dial a name)
        entry = PeerEntry(node_id=node_id, host=host, port=peer.port, fingerprint=peer.fingerprint or "")
        with self._lock:
            self._reached[node_id] = _Reached(entry, now)
            if len(self._reached) > 2 * MAX_LEARNED:  # bounded: the oldest goes
                del self._reached[min(self._reached, key=lambda k: self._reached[k].at)]


def check_interval(interval_s: object) -> float:
    """``peer_exchange_s``: 0 (off) or a number of seconds >= ``MIN_EXCHANGE_S``; ConfigError otherwise."""
    if isinstance(interval_s, bool) or not isinstance(interval_s, (int, float)):
        raise ConfigError(f"peer_exchange_s={interval_s!r} must be a number of seconds")
    value = float(interval_s)
    if not (value == 0 or MIN_EXCHANGE_S <= value <= 86400):
        raise ConfigError(f"peer_exchange_s={interval_s!r} must be 0 (off) or in [{MIN_EXCHANGE_S:g}, 86400] seconds")
    return value
