"""The daemon's between-phase trim gives freed heap memory back to the OS (glibc)."""

from __future__ import annotations

import psutil

from edge_node.node.memory import release_free_memory

MB = 2**20


def test_freed_heap_memory_goes_back_to_the_os():
    process = psutil.Process()
    before = process.memory_info().rss
    blocks = [bytearray(60_000) for _ in range(2500)]  # below glibc's mmap threshold: heap chunks
    keep = blocks[-1]  # the top chunk stays in use, so free() alone cannot shrink the heap
    del blocks
    held = process.memory_info().rss - before
    assert held > 100 * MB, f"the allocator gave back the freed blocks by itself ({held / MB:.0f} MB held)"
    assert release_free_memory()
    assert process.memory_info().rss - before < held - 100 * MB
    assert len(keep) == 60_000
