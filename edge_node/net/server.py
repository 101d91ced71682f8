"""The peer gRPC server: answers ``Peer.Hello`` and streams published snapshots.

``PeerServer`` holds what the node publishes (thread-safe; each snapshot is encoded and serialized
once and the same bytes go to every caller), the last ``keep_snapshots`` of them so that a lock-step
peer can pull exactly round ``r``; ``create_server`` builds a gRPC server around it and returns it
unstarted with its port, so the caller decides when to ``start()`` and ``stop()``.

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
connection). Connections refused by grpc core at ``max_connections`` are not counted (grpc gives
Python no hook there). A model stream whose reader stops reading is held by flow control
(cancelling the write does not end the call in grpc.aio): the connection's age ends it, so it holds
its slot for at most ``1.1 * max_connection_age_s + connection_age_grace_s``; streams that ended
before their last message are counted (``unfinished_streams``).
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import math
import resource
import threading
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn, TypeVar

import grpc
import torch

from edge_node.algorithm.heterogeneous import parse_tier
from edge_node.errors import ConfigError, ListenError
from edge_node.net.conn_guard import ConnectionGuard
from edge_node.net.tls import TlsConfig, warn_insecure
from edge_node.protocol import MAX_ROUND, check_fleet_id, check_node_id
from edge_node.wire import (
    DEFAULT_MAX_MESSAGE_BYTES,
    PROTOCOL_MAJOR,
    PROTOCOL_VERSION,
    ModelSpec,
    ValueType,
    encode_model,
    parse_protocol_version,
)
from edge_node.wire.codec import header_for_version, without_buffers
from edge_node.wire.messages import (
    PEER_SERVICE_NAME,
    GetModelRequest,
    HelloReply,
    HelloRequest,
    ProtoModelChunk,
    value_type_to_proto,
)
from edge_node.wire.spec import BUFFERS_SINCE, DIGEST_XXH3_SINCE, MIN_MAX_MESSAGE_BYTES

LEGACY_DIGEST_VERSION = "1.1"  # callers before 1.2 get a header of this version, with its SHA-256

_LOGGER = logging.getLogger(__name__)

KEEPALIVE_TIME_MS = 60_000  # server pings an idle client connection every minute
KEEPALIVE_TIMEOUT_MS = 20_000  # and drops it when the ping is unanswered for 20 s
# Clients may ping this often: 5 s after a call last received data or a ping answer; a little less, so that
# timer skew is no strike.
MIN_CLIENT_PING_INTERVAL_MS = 4_000


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
    # BatchNorm running statistics (protocol 1.3, ``norm_stats average``: the server's spec lists them), sent to
    # the callers that ask for them; {} for any other node, or one that has not trained yet.
    buffers: Mapping[str, torch.Tensor] = field(default_factory=dict)


FD_RESERVE = 256  # descriptors besides the server's connections: files, mDNS, pulls, torch, the status socket


@dataclass(frozen=True)
class ServerLimits:
    """Size, time and share limits of the server: what one host, and all together, may hold."""

    max_request_bytes: int = 64 << 10  # requests are a few ids; anything larger is refused
    max_concurrent_rpcs: int = 64  # open calls, all hosts together; beyond: RESOURCE_EXHAUSTED at once
    # Open calls of one host address (any method, counted from its headers, before its request): a
    # host cannot hold more than this share of max_concurrent_rpcs, whatever it sends or withholds.
    max_calls_per_host: int = 8
    # GetModel streams one caller may have open at once. A caller is its certificate's name with TLS,
    # else its host address (a claimed node id costs nothing to vary, so it cannot widen the cap).
    max_streams_per_caller: int = 2
    request_timeout_s: float = 2.0  # a call's request message must arrive within this (seconds)
    max_connections: int = 512  # TCP connections at once, all hosts (grpc core closes more at accept)
    # TCP connections one host address may hold: beyond it the newest are shut down within
    # connection_guard_period_s (``conn_guard``), so one host cannot fill max_connections.
    max_connections_per_host: int = 32
    connection_guard_period_s: float = 0.2
    max_streams_per_connection: int = 8  # HTTP/2 streams one connection may open at once
    handshake_timeout_s: float = 5.0  # a new connection's TLS/HTTP/2 setup must finish within this
    connection_idle_s: float = 30.0  # a connection without a call for this long is closed
    # Every connection ends in bounded time, whatever its calls do (grpc core enforces both): at
    # max_connection_age_s (+-10 % jitter) the server sends GOAWAY (new calls go to a new connection),
    # and connection_age_grace_s later it closes the connection, ending every stream still on it.
    # This is the time bound on a model stream whose reader stops reading (flow control holds the
    # write; nothing in Python can end such a call). A pull must finish within age + grace.
    max_connection_age_s: float = 60.0
    connection_age_grace_s: float = 60.0

    def __post_init__(self) -> None:
        integers = (
            "max_request_bytes", "max_concurrent_rpcs", "max_calls_per_host", "max_streams_per_caller",
            "max_connections", "max_streams_per_connection", "max_connections_per_host",
        )  # fmt: skip
        for name in integers:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r} must be a positive integer")
        seconds = (
            "request_timeout_s", "handshake_timeout_s", "connection_idle_s", "max_connection_age_s",
            "connection_age_grace_s", "connection_guard_period_s",
        )  # fmt: skip
        for name in seconds:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 86400:
                raise ValueError(f"{name}={value!r} must be a number of seconds in (0, 86400]")


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


@dataclass(frozen=True)
class _Published:
    round: int
    density: float
    tier: str
    messages: tuple[bytes, ...]  # serialized ModelChunk messages, header first
    versioned: bool = False  # encode_model's stream: callers before 1.2 get their header (else: verbatim)
    buffered: bool = False  # the stream ends with running statistics (1.3): only for callers that ask

    @property
    def wire_bytes(self) -> int:
        return sum(len(m) for m in self.messages)

    @functools.cached_property
    def plain(self) -> tuple[bytes, ...]:
        """The stream without its buffers (for a caller that did not ask for them, or of 1.2), made on the
        first such call: a fleet under ``norm_stats average`` asks for them."""
        if not self.buffered:
            return self.messages
        stripped = without_buffers([ProtoModelChunk.FromString(m) for m in self.messages])
        return tuple(m.SerializeToString() for m in stripped)

    @functools.cached_property
    def legacy_header(self) -> bytes:
        """The header for callers before 1.2 (a SHA-256 digest): made on the first such call, since
        hashing a ResNet18 stream takes about 11 ms and most fleets never need it."""
        parsed = [ProtoModelChunk.FromString(m) for m in self.plain]
        return header_for_version(parsed, LEGACY_DIGEST_VERSION).SerializeToString()

    def for_minor(self, minor: int, buffers: bool = False) -> tuple[bytes, ...]:
        """The stream in the caller's version (``PROTOCOL_MAJOR``, ``minor``); with its buffers when the caller
        asked for them (``buffers``, 1.3 on) and the stream has any."""
        if not self.versioned:
            return self.messages
        if buffers and (PROTOCOL_MAJOR, minor) >= BUFFERS_SINCE:
            return self.messages
        if (PROTOCOL_MAJOR, minor) >= DIGEST_XXH3_SINCE:
            return self.plain
        return (self.legacy_header, *self.plain[1:])


REFUSAL_KINDS = (
    "bad-request", "protocol", "fleet", "arch", "identity", "not-ready", "gone", "busy",
    "host-busy", "server-busy", "slow-request", "host-connections",
)  # fmt: skip
_LOG_EVERY_S = 10.0  # a refusal kind is logged once per host per this long
_QUIET_KINDS = ("not-ready", "busy")  # expected in lock-step fleets: logged at INFO, the rest at WARNING


class _Refusal(Exception):
    """A call to end with ``code`` and ``reason`` (raised by the checks, sent by the call's coroutine)."""

    def __init__(self, code: grpc.StatusCode, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


def _check_tier(tier: str) -> str:
    """Empty (not measured) or a known tier name/density (``heterogeneous.parse_tier``); ValueError otherwise."""
    if tier != "":
        parse_tier(tier)  # raises ConfigError (a ValueError) for anything else
    return tier


def _tls_names(context: grpc.ServicerContext) -> list[str] | None:
    """The DNS names of the caller's certificate when the call came over TLS, else None."""
    auth = context.auth_context() or {}
    if b"ssl" not in auth.get("transport_security_type", []):
        return None
    return [n.decode("utf-8", "replace") for n in auth.get("x509_subject_alternative_name", [])]


def _caller_host(context: grpc.ServicerContext) -> str:
    """``ipv4:10.0.0.2:51234`` -> ``ipv4:10.0.0.2`` (the port changes with every connection)."""
    peer = context.peer() or "unknown"
    host, sep, _port = peer.rpartition(":")
    return host if sep else peer


class PeerServer:
    """The servicer state: identity and the last published snapshots, served as pre-serialized messages."""

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
        check_node_id(node_id)
        check_fleet_id(fleet_id, "fleet_id")
        if isinstance(max_message_bytes, bool) or not isinstance(max_message_bytes, int):
            raise TypeError(f"max_message_bytes={max_message_bytes!r} must be an integer")
        if max_message_bytes < MIN_MAX_MESSAGE_BYTES:
            raise ValueError(f"max_message_bytes={max_message_bytes} must be at least {MIN_MAX_MESSAGE_BYTES}")
        if isinstance(keep_snapshots, bool) or not isinstance(keep_snapshots, int) or keep_snapshots < 1:
            raise ValueError(f"keep_snapshots={keep_snapshots!r} must be a positive integer")
        self.spec = spec
        self.node_id = node_id
        self.fleet_id = fleet_id
        self.value_type = ValueType.parse(value_type)
        self.max_message_bytes = max_message_bytes
        self.keep_snapshots = keep_snapshots
        self._tier = _check_tier(tier)
        self._lock = threading.Lock()
        self._snapshots: collections.deque[_Published] = collections.deque()  # oldest first, rounds increasing
        self._streams: collections.Counter[str] = collections.Counter()  # open GetModel streams per caller
        self._calls: collections.Counter[str] = collections.Counter()  # open calls per host address
        self._open_calls = 0  # open calls, all hosts
        self._logged: dict[tuple[str, str], float] = {}  # (refusal kind, host) -> when last logged
        self._refusals: collections.Counter[str] = collections.Counter()
        self._served_bytes = 0  # model stream bytes handed to gRPC, all callers
        self._served_streams = 0  # GetModel streams answered (complete or not)
        self._unfinished = 0  # of them, ended before their last message was handed to grpc
        self._limits = ServerLimits()  # set by rpc_handler (create_server passes its limits)

    @property
    def published_round(self) -> int | None:
        """Round of the latest snapshot, None before the first publish."""
        with self._lock:
            return self._snapshots[-1].round if self._snapshots else None

    @property
    def published_rounds(self) -> tuple[int, ...]:
        """Rounds of the snapshots kept (served on request), oldest first."""
        with self._lock:
            return tuple(p.round for p in self._snapshots)

    def served(self) -> tuple[int, int]:
        """(streams answered, model bytes handed to gRPC) so far: the node's bytes out."""
        with self._lock:
            return self._served_streams, self._served_bytes

    def refusals(self) -> dict[str, int]:
        """Calls refused so far, by kind (``REFUSAL_KINDS``); a copy, safe to read from any thread."""
        with self._lock:
            return dict(self._refusals)

    def publish(self, snapshot: ModelSnapshot) -> int:
        """Encode ``snapshot`` once and serve it from now on; returns its bytes on the wire.

        The snapshot's tensors are read here and never again: the caller may train on after return.
        Its ``density`` must be the fraction of weights its masks keep (within ERK's rounding,
        ``spec.density_tolerance``), as receivers check. Publishing a round at or below a kept one
        drops the kept snapshots from that round on (a node that resumed from an older checkpoint).
        """
        if (snapshot.node_id, snapshot.fleet_id, snapshot.arch_id) != (self.node_id, self.fleet_id, self.spec.arch_id):
            raise ValueError(
                f"snapshot of node {snapshot.node_id!r}, fleet {snapshot.fleet_id!r}, arch {snapshot.arch_id!r}"
                f" does not match this server's {self.node_id!r}, {self.fleet_id!r}, {self.spec.arch_id!r}"
            )
        tier = _check_tier(snapshot.tier) or self._tier
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
            buffers=snapshot.buffers if self.spec.buffers else None,
        )
        raw = tuple(m.SerializeToString() for m in messages)
        buffered = bool(self.spec.buffers and snapshot.buffers)
        published = _Published(snapshot.round, snapshot.density, tier, raw, versioned=True, buffered=buffered)
        self._keep(published)
        _LOGGER.info(
            "published round %s (density %.3f): %d messages, %d bytes",
            snapshot.round, snapshot.density, len(published.messages), published.wire_bytes,
        )  # fmt: skip
        return published.wire_bytes

    def publish_messages(self, messages: Sequence[ProtoModelChunk | bytes], *, round: int, density: float) -> None:
        """Serve ``messages`` verbatim as the model stream of ``round``, unchecked.

        For relaying an already-encoded stream and for fault injection (tests, a loopback node that
        sends garbage): receivers must refuse whatever is wrong with it.
        """
        raw = tuple(m if isinstance(m, bytes) else m.SerializeToString() for m in messages)
        self._keep(_Published(round, density, self._tier, raw))

    def _keep(self, published: _Published) -> None:
        with self._lock:
            while self._snapshots and self._snapshots[-1].round >= published.round:
                self._snapshots.pop()
            self._snapshots.append(published)
            while len(self._snapshots) > self.keep_snapshots:
                self._snapshots.popleft()
            self._tier = published.tier

    def _refuse(self, context: grpc.ServicerContext, kind: str, code: grpc.StatusCode, reason: str) -> NoReturn:
        """Count and log a refusal, then raise it for the call's coroutine to send."""
        self._note(kind, _caller_host(context), context.peer(), reason)
        raise _Refusal(code, reason)

    def _note(self, kind: str, host: str, who: str, reason: str, n: int = 1) -> None:
        """Count ``n`` refusals of ``kind`` and log one line per (kind, host) per ``_LOG_EVERY_S``."""
        now = time.monotonic()
        with self._lock:  # one line per (kind, host) per _LOG_EVERY_S: a flood of calls is not a flood of logs
            self._refusals[kind] += n
            last = self._logged.get((kind, host))
            quiet = last is not None and now - last < _LOG_EVERY_S
            if not quiet:
                if len(self._logged) >= 1024:
                    self._logged.clear()
                self._logged[(kind, host)] = now
        if not quiet:
            log = _LOGGER.info if kind in _QUIET_KINDS else _LOGGER.warning
            log("refused %s call from %s: %s (more from this host within %g s: counted only)", kind, who,
                reason, _LOG_EVERY_S)  # fmt: skip

    def connections_cut(self, host: str, n: int) -> None:
        """Count (``host-connections``) and log connections of ``host`` shut down beyond its cap."""
        reason = f"{n} connection(s) beyond the host's cap of {self._limits.max_connections_per_host} shut down"
        self._note("host-connections", host, host, reason, n)

    def _admit(self, context: grpc.ServicerContext) -> str:
        """Count a new call against its host and the server (before its request); refuse beyond the caps."""
        host = _caller_host(context)
        limits = self._limits
        with self._lock:
            host_full = self._calls[host] >= limits.max_calls_per_host
            server_full = self._open_calls >= limits.max_concurrent_rpcs
            if not (host_full or server_full):
                self._calls[host] += 1
                self._open_calls += 1
        if host_full:
            reason = f"host {host!r} already has {limits.max_calls_per_host} calls open (the limit)"
            self._refuse(context, "host-busy", grpc.StatusCode.RESOURCE_EXHAUSTED, reason)
        if server_full:
            reason = f"the server has {limits.max_concurrent_rpcs} calls open (the limit)"
            self._refuse(context, "server-busy", grpc.StatusCode.RESOURCE_EXHAUSTED, reason)
        return host

    def _leave(self, host: str) -> None:
        with self._lock:
            self._open_calls -= 1
            self._calls[host] -= 1
            if self._calls[host] <= 0:
                del self._calls[host]

    def open_calls(self) -> dict[str, int]:
        """Open calls per host address (a copy): what each host holds of the server right now."""
        with self._lock:
            return dict(self._calls)

    async def _request(self, context: grpc.aio.ServicerContext, method: str) -> Any:
        """The call's one request message, if it arrives within ``request_timeout_s``; refusal otherwise."""
        timeout_s = self._limits.request_timeout_s
        try:
            request = await asyncio.wait_for(context.read(), timeout_s)
        except asyncio.TimeoutError:
            reason = f"{method}: no request message within {timeout_s:g} s"
            self._refuse(context, "slow-request", grpc.StatusCode.DEADLINE_EXCEEDED, reason)
        if request is grpc.aio.EOF:
            self._refuse(context, "bad-request", grpc.StatusCode.INVALID_ARGUMENT, f"{method}: no request message")
        return request

    async def _hello_call(self, _requests: object, context: grpc.aio.ServicerContext) -> HelloReply:
        try:
            host = self._admit(context)
        except _Refusal as refusal:
            await _abort(context, refusal)
        try:
            return self._hello(await self._request(context, "Hello"), context)
        except _Refusal as refusal:
            await _abort(context, refusal)
        finally:
            self._leave(host)

    async def _get_model_call(self, _requests: object, context: grpc.aio.ServicerContext) -> None:
        try:
            host = self._admit(context)
        except _Refusal as refusal:
            await _abort(context, refusal)
        try:
            caller, messages = self._open_stream(await self._request(context, "GetModel"), context)
            try:
                await self._send(messages, context)
            finally:
                self._close_stream(caller)
        except _Refusal as refusal:
            await _abort(context, refusal)
        finally:
            self._leave(host)

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

    def unfinished_streams(self) -> int:
        """GetModel streams that ended before their last message was handed to grpc (any cause)."""
        with self._lock:
            return self._unfinished

    def _check_caller(self, context: grpc.ServicerContext, claimed: str, *, required: bool) -> str:
        """The caller's name: with TLS the one its certificate and request agree on, else its host address.

        In plaintext the claimed node id is not part of it: one host varying its claim would otherwise
        get ``max_streams_per_caller`` streams per claimed id.
        """
        names = _tls_names(context)
        if names is None:
            return _caller_host(context)
        if claimed in names or (not required and claimed == ""):
            return names[0] if names else claimed
        self._refuse(
            context,
            "identity",
            grpc.StatusCode.PERMISSION_DENIED,
            f"caller's node id {claimed[:64]!r} is not the name of its certificate {names[:4]}",
        )

    def _hello(self, request: HelloRequest, context: grpc.ServicerContext) -> HelloReply:
        self._check_caller(context, request.node_id, required=False)
        with self._lock:
            latest = self._snapshots[-1] if self._snapshots else None
            tier = self._tier
        return HelloReply(
            protocol_version=PROTOCOL_VERSION,
            node_id=self.node_id,
            fleet_id=self.fleet_id,
            arch_id=self.spec.arch_id,
            round=0 if latest is None else latest.round,
            density=0.0 if latest is None or not math.isfinite(latest.density) else latest.density,
            capacity_tier=tier,
            has_model=latest is not None,
            value_type=value_type_to_proto(self.value_type),
        )

    def _select(self, request: GetModelRequest, context: grpc.ServicerContext) -> _Published:
        """The snapshot asked for (the latest when no round is given), or the refusal to send."""
        wanted = request.round if request.HasField("round") else None
        if wanted is not None and wanted > MAX_ROUND:
            reason = f"round {wanted} is beyond {MAX_ROUND}"
            self._refuse(context, "bad-request", grpc.StatusCode.INVALID_ARGUMENT, reason)
        with self._lock:
            kept = list(self._snapshots)
        if not kept:
            what = "no model" if wanted is None else f"round {wanted} not"
            self._refuse(context, "not-ready", grpc.StatusCode.NOT_FOUND, f"{what} published yet (latest none)")
        if wanted is None:
            return kept[-1]
        if wanted > kept[-1].round:
            self._refuse(
                context,
                "not-ready",
                grpc.StatusCode.NOT_FOUND,
                f"round {wanted} not published yet (latest {kept[-1].round})",
            )
        for published in kept:
            if published.round == wanted:
                return published
        self._refuse(
            context,
            "gone",
            grpc.StatusCode.OUT_OF_RANGE,
            f"round {wanted} is no longer kept (kept rounds: {', '.join(str(p.round) for p in kept)})",
        )

    def _open_stream(self, request: GetModelRequest, context: grpc.ServicerContext) -> tuple[str, tuple[bytes, ...]]:
        """Check a GetModel request and take one of its caller's stream slots (its stream in its version)."""
        try:
            major, minor = parse_protocol_version(request.protocol_version)
        except ValueError as exc:
            self._refuse(context, "protocol", grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        if major != PROTOCOL_MAJOR:
            self._refuse(
                context,
                "protocol",
                grpc.StatusCode.FAILED_PRECONDITION,
                f"protocol version {request.protocol_version!r} is not compatible with this node's {PROTOCOL_VERSION}",
            )
        if request.fleet_id != self.fleet_id:
            self._refuse(
                context,
                "fleet",
                grpc.StatusCode.FAILED_PRECONDITION,
                f"caller's fleet {request.fleet_id[:256]!r} is not this node's fleet {self.fleet_id!r}",
            )
        if request.arch_id != self.spec.arch_id:
            self._refuse(
                context,
                "arch",
                grpc.StatusCode.FAILED_PRECONDITION,
                f"caller's architecture {request.arch_id[:256]!r} is not this node's {self.spec.arch_id!r}",
            )
        caller = self._check_caller(context, request.node_id, required=True)
        published = self._select(request, context)
        with self._lock:
            busy = self._streams[caller] >= self._limits.max_streams_per_caller
            if not busy:
                self._streams[caller] += 1
        if busy:
            self._refuse(
                context,
                "busy",
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"caller {caller!r} already has {self._limits.max_streams_per_caller} model streams open (the limit)",
            )
        _LOGGER.debug("serving round %s to %s (%s)", published.round, request.node_id, context.peer())
        return caller, published.for_minor(minor, request.buffers)

    def _close_stream(self, caller: str) -> None:
        with self._lock:
            self._served_streams += 1
            self._streams[caller] -= 1
            if self._streams[caller] <= 0:
                del self._streams[caller]

    def rpc_handler(self, limits: ServerLimits | None = None) -> grpc.GenericRpcHandler:
        """The ``edge_node.v1.Peer`` service for a ``grpc.aio`` server; GetModel sends the cached messages.

        Both methods are request-streaming on this side (see the module docstring); ``limits`` apply
        to the calls of this handler.
        """
        self._limits = limits or ServerLimits()
        identity: Callable[[bytes], bytes] = bytes
        return grpc.method_handlers_generic_handler(
            PEER_SERVICE_NAME,
            {
                "Hello": grpc.stream_unary_rpc_method_handler(
                    self._hello_call,
                    request_deserializer=HelloRequest.FromString,
                    response_serializer=HelloReply.SerializeToString,
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


async def _abort(context: grpc.aio.ServicerContext, refusal: _Refusal) -> NoReturn:
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
