"""CPU and memory limits of a loopback fleet's devices, enforced by the kernel's cgroups (needs root).

Each limited node gets a group of its own, named like the fleet's namespaces (``en-<kind>-<pid>-<n>-<tag>``,
see :func:`edge_node.fleet.netns.unique_name`), and its daemon joins it before it execs (:meth:`DeviceGroup.wrap`),
so everything the daemon starts is limited too. A daemon in a network namespace is started by ``ip netns
exec``, which gives it a fresh ``/sys`` without the cgroup mounts; its wrapper mounts the same hierarchies
again there (in that private mount namespace only), so that the node can read its own limits
(:mod:`edge_node.node.limits`). Two layouts are handled:

* cgroup v2, where a ``cgroup2`` mount offers both the ``cpu`` and the ``memory`` controller: one group
  under the hierarchy's root with ``cpu.max``, ``cpu.weight`` and ``memory.max`` (and
  ``memory.swap.max = 0``);
* cgroup v1 otherwise (``cpu`` and ``memory`` hierarchies mounted apart, as on kernels booted with v1 or
  hybrid): a group in each, below the cgroup this process is in, with ``cpu.cfs_quota_us`` /
  ``cpu.cfs_period_us``, ``cpu.shares`` and ``memory.limit_in_bytes`` (and ``memory.memsw.limit_in_bytes``
  where swap is accounted). Nested under our own cgroup, a device never gets more than the supervisor
  itself may use.

The quota is a ceiling: a device never runs faster than its share. When the machine's cores are
contended (more runnable work than cores) no group gets its full quota, so the weight (``cpu.shares`` /
``cpu.weight``, in proportion to the quota, the fastest device weighing as much as an ordinary process)
keeps the devices' speeds in the ratio of their profiles.

Every group is removed when the fleet closes (its remaining processes, ours, are killed first), and
:func:`cleanup_stale` removes the groups of a killed run: those whose creating process is gone.
"""

from __future__ import annotations

import logging
import os
import shlex
import signal
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from edge_node.errors import ConfigError, EdgeNodeError
from edge_node.fleet.netns import PREFIX, creator_pid, unique_name

_LOGGER = logging.getLogger(__name__)

CFS_PERIOD_US = 100_000  # the kernel's default period; the quota is a share of it
MIN_CPU = 0.01  # 1 ms per 100 ms: below this the daemon cannot even answer its status socket in time
MIN_MEMORY_BYTES = 64 * 2**20
SCAN_DEPTH = 4  # how deep cleanup_stale looks for our groups below a hierarchy's root
REMOVE_WAIT_S = 5.0  # the longest wait for a group's processes to go before rmdir gives up
JOIN_FAILED = 125  # the exit status of a daemon that could not join its group (it never started)
_GENERIC_MOUNT_OPTIONS = frozenset({"rw", "ro", "relatime", "noatime", "nosuid", "nodev", "noexec", "seclabel"})
CGROUP_FS = Path("/sys/fs/cgroup")


class CgroupError(EdgeNodeError):
    """A device group could not be made, limited or removed (a kernel refusal)."""


@dataclass(frozen=True)
class Hierarchy:
    """Where device groups are made: one directory per controller (v2: the same one twice)."""

    version: int  # 1 or 2
    cpu_parent: Path
    memory_parent: Path
    roots: tuple[Path, ...]  # the mounts, scanned by cleanup_stale
    mount_args: tuple[tuple[str, str, Path], ...] = ()  # (type, options, where) of each, to mount them again

    @property
    def parents(self) -> tuple[Path, ...]:
        return (self.cpu_parent,) if self.cpu_parent == self.memory_parent else (self.cpu_parent, self.memory_parent)


