"""Private network namespaces: loopback with multicast, a bridge with several "devices" (needs root).

Used by ``edge-node loopback --netns`` and by the tests. Everything lives inside namespaces made here:
the bridge sits in a namespace of its own and each device's veth end is ``eth0`` inside the device's
namespace, so qdiscs and iptables rules set on them vanish with the namespaces and nothing is ever
added to the machine's own network. Names are ``en-<kind>-<pid>-<n>-<tag>`` (kind ``fleet`` for the
command, ``test`` for tests), so that :func:`cleanup_stale` can remove the leftovers of a killed run:
those whose creating process is gone.

    with bridge_with_namespaces(3) as net:                # net.namespaces[i] has net.addresses[i]
        run_in_netns(net.namespaces[0], ["ping", "-c1", net.addresses[1]])
"""

from __future__ import annotations

import ctypes
import itertools
import logging
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

from edge_node.errors import ConfigError, EdgeNodeError

_LOGGER = logging.getLogger(__name__)

PREFIX = "en-"
_NAME_RE = re.compile(rf"^{re.escape(PREFIX)}([a-z]+)-(\d+)-")
_counter = itertools.count()
IP_TIMEOUT_S = 10  # one ip/tc/iptables call
_CLONE_NEWNET = 0x40000000  # <sched.h>


class NetnsError(EdgeNodeError):
    """A namespace, bridge or link could not be set up (not root, no iproute2, a kernel refusal)."""


def unique_name(tag: str = "ns", kind: str = "fleet") -> str:
    """A namespace name unique to this process: ``en-<kind>-<pid>-<n>-<tag>``."""
    return f"{PREFIX}{kind}-{os.getpid()}-{next(_counter)}-{tag}"


def creator_pid(name: str) -> int | None:
    """The pid in a name made by :func:`unique_name` (None for names not ours)."""
    match = _NAME_RE.match(name)
    return int(match.group(2)) if match else None


def check_available() -> None:
    """ConfigError unless this process can make namespaces: root, and ``ip`` on PATH (checked before any)."""
    if os.geteuid() != 0:
        raise ConfigError("--netns needs root to create network namespaces (run as root, or leave out --netns)")
    if shutil.which("ip") is None:
        raise ConfigError("--netns needs iproute2's `ip` on PATH")


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """``ip ARGS`` (bounded); NetnsError with its stderr when ``check`` and it fails."""
    return run_tool(["ip", *args], check=check)


