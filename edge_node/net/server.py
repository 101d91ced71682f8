"""The peer gRPC server: answers ``Peer.Hello`` and streams published snapshots.

``PeerServer`` is the servicer, thin over two parts with one job each: a ``SnapshotStore``
(``net/snapshots.py``: what the node publishes, each snapshot encoded and serialized once, the last
``keep_snapshots`` of them so that a lock-step peer can pull exactly round ``r``) and an ``AdmissionGuard``
(``net/admission.py``: the calls, streams and connections each host and caller may hold, and the refusals by
kind). A call is admitted, its request decoded and checked, then answered from the store.
``create_server`` builds a gRPC server around it and returns it unstarted with its port, so the caller
decides when to ``start()`` and ``stop()``.

The server runs on grpc's asyncio API in its own event-loop thread (``create_server`` hides this
behind the ordinary ``grpc.Server`` methods): a call that waits for its request or for a slow reader
costs a coroutine, not a worker thread, so no number of withheld requests can take the threads that
serve honest calls. Both methods are registered as request-*streaming* on this side (the bytes on
the wire are the same as a unary request), so the handler runs as soon as a call's headers arrive,
before its request message: that is where a call is counted against its host and timed.

Bounds (``ServerLimits``, documented in the README): open calls per host (``max_calls_per_host``,
counted from the headers on) and in all (``max_concurrent_rpcs``); a request message must arrive
within ``request_timeout_s``; TCP connections at once (``max_connections``, enforced by grpc core:
beyond it a connection is closed at accept) and per host (``max_connections_per_host``, enforced by
``conn_guard.ConnectionGuard``: a host's newest connections beyond it are shut down within
``connection_guard_period_s``), each with at most ``max_streams_per_connection`` streams,
``handshake_timeout_s`` to finish its TLS/HTTP/2 setup, closed after ``connection_idle_s`` without a
call, and ended ``max_connection_age_s`` (+-10 %) + ``connection_age_grace_s`` after it opened
whatever its calls do. ``check_fd_limit`` raises the process's descriptor limit to fit
``max_connections`` at start.

Refusals (a status code with a one-line reason, counted by kind in ``PeerServer.refusals()``):
another protocol major, fleet or architecture: FAILED_PRECONDITION; with TLS, a caller whose request
names another node than its certificate: PERMISSION_DENIED; a round not published yet: NOT_FOUND
(``"round r not published yet (latest q)"``); a round no longer kept: OUT_OF_RANGE; more than
``ServerLimits.max_streams_per_caller`` model streams open by one caller (``busy``), more than
``max_calls_per_host`` calls open by one host (``host-busy``) or ``max_concurrent_rpcs`` in all
(``server-busy``): RESOURCE_EXHAUSTED; no request within ``request_timeout_s`` (``slow-request``):
DEADLINE_EXCEEDED; connections shut down beyond a host's cap (``host-connections``, one per
connection); more than ``host_rate`` calls a second (burst ``host_burst_s`` worth) from one host
(``host-rate``, ``net/host_rate.py`` says what a host is): RESOURCE_EXHAUSTED, held back
``host_rate_hold_s`` before it goes out (at most ``max_held_calls``); a host asking ``ListPeers`` more than
``PEX_HOST_BURST`` times at once, then more often than once per ``PEX_HOST_INTERVAL_S`` (``pex-rate``):
RESOURCE_EXHAUSTED. Connections refused by grpc core at ``max_connections`` are not counted (grpc gives
Python no hook there). A model stream whose reader stops reading is held by flow control (cancelling the
write does not end the call in grpc.aio): the connection's age ends it, so it holds its slot for at most
``1.1 * max_connection_age_s + connection_age_grace_s``; streams that ended before their last message are
counted (``unfinished_streams``).
"""

from __future__ import annotations

import asyncio
import logging
import resource
import threading
import time
from collections.abc import Callable, Coroutine, Iterable, Sequence
from typing import Any, NoReturn, TypeVar

import grpc

