"""The DNS-SD TXT record of an edge-node advertisement (**contract**): encode, parse, validate.

Keys: ``v`` protocol version, ``id`` node id, ``fleet``, ``arch``, ``tier``, ``density``, ``round``,
``fp`` (TLS certificate fingerprint, empty without TLS). Each ``key=value`` string is at most 255 bytes.
Our own values are checked once at the entry point (``ConfigError``); values from the network are
checked by :func:`parse_txt`, which raises ``DiscoveryError`` for anything malformed so the caller can
ignore that advertiser.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from edge_node import protocol
from edge_node.errors import ConfigError, DiscoveryError
from edge_node.protocol import parse_protocol_version

TXT_KEYS = ("v", "id", "fleet", "arch", "tier", "density", "round", "fp")
REQUIRED_TXT_KEYS = ("v", "id", "fleet", "arch", "tier", "density", "round")
MAX_TXT_STRING_BYTES = 255  # one DNS character-string: a length byte then at most 255 bytes
MAX_TXT_STRINGS = 128  # ours has 8; newer peers may add keys, but not hundreds

# The wire's architecture id ("cnn/10/1a2b3c4d", ModelSpec.arch_id), so peers compare one string; may be
# empty: "no model" (e.g. an operator probe).
_ARCH_RE = re.compile(r"[A-Za-z0-9_.:/+-]{0,200}")
_TIER_RE = re.compile(r"[A-Za-z0-9_.-]{1,32}")

_T = TypeVar("_T")


@dataclass(frozen=True)
class TxtFields:
    """The validated contents of one advertisement's TXT record."""

    protocol_version: str
    node_id: str
    fleet: str
    arch: str
    tier: str
    density: float
    round: int
    fingerprint: str | None


def _check(pattern: re.Pattern[str], name: str, value: object) -> str:
    if not isinstance(value, str) or pattern.fullmatch(value) is None:
        raise ConfigError(f"{name}={value!r} is not valid (allowed: {pattern.pattern})")
    return value


def _contract(rule: Callable[[object], _T], value: object) -> _T:
    """``rule(value)`` (a ``protocol`` check), its ValueError raised as ConfigError."""
    try:
        return rule(value)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def check_node_id(node_id: object) -> str:
    """A node id usable as DNS-SD instance name and host label (``protocol.check_node_id``)."""
    return _contract(protocol.check_node_id, node_id)


def check_fleet(fleet: object) -> str:
    """A fleet id (``protocol.check_fleet_id``)."""
    return _contract(protocol.check_fleet_id, fleet)


def check_arch(arch: object) -> str:
    return _check(_ARCH_RE, "arch", arch)


def check_tier(tier: object) -> str:
    return _check(_TIER_RE, "tier", tier)


def check_fingerprint(fingerprint: object) -> str | None:
    """None when empty (no TLS), else exactly what ``net/tls.py`` produces (``protocol.check_fingerprint``)."""
    if fingerprint is None or fingerprint == "":
        return None
    return _contract(protocol.check_fingerprint, fingerprint)


def check_density(density: object) -> float:
    return _contract(protocol.check_density, density)


def check_round(round_: object) -> int:
    return _contract(protocol.check_round, round_)


def check_port(port: object) -> int:
    """The service port this node advertises (it travels in the SRV record, not in TXT)."""
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ConfigError(f"port={port!r} must be an integer in [1, 65535]")
    return port


def check_protocol_version(version: object) -> str:
    if not isinstance(version, str):
        raise ConfigError(f"protocol_version={version!r} must be a string MAJOR.MINOR")
    try:
        parse_protocol_version(version)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return version