def run_tool(argv: Sequence[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run a network tool (ip, tc, iptables) bounded by ``IP_TIMEOUT_S``; NetnsError when ``check`` and it fails."""
    try:
        result = subprocess.run(list(argv), capture_output=True, text=True, timeout=IP_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NetnsError(f"`{' '.join(argv)}` failed: {exc}") from None
    if check and result.returncode != 0:
        raise NetnsError(f"`{' '.join(argv)}` failed: {result.stderr.strip() or result.returncode}")
    return result


def list_namespaces() -> list[str]:
    out = ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def pids_in(ns: str) -> list[int]:
    """Processes running inside ``ns``."""
    result = ip("netns", "pids", ns, check=False)
    return [int(p) for p in result.stdout.split() if p.isdigit()]


def delete_namespace(ns: str) -> None:
    """Kill what still runs inside ``ns`` (made by us, so ours) and delete it; no error if gone."""
    for _ in range(3):
        pids = pids_in(ns)
        if not pids:
            break
        for pid in pids:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
    ip("netns", "del", ns, check=False)


def cleanup_stale(kind: str | None = None) -> list[str]:
    """Delete our namespaces (of ``kind``, or any) whose creating process no longer exists; returns them."""
    removed = []
    for ns in list_namespaces():
        match = _NAME_RE.match(ns)
        if match is None or (kind is not None and match.group(1) != kind):
            continue
        if Path(f"/proc/{match.group(2)}").exists():
            continue
        delete_namespace(ns)
        removed.append(ns)
    if removed:
        _LOGGER.warning("removed %d namespace(s) left by a killed run: %s", len(removed), ", ".join(removed))
    return removed


def enter_netns(ns: str) -> None:
    """Move the calling process into ``ns`` (``setns(2)``), e.g. in a child right after ``os.fork()``.

    Python 3.11 has no ``os.setns``, so this goes through libc. Raises OSError when it did not work;
    a caller about to open sockets must then exit rather than fall back to the machine's network.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/run/netns/{ns}", os.O_RDONLY)
    try:
        if libc.setns(fd, _CLONE_NEWNET) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"setns into {ns!r} failed: {os.strerror(errno)}")
        if os.stat("/proc/self/ns/net").st_ino != os.fstat(fd).st_ino:
            raise OSError(f"setns into {ns!r} did not take effect")
    finally:
        os.close(fd)


def run_in_netns(
    ns: str, argv: Sequence[str], *, timeout_s: float = 30, check: bool = False, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` inside ``ns`` to completion (bounded by ``timeout_s``), capturing text output."""
    return subprocess.run(
        ["ip", "netns", "exec", ns, *argv], capture_output=True, text=True, timeout=timeout_s, check=check, env=env
    )


@contextmanager
def netns(name: str | None = None, *, loopback_multicast: bool = True, kind: str = "fleet") -> Iterator[str]:
    """A fresh namespace with ``lo`` up; with ``loopback_multicast`` also multicast on ``lo``.

    Yields the namespace name; deletes it (and kills what runs in it) on exit.
    """
    ns = name or unique_name(kind=kind)
    ip("netns", "add", ns)
    try:
        ip("-n", ns, "link", "set", "lo", "up")
        if loopback_multicast:
            ip("-n", ns, "link", "set", "lo", "multicast", "on")
            ip("-n", ns, "route", "add", "224.0.0.0/4", "dev", "lo")
        yield ns
    finally:
        delete_namespace(ns)


@dataclass
class BridgeNet:
    """A bridge in its own namespace and ``n`` namespaces each plugged into it by a veth (``eth0``).

    Device i's veth end in the bridge's namespace is ``ports[i]`` (``p<i>``).
    """

    bridge_ns: str
    namespaces: list[str] = field(default_factory=list)
    addresses: list[str] = field(default_factory=list)
    ports: list[str] = field(default_factory=list)
    prefix_len: int = 24
    interface: str = "eth0"
    subnet: str = "10.77.0"
    kind: str = "fleet"
    _stack: ExitStack | None = field(default=None, repr=False)

    def add_host(self, tag: str) -> int:
        """Plug one more namespace into the bridge (address ``<subnet>.<index+1>``); returns its index."""
        if self._stack is None:
            raise NetnsError("this bridge is closed")
        i = len(self.namespaces)
        if i >= 250:
            raise NetnsError("a bridge holds at most 250 hosts")
        ns = self._stack.enter_context(netns(unique_name(tag, self.kind), loopback_multicast=False))
        port = f"p{i}"
        ip("-n", self.bridge_ns, "link", "add", port, "type", "veth", "peer", "name", self.interface, "netns", ns)
        ip("-n", self.bridge_ns, "link", "set", port, "master", "br0")
        ip("-n", self.bridge_ns, "link", "set", port, "up")
        address = f"{self.subnet}.{i + 1}"
        ip("-n", ns, "addr", "add", f"{address}/{self.prefix_len}", "dev", self.interface)
        ip("-n", ns, "link", "set", self.interface, "up")
        ip("-n", ns, "route", "add", "224.0.0.0/4", "dev", self.interface)
        self.namespaces.append(ns)
        self.addresses.append(address)
        self.ports.append(port)
        return i

    def set_link(self, i: int, up: bool) -> None:
        """Cut (``up=False``) or restore host ``i``'s cable: its port on the bridge goes down or up."""
        ip("-n", self.bridge_ns, "link", "set", self.ports[i], "up" if up else "down")

    @property
    def names(self) -> list[str]:
        """Every namespace of this network, the bridge's first."""
        return [self.bridge_ns, *self.namespaces]


@contextmanager
def bridge_with_namespaces(
    n: int, *, subnet: str = "10.77.0", ipv6_subnet: str | None = None, kind: str = "fleet", tag: str = "h"
) -> Iterator[BridgeNet]:
    """``n`` namespaces on one bridge: namespace i has ``<subnet>.<i+1>/24`` on ``eth0``.

    Each also gets the multicast route 224.0.0.0/4 via ``eth0`` and ``lo`` up. With ``ipv6_subnet``
    (e.g. ``"fd00:77::"``) each also gets ``<ipv6_subnet><i+1>/64``, with DAD off so it is usable at once.
    More hosts can be plugged in later (:meth:`BridgeNet.add_host`). Everything is deleted on exit,
    also when setting up fails half-way.
    """
    if not 1 <= n <= 250:
        raise ValueError(f"n={n} must be in [1, 250]")
    with ExitStack() as stack:
        bridge_ns = stack.enter_context(netns(unique_name("br", kind), loopback_multicast=False))
        net = BridgeNet(bridge_ns=bridge_ns, subnet=subnet, kind=kind, _stack=stack)
        ip("-n", bridge_ns, "link", "add", "br0", "type", "bridge")
        # 224.0.0.x is flooded anyway; snooping off keeps every group flooding without a querier.
        ip("-n", bridge_ns, "link", "set", "br0", "type", "bridge", "mcast_snooping", "0")
        ip("-n", bridge_ns, "link", "set", "br0", "up")
        for i in range(n):
            net.add_host(f"{tag}{i}")
            if ipv6_subnet is not None:
                ns = net.namespaces[i]
                ip("netns", "exec", ns, "sysctl", "-qw", f"net.ipv6.conf.{net.interface}.accept_dad=0")
                ip("-n", ns, "-6", "addr", "add", f"{ipv6_subnet}{i + 1}/64", "dev", net.interface, "nodad")
        try:
            yield net
        finally:
            net._stack = None
