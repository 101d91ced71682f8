"""The contract values peers exchange, one rule each: protocol version, node id, fleet id, architecture id,
round, density, tier, fp; and :class:`NodeIdentity`, the one type that holds what a node advertises.

Config, discovery (TXT), TLS, stream headers and Hello all check these values with the functions here: each
builds a :class:`NodeIdentity` where the values enter and calls its :meth:`~NodeIdentity.check` once.

The protocol version is shared by the wire format (stream header, Hello) and discovery (TXT ``v``).

Peers with another MAJOR version cannot talk to each other and ignore each other; a MINOR bump stays
compatible. 1.1 added ``GetModelRequest.round`` (pull one exact published round); servers of 1.0
ignore it and serve their latest snapshot, which the 1.1 client then refuses for its round.
1.2 checks a stream's payload with XXH3-128 instead of SHA-256 (``wire.spec.payload_hasher``): a 1.2
server sends a caller of 1.0 or 1.1 the header with the SHA-256 it expects, and a 1.2 receiver checks
a stream with the digest its header's version names.
1.3 adds BatchNorm running statistics to a model stream (``SparseTensor.buffer``: dense float32 chunks after
the parameters), sent only to a caller that asks for them (``GetModelRequest.buffers``: a node under
``norm_stats average``). A caller of 1.2, or one under ``local``, never asks and gets the stream it always
got; a server of 1.2, or one under ``local``, ignores the request and sends none, and the ``average`` caller
averages its statistics over the peers that did send theirs (``aggregation.aggregate_buffers``).
1.4 adds ``Peer.ListPeers`` (peer exchange, ``net/discovery/exchange.py``): the peers of the caller's fleet a
node has itself reached lately, at most 64. A server of 1.3 answers UNIMPLEMENTED, which the asking node counts
(``peer_exchange.asks_failed`` in its status) and goes on with the peers it has; nothing else changed.
1.5 adds width tiers (``tier_mode`` width or both, edge_node.algorithm.width): a stream header names its sender's
tier mode and tier (``StreamHeader.tier_mode``, ``.tier``), and its tensors have the narrow shapes that tier gives
(prefixes of the full model's; the architecture id stays the full model's). A GetModel request names the caller's
tier mode. A header without the fields (1.4, or a 1.5 node under ``mask``) is of mode ``mask``: mask fleets of 1.4
and 1.5 talk as before; a node of one mode refuses a stream, or a request, of another (counted ``tier-mode``).

Servers answer in the caller's version: they never send a field the caller's MINOR does not define,
so receivers refuse unknown fields in what peers send them (stream messages, Hello replies).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

from edge_node.errors import ConfigError

PROTOCOL_VERSION = "1.5"

# ASCII digits only ([0-9], not \d, which also matches other scripts' digits), matched in full (no
# trailing newline, which ``$`` would let through).
_VERSION_RE = re.compile(r"([0-9]{1,5})\.([0-9]{1,5})")

MAX_PEER_ENTRIES = 64  # peers one ListPeers reply carries at most (1.4); a receiver drops and counts the rest

MAX_ROUND = 10**15  # the largest round a peer may claim: 31 million years at one round per second


def parse_protocol_version(version: str) -> tuple[int, int]:
    """``"MAJOR.MINOR"`` as two ints; ValueError quoting the value when it is not of that form."""
    match = _VERSION_RE.fullmatch(version) if isinstance(version, str) else None
    if match is None:
        shown = version[:32] if isinstance(version, str) else version
        raise ValueError(f"protocol version {shown!r} is not of the form MAJOR.MINOR")
    return int(match.group(1)), int(match.group(2))


def protocol_major(version: str) -> int:
    """The MAJOR part of a protocol version: peers talk only when it is equal."""
    return parse_protocol_version(version)[0]


# A node id names an mDNS instance, a TLS certificate's DNS name and a stream header's sender, so one
# rule serves all three: a single DNS label (no dots, which DNS-SD and certificates would split).
# ``\Z``, not ``$``: the pattern is also used with ``re.match`` (discovery), where ``$`` accepts a
# trailing newline.
NODE_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}\Z"
_NODE_ID_RE = re.compile(NODE_ID_PATTERN)


def is_valid_node_id(node_id: object) -> bool:
    """Whether ``node_id`` is 1-63 characters of [A-Za-z0-9_-], starting alphanumeric."""
    return isinstance(node_id, str) and _NODE_ID_RE.fullmatch(node_id) is not None


# A fleet id travels in TXT ``fleet``, stream headers and Hello, and names a fleet in configs: the same
# one-DNS-label rule as a node id (no dots: ``lab.1`` would be accepted by one part and refused by another).
FLEET_ID_PATTERN = NODE_ID_PATTERN
_FLEET_ID_RE = _NODE_ID_RE

# ``net/tls.py`` advertises ``"sha256:" + hexdigest()`` of the certificate's DER bytes, lower case.
FINGERPRINT_PATTERN = r"sha256:[0-9a-f]{64}"
_FINGERPRINT_RE = re.compile(FINGERPRINT_PATTERN)

# Numbers a peer sends as text (TXT ``round``, ``density``) are ASCII only: ``\d`` and ``float()`` also
# take other scripts' digits ("١٢" is 12 to ``int()``).
_ROUND_TEXT_RE = re.compile(r"[0-9]{1,16}")
_DENSITY_TEXT_RE = re.compile(r"[0-9]{1,3}(\.[0-9]{1,20})?([eE][+-]?[0-9]{1,3})?")


def is_valid_fleet_id(fleet_id: object) -> bool:
    """Whether ``fleet_id`` is 1-63 characters of [A-Za-z0-9_-], starting alphanumeric (no dots)."""
    return isinstance(fleet_id, str) and _FLEET_ID_RE.fullmatch(fleet_id) is not None


def check_node_id(node_id: object, name: str = "node_id") -> str:
    """``node_id`` when valid (``is_valid_node_id``); ValueError quoting it otherwise."""
    if not is_valid_node_id(node_id):
        raise ValueError(f"{name}={_shown(node_id)} must be 1-63 characters of [A-Za-z0-9_-], starting alphanumeric")
    assert isinstance(node_id, str)
    return node_id


def check_fleet_id(fleet_id: object, name: str = "fleet") -> str:
    """``fleet_id`` when valid (``is_valid_fleet_id``); ValueError quoting it otherwise."""
    if not is_valid_fleet_id(fleet_id):
        raise ValueError(
            f"{name}={_shown(fleet_id)} must be 1-63 characters of [A-Za-z0-9_-], starting alphanumeric (no dots)"
        )
    assert isinstance(fleet_id, str)
    return fleet_id


def check_round(round: object, name: str = "round") -> int:
    """A round a node may publish or claim: an int in [0, MAX_ROUND]; ValueError otherwise."""
    if isinstance(round, bool) or not isinstance(round, int) or not 0 <= round <= MAX_ROUND:
        raise ValueError(f"{name}={_shown(round)} must be an integer in [0, {MAX_ROUND}]")
    return round


def check_density(density: object, name: str = "density") -> float:
    """A density a node trains at or publishes: a finite number in (0, 1]; ValueError otherwise.

    Every model keeps at least one weight (ERK keeps ``max(1, floor(d_l * n_l))`` of each tensor), so 0 is
    no density: a node without a model has None, which the Hello carries as 0.0 (``NodeIdentity``).
    """
    if isinstance(density, bool) or not isinstance(density, (int, float)):
        raise ValueError(f"{name}={_shown(density)} must be a number in (0, 1]")
    value = float(density)
    if not (math.isfinite(value) and 0.0 < value <= 1.0):
        raise ValueError(f"{name}={_shown(density)} must be a number in (0, 1]")
    return value


# A model's architecture id (``wire.spec.ModelSpec.arch_id``): NAME/CLASSES/HASH8, e.g. ``cnn/10/1a2b3c4d``. TXT,
# Hello and stream headers carry it, and peers compare it as one string.
ARCH_NAME_PATTERN = r"[A-Za-z0-9_.-]{1,64}"  # NAME: the model's name (``ModelSpec.arch_name``)
ARCH_ID_PATTERN = ARCH_NAME_PATTERN + r"/[0-9]{1,9}/[0-9a-f]{8}"
_ARCH_ID_RE = re.compile(ARCH_ID_PATTERN)


def check_arch_id(arch_id: object, name: str = "arch_id") -> str:
    """``arch_id`` when it is NAME/CLASSES/HASH8 (``ARCH_ID_PATTERN``); ValueError quoting it otherwise."""
    if not isinstance(arch_id, str) or _ARCH_ID_RE.fullmatch(arch_id) is None:
        raise ValueError(f"{name}={_shown(arch_id)} is not an architecture id of the form NAME/CLASSES/HASH8")
    return arch_id


# Capacity tiers (DisPFL setting ii): tier ``TIER_NAMES[i]`` trains at ``TIER_DENSITIES[i]``. A tier is advertised
# (Hello, TXT) and configured (``--capacity t3``) by its name or by its density as written here ("0.6").
TIER_DENSITIES: tuple[float, ...] = (0.2, 0.4, 0.6, 0.8, 1.0)
TIER_NAMES: tuple[str, ...] = ("t1", "t2", "t3", "t4", "t5")
_TIER_DENSITY_TEXT: tuple[str, ...] = tuple(f"{d:.1f}" for d in TIER_DENSITIES)


def tier_of_density(density: float) -> int:
    """The index of the largest tier density not above ``density`` (0 for anything below 0.2)."""
    eligible = [i for i, d in enumerate(TIER_DENSITIES) if d <= density + 1e-9]
    return eligible[-1] if eligible else 0


def tier_name(density: float) -> str:
    """The tier's name as advertised (TXT ``tier``, Hello): its density with one decimal, e.g. ``"0.6"``."""
    return f"{TIER_DENSITIES[tier_of_density(density)]:.1f}"


