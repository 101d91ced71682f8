"""Attacks on a gRPC server from a chosen source address, written as raw HTTP/2 so nothing is hidden.

``WithheldCalls`` opens calls that send their headers and never the request message (the first
finding of issue 19's probe); ``UnreadStreams`` sends whole GetModel requests but never lets the
server write (an HTTP/2 stream window of 0: it never reads); ``IdleConnections`` opens TCP
connections that send nothing. Both bind
their sockets to a source address of 127.0.0.0/8 (e.g. ``127.0.0.2``), so the server sees another
host than an honest client on ``127.0.0.1``. A reader thread per connection answers SETTINGS and
PING like a well-behaved client, so the server cannot tell the withholding from a slow network.
Used by ``tests/net/test_server_limits.py`` and ``bench/hostile.py``.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from types import TracebackType

_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_DATA, _HEADERS, _RST_STREAM, _SETTINGS, _PING, _GOAWAY = 0x0, 0x1, 0x3, 0x4, 0x6, 0x7
_END_HEADERS, _ACK = 0x4, 0x1


def _frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack("!I", len(payload))[1:] + bytes([kind, flags]) + struct.pack("!I", stream) + payload


def _literal(name: str, value: str) -> bytes:
    """HPACK "literal header field without indexing, new name" (no Huffman coding)."""
    raw_name, raw_value = name.encode(), value.encode()
    assert len(raw_name) < 127 and len(raw_value) < 127
    return b"\x00" + bytes([len(raw_name)]) + raw_name + bytes([len(raw_value)]) + raw_value


def call_headers(method: str, authority: str) -> bytes:
    """The header block of a gRPC call to ``method`` (``/edge_node.v1.Peer/GetModel``)."""
    fields = (
        (":method", "POST"), (":scheme", "http"), (":path", method), (":authority", authority),
        ("content-type", "application/grpc"), ("te", "trailers"),
    )  # fmt: skip
    return b"".join(_literal(n, v) for n, v in fields)


class _Connection:
    """One HTTP/2 connection from ``source`` that answers SETTINGS and PING and counts what it hears."""

    def __init__(self, source: str, port: int, *, handshake: bool = True) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source, 0))
        self.sock.settimeout(None)
        self.closed_by_server = threading.Event()
        self.ended: set[int] = set()  # streams the server ended (RST_STREAM or trailers)
        self.goaway = False
        self._lock = threading.Lock()
        if handshake:
            self.send_settings()

    def _send(self, data: bytes) -> None:
        with self._lock:
            self.sock.sendall(data)

    def _recv_exact(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError("closed")
            data += chunk
        return data

    def _read(self) -> None:
        try:
            while True:
                head = self._recv_exact(9)
                length = int.from_bytes(head[:3], "big")
                kind, flags = head[3], head[4]
                payload = self._recv_exact(length) if length else b""
                if kind == _SETTINGS and not flags & _ACK:
                    self._send(_frame(_SETTINGS, _ACK, 0))
                elif kind == _PING and not flags & _ACK:
                    self._send(_frame(_PING, _ACK, 0, payload))
                elif kind == _RST_STREAM or (kind == _HEADERS and flags & 0x1):  # reset, or trailers-only
                    self.ended.add(int.from_bytes(head[5:9], "big") & 0x7FFFFFFF)
                elif kind == _GOAWAY:
                    self.goaway = True
        except OSError:
            pass
        finally:
            self.closed_by_server.set()

    def send_settings(self, initial_window: int | None = None) -> None:
        """The client preface and SETTINGS (``initial_window``: SETTINGS_INITIAL_WINDOW_SIZE), then read."""
        settings = b"" if initial_window is None else struct.pack("!HI", 0x4, initial_window)
        self._send(_PREFACE + _frame(_SETTINGS, 0, 0, settings))
        self._reader = threading.Thread(target=self._read, daemon=True, name="h2-attack-reader")
        self._reader.start()

    def open_calls(self, method: str, first_stream: int, n: int, authority: str) -> int:
        """Open ``n`` calls (streams ``first_stream``, +2, ...): headers only, never a message."""
        block = call_headers(method, authority)
        sent = 0
        for i in range(n):
            try:
                self._send(_frame(_HEADERS, _END_HEADERS, first_stream + 2 * i, block))
            except OSError:
                break
            sent += 1
        return sent

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


class WithheldCalls:
    """``calls`` calls to ``method`` from ``source`` over ``connections`` connections, requests withheld.

    ``with WithheldCalls("127.0.0.2", port, "/edge_node.v1.Peer/GetModel", calls=64) as attack:``
    ``attack.ended()`` counts the calls the server has ended so far (RST_STREAM or trailers).
    """

    def __init__(self, source: str, port: int, method: str, *, calls: int, connections: int = 8) -> None:
        self.source, self.port, self.method = source, port, method
        self.calls, self.connections = calls, connections
        self._conns: list[_Connection] = []
        self.sent = 0
        self.t0 = 0.0

    def __enter__(self) -> WithheldCalls:
        per = -(-self.calls // self.connections)
        self.t0 = time.monotonic()
        for c in range(self.connections):
            n = min(per, self.calls - c * per)
            if n <= 0:
                break
            conn = _Connection(self.source, self.port)
            self._conns.append(conn)
            self.sent += conn.open_calls(self.method, 1, n, f"127.0.0.1:{self.port}")
        return self

    def ended(self) -> int:
        return sum(len(c.ended) for c in self._conns)

    def __exit__(self, *exc: object) -> None:
        for conn in self._conns:
            conn.close()


class UnreadStreams:
    """``calls`` GetModel calls from ``source`` with a valid ``request``, whose responses are never read.

    Each connection announces a stream window of 0, so the server cannot write one byte of any
    model: its writes wait on flow control for as long as the connection lives. ``ended()`` counts
    the streams the server has ended, ``closed()`` the connections it has closed.
    """

    def __init__(self, source: str, port: int, request: bytes, *, calls: int, connections: int = 1) -> None:
        self.source, self.port, self.request = source, port, request
        self.calls, self.connections = calls, connections
        self._conns: list[_Connection] = []
        self.sent = 0

    def __enter__(self) -> UnreadStreams:
        body = b"\x00" + struct.pack("!I", len(self.request)) + self.request  # gRPC message prefix
        block = call_headers("/edge_node.v1.Peer/GetModel", f"127.0.0.1:{self.port}")
        per = -(-self.calls // self.connections)
        for c in range(self.connections):
            conn = _Connection(self.source, self.port, handshake=False)
            conn.send_settings(initial_window=0)
            self._conns.append(conn)
            for i in range(min(per, self.calls - c * per)):
                stream = 1 + 2 * i
                conn._send(_frame(_HEADERS, _END_HEADERS, stream, block) + _frame(_DATA, 0x1, stream, body))
                self.sent += 1
        return self

    def ended(self) -> int:
        return sum(len(c.ended) for c in self._conns)

    def closed(self) -> int:
        return sum(c.closed_by_server.is_set() for c in self._conns)

    def __exit__(self, *exc: object) -> None:
        for conn in self._conns:
            conn.close()


class IdleConnections:
    """``n`` TCP connections from ``source`` that send nothing at all (not even the HTTP/2 preface)."""

    def __init__(self, source: str, port: int, n: int) -> None:
        self.source, self.port, self.n = source, port, n
        self.socks: list[socket.socket] = []
        self.failed = 0  # connects that failed (refused, reset, out of descriptors)

    def __enter__(self) -> IdleConnections:
        for _ in range(self.n):
            try:
                self.socks.append(socket.create_connection(("127.0.0.1", self.port), 2, (self.source, 0)))
            except OSError:
                self.failed += 1
        return self

    def open_count(self) -> int:
        """Connections the server has not closed yet (a closed one reads EOF or errors at once)."""
        alive = 0
        for sock in self.socks:
            sock.setblocking(False)
            try:
                while sock.recv(65536):  # drain what the server sent (its SETTINGS); b"": it closed
                    pass
            except BlockingIOError:
                alive += 1  # nothing more to read, not closed
            except OSError:
                pass  # reset
        return alive

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        for sock in self.socks:
            sock.close()
