"""The protocol version shared by the wire format (stream header, Hello) and discovery (TXT ``v``).

Peers with another MAJOR version cannot talk to each other and ignore each other; a MINOR bump stays
compatible.
"""

from __future__ import annotations

import re

PROTOCOL_VERSION = "1.0"

_VERSION_RE = re.compile(r"^(\d{1,5})\.(\d{1,5})$")


def parse_protocol_version(version: str) -> tuple[int, int]:
    """``"MAJOR.MINOR"`` as two ints; ValueError quoting the value when it is not of that form."""
    match = _VERSION_RE.match(version)
    if match is None:
        raise ValueError(f"protocol version {version!r} is not of the form MAJOR.MINOR")
    return int(match.group(1)), int(match.group(2))


def protocol_major(version: str) -> int:
    """The MAJOR part of a protocol version: peers talk only when it is equal."""
    return parse_protocol_version(version)[0]