def find_hierarchy(mounts: str, own_cgroups: str, read_controllers: dict[Path, str]) -> Hierarchy | None:
    """The layout to use from ``/proc/self/mounts``, ``/proc/self/cgroup`` and each cgroup2 mount's
    ``cgroup.controllers`` text; None when neither v2 nor v1 offers both ``cpu`` and ``memory``."""
    v1: dict[str, Path] = {}
    v1_options: dict[Path, str] = {}
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        where, fstype, options = Path(fields[1]), fields[2], fields[3].split(",")
        if fstype == "cgroup2" and {"cpu", "memory"} <= set(read_controllers.get(where, "").split()):
            return Hierarchy(2, where, where, (where,), (("cgroup2", "", where),))
        if fstype == "cgroup":
            for controller in ("cpu", "memory"):
                if controller in options:
                    v1[controller] = where
                    v1_options[where] = ",".join(o for o in options if o not in _GENERIC_MOUNT_OPTIONS)
    if set(v1) != {"cpu", "memory"}:
        return None
    own: dict[str, str] = {}
    for line in own_cgroups.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            for controller in parts[1].split(","):
                own[controller] = parts[2]
    cpu = v1["cpu"] / own.get("cpu", "/").lstrip("/")
    memory = v1["memory"] / own.get("memory", "/").lstrip("/")
    roots = (v1["cpu"], v1["memory"]) if v1["cpu"] != v1["memory"] else (v1["cpu"],)
    return Hierarchy(1, cpu, memory, roots, tuple(("cgroup", v1_options[r], r) for r in roots))


def system_hierarchy() -> Hierarchy | None:
    """:func:`find_hierarchy` of this machine, for this process."""
    try:
        mounts = Path("/proc/self/mounts").read_text()
        own = Path("/proc/self/cgroup").read_text()
    except OSError:
        return None
    controllers = {}
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[2] == "cgroup2":
            with suppress(OSError):
                controllers[Path(fields[1])] = (Path(fields[1]) / "cgroup.controllers").read_text()
    return find_hierarchy(mounts, own, controllers)


def check_available() -> Hierarchy:
    """The hierarchy to use; ConfigError (one line) when this process cannot limit devices."""
    if os.geteuid() != 0:
        raise ConfigError("--devices needs root to create cgroups (run as root, or leave out --devices)")
    found = system_hierarchy()
    if found is None:
        raise ConfigError("--devices needs the cgroup cpu and memory controllers (cgroup v2 with both enabled, "
                          "or v1 with both mounted); this machine has neither")  # fmt: skip
    return found


@dataclass(frozen=True)
class DeviceGroup:
    """One device's group: its directory in each hierarchy (v1: cpu and memory; v2: one)."""

    name: str
    dirs: tuple[Path, ...]
    version: int

    def wrap(self, argv: Sequence[str], namespace: str | None = None, hierarchy: Hierarchy | None = None) -> list[str]:
        """``argv`` run by a shell that first moves itself into this group, then execs it (same pid).

        With ``namespace``, the shell runs under ``ip netns exec`` and first mounts ``hierarchy`` again in
        the fresh ``/sys`` that gives it (a mount namespace of its own: nothing changes outside it).
        """
        join = (
            'while [ "$1" != -- ]; do echo $$ > "$1" || { echo "edge-node: could not join the cgroup $1" >&2; '
            f'exit {JOIN_FAILED}; }}; shift; done; shift; exec "$@"'
        )
        files = [str(d / "cgroup.procs") for d in self.dirs]
        if namespace is None:
            return ["sh", "-c", join, "edge-node-cgroup", *files, "--", *argv]
        mounts = []
        points = [where for _, _, where in (hierarchy.mount_args if hierarchy else ())]
        if any(CGROUP_FS in where.parents for where in points):
            mounts.append(f"mount -t tmpfs -o mode=755 edge-node-cgroups {CGROUP_FS}")
        for fstype, options, where in hierarchy.mount_args if hierarchy else ():
            opts = f"-o {shlex.quote(options)} " if options else ""
            mounts.append(
                f"mkdir -p {shlex.quote(str(where))} && mount -t {fstype} {opts}cgroup {shlex.quote(str(where))}"
            )
        setup = " && ".join(mounts) or "true"
        failed = f'{{ echo "edge-node: could not mount the cgroup hierarchies" >&2; exit {JOIN_FAILED}; }}'
        script = f"{setup} || {failed}; {join}"
        return ["ip", "netns", "exec", namespace, "sh", "-c", script, "edge-node-cgroup", *files, "--", *argv]

    def set_cpu(self, cpu: float | None) -> None:
        """Change the group's CPU quota now (None: no quota), as an operator changes a running container's."""
        if cpu is not None and cpu < MIN_CPU:
            raise ConfigError(f"cpu={cpu:g} must be at least {MIN_CPU:g} of a CPU")
        if self.version == 2:
            _write(self.dirs[0] / "cpu.max", f"{'max' if cpu is None else cpu_quota_us(cpu)} {CFS_PERIOD_US}")
        else:
            _write(self.dirs[0] / "cpu.cfs_quota_us", "-1" if cpu is None else str(cpu_quota_us(cpu)))

    def oom_kills(self) -> int:
        """How often the kernel's OOM killer killed a process of this group (0 when it cannot say)."""
        name, key = ("memory.events", "oom_kill") if self.version == 2 else ("memory.oom_control", "oom_kill")
        for d in self.dirs:
            with suppress(OSError, ValueError):
                for line in (d / name).read_text().splitlines():
                    word, _, value = line.partition(" ")
                    if word == key:
                        return int(value)
        return 0


