"""Device cgroups: the layout found, the wrapper that joins a group, limits the kernel enforces, clean-up."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from edge_node.fleet import cgroups as _cgroups
from edge_node.fleet.netns import unique_name

HYBRID_MOUNTS = """\
tmpfs /sys/fs/cgroup tmpfs rw,relatime,mode=755 0 0
cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0
cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0
cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0
"""
OWN = "4:memory:/jobs/42\n1:cpu:/\n0::/\n"


def test_v1_hierarchy_nests_under_our_own_groups_when_v2_lacks_the_controllers():
    found = _cgroups.find_hierarchy(HYBRID_MOUNTS, OWN, {Path("/sys/fs/cgroup/unified"): "hugetlb\n"})
    assert found is not None and found.version == 1
    assert found.cpu_parent == Path("/sys/fs/cgroup/cpu")
    assert found.memory_parent == Path("/sys/fs/cgroup/memory/jobs/42")
    assert found.mount_args == (("cgroup", "cpu", Path("/sys/fs/cgroup/cpu")),
                                ("cgroup", "memory", Path("/sys/fs/cgroup/memory")))  # fmt: skip


def test_v2_is_used_where_it_has_cpu_and_memory_and_nothing_without_controllers():
    mounts = "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid,nsdelegate 0 0\n"
    found = _cgroups.find_hierarchy(mounts, "0::/user.slice\n", {Path("/sys/fs/cgroup"): "cpuset cpu io memory pids"})
    assert found is not None and found.version == 2
    assert found.cpu_parent == found.memory_parent == Path("/sys/fs/cgroup") and len(found.parents) == 1
    assert _cgroups.find_hierarchy(mounts, "0::/\n", {Path("/sys/fs/cgroup"): "pids"}) is None
    assert _cgroups.find_hierarchy("proc /proc proc rw 0 0\n", "", {}) is None


def test_the_wrapper_writes_the_pid_that_then_runs_the_command(tmp_path):
    """The shell writes its own pid to each group's cgroup.procs, then execs: the command keeps that pid."""
    group = _cgroups.DeviceGroup("g", (tmp_path / "a", tmp_path / "b"), 1)
    for d in group.dirs:
        d.mkdir()
    argv = group.wrap([sys.executable, "-c", "import os; print(os.getpid())"])
    pid = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True).stdout.strip()
    assert [(d / "cgroup.procs").read_text().strip() for d in group.dirs] == [pid, pid]
    missing = _cgroups.DeviceGroup("g", (tmp_path / "gone",), 1).wrap(["true"])
    result = subprocess.run(missing, capture_output=True, text=True, timeout=30)
    assert result.returncode == _cgroups.JOIN_FAILED and "could not join the cgroup" in result.stderr


@pytest.fixture
def hierarchy(require_root) -> _cgroups.Hierarchy:
    found = _cgroups.system_hierarchy()
    if found is None:
        pytest.skip("no cgroup hierarchy with the cpu and memory controllers")
    return found


def _cpu_seconds_in(group: _cgroups.DeviceGroup, wall_s: float) -> float:
    """CPU seconds a busy loop of ``wall_s`` got inside ``group``."""
    spin = f"import time, os\nend = time.time() + {wall_s}\nwhile time.time() < end: pass\nprint(sum(os.times()[:2]))"
    out = subprocess.run(group.wrap([sys.executable, "-c", spin]), capture_output=True, text=True, timeout=60,
                         check=True).stdout  # fmt: skip
    return float(out.strip())


def test_the_kernel_enforces_the_cpu_quota_and_the_memory_limit(hierarchy):
    with _cgroups.device_group(hierarchy, "t", kind="test", cpu=0.2, memory_bytes=256 * 2**20, weight=0.5) as group:
        assert all(d.is_dir() for d in group.dirs)
        weight_file, weight = ("cpu.shares", "512") if hierarchy.version == 1 else ("cpu.weight", "50")
        assert (group.dirs[0] / weight_file).read_text().strip() == weight  # half an ordinary process's
        # 2 s of spinning at 0.2 CPUs: about 0.4 s of CPU (less on a loaded machine, never much more)
        assert _cpu_seconds_in(group, 2.0) < 0.6
        hog = "b = bytearray(512 * 2**20); b[::4096] = b'x' * len(b[::4096]); print('survived')"
        result = subprocess.run(group.wrap([sys.executable, "-c", hog]), capture_output=True, text=True, timeout=60)
        assert result.returncode == -9 and "survived" not in result.stdout  # the OOM killer, within the group
        assert group.oom_kills() >= 1
        dirs = group.dirs
    assert not any(d.exists() for d in dirs)


def test_a_bad_limit_leaves_no_group_behind(hierarchy):
    name = unique_name("bad", "test")
    with pytest.raises(_cgroups.ConfigError, match="at least 64 MiB"):
        _cgroups.create_group(hierarchy, name, cpu=1.0, memory_bytes=2**20)
    assert not any((p / name).exists() for p in hierarchy.parents)


def test_groups_of_a_killed_run_are_removed_by_the_next(hierarchy):
    dead = subprocess.Popen(["true"])
    dead.wait()
    name = f"en-test-{dead.pid}-0-left"
    assert not Path(f"/proc/{dead.pid}").exists()
    group = _cgroups.create_group(hierarchy, name, cpu=0.5, memory_bytes=None)
    mine = _cgroups.create_group(hierarchy, unique_name("mine", "test"), cpu=0.5, memory_bytes=None)
    try:
        removed = _cgroups.cleanup_stale(hierarchy, "test")
        assert [str(d) for d in group.dirs] == [r for r in removed if name in r]
        assert not any(d.exists() for d in group.dirs) and all(d.exists() for d in mine.dirs)
    finally:
        _cgroups.remove_group(group)
        _cgroups.remove_group(mine)


def test_devices_without_root_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(_cgroups.os, "geteuid", lambda: 1000)
    with pytest.raises(_cgroups.ConfigError, match=r"^--devices needs root to create cgroups"):
        _cgroups.check_available()