def parse_tier(name: str) -> int:
    """The tier index named by ``name``: ``"t1"`` .. ``"t5"`` or its density ``"0.2"`` .. ``"1.0"``.

    Raises:
        ConfigError: any other text (the known names are listed).
    """
    if isinstance(name, str):
        if name in TIER_NAMES:
            return TIER_NAMES.index(name)
        if name in _TIER_DENSITY_TEXT:
            return _TIER_DENSITY_TEXT.index(name)
    shown = name if not isinstance(name, str) or len(name) <= 40 else name[:40] + "..."
    raise ConfigError(
        f"tier={shown!r} is not one of {', '.join(TIER_NAMES)} (or the densities {', '.join(_TIER_DENSITY_TEXT)})"
    )


def check_tier(tier: object) -> str:
    """``tier`` when it names a tier (:func:`parse_tier`); ValueError (ConfigError) quoting it otherwise."""
    parse_tier(tier)  # type: ignore[arg-type]  # any object: parse_tier refuses what is not a tier's name
    assert isinstance(tier, str)
    return tier


# What a capacity tier buys (a fleet runs one mode): ``mask``, a sparse mask at the tier's density over the full
# model; ``width``, the tier's narrow model (the first channels of every hidden layer), dense inside; ``both``, the
# narrow model with a mask inside it. Sent as text (stream header, GetModel request, 1.5); "" is ``mask`` (1.4).
TIER_MODES: tuple[str, ...] = ("mask", "width", "both")