def cpu_quota_us(cpu: float, period_us: int = CFS_PERIOD_US) -> int:
    """The CFS quota per ``period_us`` for a share of ``cpu`` CPUs (0.25: a quarter of one core)."""
    return max(1000, round(cpu * period_us))  # the kernel refuses quotas under 1 ms


def _write(path: Path, value: str) -> None:
    try:
        path.write_text(value)
    except OSError as exc:
        raise CgroupError(f"cannot write {value!r} to {path}: {exc.strerror or exc}") from None


def _limit(hierarchy: Hierarchy, cpu_dir: Path, memory_dir: Path, cpu: float | None, memory: int | None,
           weight: float) -> None:  # fmt: skip
    if hierarchy.version == 2:
        if cpu is not None:
            _write(cpu_dir / "cpu.max", f"{cpu_quota_us(cpu)} {CFS_PERIOD_US}")
            _write(cpu_dir / "cpu.weight", str(max(1, round(100 * weight))))  # 100: an ordinary group
        if memory is not None:
            _write(memory_dir / "memory.max", str(memory))
            if (memory_dir / "memory.swap.max").exists():
                _write(memory_dir / "memory.swap.max", "0")
        return
    if cpu is not None:
        _write(cpu_dir / "cpu.cfs_period_us", str(CFS_PERIOD_US))
        _write(cpu_dir / "cpu.cfs_quota_us", str(cpu_quota_us(cpu)))
        _write(cpu_dir / "cpu.shares", str(max(2, round(1024 * weight))))  # 1024: an ordinary process
    if memory is not None:
        _write(memory_dir / "memory.limit_in_bytes", str(memory))
        if (memory_dir / "memory.memsw.limit_in_bytes").exists():  # swap accounted: no swapping past the limit
            _write(memory_dir / "memory.memsw.limit_in_bytes", str(memory))


def _enable_v2_controllers(parent: Path) -> None:
    """Let groups under ``parent`` use cpu and memory (cgroup v2's ``cgroup.subtree_control``)."""
    enabled = set((parent / "cgroup.subtree_control").read_text().split())
    if not {"cpu", "memory"} <= enabled:
        _write(parent / "cgroup.subtree_control", "+cpu +memory")