from edge_node.errors import ConfigError, ListenError
from edge_node.net.admission import REFUSAL_KINDS, AdmissionGuard, Refusal, ServerLimits
from edge_node.net.conn_guard import ConnectionGuard
from edge_node.net.host_rate import HostRates, host_key
from edge_node.net.snapshots import ModelSnapshot, NoLongerKept, NotPublished, SnapshotStore
from edge_node.net.tls import TlsConfig, warn_insecure
from edge_node.protocol import MAX_PEER_ENTRIES, PROTOCOL_VERSION, NodeIdentity, check_round, parse_tier_mode
from edge_node.wire import DEFAULT_MAX_MESSAGE_BYTES, ModelSpec, ValueType, parse_protocol_version
from edge_node.wire.messages import (
    PEER_SERVICE_NAME,
    GetModelRequest,
    HelloReply,
    HelloRequest,
    ListPeersReply,
    ListPeersRequest,
    PeerEntry,
    ProtoModelChunk,
    value_type_to_proto,
)

__all__ = [
    "REFUSAL_KINDS",
    "ModelSnapshot",
    "PeerServer",
    "ServerLimits",
    "check_fd_limit",
    "create_server",
    "server_options",
]

_LOGGER = logging.getLogger(__name__)

KEEPALIVE_TIME_MS = 60_000  # server pings an idle client connection every minute
KEEPALIVE_TIMEOUT_MS = 20_000  # and drops it when the ping is unanswered for 20 s
# Clients may ping this often: 5 s after a call last received data or a ping answer; a little less, so that
# timer skew is no strike.
MIN_CLIENT_PING_INTERVAL_MS = 4_000

# ListPeers (peer exchange, 1.4): one host may ask PEX_HOST_BURST times at once, then once per this long (a
# node asks each peer once per ``peer_exchange_s``, at least 1 s; the burst is for nodes behind one address);
# the hosts remembered are bounded (the oldest forgotten first).
PEX_HOST_INTERVAL_S = 0.5
PEX_HOST_BURST = 8
PEX_HOSTS_REMEMBERED = 4096

FD_RESERVE = 256  # descriptors besides the server's connections: files, mDNS, pulls, torch, the status socket


