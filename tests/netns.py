"""Private network namespaces for tests: loopback with multicast, a bridge with several "devices".

Everything made here is removed on exit of the context manager, also when the test fails, and only
processes started through this module (or left inside a namespace this module made) are killed.
Names carry ``en-test-<pid>-`` so leftovers of a crashed run are recognisable; :func:`cleanup_stale`
removes those whose pid is gone.

    with netns() as ns:                                   # lo up, multicast on, 224.0.0.0/4 via lo
        proc = NetnsProcess(ns, [sys.executable, "-c", "..."])
        # or, in a freshly forked child: enter_netns(ns) before opening any socket
    with bridge_with_namespaces(3) as net:                # net.namespaces[i] has net.addresses[i]
        run_in_netns(net.namespaces[0], ["ping", "-c1", net.addresses[1]])

Needs root (the ``require_root`` fixture) and iproute2.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

PREFIX = "en-test-"
_counter = itertools.count()
_IP_TIMEOUT_S = 10
_CLONE_NEWNET = 0x40000000  # <sched.h>


def unique_name(tag: str = "ns") -> str:
    """A namespace name unique to this process: ``en-test-<pid>-<n>-<tag>``."""
    return f"{PREFIX}{os.getpid()}-{next(_counter)}-{tag}"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=_IP_TIMEOUT_S, check=check)


def list_namespaces() -> list[str]:
    out = _ip("netns", "list").stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _pids_in(ns: str) -> list[int]:
    result = _ip("netns", "pids", ns, check=False)
    return [int(p) for p in result.stdout.split() if p.isdigit()]


def delete_namespace(ns: str) -> None:
    """Kill what still runs inside ``ns`` (made by us, so ours) and delete it; no error if gone."""
    for _ in range(3):
        pids = _pids_in(ns)
        if not pids:
            break
        for pid in pids:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
    _ip("netns", "del", ns, check=False)


def cleanup_stale() -> list[str]:
    """Delete ``en-test-<pid>-*`` namespaces whose creating process no longer exists."""
    removed = []
    for ns in list_namespaces():
        match = re.match(rf"^{re.escape(PREFIX)}(\d+)-", ns)
        if match is None or Path(f"/proc/{match.group(1)}").exists():
            continue
        delete_namespace(ns)
        removed.append(ns)
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
    ns: str, argv: Sequence[str], *, timeout_s: float = 30, check: bool = False, **kwargs: object
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` inside ``ns`` to completion (bounded by ``timeout_s``), capturing text output."""
    return subprocess.run(
        ["ip", "netns", "exec", ns, *argv],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=check,
        **kwargs,  # type: ignore[arg-type]
    )


@contextmanager
def netns(name: str | None = None, *, loopback_multicast: bool = True) -> Iterator[str]:
    """A fresh namespace with ``lo`` up; with ``loopback_multicast`` also multicast on ``lo``.

    Yields the namespace name; deletes it (and kills what runs in it) on exit.
    """
    ns = name or unique_name()
    _ip("netns", "add", ns)
    try:
        _ip("-n", ns, "link", "set", "lo", "up")
        if loopback_multicast:
            _ip("-n", ns, "link", "set", "lo", "multicast", "on")
            _ip("-n", ns, "route", "add", "224.0.0.0/4", "dev", "lo")
        yield ns
    finally:
        delete_namespace(ns)


@dataclass
class BridgeNet:
    """A bridge in its own namespace and ``n`` namespaces each plugged into it by a veth (``eth0``)."""

    bridge_ns: str
    namespaces: list[str] = field(default_factory=list)
    addresses: list[str] = field(default_factory=list)
    prefix_len: int = 24
    interface: str = "eth0"


