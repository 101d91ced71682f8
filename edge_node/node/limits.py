"""The CPU and memory limits this process runs under: its cgroup's CPU quota and memory limit.

A device limited by cgroups (a container, a systemd slice, ``edge-node loopback --devices``) sees the
machine's CPUs and memory in ``os.sched_getaffinity`` and ``/proc/meminfo``, not what it may use. The
capacity probe (:mod:`edge_node.node.capacity`) takes the smaller of both from here:

* CPUs: ``cpu.max`` (v2) or ``cpu.cfs_quota_us / cpu.cfs_period_us`` (v1) of this process's cgroup
  and of every ancestor, the smallest;
* memory: ``memory.max`` (v2) or ``memory.limit_in_bytes`` (v1) of the cgroup and its ancestors,
  and what is left under the binding one: the limit less the group's usage, page cache that the kernel
  can drop (``inactive_file``) not counted as used.

Both layouts are read where present (a hybrid machine has v1 controllers and an empty v2 mount); a
file that is missing or unreadable contributes nothing. The functions take the text of
``/proc/self/mounts`` and ``/proc/self/cgroup`` so tests can point them at a fake tree.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

UNLIMITED_BYTES = 2**60  # v1 writes "no limit" as 2^63 rounded to pages; anything this large is none


@dataclass(frozen=True)
class Limits:
    """What the cgroups allow this process; None where nothing limits it."""

    cpus: float | None  # CPU time the quota allows, in CPUs (0.25: a quarter of one core)
    cpu_detail: str
    memory_limit_bytes: int | None
    memory_available_bytes: int | None  # the limit less what the group already uses
    memory_detail: str


def _mounts(mounts: str) -> tuple[Path | None, dict[str, Path]]:
    """The cgroup2 mount, and each v1 controller's mount."""
    v2: Path | None = None
    v1: dict[str, Path] = {}
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        if fields[2] == "cgroup2" and v2 is None:
            v2 = Path(fields[1])
        elif fields[2] == "cgroup":
            for option in fields[3].split(","):
                v1.setdefault(option, Path(fields[1]))
    return v2, v1


def own_dirs(mounts: str, proc_cgroup: str, controller: str) -> list[tuple[int, Path, Path]]:
    """``(version, mount, directory)`` of this process's cgroup holding ``controller``, in each layout."""
    v2, v1 = _mounts(mounts)
    out = []
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        rel = parts[2].strip().lstrip("/")
        if parts[0] == "0" and parts[1] == "" and v2 is not None:
            out.append((2, v2, v2 / rel))
        elif controller in parts[1].split(",") and controller in v1:
            out.append((1, v1[controller], v1[controller] / rel))
    return out


def _up(mount: Path, d: Path) -> Iterator[Path]:
    """``d`` and its ancestors up to ``mount``."""
    while True:
        yield d
        if d == mount or mount not in d.parents:
            return
        d = d.parent


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _cpus_at(version: int, d: Path) -> float | None:
    if version == 2:
        text = _read(d / "cpu.max")
        if text is None or text.startswith("max"):
            return None
        quota, _, period = text.partition(" ")
    else:
        quota, period = _read(d / "cpu.cfs_quota_us") or "-1", _read(d / "cpu.cfs_period_us") or "0"
    try:
        q, p = int(quota), int(period or "100000")
    except ValueError:
        return None
    return q / p if q > 0 and p > 0 else None


def _stat(d: Path, key: str) -> int:
    for line in (_read(d / "memory.stat") or "").splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return 0


def _memory_at(version: int, d: Path) -> tuple[int, int] | None:
    """``(limit, used)`` of the group ``d`` when it has a limit (page cache it can drop not counted)."""
    names = ("memory.max", "memory.current") if version == 2 else ("memory.limit_in_bytes", "memory.usage_in_bytes")
    limit_text, usage_text = _read(d / names[0]), _read(d / names[1])
    if limit_text is None or not limit_text.isdigit() or int(limit_text) >= UNLIMITED_BYTES:
        return None
    usage = int(usage_text) if usage_text and usage_text.isdigit() else 0
    inactive = _stat(d, "inactive_file" if version == 2 else "total_inactive_file")
    return int(limit_text), max(0, usage - inactive)


def _levels(
    mounts: str, proc_cgroup: str, controller: str, at: Callable[[int, Path], T | None]
) -> list[tuple[Path, T]]:
    """``at(version, dir)`` of every level of this process's cgroups holding ``controller`` that has a value."""
    found = []
    for version, mount, d in own_dirs(mounts, proc_cgroup, controller):
        for level in _up(mount, d):
            value = at(version, level)
            if value is not None:
                found.append((level, value))
    return found


def read_limits(mounts: str, proc_cgroup: str) -> Limits:
    """The limits of the cgroups named in ``proc_cgroup`` (``/proc/self/cgroup``'s text)."""
    cpus: float | None = None
    cpu_detail = "no CPU quota"
    for level, value in _levels(mounts, proc_cgroup, "cpu", _cpus_at):
        if cpus is None or value < cpus:
            cpus, cpu_detail = value, f"CPU quota {value:.2f} CPUs ({level})"
    limit = available = None
    memory_detail = "no memory limit"
    for level, (group_limit, used) in _levels(mounts, proc_cgroup, "memory", _memory_at):
        left = max(0, group_limit - used)
        if available is None or left < available:
            limit, available = group_limit, left
            memory_detail = f"memory limit {group_limit / 2**20:.0f} MiB, {used / 2**20:.0f} MiB in use ({level})"
    return Limits(cpus, cpu_detail, limit, available, memory_detail)


def own_limits() -> Limits:
    """:func:`read_limits` of this process (no limits where /proc cannot be read)."""
    mounts, cgroup = _read(Path("/proc/self/mounts")), _read(Path("/proc/self/cgroup"))
    if mounts is None or cgroup is None:
        return Limits(None, "no CPU quota (/proc not readable)", None, None, "no memory limit (/proc not readable)")
    return read_limits(mounts, cgroup)


def ceil_cpus(cpus: float) -> int:
    """Whole CPUs to report for a quota of ``cpus`` (at least 1: a quarter of a core still runs)."""
    return max(1, math.ceil(cpus - 1e-9))
