"""Debian test hosts with systemd as PID 1, booted with systemd-nspawn on a private bridge.

One debootstrap rootfs (cached under ``/var/cache/edge-node-tests/``, keyed by suite and package list)
is shared read-only by every host through overlayfs (one upper layer per host). Each host has its own
network namespace (nspawn's private network) with a veth on a bridge made here, which is connected to
no real interface: the hosts reach each other and the controller (the bridge's address), nothing else,
so neither their traffic nor their mDNS touches the machine's real network, and they have no route to
any package index. The controller (ssh, ansible) runs on this machine and reaches them over the bridge.

    rootfs = build_rootfs()                              # minutes the first time, then cached
    with test_fleet(rootfs, 2, workdir) as fleet:        # hosts booted, sshd answering
        fleet.ssh(fleet.hosts[0], "systemctl is-system-running")
        subprocess.run(["ansible-playbook", "-i", inventory_path, ...])

Everything made here (bridge ``endp<pid>``, veths, overlay mounts, cgroups, nspawn processes) carries
the creating pid (``en-deploy-<pid>-``) and is removed when the context manager exits, also on failure; only processes
this module started (and what runs inside their containers) are killed. :func:`leftovers` lists what
exists under that prefix, so a test can check that nothing is left behind.

Needs root, debootstrap, systemd-nspawn (systemd-container), ssh-keygen and ssh (openssh-client).

A host of another CPU (``build_rootfs(arch="arm64")``, a Raspberry Pi's) runs under qemu's user-mode
emulation: inside :func:`foreign_cpu` the kernel hands that CPU's programs to ``qemu-<cpu>-static``
(Debian's qemu-user-static) through a binfmt_misc entry of ours with the F flag (the interpreter is
opened once, here, so it works inside the hosts' own root), removed when the context manager exits.
qemu 8 or newer: 7.2 (Debian bookworm's) refuses the IP_MULTICAST_IF option of the daemon's mDNS sockets.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import signal
import stat
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

PREFIX = "en-deploy-"
SUITE = "bookworm"
VARIANT = "minbase"
# What a test host has: what the role needs (python3, python3-venv) but not python3-apt, which Ansible's
# apt module would need: with every package present the role must not call apt (no package index here).
PACKAGES = (
    "dbus",
    "iproute2",
    "openssh-server",
    "python3",
    "python3-venv",
    "systemd",
    "systemd-sysv",
)
MIRROR = os.environ.get("EDGE_NODE_DEBIAN_MIRROR", "http://deb.debian.org/debian")
CACHE_DIR = Path(os.environ.get("EDGE_NODE_TEST_CACHE", "/var/cache/edge-node-tests"))
CGROUP_ROOTS = (Path("/sys/fs/cgroup/systemd"), Path("/sys/fs/cgroup/unified"))
SUBNET = "10.213.0"  # on the private bridge only: .1 is the bridge (the controller), .11.. the hosts
BRIDGE_PREFIX = "endp"  # + pid: interface names have at most 15 characters
DEBOOTSTRAP_TIMEOUT_S = 1200
BOOT_TIMEOUT_S = 90
SHUTDOWN_TIMEOUT_S = 20

SSHD_HOST_KEYS_DROPIN = """\
# Test hosts share one rootfs: each generates its own sshd host keys at boot.
[Service]
ExecStartPre=
ExecStartPre=/usr/bin/ssh-keygen -A
ExecStartPre=/usr/sbin/sshd -t
"""


def missing_tools() -> list[str]:
    """The host tools this module needs that are not installed."""
    tools = ("debootstrap", "systemd-nspawn", "ssh", "ssh-keygen", "ip", "mount", "umount")
    return [tool for tool in tools if shutil.which(tool) is None]


def cgroup_layout_problem(mounts: str | None = None) -> str | None:
    """Why this machine's cgroups cannot host the test hosts, or None (``mounts``: /proc/self/mounts' text).

    Each nspawn host is started from cgroups of its own made here, in the name=systemd v1 hierarchy and
    the cgroup2 one beside it (the hybrid layout, as on the CI machine, which runs no systemd).
    """
    if mounts is None:
        mounts = Path("/proc/self/mounts").read_text()
    found = {}
    for line in mounts.splitlines():
        parts = line.split()
        if len(parts) >= 4:
            found[parts[1]] = (parts[2], parts[3].split(","))
    if found.get("/sys/fs/cgroup", ("", []))[0] == "cgroup2":
        return (
            "this machine has cgroup v2 only (cgroup2 at /sys/fs/cgroup); the test hosts are started from cgroups of"
            " their own in the hybrid layout (name=systemd v1 at /sys/fs/cgroup/systemd and cgroup2 at"
            " /sys/fs/cgroup/unified), which tests/deploy/hosts.py does not replace with a delegated cgroup2 subtree"
        )
    systemd_v1 = found.get(str(CGROUP_ROOTS[0]))
    unified = found.get(str(CGROUP_ROOTS[1]))
    if systemd_v1 is None or systemd_v1[0] != "cgroup" or "name=systemd" not in systemd_v1[1]:
        return f"needs the name=systemd cgroup v1 hierarchy mounted at {CGROUP_ROOTS[0]} (the hybrid cgroup layout)"
    if unified is None or unified[0] != "cgroup2":
        return f"needs cgroup2 mounted at {CGROUP_ROOTS[1]} (the hybrid cgroup layout)"
    return None


def rootfs_key(arch: str | None = None) -> str:
    """Cache key of the rootfs: suite, variant, package list and foreign CPU (a change makes a new rootfs)."""
    text = f"{SUITE}|{VARIANT}|{','.join(sorted(PACKAGES))}|{SSHD_HOST_KEYS_DROPIN}"
    if arch is not None:
        text += f"|{arch}"  # the native rootfs keeps its key (and its cache)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _run(cmd: Sequence[str], timeout: float = 60, check: bool = True, **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout, check=check, **kw)


def build_rootfs(cache_dir: Path = CACHE_DIR, arch: str | None = None) -> Path:
    """The shared Debian rootfs, built with debootstrap on first use and then taken from the cache.

    A lock file serialises concurrent builders; a half-built tree never takes the final name. ``arch``
    (a Debian architecture such as arm64) builds a foreign one: call it inside :func:`foreign_cpu`.
    """
    cache_dir.mkdir(parents=True, exist_ok=True)
    final = cache_dir / f"rootfs-{SUITE}-{arch + '-' if arch else ''}{rootfs_key(arch)}"
    with open(cache_dir / "rootfs.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (final / "etc" / "edge-node-test-rootfs").is_file():
            return final
        tmp = cache_dir / f"{final.name}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        cmd = ["debootstrap", f"--variant={VARIANT}", f"--include={','.join(PACKAGES)}", SUITE, str(tmp), MIRROR]
        if arch is not None:
            cmd.insert(1, f"--arch={arch}")
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=DEBOOTSTRAP_TIMEOUT_S)
        if result.returncode != 0:
            shutil.rmtree(tmp, ignore_errors=True)
            raise RuntimeError(
                f"debootstrap failed ({result.returncode}): {result.stdout[-2000:]}{result.stderr[-2000:]}"
            )
        _customise_rootfs(tmp)
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        return final


def _customise_rootfs(root: Path) -> None:
    """What every host shares: sshd keys made at boot, networkd on, no machine id, clean apt."""
    for key in (root / "etc" / "ssh").glob("ssh_host_*"):
        key.unlink()
    dropin = root / "etc" / "systemd" / "system" / "ssh.service.d" / "host-keys.conf"
    dropin.parent.mkdir(parents=True, exist_ok=True)
    dropin.write_text(SSHD_HOST_KEYS_DROPIN)
    (root / "etc" / "machine-id").write_text("")
    with contextlib.suppress(FileNotFoundError):
        (root / "var" / "lib" / "dbus" / "machine-id").unlink()
    _run(["systemctl", f"--root={root}", "enable", "systemd-networkd.service"], check=False)
    for unit in ("systemd-networkd-wait-online.service", "apt-daily.timer", "apt-daily-upgrade.timer"):
        _run(["systemctl", f"--root={root}", "mask", unit], check=False)
    _run(["chroot", str(root), "apt-get", "clean"], check=False)
    (root / "etc" / "edge-node-test-rootfs").write_text(f"{SUITE} {VARIANT} {' '.join(PACKAGES)}\n")


QEMU_CPUS = {"arm64": ("aarch64", "7f454c460201010000000000000000000200b700",
                       "ffffffffffffff00fffffffffffffffffeffffff")}  # fmt: skip  # ELF header magic and mask
BINFMT = Path("/proc/sys/fs/binfmt_misc")


QEMU_MIN_VERSION = (8, 0)  # 7.2 (Debian bookworm) refuses IP_MULTICAST_IF, which the daemon's mDNS sockets set


def qemu_binary(arch: str) -> str | None:
    """The user-mode qemu for ``arch``: ``EDGE_NODE_QEMU_<CPU>`` (a path), else ``qemu-<cpu>-static`` on PATH."""
    cpu = QEMU_CPUS[arch][0]
    return os.environ.get(f"EDGE_NODE_QEMU_{cpu.upper()}") or shutil.which(f"qemu-{cpu}-static")


def qemu_problem(arch: str) -> str | None:
    """Why hosts of ``arch`` cannot run here (None: they can)."""
    if arch not in QEMU_CPUS:
        return f"no emulation set up for {arch} (known: {', '.join(QEMU_CPUS)})"
    cpu = QEMU_CPUS[arch][0]
    qemu = qemu_binary(arch)
    if qemu is None or not os.access(qemu, os.X_OK):
        return f"needs qemu-{cpu}-static >= 8 (Debian trixie's qemu-user), or EDGE_NODE_QEMU_{cpu.upper()}=PATH"
    text = _run([qemu, "--version"], check=False).stdout
    match = re.search(r"version (\d+)\.(\d+)", text)
    if match is None or (int(match.group(1)), int(match.group(2))) < QEMU_MIN_VERSION:
        return (
            f"{qemu} is {text.splitlines()[0] if text else 'of unknown version'}: qemu before 8.0 refuses "
            f"IP_MULTICAST_IF (the daemon's mDNS sockets); use Debian trixie's qemu-user "
            f"or EDGE_NODE_QEMU_{cpu.upper()}"
        )
    return None


@contextlib.contextmanager
def foreign_cpu(arch: str) -> Iterator[str]:
    """Let ``arch`` programs run here (in chroots and containers too) through qemu; yields the binfmt entry.

    Mounts binfmt_misc if it is not (and unmounts it after), registers ``en-deploy-<pid>-<cpu>`` with
    the F flag; a stale entry of a crashed run is removed by :func:`cleanup_stale`.
    """
    problem = qemu_problem(arch)
    if problem:
        raise RuntimeError(problem)
    cpu, magic, mask = QEMU_CPUS[arch]
    qemu = qemu_binary(arch)
    mounted = False
    if not (BINFMT / "register").exists():
        _run(["mount", "-t", "binfmt_misc", "binfmt_misc", str(BINFMT)])
        mounted = True
    name = f"{PREFIX}{os.getpid()}-{cpu}"

    def hexed(h: str) -> str:
        return "".join(f"\\x{h[i : i + 2]}" for i in range(0, len(h), 2))

    try:
        (BINFMT / "register").write_text(f":{name}:M::{hexed(magic)}:{hexed(mask)}:{qemu}:FC")
        yield name
    finally:
        with contextlib.suppress(FileNotFoundError):
            (BINFMT / name).write_text("-1")
        if mounted:
            _unmount(BINFMT)


@dataclass
class Host:
    """One booted test host."""

    name: str
    address: str
    lower: Path  # the shared rootfs (read-only)
    upper: Path  # the host's own overlay layer: every file it wrote is here
    merged: Path
    cgroups: list[Path] = field(default_factory=list)
    process: subprocess.Popen[bytes] | None = None

    def path(self, inside: str) -> Path:
        """Where a path inside the running host is on this machine (through the merged mount)."""
        return self.merged / inside.lstrip("/")

    def written(self) -> set[str]:
        """Paths (relative to /) the host wrote or removed since its layer was made: its upper layer."""
        return {str(p.relative_to(self.upper)) for p in self.upper.rglob("*")}

    def snapshot(self) -> dict[str, str | None]:
        """What every path the host wrote holds now: ``{path: fingerprint}`` (None: removed)."""
        return {rel: fingerprint(self.merged / rel) for rel in self.written()}

    def changes_since(self, snapshot: dict[str, str | None], ignored: Sequence[str] = ()) -> dict[str, tuple]:
        """``{path: (then, now)}`` for every path that differs from ``snapshot``, as seen inside the host.

        A path the host wrote only later is compared with the shared rootfs (what it saw before), so a
        file written and then restored to its old content and mode is no change; paths under the
        ``ignored`` prefixes are left out ("var/log/" covers var/log itself too).
        """
        changes = {}
        for rel in sorted(self.written() | set(snapshot)):
            if any(rel == prefix.rstrip("/") or rel.startswith(prefix) for prefix in ignored):
                continue
            then = snapshot[rel] if rel in snapshot else fingerprint(self.lower / rel)
            now = fingerprint(self.merged / rel)
            if then != now:
                changes[rel] = (then, now)
        return changes


def fingerprint(path: Path) -> str | None:
    """Type, mode, owner and content of a path (a file's sha256, a link's target); None if absent."""
    try:
        st = path.lstat()
    except (FileNotFoundError, NotADirectoryError):
        return None
    head = f"{stat.filemode(st.st_mode)} {st.st_uid}:{st.st_gid}"
    if stat.S_ISREG(st.st_mode):
        return f"{head} sha256:{hashlib.sha256(path.read_bytes()).hexdigest()}"
    if stat.S_ISLNK(st.st_mode):
        return f"{head} -> {os.readlink(path)}"
    return head


@dataclass
class Fleet:
    """Booted hosts on bridge ``bridge``; ``key`` logs in as root."""

    bridge: str
    key: Path
    hosts: list[Host]
    workdir: Path

    def ssh_options(self) -> list[str]:
        return [
            "-i", str(self.key), "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
            "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", "-o", "ConnectTimeout=5",
        ]  # fmt: skip

    def ssh(self, host: Host, command: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run a shell command on ``host`` as root over SSH (not checked)."""
        cmd = ["ssh", *self.ssh_options(), f"root@{host.address}", command]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)

    def inventory(self, groups: dict[str, list[int]] | None = None, host_vars: dict[str, dict] | None = None) -> str:
        """An INI inventory of the hosts (all in group ``test`` unless ``groups`` maps names to indices)."""
        groups = groups or {"test": list(range(len(self.hosts)))}
        lines = []
        for group, indices in groups.items():
            lines.append(f"[{group}]")
            for i in indices:
                host = self.hosts[i]
                extra = " ".join(f"{k}={v}" for k, v in (host_vars or {}).get(host.name, {}).items())
                lines.append(f"{host.name} ansible_host={host.address} {extra}".rstrip())
            lines.append("")
        lines += ["[all:vars]", "ansible_user=root", f"ansible_ssh_private_key_file={self.key}", ""]
        return "\n".join(lines)


