"""Giving freed heap memory back to the OS between a round's phases.

A node's peak comes and goes each round: pulled models, the aggregate, training activations and
gradients, evaluation. glibc's allocator keeps freed chunks in its arenas (one per thread that
allocated, and the gRPC and torch threads all do), so without a trim a daemon's RSS stays near the
peak of its busiest phase for good. ``release_free_memory`` asks glibc to return what is free
(``malloc_trim(0)``, a few milliseconds); elsewhere it does nothing (there is nothing to call).

The arenas themselves are the other half. glibc gives threads up to 8 per core, and a daemon's
gRPC, discovery and torch threads spread over them; each keeps its own free chunks, so RSS crept
up for 30 minutes in an 8-daemon soak (about 415 -> 460 MB, still rising +11..+75 MB/h over
its last 15 minutes). ``limit_malloc_arenas`` caps them (default 2) before the node starts any
thread: the same fleet then stayed flat near 380 MB over 15 minutes, with 1-2 % fewer rounds
(``docs/RESULTS.md``).
An operator's own ``MALLOC_ARENA_MAX`` wins: glibc read it at start-up and it is left alone.

Within a phase the opposite holds: blocks freed should be reused, not handed back. glibc maps every
block above its mmap threshold (128 KiB at start, raised only as such blocks are freed, with the heap
trimmed at twice that) and unmaps it on free, so a pull's temporaries (each message's bytes, a
tensor's positions: about 100 MB for ResNet18) were faulted in afresh on every pull, 20-30 ms of
system time against 7-9 ms with blocks reused. ``reuse_freed_blocks`` keeps blocks up to glibc's
largest threshold (32 MB on 64-bit) in the heap and trims only explicitly: ``release_free_memory``
between phases still gives free memory back, so RSS between rounds is unchanged.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import sys
from typing import Any

_LOGGER = logging.getLogger(__name__)
_libc: Any = None
_looked_up = False
M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
DEFAULT_ARENAS = 2
TRIM_THRESHOLD = 256 * 2**20  # free memory at the heap's top kept for reuse (explicit trims still give it back)
_OPERATOR_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")


def _glibc() -> Any:
    """glibc through ctypes (None elsewhere: musl has neither malloc_trim nor arenas to cap)."""
    global _libc, _looked_up
    if not _looked_up:
        _looked_up = True
        if sys.platform.startswith("linux"):
            try:
                _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
                _libc.malloc_trim.argtypes = [ctypes.c_size_t]
                _libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
            except (OSError, AttributeError):  # musl has no malloc_trim: its heap is trimmed on free
                _LOGGER.debug("not glibc: freed heap memory stays with the allocator")
                _libc = None
    return _libc


def limit_malloc_arenas(count: int = DEFAULT_ARENAS) -> bool:
    """Cap glibc's malloc arenas at ``count`` for threads started from now on; True when set.

    Does nothing (False) where the allocator is not glibc, or when ``MALLOC_ARENA_MAX`` is in the
    environment (the operator's choice, already applied by glibc).
    """
    if count < 1:
        raise ValueError(f"count={count} must be at least 1")
    libc = _glibc()
    if libc is None or "MALLOC_ARENA_MAX" in os.environ:
        return False
    return bool(libc.mallopt(M_ARENA_MAX, count))


def reuse_freed_blocks() -> bool:
    """Keep freed blocks up to glibc's largest mmap threshold in the heap for reuse; True when set.

    Does nothing (False) where the allocator is not glibc, or when the operator chose thresholds
    (``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``, or ``glibc.malloc`` in ``GLIBC_TUNABLES``).
    """
    libc = _glibc()
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    if libc is None or any(name in os.environ for name in _OPERATOR_SETTINGS) or "glibc.malloc." in tunables:
        return False
    largest = 4 * 2**20 * ctypes.sizeof(ctypes.c_long)  # DEFAULT_MMAP_THRESHOLD_MAX: 32 MB on 64-bit
    return bool(libc.mallopt(M_MMAP_THRESHOLD, largest)) and bool(libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))


def configure_allocator() -> None:
    """What ``edge-node start`` sets before it starts any thread: the arena cap and block reuse."""
    limit_malloc_arenas()
    reuse_freed_blocks()


def release_free_memory() -> bool:
    """Return free heap pages to the OS (glibc); True when the allocator gave something back."""
    libc = _glibc()
    return bool(libc.malloc_trim(0)) if libc is not None else False