def parse_tier_mode(text: object) -> str:
    """The tier mode a peer sent: one of ``TIER_MODES``, "" (not sent: 1.4, or a node under mask) read as ``mask``;
    ValueError quoting anything else."""
    if text == "":
        return "mask"
    if not isinstance(text, str) or text not in TIER_MODES:
        raise ValueError(f"tier_mode={_shown(text)} is not one of {', '.join(TIER_MODES)}")
    return text


def parse_round_text(text: str) -> int:
    """A round sent as text: 1-16 ASCII digits; ValueError otherwise (its range: ``check_round``)."""
    if not isinstance(text, str) or _ROUND_TEXT_RE.fullmatch(text) is None:
        raise ValueError(f"round={_shown(text)} is not 1-16 ASCII digits")
    return int(text)


def parse_density_text(text: str) -> float:
    """A density sent as text: ASCII digits, point and exponent only (as ``repr(float)`` writes it); its range:
    ``check_density``."""
    if not isinstance(text, str) or _DENSITY_TEXT_RE.fullmatch(text) is None:
        raise ValueError(f"density={_shown(text)} is not an ASCII decimal number")
    return float(text)


def is_valid_fingerprint(fingerprint: object) -> bool:
    """Whether ``fingerprint`` is exactly what ``net/tls.py`` advertises: ``sha256:`` and 64 lower-case hex digits."""
    return isinstance(fingerprint, str) and _FINGERPRINT_RE.fullmatch(fingerprint) is not None


