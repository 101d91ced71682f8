"""What a node publishes: its identity and the last ``keep_snapshots`` models, each encoded once.

``SnapshotStore`` is thread-safe. Each snapshot is encoded and serialized once and the same bytes go to every
caller (in the caller's protocol version: ``Published.for_minor``); the last ``keep_snapshots`` are kept so
that a lock-step peer can pull exactly round ``r`` (:meth:`SnapshotStore.select`). It knows nothing of gRPC:
the servicer (``net/server.py``) answers calls from it.
"""

from __future__ import annotations

import collections
import functools
import logging
import math
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import torch

from edge_node.protocol import PROTOCOL_VERSION, NodeIdentity
from edge_node.wire import DEFAULT_MAX_MESSAGE_BYTES, ModelSpec, ValueType, encode_model
from edge_node.wire.codec import header_for_version, without_buffers
from edge_node.wire.messages import ProtoModelChunk
from edge_node.wire.spec import BUFFERS_SINCE, DIGEST_XXH3_SINCE, MIN_MAX_MESSAGE_BYTES, PROTOCOL_MAJOR

LEGACY_DIGEST_VERSION = "1.1"  # callers before 1.2 get a header of this version, with its SHA-256

_LOGGER = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelSnapshot:
    """What a node publishes after a round: trained weights, the training mask and who it is."""

    weights: Mapping[str, torch.Tensor]
    masks: Mapping[str, torch.Tensor]
    round: int
    density: float
    node_id: str
    fleet_id: str
    arch_id: str
    tier: str = ""
    # BatchNorm running statistics (protocol 1.3, ``norm_stats average``: the server's spec lists them), sent to
    # the callers that ask for them; {} for any other node, or one that has not trained yet.
    buffers: Mapping[str, torch.Tensor] = field(default_factory=dict)


@dataclass(frozen=True)
class Published:
    """One kept snapshot: its round, density and tier, and its serialized stream."""

    round: int
    density: float
    tier: str | None
    messages: tuple[bytes, ...]  # serialized ModelChunk messages, header first
    versioned: bool = False  # encode_model's stream: callers before 1.2 get their header (else: verbatim)
    buffered: bool = False  # the stream ends with running statistics (1.3): only for callers that ask

    @property
    def wire_bytes(self) -> int:
        return sum(len(m) for m in self.messages)

    @functools.cached_property
    def plain(self) -> tuple[bytes, ...]:
        """The stream without its buffers (for a caller that did not ask for them, or of 1.2), made on the
        first such call: a fleet under ``norm_stats average`` asks for them."""
        if not self.buffered:
            return self.messages
        stripped = without_buffers([ProtoModelChunk.FromString(m) for m in self.messages])
        return tuple(m.SerializeToString() for m in stripped)

    @functools.cached_property
    def legacy_header(self) -> bytes:
        """The header for callers before 1.2 (a SHA-256 digest): made on the first such call, since
        hashing a ResNet18 stream takes about 11 ms and most fleets never need it."""
        parsed = [ProtoModelChunk.FromString(m) for m in self.plain]
        return header_for_version(parsed, LEGACY_DIGEST_VERSION).SerializeToString()

    def for_minor(self, minor: int, buffers: bool = False) -> tuple[bytes, ...]:
        """The stream in the caller's version (``PROTOCOL_MAJOR``, ``minor``); with its buffers when the caller
        asked for them (``buffers``, 1.3 on) and the stream has any."""
        if not self.versioned:
            return self.messages
        if buffers and (PROTOCOL_MAJOR, minor) >= BUFFERS_SINCE:
            return self.messages
        if (PROTOCOL_MAJOR, minor) >= DIGEST_XXH3_SINCE:
            return self.plain
        return (self.legacy_header, *self.plain[1:])


class NotPublished(LookupError):
    """The round asked for (or any model) is not published yet."""


class NoLongerKept(LookupError):
    """The round asked for was published but is no longer kept."""