def check_fd_limit(limits: ServerLimits) -> int:
    """Raise the soft descriptor limit to the hard one; ConfigError when it cannot fit ``max_connections``.

    Returns the soft limit now in force. The systemd unit sets ``LimitNOFILE``; a shell's default
    soft limit (often 1024) is raised here, so an operator only sees this error when the hard limit
    itself is too low.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as exc:  # a container may refuse; the check below decides
            _LOGGER.warning("could not raise the file-descriptor limit from %d to %d: %s", soft, hard, exc)
    needed = limits.max_connections + FD_RESERVE
    if soft != resource.RLIM_INFINITY and soft < needed:
        raise ConfigError(
            f"the file-descriptor limit is {soft} (hard {hard}), below the {needed} that server_max_connections="
            f"{limits.max_connections} needs (+{FD_RESERVE} for the rest): raise LimitNOFILE / ulimit -n, or"
            " lower server_max_connections"
        )
    return int(soft)


def hello_reply(identity: NodeIdentity, value_type: ValueType) -> HelloReply:
    """This node's identity as a Hello reply: no model yet is round 0, density 0.0 and ``has_model`` false; no
    tier is ``""`` (what ``client.hello`` maps back to None)."""
    return HelloReply(
        protocol_version=identity.protocol_version,
        node_id=identity.node_id,
        fleet_id=identity.fleet_id,
        arch_id=identity.arch_id,
        round=0 if identity.round is None else identity.round,
        density=0.0 if identity.round is None or identity.density is None else identity.density,
        capacity_tier=identity.tier or "",
        has_model=identity.round is not None,
        value_type=value_type_to_proto(value_type),
    )


class PeerServer:
    """The ``edge_node.v1.Peer`` servicer: admits a call (``guard``), checks its request, answers from ``store``."""

    def __init__(
        self,
        spec: ModelSpec,
        *,
        node_id: str,
        fleet_id: str,
        tier: str = "",
        value_type: ValueType = ValueType.FLOAT32,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        keep_snapshots: int = 2,
    ) -> None:
        self.store = SnapshotStore(
            spec, node_id=node_id, fleet_id=fleet_id, tier=tier, value_type=value_type,
            max_message_bytes=max_message_bytes, keep_snapshots=keep_snapshots,
        )  # fmt: skip
        self.guard = AdmissionGuard()  # its limits: rpc_handler's (create_server passes its own)
        self._lock = threading.Lock()
        self._served_bytes = 0  # model stream bytes handed to gRPC, all callers
        self._served_streams = 0  # GetModel streams answered (complete or not)
        self._unfinished = 0  # of them, ended before their last message was handed to grpc
        # What ListPeers answers: the peers this node reached lately (set by the node when peer exchange runs;
        # None: an empty list). Called on the server's event loop: it must not block.
        self.reached: Callable[[], list[PeerEntry]] | None = None
        # Each host's ListPeers budget (the hosts of ``host_rate.host_key``, the least recently seen forgotten first).
        self._pex_asked = HostRates(1 / PEX_HOST_INTERVAL_S, PEX_HOST_BURST, PEX_HOSTS_REMEMBERED)

    # -- what the node publishes (the store) -------------------------------------------------------
    @property
    def spec(self) -> ModelSpec:
        return self.store.spec

    @property
    def node_id(self) -> str:
        return self.store.node_id

    @property
    def fleet_id(self) -> str:
        return self.store.fleet_id

    @property
    def value_type(self) -> ValueType:
        return self.store.value_type

    @property
    def published_round(self) -> int | None:
        """Round of the latest snapshot, None before the first publish."""
        return self.store.published_round

    @property
    def published_rounds(self) -> tuple[int, ...]:
        """Rounds of the snapshots kept (served on request), oldest first."""
        return self.store.published_rounds

    def publish(self, snapshot: ModelSnapshot) -> int:
        """Encode ``snapshot`` once and serve it from now on (``SnapshotStore.publish``); its bytes on the wire."""
        return self.store.publish(snapshot)

    def publish_messages(self, messages: Sequence[ProtoModelChunk | bytes], *, round: int, density: float) -> None:
        """Serve ``messages`` verbatim as the model stream of ``round``, unchecked (``SnapshotStore``)."""
        self.store.publish_messages(messages, round=round, density=density)

    # -- what the calls did (the guard and the streams sent) ---------------------------------------
    def refusals(self) -> dict[str, int]:
        """Calls refused so far, by kind (``REFUSAL_KINDS``); a copy, safe to read from any thread."""
        return self.guard.refusals()

    def open_calls(self) -> dict[str, int]:
        """Open calls per host address (a copy): what each host holds of the server right now."""
        return self.guard.open_calls()

    def connections_cut(self, host: str, n: int) -> None:
        """Count (``host-connections``) and log connections of ``host`` shut down beyond its cap."""
        self.guard.connections_cut(host, n)

    def served(self) -> tuple[int, int]:
        """(streams answered, model bytes handed to gRPC) so far: the node's bytes out."""
        with self._lock:
            return self._served_streams, self._served_bytes

    def unfinished_streams(self) -> int:
        """GetModel streams that ended before their last message was handed to grpc (any cause)."""
        with self._lock:
            return self._unfinished

    # -- the calls ---------------------------------------------------------------------------------
    async def _admit(self, context: grpc.aio.ServicerContext) -> str:
        """The call's host, once within its rate and caps; else the refusal (a rate refusal held back first).

        Every method counts against the host's rate: a GetModel refused before its stream (not ready,
        another fleet) is as cheap to send as a Hello, and an honest node pulls once a round.
        """
        over = self.guard.over_rate(context)
        if over is not None:
            refusal, held = over
            if held is not None:
                try:  # the flooder's next call waits for this answer; the coroutine costs no thread
                    await asyncio.sleep(self.guard.limits.host_rate_hold_s)
                finally:
                    self.guard.unhold(held)
            await _abort(context, refusal)
        try:
            return self.guard.admit(context)
        except Refusal as refusal:
            await _abort(context, refusal)

    async def _hello_call(self, _requests: object, context: grpc.aio.ServicerContext) -> HelloReply:
        host = await self._admit(context)
        try:
            request: HelloRequest = await self.guard.request(context, "Hello")
            self.guard.caller(context, request.node_id, required=False)
            return hello_reply(self.store.identity, self.value_type)
        except Refusal as refusal:
            await _abort(context, refusal)
        finally:
            self.guard.leave(host)

    async def _list_peers_call(self, _requests: object, context: grpc.aio.ServicerContext) -> ListPeersReply:
        host = await self._admit(context)
        try:
            request: ListPeersRequest = await self.guard.request(context, "ListPeers")
            return self._list_peers(request, context)
        except Refusal as refusal:
            await _abort(context, refusal)
        finally:
            self.guard.leave(host)

    def _list_peers(self, request: ListPeersRequest, context: grpc.ServicerContext) -> ListPeersReply:
        """The reached peers for a caller of this fleet, at most ``MAX_PEER_ENTRIES``, once per host per interval."""
        refuse = self.guard.refuse
        try:
            compatible = NodeIdentity(protocol_version=request.protocol_version).compatible()
        except ValueError as exc:
            refuse(context, "protocol", grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        if not compatible:
            reason = f"protocol version {request.protocol_version!r} is not compatible with {PROTOCOL_VERSION}"
            refuse(context, "protocol", grpc.StatusCode.FAILED_PRECONDITION, reason)
        if request.fleet_id != self.fleet_id:
            refuse(context, "fleet", grpc.StatusCode.FAILED_PRECONDITION,
                   f"caller's fleet {request.fleet_id[:256]!r} is not this node's fleet {self.fleet_id!r}")  # fmt: skip
        self.guard.caller(context, request.node_id, required=False)
        with self._lock:
            allowed = self._pex_asked.take(host_key(context.peer() or "unknown"), time.monotonic())
        if not allowed:
            refuse(context, "pex-rate", grpc.StatusCode.RESOURCE_EXHAUSTED,
                   f"ListPeers more often than once per {PEX_HOST_INTERVAL_S:g} s from this host")  # fmt: skip
        reached = self.reached() if self.reached is not None else []
        entries = [e for e in reached if e.node_id != request.node_id][:MAX_PEER_ENTRIES]
        return ListPeersReply(protocol_version=PROTOCOL_VERSION, peers=entries)

    async def _get_model_call(self, _requests: object, context: grpc.aio.ServicerContext) -> None:
        host = await self._admit(context)
        try:
            caller, messages = self._open_stream(await self.guard.request(context, "GetModel"), context)
            try:
                await self._send(messages, context)
            finally:
                self._close_stream(caller)
        except Refusal as refusal:
            await _abort(context, refusal)
        finally:
            self.guard.leave(host)

    async def _send(self, messages: tuple[bytes, ...], context: grpc.aio.ServicerContext) -> None:
        sent = 0
        try:
            for message in messages:
                # counted when handed to grpc: a reader that has the last message may cancel the call
                # before this write's await returns (pull_models does, not waiting for the trailers)
                sent += 1
                await context.write(message)
                with self._lock:
                    self._served_bytes += len(message)
        finally:
            if sent < len(messages):  # the reader left, was cancelled or cut at the connection's age
                with self._lock:
                    self._unfinished += 1

    def _open_stream(self, request: GetModelRequest, context: grpc.ServicerContext) -> tuple[str, tuple[bytes, ...]]:
        """Check a GetModel request and take one of its caller's stream slots (its stream in its version)."""
        refuse = self.guard.refuse
        try:
            _major, minor = parse_protocol_version(request.protocol_version)
            compatible = NodeIdentity(protocol_version=request.protocol_version).compatible()
        except ValueError as exc:
            refuse(context, "protocol", grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        if not compatible:
            refuse(
                context,
                "protocol",
                grpc.StatusCode.FAILED_PRECONDITION,
                f"protocol version {request.protocol_version!r} is not compatible with this node's {PROTOCOL_VERSION}",
            )
        if request.fleet_id != self.fleet_id:
            refuse(
                context,
                "fleet",
                grpc.StatusCode.FAILED_PRECONDITION,
                f"caller's fleet {request.fleet_id[:256]!r} is not this node's fleet {self.fleet_id!r}",
            )
        if request.arch_id != self.spec.arch_id:
            refuse(
                context,
                "arch",
                grpc.StatusCode.FAILED_PRECONDITION,
                f"caller's architecture {request.arch_id[:256]!r} is not this node's {self.spec.arch_id!r}",
            )
        try:
            caller_mode = parse_tier_mode(request.tier_mode)
        except ValueError as exc:
            refuse(context, "bad-request", grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        if caller_mode != self.spec.tier_mode:  # the shapes of one mode are no use to a node of another (1.5)
            refuse(context, "tier-mode", grpc.StatusCode.FAILED_PRECONDITION, f"caller's tier mode {caller_mode} is "
                   f"not this node's {self.spec.tier_mode}: a fleet runs one tier mode")  # fmt: skip
        caller = self.guard.caller(context, request.node_id, required=True)
        wanted = request.round if request.HasField("round") else None
        try:
            published = self.store.select(None if wanted is None else check_round(wanted))
        except ValueError as exc:
            refuse(context, "bad-request", grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except NotPublished as exc:
            refuse(context, "not-ready", grpc.StatusCode.NOT_FOUND, str(exc))
        except NoLongerKept as exc:
            refuse(context, "gone", grpc.StatusCode.OUT_OF_RANGE, str(exc))
        self.guard.open_stream(context, caller)
        _LOGGER.debug("serving round %s to %s (%s)", published.round, request.node_id, context.peer())
        return caller, published.for_minor(minor, request.buffers)

    def _close_stream(self, caller: str) -> None:
        with self._lock:
            self._served_streams += 1
        self.guard.close_stream(caller)

    def rpc_handler(self, limits: ServerLimits | None = None) -> grpc.GenericRpcHandler:
        """The ``edge_node.v1.Peer`` service for a ``grpc.aio`` server; GetModel sends the cached messages.

        Both methods are request-streaming on this side (see the module docstring); ``limits`` apply
        to the calls of this handler.
        """
        self.guard.limits = limits or ServerLimits()
        identity: Callable[[bytes], bytes] = bytes
        return grpc.method_handlers_generic_handler(
            PEER_SERVICE_NAME,
            {
                "Hello": grpc.stream_unary_rpc_method_handler(
                    self._hello_call,
                    request_deserializer=HelloRequest.FromString,
                    response_serializer=HelloReply.SerializeToString,
                ),
                "ListPeers": grpc.stream_unary_rpc_method_handler(
                    self._list_peers_call,
                    request_deserializer=ListPeersRequest.FromString,
                    response_serializer=ListPeersReply.SerializeToString,
                ),
                "GetModel": grpc.stream_stream_rpc_method_handler(
                    self._get_model_call, request_deserializer=GetModelRequest.FromString, response_serializer=identity
                ),
            },
        )


_T = TypeVar("_T")


class _Server(grpc.Server):
    """A ``grpc.aio`` server on its own event-loop thread, behind the blocking ``grpc.Server`` methods."""

    def __init__(self, limits: ServerLimits, peer: PeerServer) -> None:
        self._loop = asyncio.new_event_loop()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="edge-node-grpc", daemon=True)
        self._thread.start()
        self._inner: grpc.aio.Server = self._call(self._build(limits, peer))
        self._limits, self._peer = limits, peer
        self._guard: ConnectionGuard | None = None

    def guard(self, port: int) -> None:
        """Cap every host's connections to ``port`` (started with the server)."""
        limits = self._limits
        self._guard = ConnectionGuard(
            port, limits.max_connections_per_host, self._peer.connections_cut, period_s=limits.connection_guard_period_s
        )

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_forever()
        finally:
            self._loop.close()
            self._stopped.set()

    @staticmethod
    async def _build(limits: ServerLimits, peer: PeerServer) -> grpc.aio.Server:
        return grpc.aio.server(
            handlers=[peer.rpc_handler(limits)],
            options=server_options(limits),
            maximum_concurrent_rpcs=2 * limits.max_concurrent_rpcs,  # a net below ours, which counts refusals
        )

    def _call(self, coro: Coroutine[Any, Any, _T]) -> _T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    async def _sync(self, fn: Callable[..., _T], *args: Any) -> _T:
        return fn(*args)

    def add_generic_rpc_handlers(self, generic_rpc_handlers: Iterable[grpc.GenericRpcHandler]) -> None:
        self._call(self._sync(self._inner.add_generic_rpc_handlers, generic_rpc_handlers))

    def add_registered_method_handlers(
        self, service_name: str, method_handlers: dict[str, grpc.RpcMethodHandler]
    ) -> None:
        self._call(self._sync(self._inner.add_registered_method_handlers, service_name, method_handlers))

    def add_insecure_port(self, address: str) -> int:
        return self._call(self._sync(self._inner.add_insecure_port, address))

    def add_secure_port(self, address: str, server_credentials: grpc.ServerCredentials) -> int:
        return self._call(self._sync(self._inner.add_secure_port, address, server_credentials))

    def start(self) -> None:
        self._call(self._inner.start())
        if self._guard is not None:
            self._guard.start()

    def stop(self, grace: float | None) -> threading.Event:
        """Stop serving (calls in flight get ``grace`` seconds), then end the loop thread; set when done."""
        if self._guard is not None:
            self._guard.stop()
        if not self._stopped.is_set() and self._loop.is_running():
            done = asyncio.run_coroutine_threadsafe(self._inner.stop(grace), self._loop)
            done.add_done_callback(lambda _: self._loop.call_soon_threadsafe(self._loop.stop))
        return self._stopped

    def wait_for_termination(self, timeout: float | None = None) -> bool:
        return not self._stopped.wait(timeout)


async def _abort(context: grpc.aio.ServicerContext, refusal: Refusal) -> NoReturn:
    """End the call with the refusal's code: ``context.abort`` always raises (grpc ships no types to say so)."""
    await context.abort(refusal.code, refusal.reason)
    raise AssertionError("grpc.aio.ServicerContext.abort returned")  # unreachable


def server_options(limits: ServerLimits) -> list[tuple[str, int]]:
    return [
        ("grpc.max_receive_message_length", limits.max_request_bytes),
        ("grpc.so_reuseport", 0),  # a port in use is an error, not a silently shared port
        ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", MIN_CLIENT_PING_INTERVAL_MS),
        ("grpc.http2.max_ping_strikes", 3),
        ("grpc.max_concurrent_streams", limits.max_streams_per_connection),
        ("grpc.max_allowed_incoming_connections", limits.max_connections),
        ("grpc.server_handshake_timeout_ms", int(limits.handshake_timeout_s * 1000)),
        ("grpc.max_connection_idle_ms", int(limits.connection_idle_s * 1000)),
        ("grpc.max_connection_age_ms", int(limits.max_connection_age_s * 1000)),
        ("grpc.max_connection_age_grace_ms", int(limits.connection_age_grace_s * 1000)),
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
    server = _Server(limits, peer)
    try:
        if tls is None:
            warn_insecure("server")
            port = server.add_insecure_port(address)
        else:
            port = server.add_secure_port(address, tls.server_credentials())
    except RuntimeError as exc:  # grpc raises RuntimeError("Failed to bind to address ...")
        server.stop(None).wait(5)
        raise ListenError(f"cannot listen on {address!r}: {exc}") from exc
    if port == 0:
        server.stop(None).wait(5)
        raise ListenError(f"cannot listen on {address!r}")
    server.guard(port)
    return server, port
