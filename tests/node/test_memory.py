"""The daemon's between-phase trim gives freed heap memory back to the OS (glibc)."""

from __future__ import annotations

import subprocess
import sys

# In a fresh interpreter: in the test session's long-lived heap, the blocks would partly land in chunks
# earlier tests freed, and RSS would not show them come and go.
CHECK = """
import psutil
from edge_node.node.memory import release_free_memory

MB = 2**20
process = psutil.Process()
before = process.memory_info().rss
blocks = [bytearray(60_000) for _ in range(2500)]  # below glibc's mmap threshold: heap chunks
keep = blocks[-1]  # the top chunk stays in use, so free() alone cannot shrink the heap
del blocks
held = process.memory_info().rss - before
assert held > 100 * MB, f"the allocator gave back the freed blocks by itself ({held / MB:.0f} MB held)"
assert release_free_memory(), "malloc_trim gave nothing back"
after = process.memory_info().rss - before
assert after < held - 100 * MB, f"{held / MB:.0f} MB held before the trim, {after / MB:.0f} MB after"
assert len(keep) == 60_000
print(f"held {held / MB:.0f} MB, after trim {after / MB:.0f} MB")
"""


def test_freed_heap_memory_goes_back_to_the_os():
    proc = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "after trim" in proc.stdout
