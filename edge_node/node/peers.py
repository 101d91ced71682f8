"""A node's peers: who they are, whom a round pulls, and what the node remembers of each.

:class:`PeerFinder` lists the live peers of every discovery (identifying static ``host:port`` entries by
a Hello), picks a round's peers among those not in backoff, and records what each round's pulls and
screen made of them, in the one :class:`PeerTracker` and in discovery's tables.

What a node remembers of each peer: the last pull's result, and a jittered backoff after failures.

A peer that failed is skipped until ``retry_after``: ``base * 2**(failures - 1)`` seconds (at most ``max``),
times a random factor in [0.5, 1.5) so that a fleet does not retry a recovered peer all at once. One
success clears it. The table is bounded: peers discovery no longer lists are forgotten first.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from edge_node.algorithm.topology import pick_peers
from edge_node.errors import PeerUnreachable
from edge_node.net import PeerAddress, PeerHello, TlsConfig, hello
from edge_node.net.discovery import Discovery, PeerInfo, StaticDiscovery
from edge_node.node.parallel import Abandoned, Stopped, run_parallel

_LOGGER = logging.getLogger(__name__)

BASE_BACKOFF_S = 2.0
MAX_BACKOFF_S = 120.0
MAX_TRACKED = 256
HELLO_TIMEOUT_S = 2.0
HELLO_WORKERS = 8  # Hellos in flight at once (static peers not identified yet, the lock-step barrier)
# A last pull that ended in one of these refused the peer's model itself (not the link, not its pace).
MODEL_REFUSED = frozenset({"decode", "limit", "header", "identity", "tls", "screened"})


@dataclass(frozen=True)
class PeerRecord:
    node_id: str
    last_result: str = ""  # "ok", or the failure kind of the last pull
    last_detail: str = ""
    last_round: int | None = None  # header round of the last snapshot received
    last_ok: float | None = None  # monotonic time of the last success
    failures: int = 0  # in a row
    retry_after: float = 0.0  # monotonic time before which the peer is skipped


class PeerTracker:
    """Thread-safe per-peer results with backoff; ``rng`` draws the jitter (a seeded one in tests)."""

    def __init__(
        self,
        rng: np.random.Generator,
        *,
        base_backoff_s: float = BASE_BACKOFF_S,
        max_backoff_s: float = MAX_BACKOFF_S,
        max_tracked: int = MAX_TRACKED,
    ) -> None:
        self._rng = rng
        self._base = base_backoff_s
        self._max = max_backoff_s
        self._max_tracked = max_tracked
        self._records: dict[str, PeerRecord] = {}
        self._lock = threading.Lock()

    def eligible(self, node_ids: list[str], now: float | None = None) -> list[str]:
        """The ``node_ids`` not in backoff now, in the given order."""
        now = time.monotonic() if now is None else now
        with self._lock:
            return [n for n in node_ids if self._records.get(n, PeerRecord(n)).retry_after <= now]

    def success(self, node_id: str, round_index: int, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        with self._lock:
            old = self._records.get(node_id, PeerRecord(node_id))
            self._put(replace(old, last_result="ok", last_detail="", last_round=round_index, last_ok=now,
                              failures=0, retry_after=0.0))  # fmt: skip

    def failure(self, node_id: str, kind: str, detail: str, now: float | None = None) -> float:
        """Record a failed pull; returns the seconds the peer will be skipped."""
        now = time.monotonic() if now is None else now
        with self._lock:
            old = self._records.get(node_id, PeerRecord(node_id))
            failures = old.failures + 1
            wait_s = min(self._max, self._base * 2 ** (failures - 1)) * float(self._rng.uniform(0.5, 1.5))
            self._put(replace(old, last_result=kind, last_detail=detail[:300], failures=failures,
                              retry_after=now + wait_s))  # fmt: skip
        return wait_s

    def model_refused(self, node_id: str) -> bool:
        """Whether this node's last pull of ``node_id`` refused its model (``MODEL_REFUSED``)."""
        with self._lock:
            record = self._records.get(node_id)
        return record is not None and record.last_result in MODEL_REFUSED

    def forget_except(self, live: set[str]) -> None:
        """Drop peers discovery no longer lists (their history is of no use once they are gone)."""
        with self._lock:
            for node_id in [n for n in self._records if n not in live]:
                del self._records[node_id]

    def records(self) -> list[PeerRecord]:
        with self._lock:
            return sorted(self._records.values(), key=lambda r: r.node_id)

    def to_json(self, now: float | None = None) -> list[dict[str, Any]]:
        now = time.monotonic() if now is None else now
        out = []
        for record in self.records():
            item = asdict(record)
            item["last_ok_age_s"] = None if record.last_ok is None else round(now - record.last_ok, 1)
            item["backoff_s"] = round(max(0.0, record.retry_after - now), 1)
            del item["last_ok"], item["retry_after"]
            out.append(item)
        return out

    def _put(self, record: PeerRecord) -> None:
        self._records[record.node_id] = record
        if len(self._records) > self._max_tracked:  # evict the longest-failing peer that never answered
            victim = max(
                (r for r in self._records.values() if r.node_id != record.node_id),
                key=lambda r: (r.last_ok is None, r.failures),
            )
            del self._records[victim.node_id]


