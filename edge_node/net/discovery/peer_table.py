"""The live peer table and the interface every discovery (mDNS, static) offers the node.

One table per discovery: entries are added, updated (TXT changed) and removed (goodbye, TTL expiry,
filtered out); listeners hear each change. The table is read from any thread.
"""

from __future__ import annotations

import abc
import dataclasses
import enum
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import TypeVar

from edge_node.net.discovery.bounds import RefusalCounter
from edge_node.protocol import PROTOCOL_VERSION, NodeIdentity

_LOGGER = logging.getLogger(__name__)


@dataclass(frozen=True)
class PeerInfo:
    """What discovery knows about one peer: who it says it is, and where it is.

    ``identity``: what its TXT record or its Hello said, checked where it entered. A static peer not heard from
    yet knows at most its configured node id (the rest is None until its Hello is recorded).
    ``last_seen`` is on ``time.monotonic()``'s clock (s): when the peer's records were last confirmed.
    """

    identity: NodeIdentity
    addresses: list[str]
    port: int
    fingerprint: str | None
    last_seen: float

    @property
    def name(self) -> str:
        """The peer's node id, or ``host:port`` while it has none (a static peer not identified yet)."""
        return self.identity.node_id or self.endpoint

    @property
    def endpoint(self) -> str:
        """``host:port`` of the first address (IPv6 in brackets), ready for a gRPC target."""
        host = self.addresses[0] if self.addresses else ""
        return f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"

    def same_advertisement(self, other: PeerInfo) -> bool:
        """Equal in everything but ``last_seen``: a refresh, not an update worth telling listeners."""
        return dataclasses.replace(self, last_seen=0.0) == dataclasses.replace(other, last_seen=0.0)

    def to_json(self) -> dict[str, object]:
        """A JSON-ready dict (``edge-node peers --json``); ``last_seen`` becomes ``age_s``, unknown values null."""
        identity = self.identity
        return {
            "node_id": identity.node_id,
            "addresses": list(self.addresses),
            "port": self.port,
            "fleet": identity.fleet_id,
            "arch": identity.arch_id,
            "tier": identity.tier,
            "density": identity.density,
            "round": identity.round,
            "protocol_version": identity.protocol_version,
            "fingerprint": self.fingerprint,
            "endpoint": self.endpoint,
            "age_s": round(max(0.0, time.monotonic() - self.last_seen), 3),
        }


class PeerEvent(enum.Enum):
    ADDED = "added"
    UPDATED = "updated"
    REMOVED = "removed"


PeerListener = Callable[[PeerEvent, PeerInfo], None]
_D = TypeVar("_D", bound="Discovery")


