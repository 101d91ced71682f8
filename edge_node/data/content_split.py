"""Which side of a train/test split a sample falls on, decided by its content alone.

A flat data folder, or a data factory that returns no test set of its own, is split by this rule: the
same bytes land on the same side in every round, after every restart and on every machine (a keyed
BLAKE2b digest, never Python's salted ``hash``), so test results stay comparable while samples arrive.
"""

from __future__ import annotations

import hashlib

_PERSON = b"edge-node-split"  # keys the digest: this rule's sides, not another use's of the same bytes
_SPAN = float(1 << 64)


def is_test_sample(content: bytes, test_fraction: float) -> bool:
    """Whether the sample of these bytes belongs to the test side, for a share ``test_fraction`` in [0, 1]."""
    digest = hashlib.blake2b(content, digest_size=8, person=_PERSON).digest()
    return int.from_bytes(digest, "big") < test_fraction * _SPAN
