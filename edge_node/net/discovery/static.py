"""Static discovery for networks where multicast does not pass: ``--peers ID@HOST:PORT,...`` or a file.

The same interface as mDNS discovery. A peer is written ``ID@HOST:PORT`` (``ID@[v6]:PORT``) or, for
plaintext only, ``HOST:PORT``:

* with ``ID@`` the peer carries its node id from the start; that id is the name its TLS certificate
  must carry, so **TLS needs ``ID@``** (with a bare ``HOST:PORT`` there is no name to verify the
  handshake against; ``require_node_ids=True`` refuses bare entries). A Hello that says another id
  drops the peer (``id_mismatch``).
* a bare ``HOST:PORT`` is listed under its endpoint (``PeerInfo.name``: ``host:port``) until the node
  records its Hello with :meth:`StaticDiscovery.record_hello`.

Either way a peer not heard from knows only its configured id (every other value of its identity is None
until its Hello is recorded), and the same filter as mDNS applies to the Hello (another fleet, protocol
major version or architecture drops the peer; so does our own node id, for a fleet-wide file). Node ids
follow :func:`edge_node.protocol.is_valid_node_id`.
"""

from __future__ import annotations

import ipaddress
import logging
import re
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

from edge_node.errors import ConfigError, DiscoveryError
from edge_node.net.discovery.peer_table import Discovery, PeerInfo
from edge_node.net.discovery.txt import check_fingerprint, check_identity, check_port
from edge_node.protocol import PROTOCOL_VERSION, NodeIdentity

_LOGGER = logging.getLogger(__name__)

MAX_PEERS_FILE_BYTES = 1 << 20
MAX_STATIC_PEERS = 1024  # peers one list (flags, config or file) may name
_HOSTNAME_RE = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?$"
)  # noqa: E501


def endpoint(host: str, port: int) -> str:
    """``host:port``, IPv6 hosts in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class StaticPeer(NamedTuple):
    """One configured peer: ``host`` (name, IPv4 or IPv6 without brackets), ``port``, and its node id if given."""

    host: str
    port: int
    node_id: str | None = None

    @property
    def endpoint(self) -> str:
        return endpoint(self.host, self.port)

    def __str__(self) -> str:
        return f"{self.node_id}@{self.endpoint}" if self.node_id else self.endpoint


def parse_peer(spec: str) -> StaticPeer:
    """One ``[ID@]HOST:PORT`` or ``[ID@][v6addr]:PORT``; ConfigError quoting the value otherwise."""
    text = spec.strip()
    node_id: str | None = None
    if "@" in text:
        node_id, _, text = text.partition("@")
        try:
            NodeIdentity(node_id=node_id).check()
        except ValueError:
            raise ConfigError(
                f"peer {spec!r} has an invalid node id {node_id!r} (1-63 of A-Z a-z 0-9 _ -, starting alphanumeric)"
            ) from None
    if text.startswith("["):
        host, sep, port_text = text[1:].partition("]:")
        if not sep:
            raise ConfigError(f"peer {spec!r} must be [ID@][IPv6]:PORT")
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ConfigError(f"peer {spec!r} has an invalid IPv6 address {host!r}") from None
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep or not host:
            raise ConfigError(f"peer {spec!r} must be [ID@]HOST:PORT")
        if ":" in host:
            raise ConfigError(f"peer {spec!r}: write IPv6 addresses in brackets, [ID@][ADDR]:PORT")
        if _HOSTNAME_RE.match(host) is None:
            raise ConfigError(f"peer {spec!r} has an invalid host {host!r}")
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise ConfigError(f"peer {spec!r} has an invalid port {port_text!r} (1..65535)")
    return StaticPeer(host, int(port_text), node_id)


def parse_peers(spec: str | Sequence[str]) -> list[StaticPeer]:
    """``[ID@]HOST:PORT`` items separated by commas or whitespace (or a list of them), duplicates dropped.

    Raises ConfigError for a bad item, for one endpoint given two different ids (or with and without
    one), for one id given two endpoints, and for more than ``MAX_STATIC_PEERS`` items.
    """
    parts = [spec] if isinstance(spec, str) else list(spec)
    items = [item for part in parts for item in part.replace(",", " ").split()]
    if len(items) > MAX_STATIC_PEERS:
        raise ConfigError(
            f"peers lists {len(items)} entries, more than {MAX_STATIC_PEERS}: list a few seeds (peer exchange learns"
            " the rest)"
        )
    out: list[StaticPeer] = []
    by_endpoint: dict[tuple[str, int], StaticPeer] = {}
    by_id: dict[str, StaticPeer] = {}
    for item in items:
        peer = parse_peer(item)
        seen = by_endpoint.get((peer.host, peer.port))
        if seen is not None:
            if seen != peer:
                raise ConfigError(f"peer {peer.endpoint} is given twice, as {str(seen)!r} and as {str(peer)!r}")
            continue
        if peer.node_id is not None:
            other = by_id.get(peer.node_id)
            if other is not None:
                raise ConfigError(f"node id {peer.node_id!r} is given for two peers, {other} and {peer}")
            by_id[peer.node_id] = peer
        by_endpoint[(peer.host, peer.port)] = peer
        out.append(peer)
    return out


def read_peers_file(path: str | Path) -> list[StaticPeer]:
    """Peers from a file: ``[ID@]HOST:PORT`` per line (or comma-separated), ``#`` starts a comment."""
    file = Path(path)
    try:
        if file.stat().st_size > MAX_PEERS_FILE_BYTES:
            raise ConfigError(f"peers file {str(file)!r} is larger than {MAX_PEERS_FILE_BYTES} bytes")
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DiscoveryError(f"cannot read peers file {str(file)!r}: {exc}") from None
    lines = [line.split("#", 1)[0] for line in text.splitlines()]
    try:
        return parse_peers(lines)
    except ConfigError as exc:
        raise ConfigError(f"peers file {str(file)!r}: {exc}") from None


