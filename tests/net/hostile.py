"""A real gRPC server on 127.0.0.1 that answers the Peer service however a test tells it to.

For the hostile-network tests: the behaviour is a plain function of the request and the servicer
context, so a test states its attack in a few lines; the server counts calls and bytes it sent and
notes when each call ended (completed or cancelled by the client).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc

from edge_node.net import TlsConfig
from edge_node.wire.messages import PEER_SERVICE_NAME, GetModelRequest, HelloRequest

GetModel = Callable[[GetModelRequest, grpc.ServicerContext], Iterator[bytes]]
Hello = Callable[[HelloRequest, grpc.ServicerContext], bytes]


def connections_to(port: int) -> int:
    """This process's TCP connections to ``port`` that are not closed yet (any state but TIME_WAIT)."""
    import psutil

    return sum(
        1
        for c in psutil.Process().net_connections(kind="tcp")
        if c.raddr and c.raddr.port == port and c.status != psutil.CONN_TIME_WAIT
    )


def no_connections_to(ports: list[int], within_s: float = 2.0) -> list[int]:
    """Each port's open connections from this process, once none is left or ``within_s`` has passed."""
    deadline = time.monotonic() + within_s
    while any(connections_to(p) for p in ports) and time.monotonic() < deadline:
        time.sleep(0.02)
    return [connections_to(p) for p in ports]


def hold_open(context: grpc.ServicerContext) -> Iterator[bytes]:
    """Keep a stream open, sending nothing, until the client goes away (or 60 s)."""
    end = time.monotonic() + 60
    while context.is_active() and time.monotonic() < end:
        time.sleep(0.02)
    return
    yield  # a generator


class HostileServer:
    """``with HostileServer(get_model=..., hello=...) as server:`` then pull from ``server.port``.

    ``address`` is where it listens (``HOST:0`` picks a port): 127.0.0.1, or a namespace's own address.
    """

    def __init__(
        self, get_model: GetModel | None = None, hello: Hello | None = None, tls: TlsConfig | None = None,
        address: str = "127.0.0.1:0", options: list[tuple[str, int]] | None = None,
    ):  # fmt: skip
        self._address = address
        self._options = options or []
        self._get_model = get_model
        self._hello = hello
        self._tls = tls
        self.calls = 0
        self.bytes_sent = 0
        self.open_calls = 0
        self._lock = threading.Lock()
        self.all_ended = threading.Condition(self._lock)

    def _count_end(self) -> None:
        with self._lock:
            self.open_calls -= 1
            self.all_ended.notify_all()

    def _model(self, request: GetModelRequest, context: grpc.ServicerContext) -> Iterator[bytes]:
        with self._lock:
            self.calls += 1
            self.open_calls += 1
        context.add_callback(self._count_end)
        assert self._get_model is not None
        for message in self._get_model(request, context):
            with self._lock:
                self.bytes_sent += len(message)
            yield message

    def _hello_reply(self, request: HelloRequest, context: grpc.ServicerContext) -> bytes:
        with self._lock:
            self.calls += 1
        assert self._hello is not None
        return self._hello(request, context)

    def wait_ended(self, timeout_s: float) -> bool:
        """Whether every GetModel call has ended (the client cancelled or it completed) within ``timeout_s``."""
        with self._lock:
            return self.all_ended.wait_for(lambda: self.open_calls == 0, timeout_s)

    def __enter__(self) -> HostileServer:
        self._executor = ThreadPoolExecutor(max_workers=8, thread_name_prefix="hostile")
        handlers = {}
        if self._get_model is not None:
            handlers["GetModel"] = grpc.unary_stream_rpc_method_handler(
                self._model, request_deserializer=GetModelRequest.FromString, response_serializer=bytes
            )
        if self._hello is not None:
            handlers["Hello"] = grpc.unary_unary_rpc_method_handler(
                self._hello_reply, request_deserializer=HelloRequest.FromString, response_serializer=bytes
            )
        self._server = grpc.server(
            self._executor,
            handlers=[grpc.method_handlers_generic_handler(PEER_SERVICE_NAME, handlers)],
            options=self._options,
        )
        address = self._address
        if self._tls is None:
            self.port = self._server.add_insecure_port(address)
        else:
            self.port = self._server.add_secure_port(address, self._tls.server_credentials())
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop(0).wait(10)
        self._executor.shutdown(wait=True)


class StallingProxy:
    """A TCP relay on 127.0.0.1 to ``target_port`` whose chosen connections stop delivering mid-stream.

    A stalled connection (``stall_connections``: the 1-based accept order, or all) relays the server's first
    ``stall_after_bytes`` bytes and then nothing more, holding both sockets open: the client sees a connection
    that is up (its own bytes still reach the server) but silent, as one in TCP's retransmission backoff
    under heavy loss. Every other connection relays both ways. ``connections`` counts those accepted.
    """

    def __init__(self, target_port: int, stall_after_bytes: int, stall_connections: set[int] | None = None) -> None:
        self._target_port = target_port
        self._stall_after = stall_after_bytes
        self._stall = stall_connections  # None: every connection
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.connections = 0
        self._sockets: list[socket.socket] = []
        self._closed = threading.Event()

    def __enter__(self) -> StallingProxy:
        threading.Thread(target=self._accept, name="stalling-proxy", daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._closed.set()
        self._listener.close()
        for sock in self._sockets:
            sock.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            self.connections += 1
            server = socket.create_connection(("127.0.0.1", self._target_port))
            self._sockets += [client, server]
            stall = self._stall is None or self.connections in self._stall
            threading.Thread(target=self._relay, args=(client, server, None), daemon=True).start()
            threading.Thread(target=self._relay, args=(server, client, self._stall_after if stall else None),
                             daemon=True).start()  # fmt: skip

    def _relay(self, source: socket.socket, sink: socket.socket, limit: int | None) -> None:
        relayed = 0
        try:
            while not self._closed.is_set():
                if limit is not None and relayed >= limit:
                    self._closed.wait()  # silent from here on, both sockets held open
                    return
                data = source.recv(65536 if limit is None else min(65536, limit - relayed))
                if not data:
                    sink.shutdown(socket.SHUT_WR)
                    return
                sink.sendall(data)
                relayed += len(data)
        except OSError:
            return