def create_group(hierarchy: Hierarchy, name: str, *, cpu: float | None, memory_bytes: int | None,
                 weight: float = 1.0) -> DeviceGroup:  # fmt: skip
    """A group ``name`` limited to ``cpu`` CPUs and ``memory_bytes`` (None: not limited), with a CPU weight of
    ``weight`` (in (0, 1]) times an ordinary process's; removed again when setting a limit fails."""
    if cpu is not None and cpu < MIN_CPU:
        raise ConfigError(f"cpu={cpu:g} must be at least {MIN_CPU:g} of a CPU")
    if not 0 < weight <= 1:
        raise ValueError(f"weight={weight} must be in (0, 1]")
    if memory_bytes is not None and memory_bytes < MIN_MEMORY_BYTES:
        raise ConfigError(f"mem={memory_bytes} bytes must be at least {MIN_MEMORY_BYTES // 2**20} MiB")
    if hierarchy.version == 2:
        _enable_v2_controllers(hierarchy.cpu_parent)
    dirs = tuple(parent / name for parent in hierarchy.parents)
    group = DeviceGroup(name, dirs, hierarchy.version)
    made = []
    try:
        for d in dirs:
            try:
                d.mkdir()
            except OSError as exc:
                raise CgroupError(f"cannot create the cgroup {d}: {exc.strerror or exc}") from None
            made.append(d)
        _limit(hierarchy, dirs[0], dirs[-1], cpu, memory_bytes, weight)
    except BaseException:
        remove_group(DeviceGroup(name, tuple(made), hierarchy.version))
        raise
    return group


def _pids(d: Path) -> list[int]:
    try:
        return [int(p) for p in (d / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def remove_group(group: DeviceGroup, wait_s: float = REMOVE_WAIT_S) -> None:
    """Kill what still runs in ``group`` (our daemons, by pid) and remove its directories; no error if gone."""
    for d in group.dirs:
        deadline = time.monotonic() + wait_s
        while d.exists():
            for pid in _pids(d):
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            try:
                d.rmdir()
            except FileNotFoundError:
                break
            except OSError as exc:  # EBUSY while killed processes are being reaped
                if time.monotonic() > deadline:
                    _LOGGER.warning("cannot remove the cgroup %s: %s", d, exc.strerror or exc)
                    break
                time.sleep(0.05)


@contextmanager
def device_group(hierarchy: Hierarchy, tag: str, *, kind: str = "fleet", cpu: float | None,
                 memory_bytes: int | None, weight: float = 1.0) -> Iterator[DeviceGroup]:  # fmt: skip
    """:func:`create_group` with a unique name, removed on exit."""
    group = create_group(hierarchy, unique_name(tag, kind), cpu=cpu, memory_bytes=memory_bytes, weight=weight)
    try:
        yield group
    finally:
        remove_group(group)


def our_groups(hierarchy: Hierarchy, kind: str | None = None) -> list[Path]:
    """Directories of groups named by us (of ``kind``, or any) anywhere within ``SCAN_DEPTH`` of the roots."""
    found = []
    level = list(hierarchy.roots)
    for _ in range(SCAN_DEPTH):
        below = []
        for d in level:
            try:
                children = [c for c in d.iterdir() if c.is_dir()]
            except OSError:
                continue
            for child in children:
                if child.name.startswith(PREFIX) and creator_pid(child.name) is not None:
                    if kind is None or child.name.startswith(f"{PREFIX}{kind}-"):
                        found.append(child)
                else:
                    below.append(child)
        level = below
    return found


def cleanup_stale(hierarchy: Hierarchy | None, kind: str | None = None) -> list[str]:
    """Remove our groups (of ``kind``, or any) whose creating process no longer exists; returns their paths."""
    if hierarchy is None:
        return []
    removed = []
    for d in our_groups(hierarchy, kind):
        pid = creator_pid(d.name)
        if pid is None or Path(f"/proc/{pid}").exists():
            continue
        remove_group(DeviceGroup(d.name, (d,), hierarchy.version))
        removed.append(str(d))
    if removed:
        _LOGGER.warning("removed %d cgroup(s) left by a killed run: %s", len(removed), ", ".join(removed))
    return removed
