"""A per-host cap on the TCP connections the gRPC server holds (grpc core only caps them in all).

grpc gives Python no hook at accept, so one host that opens ``max_connections`` connections would
keep every other host out while it holds them. ``ConnectionGuard`` is a watcher thread in the
server's process: every ``period_s`` it lists the process's sockets (``/proc/self/fd``) and, only
when there are more than one host's cap, asks each (through a duplicate of grpc's descriptor,
checked to be the same socket) for its local port and peer; a host holding more than
``max_connections_per_host`` connections to the server's port loses the newest ones (highest
inode) beyond its cap: ``shutdown()`` on the duplicate, after which grpc sees the connection end
and closes it. A sweep that cut something is followed by the next after ``cutting_period_s``
instead of ``period_s``, until one cuts nothing. So a host holds at most its cap, plus what it opens
within one period; the rest of ``max_connections`` stays free.
Linux only (``/proc``); elsewhere the guard says so once and the global cap is the only one.

The naming of hosts and the choice of what to cut are pure functions (tested without sockets).
"""

from __future__ import annotations

import collections
import contextlib
import ipaddress
import logging
import os
import socket
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

_LOGGER = logging.getLogger(__name__)


@dataclass(frozen=True)
class Connection:
    """One connection to the server's port: its socket inode and the remote host (``ipv4:10.0.0.2``)."""

    inode: int
    host: str


def host_of(family: int, peer: tuple[object, ...]) -> str:
    """The host part of a peer address as grpc names it: ``ipv4:10.0.0.2``, ``ipv6:[fe80::1]``."""
    address = ipaddress.ip_address(str(peer[0]).split("%")[0])
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped  # a dual-stack socket names an IPv4 peer this way
    return f"ipv4:{address}" if address.version == 4 else f"ipv6:[{address}]"


@contextlib.contextmanager
def _same_socket(fd: int, inode: int) -> Iterator[socket.socket | None]:
    """A socket on a duplicate of ``fd`` while it is still socket ``inode`` (grpc may have closed and reused the
    number); None otherwise. The duplicate is closed on exit."""
    try:
        duplicate = os.dup(fd)
    except OSError:
        yield None
        return
    try:
        sock = socket.socket(fileno=duplicate) if os.fstat(duplicate).st_ino == inode else None
    except OSError:
        sock = None
    if sock is None:
        os.close(duplicate)
        yield None
        return
    with sock:
        yield sock


def _connection(fd: int, inode: int, port: int) -> Connection | None:
    """The connection on ``fd`` when it is still that socket and a TCP connection to ``port``."""
    try:
        with _same_socket(fd, inode) as sock:
            if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
                return None
            if sock.type != socket.SOCK_STREAM or sock.getsockname()[1] != port:
                return None
            return Connection(inode, host_of(sock.family, sock.getpeername()))
    except (OSError, ValueError):  # not connected (the listening socket), or gone
        return None


def over_cap(connections: Iterable[Connection], cap: int) -> dict[str, list[Connection]]:
    """Per host over ``cap``, its connections beyond the cap: the newest (highest inode) go first."""
    by_host: dict[str, list[Connection]] = collections.defaultdict(list)
    for connection in connections:
        by_host[connection.host].append(connection)
    excess = {}
    for host, held in by_host.items():
        if len(held) > cap:
            excess[host] = sorted(held, key=lambda c: c.inode)[cap:]
    return excess


def socket_inodes(fd_dir: str = "/proc/self/fd") -> dict[int, int]:
    """This process's socket descriptors: inode -> fd."""
    inodes = {}
    for name in os.listdir(fd_dir):
        with contextlib.suppress(OSError):  # closed since listdir
            target = os.readlink(os.path.join(fd_dir, name))
            if target.startswith("socket:["):
                inodes[int(target[8:-1])] = int(name)
    return inodes


def _cut(fd: int, inode: int) -> bool:
    """Shut the socket down if ``fd`` is still that socket (grpc may have closed and reused it)."""
    try:
        with _same_socket(fd, inode) as sock:
            if sock is None:
                return False
            sock.shutdown(socket.SHUT_RDWR)  # ends the connection for grpc too; grpc closes its fd
            return True
    except OSError:
        return False


class ConnectionGuard:
    """The watcher thread: caps every host at ``max_connections_per_host`` connections to ``port``.

    ``on_cut(host, n)`` is called for each host that lost ``n`` connections in a sweep (to count
    and log them). ``sweep()`` runs one pass (tests call it directly).
    """

    def __init__(
        self,
        port: int,
        max_connections_per_host: int,
        on_cut: Callable[[str, int], None],
        *,
        period_s: float = 0.2,
        cutting_period_s: float = 0.01,
    ) -> None:
        self.port = port
        self.cap = max_connections_per_host
        self.period_s = period_s
        self.cutting_period_s = cutting_period_s
        self._on_cut = on_cut
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.sweeps = 0
        self._cut: set[int] = set()  # inodes shut down and not yet closed by grpc: not counted again
        self._known: dict[int, Connection | None] = {}  # inode -> its connection to the port (None: not one)

    def start(self) -> bool:
        """Start watching; False (logged once) where /proc is not there to watch."""
        if not os.path.isdir("/proc/self/fd"):
            _LOGGER.warning("no /proc on this system: connections are capped in all only, not per host")
            return False
        self._thread = threading.Thread(target=self._run, name="edge-node-conn-guard", daemon=True)
        self._thread.start()
        return True

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def _run(self) -> None:
        wait = self.period_s
        while not self._stop.wait(wait):
            try:
                cut = self.sweep()
            except Exception:  # a failed sweep must not end the watcher; the next one retries
                _LOGGER.exception("connection guard sweep failed")
                cut = 0
            # While a host is being cut, look again soon: each slot a cut frees can be taken at once by
            # another of its connections waiting in the listen backlog (a soak saw one such attack keep
            # every honest Hello out while the guard swept every 0.2 s).
            wait = self.cutting_period_s if cut else self.period_s

    def sweep(self) -> int:
        """One pass; returns the connections cut."""
        self.sweeps += 1
        inodes = socket_inodes()
        if len(inodes) <= self.cap:  # nobody can be over the cap: skip asking the sockets
            return 0
        self._cut &= inodes.keys()
        # a socket's inode and peer do not change while it is open: probe only sockets not seen before
        self._known = {inode: self._known[inode] for inode in inodes if inode in self._known}
        for inode, fd in inodes.items():
            if inode not in self._known:
                self._known[inode] = _connection(fd, inode, self.port)
        connections = [c for i, c in self._known.items() if c is not None and i not in self._cut]
        cut = 0
        for host, excess in over_cap(connections, self.cap).items():
            done = [c.inode for c in excess if _cut(inodes[c.inode], c.inode)]
            self._cut.update(done)
            n = len(done)
            if n:
                cut += n
                self._on_cut(host, n)
        return cut
