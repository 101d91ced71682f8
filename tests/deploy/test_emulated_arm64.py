"""A Raspberry Pi's CPU, emulated: the role converges an arm64 Debian host from the offline wheelhouse,
and the daemon it starts trains.

The host is the deployment tests' Debian host (tests/deploy/hosts.py) built for arm64, booted with
systemd-nspawn while qemu's user-mode emulation runs its programs (binfmt_misc). It sits in the
inventory's ``rpi`` group, so the group's own settings apply (PyPI's last aarch64 CPU torch, 2.10), except
the two a Raspberry Pi has and this host has not: the PMIC meter (``vcgencmd``) and raspi-utils. What
emulation itself cannot run is turned off on the test host only, and named: systemd-networkd (the host's
address is set from outside, see hosts.py) and the unit's seccomp-based sandboxing (NO_SECCOMP_DROPIN).

Not in the default run: it takes several minutes (arm64 debootstrap about 3 minutes the first time, pip
installing torch and the rest under emulation, the daemon's start), so pyproject's ``addopts`` deselect
the marker ``emulated``. Run it with::

    # qemu 8 or newer, e.g. the static binary of Debian trixie's qemu-user (bookworm's 7.2 refuses
    # IP_MULTICAST_IF, which the daemon's mDNS sockets set): on PATH as qemu-aarch64-static, or
    EDGE_NODE_QEMU_AARCH64=/path/to/qemu-aarch64 pytest -m emulated tests/deploy/test_emulated_arm64.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.deploy import hosts as deploy_hosts
from tests.deploy.conftest import CONTROLLER_CACHE, TIMINGS, run_playbook, skip_reason, write_inventory

pytestmark = [pytest.mark.deploy, pytest.mark.slow, pytest.mark.emulated]

STATE_DIR = "/var/lib/edge-node"
BOOT_TIMEOUT_S = 600  # systemd and sshd under emulation, on a loaded 2-core machine
ROUND_TIMEOUT_S = 900
TRAIN_SPEED = Path(__file__).with_name("train_speed.py")
# systemd's seccomp filters name the CPU that systemd itself runs as (aarch64, emulated); the kernel sees
# qemu's x86_64 system calls and refuses them all, so the unit's seccomp-based sandboxing cannot run under
# user-mode emulation. This drop-in, written on the test host only, turns exactly those settings off.
NO_SECCOMP_DROPIN = """\
[Service]
SystemCallArchitectures=
RestrictAddressFamilies=
ProtectClock=no
ProtectKernelModules=no
ProtectKernelLogs=no
ProtectHostname=no
RestrictRealtime=no
RestrictNamespaces=no
RestrictSUIDSGID=no
LockPersonality=no
"""
WHEELHOUSE_LIMIT_MB = 400  # the torch 2.10 CPU wheel and the rest: about 235 MB (3.2 GB with CUDA's libraries)


@pytest.fixture(scope="module")
def arm64_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[deploy_hosts.Fleet]:
    """One booted arm64 host; its binfmt entry, mounts and processes are gone afterwards (checked)."""
    reason = skip_reason() or deploy_hosts.qemu_problem("arm64")
    if reason:
        pytest.skip(reason)
    deploy_hosts.cleanup_stale()
    before = set(deploy_hosts.leftovers())
    try:
        with deploy_hosts.foreign_cpu("arm64"):
            start = time.monotonic()
            rootfs = deploy_hosts.build_rootfs(arch="arm64")
            TIMINGS["arm64 rootfs (debootstrap under emulation, or the cache)"] = time.monotonic() - start
            start = time.monotonic()
            workdir = tmp_path_factory.mktemp("arm64")
            with deploy_hosts.test_fleet(rootfs, 1, workdir, boot_timeout=BOOT_TIMEOUT_S, emulated=True) as fleet:
                TIMINGS["arm64 host booted, sshd answering"] = time.monotonic() - start
                yield fleet
    finally:
        left = sorted(set(deploy_hosts.leftovers()) - before)
        assert not left, f"left behind: {left}"


def _rounds(fleet: deploy_hosts.Fleet, host: deploy_hosts.Host) -> list[dict]:
    result = fleet.ssh(host, f"cat {STATE_DIR}/rounds.jsonl 2>/dev/null; true")
    return [json.loads(line) for line in result.stdout.splitlines() if line.strip()]


@pytest.mark.timeout(3600)
def test_the_role_converges_an_emulated_raspberry_pi_whose_daemon_trains(
    arm64_fleet: deploy_hosts.Fleet, tmp_path: Path
) -> None:
    fleet = arm64_fleet
    (host,) = fleet.hosts
    assert fleet.ssh(host, "uname -m").stdout.strip() == "aarch64"

    settings = {
        "edge_node_health_retries": 150,  # 10 minutes: the daemon imports torch under emulation
        "edge_node_num_clients": 8,  # an eighth of the demo set, one epoch: a round of a minute or two here
        "edge_node_client_index": 0,
        "edge_node_dataset": "demo",
        "edge_node_extra_config": {"epochs": 1},
    }
    inventory = write_inventory(fleet, tmp_path / "inventory.ini", extra_vars=settings, groups={"rpi": [0]})
    # What this host lacks of a Raspberry Pi, as typed host variables (they beat the rpi group's).
    host_vars = {
        "edge_node_energy_backend": "estimate",  # no PMIC to read (vcgencmd)
        "edge_node_system_packages": ["python3", "python3-venv"],  # Debian has no raspi-utils
        "edge_node_capacity": 0.6,  # a fixed tier: the start-up probe would time an emulated CPU
    }
    (tmp_path / "host_vars").mkdir()
    (tmp_path / "host_vars" / f"{host.name}.yml").write_text(json.dumps(host_vars) + "\n")  # JSON is YAML
    dropin = Path(host.merged) / "etc" / "systemd" / "system" / "edge-node.service.d" / "emulation.conf"
    dropin.parent.mkdir(parents=True)
    dropin.write_text(NO_SECCOMP_DROPIN)
    # The rpi group's torch requirement wins over the tests' all.yml (playbook group_vars beat inventory's).
    run = run_playbook(inventory, log="converge-arm64", timeout=2400)
    TIMINGS["arm64 converge (wheelhouse, pip under emulation, start, healthy)"] = run.seconds
    if run.returncode != 0:
        journal = fleet.ssh(host, "systemctl status edge-node --no-pager; journalctl -u edge-node --no-pager -n 80")
        pytest.fail(f"converge failed ({run.returncode}):\n{run.output[-6000:]}\n{journal.stdout[-6000:]}")

    version = fleet.ssh(host, "/opt/edge-node/venv/bin/edge-node --version")
    assert version.returncode == 0 and "edge-node, version" in version.stdout, version.stdout + version.stderr
    installed = fleet.ssh(host, "/opt/edge-node/venv/bin/python -m pip list --format=json", timeout=300)
    packages = {p["name"].lower(): p["version"] for p in json.loads(installed.stdout)}
    assert packages["torch"].startswith("2.10."), f"the rpi group asks for torch<2.11: {packages['torch']}"
    cuda = sorted(name for name in packages if name.startswith(("nvidia-", "cuda-")) and name != "nvidia-ml-py")
    assert not cuda, f"CUDA libraries on a Raspberry Pi: {cuda}"
    houses = list((CONTROLLER_CACHE / "wheelhouse").glob("cp311-aarch64-*.tar"))
    sizes = {house.name: house.stat().st_size / 1e6 for house in houses}
    assert sizes and all(mb < WHEELHOUSE_LIMIT_MB for mb in sizes.values()), sizes
    print(f"\narm64 converge: {run.seconds:.0f} s, recap {run.recap()}, wheelhouse {sizes}")

    converged = time.monotonic()
    deadline = converged + ROUND_TIMEOUT_S
    rounds: list[dict] = []
    while not rounds and time.monotonic() < deadline:
        rounds = _rounds(fleet, host)
        time.sleep(5)
    if not rounds:
        journal = fleet.ssh(host, "journalctl -u edge-node --no-pager -n 60").stdout
        pytest.fail(f"no round within {ROUND_TIMEOUT_S} s of a healthy start:\n{journal}")
    TIMINGS["arm64 daemon: first round recorded, after the converge"] = time.monotonic() - converged
    first = rounds[0]
    assert first.get("tier") == "0.6", first
    print(f"arm64 first round: {json.dumps(first)[:600]}")

    # What emulation costs a training step: the same six cnn steps natively and on the host, one thread each,
    # with the daemon stopped first (its training would share the host's CPU time with the timed steps).
    stopped = fleet.ssh(host, "systemctl stop edge-node", timeout=120)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    # In /root: the booted host mounts a tmpfs over /tmp, which hides what is written to the rootfs's /tmp.
    host.path("/root/train_speed.py").write_text(TRAIN_SPEED.read_text())
    emulated = fleet.ssh(host, "/opt/edge-node/venv/bin/python /root/train_speed.py", timeout=900)
    assert emulated.returncode == 0, emulated.stdout + emulated.stderr
    native = json.loads(subprocess.run([sys.executable, str(TRAIN_SPEED)], capture_output=True, text=True,
                                       check=True).stdout)  # fmt: skip
    arm = json.loads(emulated.stdout.strip().splitlines()[-1])
    ratio = arm["seconds"] / native["seconds"]
    TIMINGS["6 cnn steps on one thread, native"] = native["seconds"]
    TIMINGS["6 cnn steps on one thread, emulated arm64"] = arm["seconds"]
    print(f"training steps: native {native}, emulated {arm}, {ratio:.1f}x")
    assert arm["torch"].startswith("2.10.") and abs(arm["loss"] - native["loss"]) < 0.05, (arm, native)