def _owner_pid(name: str) -> int | None:
    match = re.match(rf"^{re.escape(PREFIX)}(\d+)-", name)
    return int(match.group(1)) if match else None


def leftovers() -> list[str]:
    """Bridges, veths, mounts, cgroups and nspawn processes of this module that still exist (any pid)."""
    found = [f"link {name}" for name in _links() if name.startswith((BRIDGE_PREFIX, "vb-" + PREFIX[:6]))]
    for line in Path("/proc/self/mounts").read_text().splitlines():
        target = line.split()[1]
        if PREFIX in target:
            found.append(f"mount {target}")
    for root in CGROUP_ROOTS:
        if root.is_dir():
            found += [f"cgroup {p}" for p in root.iterdir() if p.name.startswith(PREFIX)]
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError):
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                if cmdline.startswith("systemd-nspawn") and PREFIX in cmdline:
                    found.append(f"process {proc.name}: {cmdline[:120]}")
    if BINFMT.is_dir():
        found += [f"binfmt {p.name}" for p in BINFMT.iterdir() if p.name.startswith(PREFIX)]
    return found


def _kill_cgroup(cgroup: Path) -> None:
    """SIGKILL every process in ``cgroup`` and below (all started by us), then remove the cgroups."""
    if not cgroup.is_dir():
        return
    for _ in range(50):
        pids = set()
        for procs in cgroup.rglob("cgroup.procs"):
            with contextlib.suppress(OSError):
                pids |= {int(p) for p in procs.read_text().split()}
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
    for sub in sorted((p for p in cgroup.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):
            sub.rmdir()
    with contextlib.suppress(OSError):
        cgroup.rmdir()


def _unmount(target: Path) -> None:
    if _run(["umount", str(target)], check=False).returncode != 0:
        _run(["umount", "--lazy", str(target)], check=False)


def cleanup_stale() -> list[str]:
    """Remove what a crashed earlier run of this module left (its creating pid no longer exists)."""
    removed = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        target = line.split()[1]
        name = next((part for part in Path(target).parts if part.startswith(PREFIX)), None)
        pid = _owner_pid(name) if name else None
        if pid is not None and not Path(f"/proc/{pid}").exists():
            _unmount(Path(target))
            removed.append(target)
    for root in CGROUP_ROOTS:
        if root.is_dir():
            for cgroup in root.iterdir():
                pid = _owner_pid(cgroup.name)
                if pid is not None and not Path(f"/proc/{pid}").exists():
                    _kill_cgroup(cgroup)
                    removed.append(str(cgroup))
    for name in _links():
        match = re.match(rf"^{BRIDGE_PREFIX}(\d+)$", name)
        if match and not Path(f"/proc/{match.group(1)}").exists():
            _run(["ip", "link", "del", name], check=False)
            removed.append(name)
    if BINFMT.is_dir():
        for entry in BINFMT.iterdir():
            pid = _owner_pid(entry.name)
            if pid is not None and not Path(f"/proc/{pid}").exists():
                entry.write_text("-1")
                removed.append(f"binfmt {entry.name}")
    return removed


def _links() -> list[str]:
    return [p.name for p in Path("/sys/class/net").iterdir()]


def _enter_cgroups(paths: Sequence[Path]) -> None:
    """In the forked child before exec: move into our own cgroups (nspawn needs one per host)."""
    for path in paths:
        (path / "cgroup.procs").write_text(str(os.getpid()))
    os.setsid()


@contextlib.contextmanager
def test_fleet(
    rootfs: Path, count: int, workdir: Path, boot_timeout: float = BOOT_TIMEOUT_S, emulated: bool = False
) -> Iterator[Fleet]:
    """Boot ``count`` hosts from ``rootfs`` on a private bridge; yield once every sshd answers (within
    ``boot_timeout`` seconds: an emulated CPU boots several times slower).

    ``emulated``: the hosts run under qemu's user-mode emulation, where systemd-networkd cannot start
    (qemu does not translate every netlink request: "Protocol not supported"), so this machine's ``ip``
    gives each host its address and multicast route from outside, in the host's network namespace.
    """
    tag = f"{PREFIX}{os.getpid()}-{time.monotonic_ns() % 10**6}"
    bridge = f"{BRIDGE_PREFIX}{os.getpid()}"
    base = workdir / tag  # the prefix in the path lets leftovers() and cleanup_stale() find the mounts
    base.mkdir(parents=True)
    key = base / "id_ed25519"
    _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "edge-node-test", "-f", str(key)])
    hosts: list[Host] = []
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, base, ignore_errors=True)  # last: after every unmount
        _run(["ip", "link", "add", bridge, "type", "bridge"])
        stack.callback(_run, ["ip", "link", "del", bridge], check=False)
        _run(["ip", "addr", "add", f"{SUBNET}.1/24", "dev", bridge])
        _run(["ip", "link", "set", bridge, "up"])
        for i in range(count):
            name = f"node{i + 1}"
            host = Host(name, f"{SUBNET}.{11 + i}", rootfs, base / name / "upper", base / name / "merged")
            hosts.append(host)
            stack.callback(_stop_host, host)
            _prepare_host(host, rootfs, key.with_suffix(".pub"))
            host.cgroups = [root / f"{tag}-{name}" for root in CGROUP_ROOTS]
            for cgroup in host.cgroups:
                cgroup.mkdir()
            log = open(base / name / "console.log", "wb")  # noqa: SIM115 (closed by the callback below)
            stack.callback(log.close)
            cmd = [
                "systemd-nspawn", "--boot", "--register=no", "--keep-unit", f"--network-bridge={bridge}",
                f"--directory={host.merged}", f"--machine={tag}-{name}", f"--hostname={name}",
                "--console=pipe", "--quiet",
            ]  # fmt: skip
            host.process = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=lambda cg=host.cgroups: _enter_cgroups(cg),  # noqa: PLW1509
            )
        fleet = Fleet(bridge, key, hosts, base)
        if emulated:
            for host in hosts:
                _address_from_outside(host, boot_timeout)
        _wait_for_ssh(fleet, boot_timeout)
        yield fleet


