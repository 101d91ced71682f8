"""The node's view of its cgroup limits (node/limits.py) and what capacity auto makes of them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from edge_node.errors import ConfigError
from edge_node.fleet import cgroups as _cgroups
from edge_node.node import capacity
from edge_node.node.limits import ceil_cpus, read_limits


def _files(d: Path, **files: str) -> None:
    d.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (d / name.replace("__", ".")).write_text(text + "\n")


def test_v1_limits_take_the_smallest_level_and_drop_reclaimable_cache(tmp_path):
    cpu, memory = tmp_path / "cpu", tmp_path / "memory"
    _files(cpu, cpu__cfs_quota_us="-1", cpu__cfs_period_us="100000")
    _files(cpu / "dev", cpu__cfs_quota_us="25000", cpu__cfs_period_us="100000")
    _files(memory / "jobs", memory__limit_in_bytes=str(2**30), memory__usage_in_bytes=str(100 * 2**20),
           memory__stat="total_inactive_file 0")  # fmt: skip
    _files(memory / "jobs" / "dev", memory__limit_in_bytes=str(512 * 2**20),
           memory__usage_in_bytes=str(300 * 2**20), memory__stat=f"total_inactive_file {100 * 2**20}")  # fmt: skip
    mounts = f"cgroup {cpu} cgroup rw,cpu 0 0\ncgroup {memory} cgroup rw,memory 0 0\n"
    limits = read_limits(mounts, "2:memory:/jobs/dev\n1:cpu:/dev\n0::/\n")
    assert limits.cpus == 0.25 and str(cpu / "dev") in limits.cpu_detail
    assert limits.memory_limit_bytes == 512 * 2**20
    assert limits.memory_available_bytes == (512 - 200) * 2**20  # 300 MiB used, 100 MiB of it droppable cache
    # a parent that leaves less than the child's own limit binds
    _files(memory / "jobs", memory__usage_in_bytes=str(900 * 2**20))
    tight = read_limits(mounts, "2:memory:/jobs/dev\n1:cpu:/dev\n")
    assert tight.memory_limit_bytes == 2**30 and tight.memory_available_bytes == 124 * 2**20


def test_v2_limits_and_no_limits(tmp_path):
    root = tmp_path / "unified"
    _files(root / "dev", cpu__max="50000 100000", memory__max=str(2**30), memory__current=str(2**28),
           memory__stat="inactive_file 0")  # fmt: skip
    _files(root / "free", cpu__max="max 100000", memory__max="max", memory__current="1")
    mounts = f"cgroup2 {root} cgroup2 rw 0 0\n"
    limits = read_limits(mounts, "0::/dev\n")
    assert (limits.cpus, limits.memory_limit_bytes, limits.memory_available_bytes) == (0.5, 2**30, 3 * 2**28)
    free = read_limits(mounts, "0::/free\n")
    assert (free.cpus, free.memory_limit_bytes, free.memory_available_bytes) == (None, None, None)
    assert free.cpu_detail == "no CPU quota" and free.memory_detail == "no memory limit"
    assert read_limits("", "0::/\n").cpus is None  # no cgroup mounted (e.g. a fresh /sys): nothing known
    assert [ceil_cpus(c) for c in (0.05, 1.0, 1.5)] == [1, 1, 2]


def test_link_speed_takes_a_slower_shaping_qdisc(tmp_path):
    for name, speed in (("eth0", "10000"), ("eth1", "100")):
        _files(tmp_path / name, speed=speed)
    rates = {"eth0": 4.0, "eth1": None}
    speed, detail = capacity.link_speed(["eth0", "eth1"], tmp_path, shaped=rates.get)
    assert (speed, detail) == (4.0, "eth0: 4 Mbit/s (the qdisc shaping it)")
    assert capacity.link_speed(["eth1"], tmp_path, shaped=lambda name: 1000.0)[0] == 100.0  # slower reported speed wins
    assert capacity.link_speed(["veth9"], tmp_path, shaped=lambda name: 20.0)[0] == 20.0  # a veth reports no speed


def test_a_device_short_of_memory_is_refused_with_one_line():
    capacity.refuse_short_memory("cnn", 100 * 2**20, 200 * 2**20, None)  # fits with the headroom
    with pytest.raises(ConfigError) as info:
        capacity.refuse_short_memory("resnet18", 202 * 2**20, 141 * 2**20, 400 * 2**20)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("too little memory for resnet18: a round needs about 202 MiB, but this device has "
                              "141 MiB available under its memory limit of 400 MiB")  # fmt: skip


CAPACITY = [sys.executable, "-m", "edge_node", "capacity", "--json", "--fleet", "test", "--num-clients", "6",
            "--client-index", "0", "--epochs", "1", "--threads", "1"]  # fmt: skip


@pytest.fixture
def hierarchy(require_root) -> _cgroups.Hierarchy:
    found = _cgroups.system_hierarchy()
    if found is None:
        pytest.skip("no cgroup hierarchy with the cpu and memory controllers")
    return found


def test_edge_node_capacity_inside_a_limited_group_sees_its_limits(hierarchy):
    with _cgroups.device_group(hierarchy, "cap", kind="test", cpu=0.5, memory_bytes=2**30) as group:
        result = subprocess.run(group.wrap(CAPACITY), capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr
    m = json.loads(result.stdout)["measurements"]
    assert (m["cpu_limit"], m["cpu_count"], m["memory_limit_bytes"]) == (0.5, 1, 2**30)
    assert 0 < m["available_memory_bytes"] < 2**30 and "CPU quota 0.50 CPUs" in m["limits_detail"]


def test_a_memory_limit_too_small_for_the_model_is_refused_before_the_probe(hierarchy):
    """resnet18 with 3 neighbours needs about 310 MiB a round; under 512 MiB, with torch and the data loaded,
    much less is left: one line and exit 2 (not the OOM killer)."""
    with _cgroups.device_group(hierarchy, "small", kind="test", cpu=None, memory_bytes=512 * 2**20) as group:
        result = subprocess.run(group.wrap([*CAPACITY, "--model", "resnet18"]), capture_output=True, text=True,
                                timeout=180)  # fmt: skip
        oom_kills = group.oom_kills()
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and oom_kills == 0, result.stderr
    assert len(lines) == 1 and lines[0].startswith("edge-node: error: too little memory for resnet18: a round needs")
    assert "under its memory limit of 512 MiB" in lines[0]
