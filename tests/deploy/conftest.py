"""Fixtures of the deployment tests: the cached rootfs, booted test hosts, ansible-playbook runs.

The hosts are real Debian systems with systemd as PID 1 (see tests/deploy/hosts.py); the playbook
reaches them over SSH exactly as it would reach a fleet. One rootfs and one controller directory
(the built wheel and the wheelhouse) are cached under /var/cache/edge-node-tests/ between runs.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.deploy import hosts as deploy_hosts

REPO_ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
CONTROLLER_CACHE = deploy_hosts.CACHE_DIR / "controller"  # the built wheel and the wheelhouses
# A bound for a hung run, not a budget: on the 2-core machine at load 12-16 the first converge's pip
# installs alone took 165 s per host, one host after the other, and the run passed 600 s.
PLAYBOOK_TIMEOUT_S = 1200
# Seconds per phase of this session's deployment tests, printed in the terminal summary (docs/DEPLOY.md).
TIMINGS: dict[str, float] = {}


def ansible_tool(name: str) -> str:
    """The ansible command installed beside this Python (the test extra), else the one on PATH."""
    path = VENV_BIN / name
    if path.exists():
        return str(path)
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed: pip install -e '.[test]' installs it")
    return found


def ansible_env() -> dict[str, str]:
    return {
        **os.environ,
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "ANSIBLE_HOST_KEY_CHECKING": "False",  # every test host makes new host keys at boot
        "ANSIBLE_CALLBACKS_ENABLED": "ansible.posix.profile_tasks",  # task times in the output
        "ANSIBLE_FORCE_COLOR": "0",
        "ANSIBLE_NOCOLOR": "1",
    }


@dataclass
class PlaybookRun:
    returncode: int
    output: str
    seconds: float

    def recap(self) -> dict[str, dict[str, int]]:
        """PLAY RECAP counters per host: {"node1": {"ok": 30, "changed": 0, "failed": 0, ...}}."""
        recap: dict[str, dict[str, int]] = {}
        for line in self.output.split("PLAY RECAP", 1)[-1].splitlines():
            match = re.match(r"^(\S+)\s+:\s+(ok=.*)$", line)
            if match:
                recap[match.group(1)] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", match.group(2))}
        return recap


def run_playbook(inventory: Path, *args: str, log: str = "", timeout: float = PLAYBOOK_TIMEOUT_S) -> PlaybookRun:
    """``ansible-playbook deploy/site.yml -i INVENTORY ARGS`` from the repository root, as the docs say.

    The output (with profile_tasks' time per task) goes to ``LOG.log`` beside the inventory as it
    comes, so a run that hangs past ``timeout`` still shows where: the test fails with its last lines.
    """
    cmd = [ansible_tool("ansible-playbook"), "deploy/site.yml", "-i", str(inventory), *args]
    path = inventory.parent / f"{log or 'playbook'}.log"
    start = time.monotonic()
    with path.open("w") as out:
        out.write(f"$ {' '.join(cmd)}\n")
        out.flush()
        try:
            result = subprocess.run(cmd, cwd=REPO_ROOT, env=ansible_env(), stdout=out, stderr=subprocess.STDOUT,
                                    timeout=timeout)  # fmt: skip
        except subprocess.TimeoutExpired:
            pytest.fail(f"ansible-playbook ran past {timeout:.0f} s ({path}):\n{path.read_text()[-8000:]}")
    output = path.read_text().split("\n", 1)[1]
    return PlaybookRun(result.returncode, output, time.monotonic() - start)


def skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root to boot test hosts (systemd-nspawn, overlayfs, a bridge)"
    missing = deploy_hosts.missing_tools()
    if missing:
        return f"needs {', '.join(missing)} (apt-get install debootstrap systemd-container openssh-client)"
    return deploy_hosts.cgroup_layout_problem()


_HERE = Path(__file__).resolve().parent
_rootfs_build: Future[tuple[Path, float]] | None = None


def _timed_build() -> tuple[Path, float]:
    start = time.monotonic()
    return deploy_hosts.build_rootfs(), time.monotonic() - start


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deployment tests without hosts first; the rootfs is built meanwhile, in a thread, when hosts are wanted.

    A cold debootstrap takes minutes; lint, renders and the wheelhouse tests fill them. Only this
    directory's tests move, among their own places in the run.
    """
    global _rootfs_build
    slots = [i for i, item in enumerate(items) if _HERE in Path(str(item.path)).resolve().parents]
    ours = [items[i] for i in slots]
    for slot, item in zip(slots, sorted(ours, key=lambda item: "rootfs" in item.fixturenames), strict=True):
        items[slot] = item
    wants_hosts = any("rootfs" in item.fixturenames for item in ours)
    if wants_hosts and not config.option.collectonly and skip_reason() is None and _rootfs_build is None:
        _rootfs_build = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rootfs").submit(_timed_build)


@pytest.fixture(scope="session")
def rootfs() -> Path:
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    deploy_hosts.cleanup_stale()
    start = time.monotonic()
    if _rootfs_build is not None:
        path, built_s = _rootfs_build.result()
        TIMINGS["rootfs (debootstrap, or the cache), built from collection on"] = built_s
        TIMINGS["  of which the tests waited for"] = time.monotonic() - start
    else:
        path, built_s = _timed_build()
        TIMINGS["rootfs (debootstrap, or the cache)"] = built_s
    return path


@pytest.fixture(scope="module")
def fleet(rootfs: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[deploy_hosts.Fleet]:
    """Two booted hosts for the module's tests; nothing of them is left afterwards (checked)."""
    before = set(deploy_hosts.leftovers())
    start = time.monotonic()
    try:
        with deploy_hosts.test_fleet(rootfs, 2, tmp_path_factory.mktemp("fleet")) as booted:
            TIMINGS["2 hosts booted, sshd answering"] = time.monotonic() - start
            yield booted
    finally:
        left = sorted(set(deploy_hosts.leftovers()) - before)
        assert not left, f"test hosts left behind: {left}"


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if TIMINGS:
        terminalreporter.write_sep("-", "deployment test timings")
        for phase, seconds in TIMINGS.items():
            terminalreporter.write_line(f"{seconds:7.1f} s  {phase}")
        load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
        terminalreporter.write_line(f"load average now (1, 5, 15 min): {load} on {os.cpu_count()} CPUs")


def write_inventory(
    fleet: deploy_hosts.Fleet,
    path: Path,
    extra_vars: dict[str, object] | None = None,
    groups: dict[str, list[int]] | None = None,
    **host_vars: dict,
) -> Path:
    """An inventory of the fleet's hosts with the test settings in ``group_vars/all.yml`` beside it.

    Group variables go in YAML (typed: lists stay lists) rather than an INI ``[all:vars]`` section,
    where every value is a string. ``host_vars`` (per host name) go on the host lines; ``groups`` maps
    group names to host indices (default: every host in ``test``).
    """
    settings: dict[str, object] = {
        "edge_node_fleet": "deploy-test",
        "edge_node_install_from": "wheelhouse",  # the hosts have no route to a package index
        "edge_node_torch_requirement": "torch==2.13.0+cpu",  # the CPU build; the plain name pulls CUDA
        "edge_node_controller_dir": str(CONTROLLER_CACHE),
        "edge_node_interfaces": ["host0"],  # the hosts have no default route, which the daemon's default wants
        **(extra_vars or {}),
    }
    (path.parent / "group_vars").mkdir(exist_ok=True)
    (path.parent / "group_vars" / "all.yml").write_text(json.dumps(settings, indent=2) + "\n")  # JSON is YAML
    path.write_text(fleet.inventory(groups=groups, host_vars=host_vars))
    return path
