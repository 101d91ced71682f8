"""The peer gRPC server: answers ``Peer.Hello`` and streams the latest published snapshot.

``PeerServer`` holds what the node publishes (thread-safe; each snapshot is encoded and serialized
once and the same bytes go to every caller); ``create_server`` builds a gRPC server around it and
returns it unstarted with its port, so the caller decides when to ``start()`` and ``stop()``.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import NoReturn

import grpc
import torch

from edge_node.errors import ConfigError, ListenError
from edge_node.net.tls import TlsConfig, warn_insecure
from edge_node.wire import (
    DEFAULT_MAX_MESSAGE_BYTES,
    PROTOCOL_MAJOR,
    PROTOCOL_VERSION,
    ModelSpec,
    ValueType,
    encode_model,
    parse_protocol_version,
)
from edge_node.wire.messages import (
    PEER_SERVICE_NAME,
    GetModelRequest,
    HelloReply,
    HelloRequest,
    ProtoModelChunk,
    value_type_to_proto,
)
from edge_node.wire.spec import MIN_MAX_MESSAGE_BYTES

_LOGGER = logging.getLogger(__name__)

KEEPALIVE_TIME_MS = 60_000  # server pings an idle client connection every minute
KEEPALIVE_TIMEOUT_MS = 20_000  # and drops it when the ping is unanswered for 20 s
MIN_CLIENT_PING_INTERVAL_MS = 10_000  # clients may ping this often (they ping every 30 s)


@dataclass(frozen=True)
class ModelSnapshot:
    """What a node publishes after a round: trained weights, the training mask and who it is."""

    weights: Mapping[str, torch.Tensor]
    masks: Mapping[str, torch.Tensor]
    round: int
    density: float
    node_id: str
    fleet_id: str
    arch_id: str
    tier: str = ""


@dataclass(frozen=True)
class ServerLimits:
    """Size and rate limits of the server (every RPC)."""

    max_request_bytes: int = 64 << 10  # requests are a few ids; anything larger is refused
    max_concurrent_rpcs: int = 16  # beyond this, calls get RESOURCE_EXHAUSTED at once
    max_workers: int = 8  # threads serving calls

    def __post_init__(self) -> None:
        for name in ("max_request_bytes", "max_concurrent_rpcs", "max_workers"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r} must be a positive integer")


@dataclass(frozen=True)
class _Published:
    round: int
    density: float
    tier: str
    messages: tuple[bytes, ...]  # serialized ModelChunk messages, header first

    @property
    def wire_bytes(self) -> int:
        return sum(len(m) for m in self.messages)


class PeerServer:
    """The servicer state: identity and the latest snapshot, served as pre-serialized messages."""

    def __init__(
        self,
        spec: ModelSpec,
        *,
        node_id: str,
        fleet_id: str,
        tier: str = "",
        value_type: ValueType = ValueType.FLOAT32,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        for kind, value in (("node_id", node_id), ("fleet_id", fleet_id)):
            if not isinstance(value, str) or not value or len(value.encode()) > 255:
                raise ValueError(f"{kind}={value!r} must be a non-empty string of at most 255 bytes")
        if isinstance(max_message_bytes, bool) or not isinstance(max_message_bytes, int):
            raise TypeError(f"max_message_bytes={max_message_bytes!r} must be an integer")
        if max_message_bytes < MIN_MAX_MESSAGE_BYTES:
            raise ValueError(f"max_message_bytes={max_message_bytes} must be at least {MIN_MAX_MESSAGE_BYTES}")
        self.spec = spec
        self.node_id = node_id
        self.fleet_id = fleet_id
        self.value_type = ValueType.parse(value_type)
        self.max_message_bytes = max_message_bytes
        self._tier = tier
        self._lock = threading.Lock()
        self._published: _Published | None = None

    @property
    def published_round(self) -> int | None:
        """Round of the snapshot being served, None before the first publish."""
        published = self._published
        return None if published is None else published.round

    def publish(self, snapshot: ModelSnapshot) -> int:
        """Encode ``snapshot`` once and serve it from now on; returns its bytes on the wire.

        The snapshot's tensors are read here and never again: the caller may train on after return.
        """
        if (snapshot.node_id, snapshot.fleet_id, snapshot.arch_id) != (self.node_id, self.fleet_id, self.spec.arch_id):
            raise ValueError(
                f"snapshot of node {snapshot.node_id!r}, fleet {snapshot.fleet_id!r}, arch {snapshot.arch_id!r}"
                f" does not match this server's {self.node_id!r}, {self.fleet_id!r}, {self.spec.arch_id!r}"
            )
        messages = encode_model(
            self.spec,
            snapshot.weights,
            snapshot.masks,
            node_id=self.node_id,
            fleet_id=self.fleet_id,
            round=snapshot.round,
            density=snapshot.density,
            value_type=self.value_type,
            max_message_bytes=self.max_message_bytes,
        )
        published = _Published(
            snapshot.round,
            snapshot.density,
            snapshot.tier or self._tier,
            tuple(m.SerializeToString() for m in messages),
        )
        with self._lock:
            self._published = published
            self._tier = published.tier
        _LOGGER.info(
            "published round %s (density %.3f): %d messages, %d bytes",
            snapshot.round, snapshot.density, len(published.messages), published.wire_bytes,
        )  # fmt: skip
        return published.wire_bytes

    def publish_messages(self, messages: Sequence[ProtoModelChunk | bytes], *, round: int, density: float) -> None:
        """Serve ``messages`` verbatim as the model stream, unchecked.

        For relaying an already-encoded stream and for fault injection (tests, a loopback node that
        sends garbage): receivers must refuse whatever is wrong with it.
        """
        raw = tuple(m if isinstance(m, bytes) else m.SerializeToString() for m in messages)
        with self._lock:
            self._published = _Published(round, density, self._tier, raw)

    def _hello(self, request: HelloRequest, context: grpc.ServicerContext) -> HelloReply:
        published = self._published
        return HelloReply(
            protocol_version=PROTOCOL_VERSION,
            node_id=self.node_id,
            fleet_id=self.fleet_id,
            arch_id=self.spec.arch_id,
            round=0 if published is None else published.round,
            density=0.0 if published is None or not math.isfinite(published.density) else published.density,
            capacity_tier=self._tier,
            has_model=published is not None,
            value_type=value_type_to_proto(self.value_type),
        )

    def _refuse(self, context: grpc.ServicerContext, code: grpc.StatusCode, reason: str) -> NoReturn:
        _LOGGER.warning("refused GetModel from %s: %s", context.peer(), reason)
        _abort(context, code, reason)

    def _get_model(self, request: GetModelRequest, context: grpc.ServicerContext) -> Iterator[bytes]:
        try:
            major, _minor = parse_protocol_version(request.protocol_version)
        except ValueError as exc:
            self._refuse(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        if major != PROTOCOL_MAJOR:
            self._refuse(
                context,
                grpc.StatusCode.FAILED_PRECONDITION,
                f"protocol version {request.protocol_version!r} is not compatible with this node's {PROTOCOL_VERSION}",
            )
        if request.fleet_id != self.fleet_id:
            self._refuse(
                context,
                grpc.StatusCode.FAILED_PRECONDITION,
                f"caller's fleet {request.fleet_id!r} is not this node's fleet {self.fleet_id!r}",
            )
        if request.arch_id != self.spec.arch_id:
            self._refuse(
                context,
                grpc.StatusCode.FAILED_PRECONDITION,
                f"caller's architecture {request.arch_id!r} is not this node's {self.spec.arch_id!r}",
            )
        published = self._published
        if published is None:
            _abort(context, grpc.StatusCode.UNAVAILABLE, "no model published yet")
        _LOGGER.debug("serving round %s to %s (%s)", published.round, request.node_id, context.peer())
        yield from published.messages

    def rpc_handler(self) -> grpc.GenericRpcHandler:
        """The ``edge_node.v1.Peer`` service; GetModel sends the cached serialized messages as they are."""
        identity: Callable[[bytes], bytes] = bytes
        return grpc.method_handlers_generic_handler(
            PEER_SERVICE_NAME,
            {
                "Hello": grpc.unary_unary_rpc_method_handler(
                    self._hello,
                    request_deserializer=HelloRequest.FromString,
                    response_serializer=HelloReply.SerializeToString,
                ),
                "GetModel": grpc.unary_stream_rpc_method_handler(
                    self._get_model, request_deserializer=GetModelRequest.FromString, response_serializer=identity
                ),
            },
        )


class _Server(grpc.Server):
    """A ``grpc.Server`` that also shuts down its own thread pool when stopped."""

    def __init__(self, inner: grpc.Server, executor: ThreadPoolExecutor) -> None:
        self._inner = inner
        self._executor = executor

    def add_generic_rpc_handlers(self, generic_rpc_handlers: Iterable[grpc.GenericRpcHandler]) -> None:
        self._inner.add_generic_rpc_handlers(generic_rpc_handlers)

    def add_registered_method_handlers(
        self, service_name: str, method_handlers: dict[str, grpc.RpcMethodHandler]
    ) -> None:
        self._inner.add_registered_method_handlers(service_name, method_handlers)

    def add_insecure_port(self, address: str) -> int:
        return self._inner.add_insecure_port(address)

    def add_secure_port(self, address: str, server_credentials: grpc.ServerCredentials) -> int:
        return self._inner.add_secure_port(address, server_credentials)

    def start(self) -> None:
        self._inner.start()

    def stop(self, grace: float | None) -> threading.Event:
        stopped = self._inner.stop(grace)
        waiter = threading.Thread(target=self._shutdown_pool, args=(stopped,), name="edge-node-grpc-stop", daemon=True)
        waiter.start()
        return stopped

    def _shutdown_pool(self, stopped: threading.Event) -> None:
        stopped.wait()
        self._executor.shutdown(wait=False, cancel_futures=True)

    def wait_for_termination(self, timeout: float | None = None) -> bool:
        return self._inner.wait_for_termination(timeout)


def _abort(context: grpc.ServicerContext, code: grpc.StatusCode, details: str) -> NoReturn:
    """End the call with ``code``: ``context.abort`` always raises (grpc ships no types to say so)."""
    context.abort(code, details)
    raise AssertionError("grpc.ServicerContext.abort returned")  # unreachable


def server_options(limits: ServerLimits) -> list[tuple[str, int]]:
    return [
        ("grpc.max_receive_message_length", limits.max_request_bytes),
        ("grpc.so_reuseport", 0),  # a port in use is an error, not a silently shared port
        ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_recv_ping_interval_without_data_ms", MIN_CLIENT_PING_INTERVAL_MS),
        ("grpc.http2.max_ping_strikes", 3),
    ]


def _check_address(address: object) -> str:
    """``HOST:PORT`` (IPv6 hosts in brackets) with a port gRPC will not silently wrap around."""
    host, sep, port_text = address.rpartition(":") if isinstance(address, str) else ("", "", "")
    if not isinstance(address, str) or not sep or not host or not port_text.isdigit() or int(port_text) > 65535:
        raise ConfigError(f"listen address {address!r} must be HOST:PORT with PORT in 0..65535 (0 picks a free port)")
    return address


def create_server(
    address: str,
    peer: PeerServer,
    *,
    tls: TlsConfig | None = None,
    insecure: bool = False,
    limits: ServerLimits | None = None,
) -> tuple[grpc.Server, int]:
    """A gRPC server for ``peer`` listening on ``address`` (``"127.0.0.1:0"`` picks a port), not started.

    Args:
        tls: mutual TLS with the fleet CA; required unless ``insecure`` is set explicitly.
        insecure: serve plaintext (logged loudly once).

    Returns:
        ``(server, port)``: call ``server.start()`` to serve and ``server.stop(grace_s)`` to stop.

    Raises:
        ConfigError: neither ``tls`` nor ``insecure`` given (or both), or ``address`` is not HOST:PORT.
        ListenError: the address cannot be bound.
    """
    _check_address(address)
    if (tls is None) == (not insecure):
        if tls is None:
            raise ConfigError(
                "no TLS material given: pass tls=TlsConfig(...) or, explicitly, insecure=True (--insecure)"
            )
        raise ConfigError("tls and insecure=True are mutually exclusive")
    limits = limits or ServerLimits()
    executor = ThreadPoolExecutor(max_workers=limits.max_workers, thread_name_prefix="edge-node-grpc")
    inner = grpc.server(
        executor,
        handlers=[peer.rpc_handler()],
        options=server_options(limits),
        maximum_concurrent_rpcs=limits.max_concurrent_rpcs,
    )
    server = _Server(inner, executor)
    try:
        if tls is None:
            warn_insecure("server")
            port = server.add_insecure_port(address)
        else:
            port = server.add_secure_port(address, tls.server_credentials())
    except RuntimeError as exc:  # grpc raises RuntimeError("Failed to bind to address ...")
        executor.shutdown(wait=False)
        raise ListenError(f"cannot listen on {address!r}: {exc}") from exc
    if port == 0:
        executor.shutdown(wait=False)
        raise ListenError(f"cannot listen on {address!r}")
    return server, port