def encode_txt(fields: TxtFields) -> dict[str, str]:
    """The TXT properties for ``fields`` (``fp`` is always present, empty without TLS).

    Raises ConfigError when a value is invalid or a ``key=value`` string exceeds 255 bytes.
    """
    properties = {
        "v": check_protocol_version(fields.protocol_version),
        "id": check_node_id(fields.node_id),
        "fleet": check_fleet(fields.fleet),
        "arch": check_arch(fields.arch),
        "tier": check_tier(fields.tier),
        "density": repr(check_density(fields.density)),  # shortest string that round-trips
        "round": str(check_round(fields.round)),
        "fp": check_fingerprint(fields.fingerprint) or "",
    }
    for key, value in properties.items():
        size = len(key.encode()) + 1 + len(value.encode())
        if size > MAX_TXT_STRING_BYTES:
            raise ConfigError(f"TXT {key}={value!r} is {size} bytes, more than {MAX_TXT_STRING_BYTES}")
    return properties


def _decode(raw: Mapping[bytes, bytes | None]) -> dict[str, str]:
    """Keys lower-cased (DNS-SD keys are case-insensitive), values UTF-8; the first of duplicates wins."""
    out: dict[str, str] = {}
    for raw_key, raw_value in raw.items():
        try:
            key = raw_key.decode("ascii").lower()
        except UnicodeDecodeError:
            raise DiscoveryError(f"TXT key {raw_key!r} is not ASCII") from None
        if raw_value is None:
            if key in TXT_KEYS:
                raise DiscoveryError(f"TXT key {key!r} has no value")
            continue
        if len(raw_key) + 1 + len(raw_value) > MAX_TXT_STRING_BYTES:
            raise DiscoveryError(f"TXT {key}=... is longer than {MAX_TXT_STRING_BYTES} bytes")
        try:
            value = raw_value.decode("utf-8")
        except UnicodeDecodeError:
            raise DiscoveryError(f"TXT {key}={raw_value[:40]!r} is not UTF-8") from None
        out.setdefault(key, value)
    return out


def decode_txt_record(text: bytes) -> dict[bytes, bytes | None]:
    """The ``key=value`` strings of a raw TXT record (RDATA), as python-zeroconf unpacks them.

    Each string is a length byte and that many bytes; the first of duplicate keys wins; a string
    without ``=`` is a boolean attribute (value None). Raises DiscoveryError for a truncated record
    or more than ``MAX_TXT_STRINGS`` strings.
    """
    properties: dict[bytes, bytes | None] = {}
    pos, count, total = 0, 0, len(text)
    while pos < total:
        count += 1
        if count > MAX_TXT_STRINGS:
            raise DiscoveryError(f"TXT has more than {MAX_TXT_STRINGS} strings")
        length = text[pos]
        start = pos + 1
        if start + length > total:
            raise DiscoveryError("TXT record is truncated")
        key, sep, value = text[start : start + length].partition(b"=")
        pos = start + length
        if key and key not in properties:
            properties[key] = value if sep else None
    return properties


def parse_txt(raw: Mapping[bytes, bytes | None]) -> TxtFields:
    """Validate the TXT properties of a foreign advertisement (as python-zeroconf decodes them).

    Unknown keys are ignored (newer peers may add some). Raises DiscoveryError naming the first
    problem: a missing key, a value that is not UTF-8, oversize, non-numeric or out of range.
    """
    props = _decode(raw)
    missing = [key for key in REQUIRED_TXT_KEYS if key not in props]
    if missing:
        raise DiscoveryError(f"TXT lacks key(s) {', '.join(missing)}")
    try:
        return TxtFields(
            protocol_version=check_protocol_version(props["v"]),
            node_id=check_node_id(props["id"]),
            fleet=check_fleet(props["fleet"]),
            arch=check_arch(props["arch"]),
            tier=check_tier(props["tier"]),
            density=protocol.parse_density_text(props["density"]),
            round=protocol.parse_round_text(props["round"]),
            fingerprint=check_fingerprint(props.get("fp")),
        )
    except ValueError as exc:  # ConfigError is one
        raise DiscoveryError(f"TXT value rejected: {_shorten(str(exc))}") from None


def _shorten(text: str, limit: int = 160) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
