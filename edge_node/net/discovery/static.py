"""Static discovery for networks where multicast does not pass: ``--peers host:port,...`` or a file.

The same interface as mDNS discovery. A configured peer is listed under its endpoint (``host:port``
as ``node_id``, placeholder tier/density) until the node records its Hello with :meth:`record_hello`;
from then on it carries the peer's real identity and the same filter as mDNS applies (another fleet,
protocol major version or architecture drops it; so does our own node id, for a fleet-wide file).
"""

from __future__ import annotations

import ipaddress
import logging
import re
import time
from collections.abc import Sequence
from pathlib import Path

from edge_node.errors import ConfigError, DiscoveryError
from edge_node.net.discovery.peer_table import Discovery, PeerInfo
from edge_node.net.discovery.txt import (
    check_arch,
    check_density,
    check_fingerprint,
    check_fleet,
    check_node_id,
    check_port,
    check_protocol_version,
    check_round,
    check_tier,
)
from edge_node.protocol import PROTOCOL_VERSION

_LOGGER = logging.getLogger(__name__)

MAX_PEERS_FILE_BYTES = 1 << 20
_HOSTNAME_RE = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?$"
)  # noqa: E501


def endpoint(host: str, port: int) -> str:
    """``host:port``, IPv6 hosts in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_peer(spec: str) -> tuple[str, int]:
    """One ``host:port`` or ``[v6addr]:port``; ConfigError quoting the value otherwise."""
    text = spec.strip()
    if text.startswith("["):
        host, sep, port_text = text[1:].partition("]:")
        if not sep:
            raise ConfigError(f"peer {spec!r} must be [IPv6]:PORT")
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ConfigError(f"peer {spec!r} has an invalid IPv6 address {host!r}") from None
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep or not host:
            raise ConfigError(f"peer {spec!r} must be HOST:PORT")
        if ":" in host:
            raise ConfigError(f"peer {spec!r}: write IPv6 addresses in brackets, [ADDR]:PORT")
        if _HOSTNAME_RE.match(host) is None:
            raise ConfigError(f"peer {spec!r} has an invalid host {host!r}")
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise ConfigError(f"peer {spec!r} has an invalid port {port_text!r} (1..65535)")
    return host, int(port_text)


def parse_peers(spec: str | Sequence[str]) -> list[tuple[str, int]]:
    """``host:port`` items separated by commas or whitespace (or a list of them), duplicates dropped."""
    parts = [spec] if isinstance(spec, str) else list(spec)
    items = [item for part in parts for item in part.replace(",", " ").split()]
    out: list[tuple[str, int]] = []
    for item in items:
        peer = parse_peer(item)
        if peer not in out:
            out.append(peer)
    return out


def read_peers_file(path: str | Path) -> list[tuple[str, int]]:
    """Peers from a file: ``host:port`` per line (or comma-separated), ``#`` starts a comment."""
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
        peers: ``"host:port,..."`` or a list of such strings.
        peers_file: a file of peers (see :func:`read_peers_file`), merged with ``peers``.
        node_id, port, fleet, arch, tier, density, round, fingerprint: this node's identity and
            state, kept for its Hello (nothing is broadcast); ``fleet``/``arch`` filter recorded Hellos.
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
        tier: str = "unknown",
        density: float = 1.0,
        round: int = 0,
        fingerprint: str | None = None,
        protocol_version: str = PROTOCOL_VERSION,
    ) -> None:
        check_protocol_version(protocol_version)
        if node_id is not None:
            check_node_id(node_id)
        if fleet is not None:
            check_fleet(fleet)
        if arch:
            check_arch(arch)
        if port is not None:
            check_port(port)
        super().__init__(fleet=fleet, arch=arch or None, protocol_version=protocol_version)
        endpoints = parse_peers(peers) if peers else []
        if peers_file is not None:
            endpoints += [p for p in read_peers_file(peers_file) if p not in endpoints]
        if not endpoints:
            raise ConfigError("static discovery needs at least one peer (--peers HOST:PORT,... or a file)")
        self.endpoints = endpoints
        self.node_id = node_id
        self.port = port
        self.tier = check_tier(tier)
        self.density = check_density(density)
        self.round = check_round(round)
        self.fingerprint = check_fingerprint(fingerprint)
        self._started = False

    def start(self) -> None:
        """List every configured peer (placeholders until their Hello is recorded)."""
        if self._started:
            return
        self._started = True
        now = time.monotonic()
        for host, port in self.endpoints:
            key = endpoint(host, port)
            self._table.upsert(
                key,
                PeerInfo(
                    node_id=key,
                    addresses=[host],
                    port=port,
                    fleet=self.fleet or "",
                    arch=self.arch or "",
                    tier="unknown",
                    density=0.0,
                    round=0,
                    protocol_version=self.protocol_version,
                    fingerprint=None,
                    last_seen=now,
                ),
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
        """Keep this node's state for its Hello; static discovery has nothing to broadcast."""
        if round is not None:
            self.round = check_round(round)
        if density is not None:
            self.density = check_density(density)
        if tier is not None:
            self.tier = check_tier(tier)

    def record_hello(self, host: str, port: int, peer: PeerInfo) -> bool:
        """Replace the placeholder of ``host:port`` with what its Hello said; False if it is dropped.

        The peer is dropped (removed from the table) when it is this node itself or fails the filter.
        """
        key = endpoint(host, port)
        if (host, port) not in self.endpoints:
            raise ConfigError(f"{key!r} is not one of the configured static peers")
        if not self._started:
            return False
        reason = "it is this node" if self.node_id is not None and peer.node_id == self.node_id else None
        reason = reason or self.rejection(peer)
        if reason is not None:
            if self._table.remove(key) is not None:
                _LOGGER.info("static peer %s dropped: %s", key, reason)
            return False
        self._table.upsert(key, peer)
        return True
