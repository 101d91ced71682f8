"""Private network namespaces for tests: loopback with multicast, a bridge with several "devices".

Everything made here is removed on exit of the context manager, also when the test fails, and only
processes started through this module (or left inside a namespace this module made) are killed.
Names carry ``en-test-<pid>-`` so leftovers of a crashed run are recognisable; :func:`cleanup_stale`
removes those whose pid is gone. The namespace helpers are the product's (``edge_node.fleet.netns``,
which ``edge-node loopback --netns`` uses), bound to the ``test`` kind here.

    with netns() as ns:                                   # lo up, multicast on, 224.0.0.0/4 via lo
        proc = NetnsProcess(ns, [sys.executable, "-c", "..."])
        # or, in a freshly forked child: enter_netns(ns) before opening any socket
    with bridge_with_namespaces(3) as net:                # net.namespaces[i] has net.addresses[i]
        run_in_netns(net.namespaces[0], ["ping", "-c1", net.addresses[1]])

Needs root (the ``require_root`` fixture) and iproute2.
"""

from __future__ import annotations

import functools
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import suppress

from edge_node.fleet import netns as _netns
from edge_node.fleet.netns import BridgeNet, delete_namespace, enter_netns, list_namespaces, run_in_netns

KIND = "test"
PREFIX = f"{_netns.PREFIX}{KIND}-"
unique_name = functools.partial(_netns.unique_name, kind=KIND)
netns = functools.partial(_netns.netns, kind=KIND)
bridge_with_namespaces = functools.partial(_netns.bridge_with_namespaces, kind=KIND)
cleanup_stale = functools.partial(_netns.cleanup_stale, KIND)

__all__ = [
    "PREFIX", "BridgeNet", "NetnsProcess", "bridge_with_namespaces", "cleanup_stale", "delete_namespace",
    "enter_netns", "list_namespaces", "netns", "run_in_netns", "unique_name",
]  # fmt: skip


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