class SnapshotStore:
    """This node's identity and the last published snapshots, served as pre-serialized messages."""

    def __init__(
        self,
        spec: ModelSpec,
        *,
        node_id: str,
        fleet_id: str,
        tier: str = "",
        value_type: ValueType = ValueType.FLOAT32,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        keep_snapshots: int = 2,
    ) -> None:
        identity = NodeIdentity(PROTOCOL_VERSION, node_id, fleet_id, spec.arch_id, tier=tier or None).check()
        if isinstance(max_message_bytes, bool) or not isinstance(max_message_bytes, int):
            raise TypeError(f"max_message_bytes={max_message_bytes!r} must be an integer")
        if max_message_bytes < MIN_MAX_MESSAGE_BYTES:
            raise ValueError(f"max_message_bytes={max_message_bytes} must be at least {MIN_MAX_MESSAGE_BYTES}")
        if isinstance(keep_snapshots, bool) or not isinstance(keep_snapshots, int) or keep_snapshots < 1:
            raise ValueError(f"keep_snapshots={keep_snapshots!r} must be a positive integer")
        self.spec = spec
        self.node_id = node_id
        self.fleet_id = fleet_id
        self.value_type = ValueType.parse(value_type)
        self.max_message_bytes = max_message_bytes
        self.keep_snapshots = keep_snapshots
        self._identity = identity  # round, density: None until the first publish
        self._lock = threading.Lock()
        self._snapshots: collections.deque[Published] = collections.deque()  # oldest first, rounds increasing

    @property
    def identity(self) -> NodeIdentity:
        """What this node advertises now (Hello): its round, density and tier are the latest snapshot's."""
        with self._lock:
            return self._identity

    @property
    def published_round(self) -> int | None:
        """Round of the latest snapshot, None before the first publish."""
        with self._lock:
            return self._snapshots[-1].round if self._snapshots else None

    @property
    def published_rounds(self) -> tuple[int, ...]:
        """Rounds of the snapshots kept (served on request), oldest first."""
        with self._lock:
            return tuple(p.round for p in self._snapshots)

    def publish(self, snapshot: ModelSnapshot) -> int:
        """Encode ``snapshot`` once and serve it from now on; returns its bytes on the wire.

        The snapshot's tensors are read here and never again: the caller may train on after return.
        Its ``density`` must be the fraction of weights its masks keep (within ERK's rounding,
        ``spec.density_tolerance``), as receivers check. Publishing a round at or below a kept one
        drops the kept snapshots from that round on (a node that resumed from an older checkpoint).
        """
        if (snapshot.node_id, snapshot.fleet_id, snapshot.arch_id) != (self.node_id, self.fleet_id, self.spec.arch_id):
            raise ValueError(
                f"snapshot of node {snapshot.node_id!r}, fleet {snapshot.fleet_id!r}, arch {snapshot.arch_id!r}"
                f" does not match this server's {self.node_id!r}, {self.fleet_id!r}, {self.spec.arch_id!r}"
            )
        tier = NodeIdentity(tier=snapshot.tier or None).check().tier or self.identity.tier
        messages = encode_model(
            self.spec,
            snapshot.weights,
            snapshot.masks,
            node_id=self.node_id,
            fleet_id=self.fleet_id,
            round=snapshot.round,
            density=snapshot.density,
            value_type=self.value_type,
            max_message_bytes=self.max_message_bytes,
            buffers=snapshot.buffers if self.spec.buffers else None,
            tier=tier if self.spec.tier_mode != "mask" else None,  # width tiers: the tier's narrow shapes travel
        )
        raw = tuple(m.SerializeToString() for m in messages)
        buffered = bool(self.spec.buffers and snapshot.buffers)
        published = Published(snapshot.round, snapshot.density, tier, raw, versioned=True, buffered=buffered)
        self._keep(published)
        _LOGGER.info(
            "published round %s (density %.3f): %d messages, %d bytes",
            snapshot.round, snapshot.density, len(published.messages), published.wire_bytes,
        )  # fmt: skip
        return published.wire_bytes

    def publish_messages(self, messages: Sequence[ProtoModelChunk | bytes], *, round: int, density: float) -> None:
        """Serve ``messages`` verbatim as the model stream of ``round``, unchecked.

        For relaying an already-encoded stream and for fault injection (tests, a loopback node that
        sends garbage): receivers must refuse whatever is wrong with it.
        """
        raw = tuple(m if isinstance(m, bytes) else m.SerializeToString() for m in messages)
        self._keep(Published(round, density, self.identity.tier, raw))

    def _keep(self, published: Published) -> None:
        with self._lock:
            while self._snapshots and self._snapshots[-1].round >= published.round:
                self._snapshots.pop()
            self._snapshots.append(published)
            while len(self._snapshots) > self.keep_snapshots:
                self._snapshots.popleft()
            # A stream served verbatim may claim any density: the Hello carries it only when it is one.
            density = published.density if math.isfinite(published.density) else None
            self._identity = replace(self._identity, round=published.round, density=density, tier=published.tier)

    def select(self, wanted: int | None) -> Published:
        """The snapshot of round ``wanted`` (the latest when None).

        Raises:
            NotPublished: no snapshot yet, or ``wanted`` is beyond the latest.
            NoLongerKept: ``wanted`` is older than every kept snapshot, or was skipped.
        """
        with self._lock:
            kept = list(self._snapshots)
        if not kept:
            what = "no model" if wanted is None else f"round {wanted} not"
            raise NotPublished(f"{what} published yet (latest none)")
        if wanted is None:
            return kept[-1]
        if wanted > kept[-1].round:
            raise NotPublished(f"round {wanted} not published yet (latest {kept[-1].round})")
        for published in kept:
            if published.round == wanted:
                return published
        rounds = ", ".join(str(p.round) for p in kept)
        raise NoLongerKept(f"round {wanted} is no longer kept (kept rounds: {rounds})")