@dataclass(frozen=True)
class Caller:
    """This node as the peers it calls see it: what every Hello it sends carries."""

    node_id: str
    fleet: str
    tls: TlsConfig | None
    insecure: bool

    def hello(self, address: PeerAddress) -> PeerHello:
        """The peer's validated Hello within ``HELLO_TIMEOUT_S``; PeerUnreachable otherwise."""
        return hello(address, node_id=self.node_id, fleet_id=self.fleet, timeout_s=HELLO_TIMEOUT_S, tls=self.tls,
                     insecure=self.insecure)  # fmt: skip


class PeerFinder:
    """The live peers of a node's discoveries, the round's pick among them, and their standing after it."""

    def __init__(
        self, caller: Caller, discoveries: list[Discovery], tracker: PeerTracker, stop: threading.Event
    ) -> None:
        self.caller = caller
        self.discoveries = discoveries
        self.tracker = tracker
        self.stop = stop

    def live(self) -> dict[str, PeerInfo]:
        """Peers every discovery lists now (not this node), by node id; static peers without an id get a Hello.

        The Hellos go out in parallel (at most ``HELLO_WORKERS`` at once, each bounded by
        ``HELLO_TIMEOUT_S``) and a stop ends the wait at once (:class:`Stopped`).
        """
        placeholders = [
            (discovery, peer)
            for discovery in self.discoveries
            if isinstance(discovery, StaticDiscovery)
            for peer in discovery.peers()
            if peer.identity.node_id is None
        ]
        identified: dict[tuple[int, str], PeerInfo] = {}
        if placeholders:
            try:
                answers = run_parallel(
                    lambda item: self._hello_static(*item), placeholders, workers=HELLO_WORKERS, stop=self.stop,
                    name="hello",
                )  # fmt: skip
            except Abandoned:
                raise Stopped from None
            identified = {
                (id(d), p.endpoint): answer for (d, p), answer in zip(placeholders, answers, strict=True) if answer
            }  # fmt: skip
        peers: dict[str, PeerInfo] = {}
        for discovery in self.discoveries:
            for peer in discovery.peers():
                if peer.identity.node_id is None:
                    found = identified.get((id(discovery), peer.endpoint))
                    if found is None:
                        continue  # not identified yet
                    peer = found
                node_id = peer.identity.node_id
                if node_id is not None and node_id != self.caller.node_id and peer.addresses:
                    peers.setdefault(node_id, peer)
        self.tracker.forget_except(set(peers))
        return peers

    def _hello_static(self, discovery: StaticDiscovery, placeholder: PeerInfo) -> PeerInfo | None:
        """Learn a static peer's identity from its Hello (None when it does not answer)."""
        host, port = placeholder.addresses[0], placeholder.port
        try:
            reply = self.caller.hello(PeerAddress(node_id=placeholder.name, host=host, port=port))
        except PeerUnreachable as exc:
            _LOGGER.debug("static peer %s: %s", placeholder.endpoint, exc)
            return None
        peer = PeerInfo(reply.identity, [host], port, fingerprint=None, last_seen=time.monotonic())
        return peer if discovery.record_hello(host, port, peer) else None

    def awaited(self) -> list[PeerAddress]:
        """The live peers a node that has done its rounds serves on for: all but those whose model its last
        pull refused (malformed, another architecture or identity, screened out): a peer like that gets no
        more of the node's time than a round's pull of it."""
        tls = self.caller.tls is not None
        live = self.live()
        return [_address(live[k], tls=tls) for k in sorted(live) if not self.tracker.model_refused(k)]

    def pick(self, k: int, rng: np.random.Generator) -> list[PeerAddress]:
        """Up to ``k`` live peers not in backoff, drawn with ``rng``, as addresses to pull."""
        live = self.live()
        chosen = pick_peers(self.tracker.eligible(sorted(live)), k, rng)
        return [_address(live[node_id], tls=self.caller.tls is not None) for node_id in chosen]

    def record(self, accepted: dict[str, int], refused: dict[str, tuple[str, str]]) -> None:
        """What a round made of its peers: ``accepted`` (id -> snapshot round) and ``(kind, detail)`` refusals.

        A stale or cancelled pull is no fault of the peer (no backoff); proven peers are never evicted
        from discovery's bounded tables for newcomers.
        """
        for node_id, round_index in accepted.items():
            self.tracker.success(node_id, round_index)
        for node_id, (kind, detail) in refused.items():
            if kind not in ("stale", "cancelled"):
                self.tracker.failure(node_id, kind, detail)
        for discovery in self.discoveries:
            for node_id in accepted:
                discovery.record_pull(node_id, True)
            for node_id, (kind, _) in refused.items():
                if kind != "cancelled":
                    discovery.record_pull(node_id, kind == "stale")


def _address(peer: PeerInfo, *, tls: bool) -> PeerAddress:
    """Where to pull ``peer``; with TLS its certificate must be the one it advertised (mDNS ``fp``), if any."""
    fingerprint = peer.fingerprint if tls else None
    assert peer.identity.node_id is not None  # live() lists identified peers only
    return PeerAddress(peer.identity.node_id, host=peer.addresses[0], port=peer.port, expected_fingerprint=fingerprint)
