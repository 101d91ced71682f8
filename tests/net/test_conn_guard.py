"""The per-host connection cap (``edge_node/net/conn_guard.py``): host names, the choice of what to
cut, and one sweep over real loopback sockets (a plain listener, no grpc)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time

from edge_node.net.conn_guard import Connection, ConnectionGuard, host_of, over_cap


def test_hosts_are_named_as_grpc_names_them() -> None:
    assert host_of(socket.AF_INET, ("10.0.0.2", 5000)) == "ipv4:10.0.0.2"
    assert host_of(socket.AF_INET6, ("::ffff:10.0.0.2", 5000, 0, 0)) == "ipv4:10.0.0.2"  # dual-stack socket
    assert host_of(socket.AF_INET6, ("fe80::1%eth0", 5000, 0, 2)) == "ipv6:[fe80::1]"
    assert host_of(socket.AF_INET6, ("::1", 5000, 0, 0)) == "ipv6:[::1]"


def test_only_hosts_over_the_cap_lose_their_newest_connections() -> None:
    held = [Connection(i, "ipv4:10.0.0.9") for i in (50, 10, 40, 20, 30)] + [Connection(7, "ipv4:10.0.0.1")]
    assert over_cap(held, 5) == {}
    excess = over_cap(held, 2)
    assert list(excess) == ["ipv4:10.0.0.9"]
    assert [c.inode for c in excess["ipv4:10.0.0.9"]] == [30, 40, 50]  # the two oldest stay


def test_a_sweep_shuts_down_one_hosts_connections_beyond_its_cap() -> None:
    cut: list[tuple[str, int]] = []
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        guard = ConnectionGuard(port, 3, lambda host, n: cut.append((host, n)))
        clients = [socket.create_connection(("127.0.0.1", port), 2, ("127.0.0.2", 0)) for _ in range(8)]
        honest = socket.create_connection(("127.0.0.1", port), 2)
        accepted = [listener.accept()[0] for _ in range(9)]
        try:
            assert guard.sweep() == 5
            assert cut == [("ipv4:127.0.0.2", 5)]
            ended = 0
            for client in clients:
                client.settimeout(1)
                with contextlib.suppress(TimeoutError):  # a timeout: still open
                    ended += client.recv(1) == b""  # shut down by the guard: EOF at once
            honest.settimeout(0.2)
            try:
                honest_open = honest.recv(1) != b""
            except TimeoutError:
                honest_open = True
            assert ended == 5 and honest_open
            assert guard.sweep() == 0  # the host is at its cap now
        finally:
            for s in [*clients, honest, *accepted]:
                s.close()


class _Scripted(ConnectionGuard):
    """A guard whose sweeps cut what a script says, recording when each ran."""

    def __init__(self, cuts: list[int]) -> None:
        super().__init__(0, 1, lambda host, n: None, period_s=1.0, cutting_period_s=0.01)
        self.script = cuts
        self.times: list[float] = []

    def sweep(self) -> int:
        self.times.append(time.monotonic())
        return self.script.pop(0) if self.script else 0


def test_sweeps_follow_at_once_while_a_host_is_being_cut() -> None:
    """A freed slot can be refilled from the attacker's backlog: the guard looks again within 10 ms."""
    guard = _Scripted([5, 3, 0, 0])
    thread = threading.Thread(target=guard._run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while len(guard.times) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    guard.stop()
    thread.join(2)
    gaps = [b - a for a, b in zip(guard.times, guard.times[1:], strict=False)]
    assert len(gaps) >= 3, guard.times
    assert gaps[0] < 0.5 and gaps[1] < 0.5  # after sweeps that cut: soon (10 ms, slack for a loaded machine)
    assert gaps[2] >= 0.95  # after one that cut nothing: the quiet period again