class PeerTable:
    """Thread-safe table keyed by a discovery-specific key, telling listeners about real changes."""

    def __init__(self) -> None:
        self._peers: dict[str, PeerInfo] = {}
        self._listeners: list[PeerListener] = []
        self._changed = threading.Condition()

    def add_listener(self, listener: PeerListener) -> None:
        with self._changed:
            self._listeners.append(listener)

    def remove_listener(self, listener: PeerListener) -> None:
        with self._changed:
            if listener in self._listeners:
                self._listeners.remove(listener)

    def upsert(self, key: str, peer: PeerInfo) -> PeerEvent | None:
        """Store ``peer``; returns ADDED/UPDATED, or None when only ``last_seen`` moved."""
        with self._changed:
            old = self._peers.get(key)
            self._peers[key] = peer
            if old is not None and old.same_advertisement(peer):
                return None
            event = PeerEvent.ADDED if old is None else PeerEvent.UPDATED
            self._changed.notify_all()
        self._notify(event, peer)
        return event

    def remove(self, key: str) -> PeerInfo | None:
        with self._changed:
            old = self._peers.pop(key, None)
            if old is None:
                return None
            self._changed.notify_all()
        self._notify(PeerEvent.REMOVED, old)
        return old

    def get(self, key: str) -> PeerInfo | None:
        with self._changed:
            return self._peers.get(key)

    def keys(self) -> list[str]:
        with self._changed:
            return list(self._peers)

    def clear(self, *, notify: bool = True) -> None:
        """Empty the table; ``notify=False`` when discovery stops (nothing left to tell)."""
        if notify:
            for key in self.keys():
                self.remove(key)
            return
        with self._changed:
            self._peers.clear()
            self._changed.notify_all()

    def snapshot(self) -> list[PeerInfo]:
        """The peers, sorted by node id."""
        with self._changed:
            return sorted(self._peers.values(), key=lambda p: (p.name, p.endpoint))

    def wait_for(self, predicate: Callable[[list[PeerInfo]], bool], timeout_s: float) -> list[PeerInfo]:
        """Block until ``predicate(snapshot)`` holds or ``timeout_s`` passes; returns the last snapshot."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while True:
                peers = self.snapshot()
                remaining = deadline - time.monotonic()
                if predicate(peers) or remaining <= 0:
                    return peers
                self._changed.wait(min(remaining, 0.5))

    def _notify(self, event: PeerEvent, peer: PeerInfo) -> None:
        with self._changed:
            listeners = list(self._listeners)
        for listener in listeners:
            try:
                listener(event, peer)
            except Exception:  # a listener's bug must not stop discovery
                _LOGGER.exception("peer listener %r failed on %s %s", listener, event.value, peer.name)


class Discovery(abc.ABC):
    """What the node sees of discovery, whichever kind: start/stop, the live table, own-state updates.

    Subclasses fill the table; this base holds it, the listeners, the peer filter (fleet, protocol
    major version, architecture) and context-manager support.
    """

    def __init__(
        self,
        *,
        fleet: str | None,
        arch: str | None,
        protocol_version: str = PROTOCOL_VERSION,
    ) -> None:
        self.fleet = fleet
        self.arch = arch
        self.protocol_version = protocol_version
        self._table = PeerTable()
        self._refusals = RefusalCounter()

    # -- the interface ---------------------------------------------------------------------------
    @abc.abstractmethod
    def start(self) -> None:
        """Begin advertising (when this node has an identity) and filling the peer table."""

    @abc.abstractmethod
    def stop(self) -> None:
        """Stop; mDNS sends goodbye packets first. Safe to call twice."""

    @abc.abstractmethod
    def update(
        self,
        *,
        round: int | None = None,
        density: float | None = None,
        tier: str | None = None,
    ) -> None:
        """Change this node's advertised round, density or tier (mDNS: rate-limited re-announcement)."""

    @abc.abstractmethod
    def record_pull(self, node_id: str, ok: bool) -> None:
        """Tell discovery how a pull from ``node_id`` went; the node calls this after every pull.

        A successful pull marks the peer proven: proven peers are never evicted from a full table for
        newcomers. Failed pulls in a row make an unproven peer evictable. Unknown ids are ignored.
        """

    def refusals(self) -> dict[str, int]:
        """How many records, advertisements or peers were refused (or queries deferred), by reason.

        Thread-safe; the reasons are the keys of ``edge_node.net.discovery.bounds.REFUSAL_REASONS``.
        Counts only grow; the node can log the difference between two calls.
        """
        return self._refusals.snapshot()

    def peers(self) -> list[PeerInfo]:
        """A snapshot of the live peer table, sorted by node id."""
        return self._table.snapshot()

    def add_listener(self, listener: PeerListener) -> None:
        """Call ``listener(event, peer)`` on each add/update/remove (from discovery's own thread)."""
        self._table.add_listener(listener)

    def remove_listener(self, listener: PeerListener) -> None:
        self._table.remove_listener(listener)

    def wait_for(self, predicate: Callable[[list[PeerInfo]], bool], timeout_s: float) -> list[PeerInfo]:
        """Wait (bounded) until ``predicate(peers())`` holds; returns the last snapshot either way."""
        return self._table.wait_for(predicate, timeout_s)

    def __enter__(self: _D) -> _D:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- shared by the implementations -----------------------------------------------------------
    def rejection(self, peer: PeerInfo) -> str | None:
        """Why ``peer`` is not ours (other fleet, protocol major, architecture), or None."""
        reason = self.rejection_reason(peer)
        return None if reason is None else reason[1]

    def rejection_reason(self, peer: PeerInfo) -> tuple[str, str] | None:
        """``(refusal key, text)`` when ``peer`` is not ours, or None; keys: other_fleet/_version/_arch.

        For a peer that has told its identity (TXT, Hello): no architecture (a node without a model) is not ours.
        """
        identity = peer.identity
        if self.fleet is not None and identity.fleet_id != self.fleet:
            return "other_fleet", f"fleet {identity.fleet_id!r} is not {self.fleet!r}"
        try:
            compatible = identity.compatible(self.protocol_version)
        except ValueError:
            return "other_version", f"protocol version {identity.protocol_version!r} is malformed"
        if not compatible:
            return (
                "other_version",
                f"protocol version {identity.protocol_version!r} has another major than {self.protocol_version!r}",
            )
        if self.arch and identity.arch_id != self.arch:
            return "other_arch", f"architecture {identity.arch_id!r} is not {self.arch!r}"
        return None
