"""The DNS-SD TXT record of an edge-node advertisement (**contract**): encode, parse, validate.

Keys: ``v`` protocol version, ``id`` node id, ``fleet``, ``arch``, ``tier``, ``density``, ``round``,
``fp`` (TLS certificate fingerprint, empty without TLS). Each ``key=value`` string is at most 255 bytes.
Both directions check the values with ``NodeIdentity.check`` (``edge_node.protocol``): our own once at the
entry point (``ConfigError``), those from the network in :func:`parse_txt`, which raises ``DiscoveryError``
for anything malformed so the caller can ignore that advertiser. A value not known yet (None) is written
``arch=`` or ``tier=unknown``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from edge_node import protocol
from edge_node.errors import ConfigError, DiscoveryError
from edge_node.protocol import NodeIdentity

TXT_KEYS = ("v", "id", "fleet", "arch", "tier", "density", "round", "fp")
REQUIRED_TXT_KEYS = ("v", "id", "fleet", "arch", "tier", "density", "round")
MAX_TXT_STRING_BYTES = 255  # one DNS character-string: a length byte then at most 255 bytes
MAX_TXT_STRINGS = 128  # ours has 8; newer peers may add keys, but not hundreds

# How TXT writes the values not known yet (None in ``NodeIdentity``): no architecture (a node without a model,
# e.g. an operator's probe) is ``arch=``, no tier ``tier=unknown``. ``probe``, the tier older ``edge-node peers
# --announce`` advertised, is read as None too.
NO_ARCH_TEXT = ""
NO_TIER_TEXT = "unknown"
_NO_TIER_TEXTS = (NO_TIER_TEXT, "probe")

_T = TypeVar("_T")


@dataclass(frozen=True)
class TxtFields:
    """The validated contents of one advertisement's TXT record: who advertises, and its certificate's fingerprint."""

    identity: NodeIdentity
    fingerprint: str | None


def _contract(rule: Callable[[], _T]) -> _T:
    """``rule()`` (a ``protocol`` check of this node's own values), its ValueError raised as ConfigError."""
    try:
        return rule()
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def check_identity(identity: NodeIdentity) -> NodeIdentity:
    """This node's own identity (or the filter values it gives discovery), checked: ``NodeIdentity.check``."""
    return _contract(identity.check)


def check_fingerprint(fingerprint: object) -> str | None:
    """None when empty (no TLS), else exactly what ``net/tls.py`` produces (``protocol.check_fingerprint``)."""
    if fingerprint is None or fingerprint == "":
        return None
    return _contract(lambda: protocol.check_fingerprint(fingerprint))


def check_port(port: object) -> int:
    """The service port this node advertises (it travels in the SRV record, not in TXT)."""
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ConfigError(f"port={port!r} must be an integer in [1, 65535]")
    return port


def encode_txt(fields: TxtFields) -> dict[str, str]:
    """The TXT properties for ``fields`` (``fp`` is always present, empty without TLS).

    Raises ConfigError when a value is invalid or missing (an advertisement has a protocol version, node id,
    fleet id, round and density), or a ``key=value`` string exceeds 255 bytes.
    """
    identity = check_identity(fields.identity)
    values = (identity.protocol_version, identity.node_id, identity.fleet_id, identity.round, identity.density)
    if any(value is None for value in values):
        raise ConfigError(f"a TXT record needs a protocol version, node id, fleet id, round and density: {identity}")
    properties = {
        "v": str(identity.protocol_version),
        "id": str(identity.node_id),
        "fleet": str(identity.fleet_id),
        "arch": NO_ARCH_TEXT if identity.arch_id is None else identity.arch_id,
        "tier": NO_TIER_TEXT if identity.tier is None else identity.tier,
        "density": repr(identity.density),  # shortest string that round-trips
        "round": str(identity.round),
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
        identity = NodeIdentity(
            protocol_version=props["v"],
            node_id=props["id"],
            fleet_id=props["fleet"],
            arch_id=None if props["arch"] == NO_ARCH_TEXT else props["arch"],
            round=protocol.parse_round_text(props["round"]),
            density=protocol.parse_density_text(props["density"]),
            tier=None if props["tier"] in _NO_TIER_TEXTS else props["tier"],
        ).check()
        return TxtFields(identity, fingerprint=check_fingerprint(props.get("fp")))
    except ValueError as exc:  # ConfigError is one
        raise DiscoveryError(f"TXT value rejected: {_shorten(str(exc))}") from None


def _shorten(text: str, limit: int = 160) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