def _prepare_host(host: Host, rootfs: Path, pubkey: Path) -> None:
    """Mount the host's overlay and write what is its own: hostname, address, root's SSH key."""
    work = host.upper.parent / "work"
    for d in (host.upper, work, host.merged):
        d.mkdir(parents=True)
    opts = f"lowerdir={rootfs},upperdir={host.upper},workdir={work}"
    _run(["mount", "-t", "overlay", "overlay", "-o", opts, str(host.merged)])
    (host.merged / "etc" / "hostname").write_text(f"{host.name}\n")
    hosts = (host.merged / "etc" / "hosts").read_text() if (host.merged / "etc" / "hosts").exists() else ""
    (host.merged / "etc" / "hosts").write_text(f"127.0.0.1 localhost\n127.0.1.1 {host.name}\n{hosts}")
    network = host.merged / "etc" / "systemd" / "network" / "10-host0.network"
    network.parent.mkdir(parents=True, exist_ok=True)
    network.write_text(
        "[Match]\nName=host0\n\n[Network]\n"
        f"Address={host.address}/24\nLinkLocalAddressing=no\nIPv6AcceptRA=no\nMulticastDNS=no\nLLMNR=no\n\n"
        "[Route]\nDestination=224.0.0.0/4\n"  # mDNS leaves through the bridge
    )
    ssh_dir = host.merged / "root" / ".ssh"
    ssh_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    (ssh_dir / "authorized_keys").write_text(pubkey.read_text())
    (ssh_dir / "authorized_keys").chmod(0o600)


