"""Giving freed heap memory back to the OS between a round's phases.

A node's peak comes and goes each round: pulled models, the aggregate, training activations and
gradients, evaluation. glibc's allocator keeps freed chunks in its arenas (one per thread that
allocated, and the gRPC and torch threads all do), so without a trim a daemon's RSS stays near the
peak of its busiest phase for good. ``release_free_memory`` asks glibc to return what is free
(``malloc_trim(0)``, a few milliseconds); elsewhere it does nothing (there is nothing to call).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys
from typing import Any

_LOGGER = logging.getLogger(__name__)
_libc: Any = None
_looked_up = False


def _malloc_trim() -> Any:
    global _libc, _looked_up
    if not _looked_up:
        _looked_up = True
        if sys.platform.startswith("linux"):
            try:
                _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
                _libc.malloc_trim.argtypes = [ctypes.c_size_t]
            except (OSError, AttributeError):  # musl has no malloc_trim: its heap is trimmed on free
                _LOGGER.debug("malloc_trim not available; freed heap memory stays with the allocator")
                _libc = None
    return _libc.malloc_trim if _libc is not None else None


def release_free_memory() -> bool:
    """Return free heap pages to the OS (glibc); True when the allocator gave something back."""
    trim = _malloc_trim()
    return bool(trim(0)) if trim is not None else False