def check_fingerprint(fingerprint: object) -> str:
    """``fingerprint`` when valid (``is_valid_fingerprint``); ValueError quoting it otherwise."""
    if not is_valid_fingerprint(fingerprint):
        raise ValueError(f"fingerprint={_shown(fingerprint)} is not sha256:<64 lower-case hex digits>")
    assert isinstance(fingerprint, str)
    return fingerprint


@dataclass(frozen=True)
class NodeIdentity:
    """What a node advertises about itself (TXT record, Hello, a stream's header) and knows of a peer.

    None is a value not known yet: a static peer not heard from knows at most its configured node id; a node
    that has published no model has no ``round`` or ``density`` (its Hello carries 0 and 0.0); a tier not
    measured is None (Hello ``""``, TXT ``unknown``). Each wire's encoding of None is mapped where it enters,
    then :meth:`check` applies the one rule of each value that is known.
    """

    protocol_version: str | None = None  # MAJOR.MINOR: peers of another MAJOR ignore each other
    node_id: str | None = None
    fleet_id: str | None = None
    arch_id: str | None = None  # NAME/CLASSES/HASH8
    round: int | None = None  # the latest round published
    density: float | None = None  # the fraction of weights its model keeps, in (0, 1]
    tier: str | None = None  # capacity tier: t1..t5 or its density 0.2..1.0

    def check(self) -> NodeIdentity:
        """This identity with ``density`` as a float, when every known value keeps its rule.

        Raises:
            ValueError: naming the first field that breaks its rule, and its value.
        """
        if self.protocol_version is not None:
            parse_protocol_version(self.protocol_version)
        if self.node_id is not None:
            check_node_id(self.node_id)
        if self.fleet_id is not None:
            check_fleet_id(self.fleet_id, "fleet_id")
        if self.arch_id is not None:
            check_arch_id(self.arch_id)
        if self.round is not None:
            check_round(self.round)
        if self.tier is not None:
            check_tier(self.tier)
        return self if self.density is None else replace(self, density=check_density(self.density))

    def compatible(self, version: str = PROTOCOL_VERSION) -> bool:
        """Whether this node and one speaking ``version`` can talk: the same MAJOR protocol version.

        True while this identity's version is not known (a static peer not heard from yet: nothing against
        it). ValueError when either version is not MAJOR.MINOR.
        """
        if self.protocol_version is None:
            return True
        return protocol_major(self.protocol_version) == protocol_major(version)


def _shown(value: object) -> str:
    """``repr`` of a value, cut to 80 characters (peers may send kilobytes)."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