@contextmanager
def bridge_with_namespaces(n: int, *, subnet: str = "10.77.0", ipv6_subnet: str | None = None) -> Iterator[BridgeNet]:
    """``n`` namespaces on one bridge: namespace i has ``<subnet>.<i+1>/24`` on ``eth0``.

    Each also gets the multicast route 224.0.0.0/4 via ``eth0`` and ``lo`` up. With ``ipv6_subnet``
    (e.g. ``"fd00:77::"``) each also gets ``<ipv6_subnet><i+1>/64``, with DAD off so it is usable at once.
    Everything is deleted on exit, also when setting up fails half-way.
    """
    if not 1 <= n <= 250:
        raise ValueError(f"n={n} must be in [1, 250]")
    with ExitStack() as stack:
        bridge_ns = stack.enter_context(netns(unique_name("br"), loopback_multicast=False))
        net = BridgeNet(bridge_ns=bridge_ns)
        _ip("-n", bridge_ns, "link", "add", "br0", "type", "bridge")
        # 224.0.0.x is flooded anyway; snooping off keeps every group flooding without a querier.
        _ip("-n", bridge_ns, "link", "set", "br0", "type", "bridge", "mcast_snooping", "0")
        _ip("-n", bridge_ns, "link", "set", "br0", "up")
        for i in range(n):
            ns = stack.enter_context(netns(unique_name(f"h{i}"), loopback_multicast=False))
            port = f"p{i}"
            _ip("-n", bridge_ns, "link", "add", port, "type", "veth", "peer", "name", net.interface, "netns", ns)
            _ip("-n", bridge_ns, "link", "set", port, "master", "br0")
            _ip("-n", bridge_ns, "link", "set", port, "up")
            address = f"{subnet}.{i + 1}"
            if ipv6_subnet is not None:
                _ip("netns", "exec", ns, "sysctl", "-qw", f"net.ipv6.conf.{net.interface}.accept_dad=0")
                _ip("-n", ns, "-6", "addr", "add", f"{ipv6_subnet}{i + 1}/64", "dev", net.interface, "nodad")
            _ip("-n", ns, "addr", "add", f"{address}/{net.prefix_len}", "dev", net.interface)
            _ip("-n", ns, "link", "set", net.interface, "up")
            _ip("-n", ns, "route", "add", "224.0.0.0/4", "dev", net.interface)
            net.namespaces.append(ns)
            net.addresses.append(address)
        yield net


class NetnsProcess:
    """A process inside a namespace (``ns=None``: this one) whose output lines are collected.

    Daemon reader threads collect stdout and stderr lines.
    ``wait_for(pred, timeout_s)`` waits (bounded) until ``pred(lines)`` holds. Use as a context
    manager, or call ``kill()``: the process is ended by its own pid, never by name.
    """

    def __init__(self, ns: str | None, argv: Sequence[str], *, env: dict[str, str] | None = None) -> None:
        self.argv = list(argv)
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", ns, *argv] if ns is not None else list(argv),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            bufsize=1,
            env=env,
        )
        self.lines: list[str] = []
        self.stderr_lines: list[str] = []
        self._changed = threading.Condition()
        self._readers = [
            threading.Thread(target=self._read, args=(self.proc.stdout, self.lines), daemon=True),
            threading.Thread(target=self._read, args=(self.proc.stderr, self.stderr_lines), daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    def _read(self, stream: object, sink: list[str]) -> None:
        for line in iter(stream.readline, ""):  # type: ignore[attr-defined]
            with self._changed:
                sink.append(line.rstrip("\n"))
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def wait_for(self, predicate: Callable[[list[str]], bool], timeout_s: float) -> bool:
        """True once ``predicate(stdout lines so far)`` holds; False after ``timeout_s`` or on exit."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while True:
                if predicate(list(self.lines)):
                    return True
                remaining = deadline - time.monotonic()
                if remaining <= 0 or (self.proc.poll() is not None and not any(r.is_alive() for r in self._readers)):
                    return False
                self._changed.wait(min(remaining, 0.2))

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def signal(self, signum: int) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signum)

    def wait(self, timeout_s: float) -> int | None:
        """Exit status, or None if still running after ``timeout_s``."""
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        """SIGKILL by pid (``ip netns exec`` execs the command, so the pid is the command's)."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        for reader in self._readers:
            reader.join(timeout=5)
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                with suppress(OSError):
                    stream.close()

    @property
    def stderr_text(self) -> str:
        with self._changed:
            return "\n".join(self.stderr_lines)

    def __enter__(self) -> NetnsProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()