def _address_from_outside(host: Host, timeout: float) -> None:
    """Configure ``host0`` of a booting host as its networkd file says, with this machine's ``ip``."""
    assert host.process is not None
    deadline = time.monotonic() + timeout
    while True:  # nspawn's child is the host's init; its network namespace has host0 once nspawn made it
        children = Path(f"/proc/{host.process.pid}/task/{host.process.pid}/children")
        with contextlib.suppress(OSError):
            for pid in children.read_text().split():
                probe = _run(["nsenter", "-t", pid, "-n", "ip", "link", "show", "host0"], check=False)
                if probe.returncode == 0:
                    for cmd in (
                        ["ip", "addr", "add", f"{host.address}/24", "dev", "host0"],
                        ["ip", "link", "set", "host0", "up"],
                        ["ip", "route", "add", "224.0.0.0/4", "dev", "host0"],  # mDNS leaves through the bridge
                    ):
                        _run(["nsenter", "-t", pid, "-n", *cmd])
                    return
        if host.process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{host.name}: no host0 to configure (nspawn {host.process.poll()})")
        time.sleep(0.2)


def _stop_host(host: Host) -> None:
    """Power the host off (SIGTERM to nspawn), kill what is left in its cgroups, unmount its layer."""
    proc = host.process
    if proc is not None and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=SHUTDOWN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    for cgroup in host.cgroups:
        _kill_cgroup(cgroup)
    if host.merged.is_mount():
        _unmount(host.merged)


def _wait_for_ssh(fleet: Fleet, boot_timeout: float) -> None:
    deadline = time.monotonic() + boot_timeout
    for host in fleet.hosts:
        while True:
            if host.process is not None and host.process.poll() is not None:
                console = (fleet.workdir / host.name / "console.log").read_text(errors="replace")
                raise RuntimeError(f"{host.name}: nspawn exited {host.process.returncode}: {console[-3000:]}")
            if fleet.ssh(host, "true", timeout=15).returncode == 0:
                break
            if time.monotonic() > deadline:
                console = (fleet.workdir / host.name / "console.log").read_text(errors="replace")
                raise TimeoutError(f"{host.name}: no SSH after {boot_timeout:.0f} s: {console[-3000:]}")
            time.sleep(0.5)
