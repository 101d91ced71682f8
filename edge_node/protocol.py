"""The protocol version shared by the wire format (stream header, Hello) and discovery (TXT ``v``).

Peers with another MAJOR version cannot talk to each other and ignore each other; a MINOR bump stays
compatible. 1.1 added ``GetModelRequest.round`` (pull one exact published round); servers of 1.0
ignore it and serve their latest snapshot, which the 1.1 client then refuses for its round.

Servers answer in the caller's version: they never send a field the caller's MINOR does not define,
so receivers refuse unknown fields in what peers send them (stream messages, Hello replies).
"""

from __future__ import annotations

import re

PROTOCOL_VERSION = "1.1"

# ASCII digits only ([0-9], not \d, which also matches other scripts' digits), matched in full (no
# trailing newline, which ``$`` would let through).
_VERSION_RE = re.compile(r"([0-9]{1,5})\.([0-9]{1,5})")

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
