"""The test-host harness itself: when this machine's cgroups can hold hosts, and that nothing of them stays.

The cgroup-layout rule needs no host. The cleanup tests boot hosts (one real one; two that fail to
boot) and check that a failure inside the fleet, or during its start, leaves no bridge, veth, overlay
mount, cgroup or nspawn process behind.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.deploy import hosts as deploy_hosts
from tests.deploy.conftest import skip_reason

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


def _skip_without_hosts() -> None:
    reason = skip_reason()
    if reason:
        pytest.skip(reason)


def _kinds(entries: set[str]) -> set[str]:
    """The kinds of things in leftovers() entries: link, mount, cgroup, process."""
    return {entry.split(" ", 1)[0] for entry in entries}


@pytest.mark.slow
def test_a_failure_inside_the_fleet_removes_hosts_mounts_cgroups_and_bridge(rootfs: Path, tmp_path: Path) -> None:
    """A test that fails while the hosts run: the exception goes on, and nothing of the hosts stays."""
    before = set(deploy_hosts.leftovers())
    during: set[str] = set()
    with (
        pytest.raises(RuntimeError, match="the test failed"),
        deploy_hosts.test_fleet(rootfs, 1, tmp_path) as fleet,
    ):
        assert fleet.ssh(fleet.hosts[0], "true").returncode == 0
        during = set(deploy_hosts.leftovers()) - before
        raise RuntimeError("the test failed")
    # What leftovers() saw while the host ran, so that its finding nothing afterwards means something.
    assert _kinds(during) == {"link", "mount", "cgroup", "process"}, during
    assert set(deploy_hosts.leftovers()) - before == set()
    assert list(tmp_path.iterdir()) == [], "the fleet's directory (overlay layers, keys) is left"


@pytest.mark.slow
def test_a_host_that_fails_to_boot_leaves_nothing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """nspawn refuses a tree that is no OS: the start fails with its reason, and the cleanup still runs."""
    _skip_without_hosts()
    not_an_os = tmp_path / "not-an-os"  # no os-release, no init: systemd-nspawn --boot refuses it
    (not_an_os / "etc").mkdir(parents=True)
    before = set(deploy_hosts.leftovers())
    during: set[str] = set()
    wait_for_ssh = deploy_hosts._wait_for_ssh

    def watched_wait(fleet: deploy_hosts.Fleet, boot_timeout: float) -> None:
        during.update(set(deploy_hosts.leftovers()) - before)
        wait_for_ssh(fleet, boot_timeout)

    monkeypatch.setattr(deploy_hosts, "_wait_for_ssh", watched_wait)
    with pytest.raises(RuntimeError, match="nspawn exited"), deploy_hosts.test_fleet(not_an_os, 2, tmp_path / "work"):
        pytest.fail("a tree with no OS booted")
    assert {"link", "mount", "cgroup"} <= _kinds(during), during
    assert set(deploy_hosts.leftovers()) - before == set()
    assert list((tmp_path / "work").iterdir()) == []