class StaticDiscovery(Discovery):
    """A fixed list of peers behind the discovery interface.

    Args:
        peers: ``"ID@HOST:PORT,..."`` (or bare ``HOST:PORT`` for plaintext) or a list of such strings.
        peers_file: a file of peers (see :func:`read_peers_file`), merged with ``peers``.
        node_id, port, fleet, arch, tier, density, round, fingerprint: this node's identity and
            state (``identity``; nothing is broadcast); ``fleet``/``arch`` filter recorded Hellos.
        require_node_ids: refuse bare ``HOST:PORT`` entries (set it under TLS: the id is the
            certificate name that is verified).
    """

    def __init__(
        self,
        peers: str | Sequence[str] | None = None,
        *,
        peers_file: str | Path | None = None,
        node_id: str | None = None,
        port: int | None = None,
        fleet: str | None = None,
        arch: str | None = None,
        tier: str | None = None,
        density: float = 1.0,
        round: int = 0,
        fingerprint: str | None = None,
        protocol_version: str = PROTOCOL_VERSION,
        require_node_ids: bool = False,
    ) -> None:
        identity = check_identity(
            NodeIdentity(protocol_version, node_id, fleet, arch or None, round=round, density=density, tier=tier)
        )
        if port is not None:
            check_port(port)
        super().__init__(fleet=fleet, arch=arch or None, protocol_version=protocol_version)
        configured = parse_peers(peers) if peers else []
        if peers_file is not None:
            configured = parse_peers([str(p) for p in configured + read_peers_file(peers_file)])
        if not configured:
            raise ConfigError("static discovery needs at least one peer (--peers ID@HOST:PORT,... or a file)")
        bare = [p.endpoint for p in configured if p.node_id is None]
        if require_node_ids and bare:
            raise ConfigError(
                "static peers must be written ID@HOST:PORT under TLS (the node id is the certificate name that is"
                f" verified); these have none: {', '.join(bare)}"
            )
        self.endpoints: list[StaticPeer] = configured
        self._configured = {(p.host, p.port): p for p in configured}
        self.node_id = node_id
        self.port = port
        self.identity = identity
        self.fingerprint = check_fingerprint(fingerprint)
        self._started = False
        self._pulls_lock = threading.Lock()
        self._last_ok: dict[str, float] = {}  # node id -> monotonic time of its last successful pull

    def start(self) -> None:
        """List every configured peer (known by its configured id, if any, until its Hello is recorded)."""
        if self._started:
            return
        self._started = True
        now = time.monotonic()
        for peer in self.endpoints:
            key = peer.endpoint
            self._table.upsert(
                key,
                PeerInfo(NodeIdentity(node_id=peer.node_id), [peer.host], peer.port, fingerprint=None, last_seen=now),
            )

    def stop(self) -> None:
        self._started = False
        self._table.clear(notify=False)

    def update(
        self,
        *,
        round: int | None = None,
        density: float | None = None,
        tier: str | None = None,
    ) -> None:
        """Keep this node's state (``identity``); static discovery has nothing to broadcast."""
        identity = self.identity
        self.identity = check_identity(
            replace(
                identity,
                round=identity.round if round is None else round,
                density=identity.density if density is None else density,
                tier=identity.tier if tier is None else tier,
            )
        )

    def record_pull(self, node_id: str, ok: bool) -> None:
        """Remember successful pulls (:meth:`is_proven`); a static list is never evicted from."""
        if not isinstance(node_id, str) or not isinstance(ok, bool):
            raise TypeError(f"record_pull(node_id={node_id!r}, ok={ok!r}) needs a str and a bool")
        if not any(p.identity.node_id == node_id for p in self._table.snapshot()):
            return
        with self._pulls_lock:
            if ok:
                self._last_ok[node_id] = time.monotonic()

    def is_proven(self, node_id: str) -> bool:
        """Whether a pull from ``node_id`` ever succeeded while it was listed."""
        with self._pulls_lock:
            return node_id in self._last_ok

    def record_hello(self, host: str, port: int, peer: PeerInfo) -> bool:
        """Replace what is known of ``host:port`` with what its Hello said (``peer``); False if it is dropped.

        The peer is dropped (removed from the table, the refusal counted) when it is this node
        itself, when it was configured as ``ID@`` and its Hello carries another id, or when it fails
        the filter.
        """
        key = endpoint(host, port)
        configured = self._configured.get((host, port))
        if configured is None:
            raise ConfigError(f"{key!r} is not one of the configured static peers")
        if not self._started:
            return False
        refusal: tuple[str, str] | None = None
        heard = peer.identity.node_id
        if self.node_id is not None and heard == self.node_id:
            refusal = ("self", "it is this node")
        elif configured.node_id is not None and heard != configured.node_id:
            refusal = ("id_mismatch", f"its Hello says node id {heard!r}, configured {configured.node_id!r}")
        refusal = refusal or self.rejection_reason(peer)
        if refusal is not None:
            if self._table.remove(key) is not None:
                self._refusals.add(refusal[0])
                _LOGGER.info("static peer %s dropped: %s", configured, refusal[1])
            return False
        self._table.upsert(key, peer)
        return True
