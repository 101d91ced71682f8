"""The test-host harness's own decisions that need no host: when this machine's cgroups can hold them."""

from __future__ import annotations

import pytest

from tests.deploy import hosts as deploy_hosts

pytestmark = [pytest.mark.deploy]

HYBRID = """\
tmpfs /sys/fs/cgroup tmpfs rw,relatime,mode=755 0 0
cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0
cgroup /sys/fs/cgroup/systemd cgroup rw,relatime,name=systemd 0 0
cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0
"""
V2_ONLY = "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid,nodev,noexec,relatime,nsdelegate 0 0\n"
V1_ONLY = "tmpfs /sys/fs/cgroup tmpfs rw 0 0\ncgroup /sys/fs/cgroup/systemd cgroup rw,name=systemd 0 0\n"


def test_hybrid_cgroups_can_hold_test_hosts() -> None:
    assert deploy_hosts.cgroup_layout_problem(HYBRID) is None


def test_cgroup_v2_only_machine_gets_a_reason_instead_of_a_crash() -> None:
    reason = deploy_hosts.cgroup_layout_problem(V2_ONLY)
    assert reason is not None and "cgroup v2 only" in reason


def test_missing_unified_hierarchy_is_named() -> None:
    reason = deploy_hosts.cgroup_layout_problem(V1_ONLY)
    assert reason is not None and "/sys/fs/cgroup/unified" in reason
