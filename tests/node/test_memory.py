"""The daemon's between-phase trim gives freed heap memory back to the OS (glibc)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from edge_node.node.memory import limit_malloc_arenas, reuse_freed_blocks

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


# Threads each malloc through ctypes (the GIL is released, so they overlap) and wait, so every thread
# holds an arena; malloc_info's XML has one <heap nr=...> per arena.
ARENAS = """
import ctypes, os, sys, tempfile, threading
from edge_node.node.memory import limit_malloc_arenas, reuse_freed_blocks

libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
if sys.argv[1] == "limit":
    assert limit_malloc_arenas(2)
barrier = threading.Barrier(8)
def work():
    for _ in range(200):
        libc.malloc(200)
    barrier.wait()
threads = [threading.Thread(target=work) for _ in range(8)]
for t in threads: t.start()
for t in threads: t.join()
libc.fdopen.restype = ctypes.c_void_p
libc.fdopen.argtypes = [ctypes.c_int, ctypes.c_char_p]
libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
libc.fclose.argtypes = [ctypes.c_void_p]
with tempfile.TemporaryFile() as out:
    fp = libc.fdopen(os.dup(out.fileno()), b"w")
    libc.malloc_info(0, fp)
    libc.fclose(fp)
    out.seek(0)
    print(out.read().decode().count("<heap nr="))
"""


def _arenas(mode: str, env: dict[str, str] | None = None) -> int:
    proc = subprocess.run([sys.executable, "-c", ARENAS, mode], capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    return int(proc.stdout.split()[-1])


def test_the_arena_cap_holds_threads_to_two_arenas():
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    assert _arenas("free", env) > 2  # glibc alone gives the 8 threads more arenas
    assert _arenas("limit", env) <= 2


def test_an_operators_malloc_arena_max_is_left_alone(monkeypatch):
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert limit_malloc_arenas() is False
    with pytest.raises(ValueError):
        limit_malloc_arenas(0)


# A pull's pattern: 30 messages' worth of blocks (800 KB each) allocated, touched and freed, again and
# again. glibc alone raises its mmap threshold to the block size, but trims the heap's top at twice
# that, so every round gives the 24 MB back and faults it in afresh; with reuse it is faulted in once.
REUSE = """
import ctypes, resource, sys
from edge_node.node.memory import reuse_freed_blocks

libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
if sys.argv[1] == "reuse":
    assert reuse_freed_blocks()
size = 800_000
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    blocks = [libc.malloc(size) for _ in range(30)]
    for block in blocks:
        libc.memset(block, 1, size)
    for block in blocks:
        libc.free(block)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str, env: dict[str, str] | None = None) -> int:
    proc = subprocess.run([sys.executable, "-c", REUSE, mode], capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    return int(proc.stdout.split()[-1])


def test_freed_blocks_are_reused_instead_of_mapped_afresh():
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    pages = 30 * 800_000 // 4096
    assert _faults("default", env) > 10 * pages  # glibc alone: most of the 20 rounds faulted in afresh
    assert _faults("reuse", env) < 2 * pages  # faulted in once, then reused


def test_an_operators_malloc_thresholds_are_left_alone(monkeypatch):
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")
    assert reuse_freed_blocks() is False
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_")
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=1")
    assert reuse_freed_blocks() is False
