"""The peer gRPC client: ``hello`` one peer, ``pull_model`` from one, ``pull_models`` from several.

Bounds, so that no peer can hold a node up:
- one overall deadline per pull covers its connection, TLS checks, retries and backoff, and
  ``pull_models`` has one deadline for the whole batch (then it abandons the stragglers, cancelling
  their calls, and returns what arrived); a ``cancel`` event abandons everything within ~0.1 s;
- a pull is complete when the messages its header announced have arrived: the call is cancelled
  then, so a peer that holds the stream open afterwards costs nothing;
- a stream is bounded by the receiver's own model (``WireLimits.for_spec``) and decoded by the
  strict ``ModelDecoder`` (the header must name the peer pulled, and the round asked for);
- only transient failures (UNAVAILABLE without a TLS cause, DEADLINE_EXCEEDED, a busy server) are
  retried, with jittered exponential backoff; refusals, TLS failures and bad streams are final. A
  round not published yet (NOT_FOUND) is waited for with short jittered polls until the deadline
  when a ``round`` was asked for: this is how a lock-step node waits for slower peers;
- a pull's channel is kept for the next pull from that peer (``channels.CHANNELS``: at most 16, idle
  ones closed after 5 minutes), unless the pull failed: then it is closed, and the next pull connects
  afresh. Pulls run on kept daemon threads (``PULLERS``).

Every failure has a kind (``FAILURE_KINDS``) for per-round counts, and a one-line reason.
"""

from __future__ import annotations

import functools
import logging
import math
import random
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field
from typing import NoReturn

import grpc
import grpc.experimental  # ChannelOptions: not imported by grpc itself
from google.protobuf.message import DecodeError

from edge_node.errors import (
    ConfigError,
    HeaderMismatch,
    PeerIdentityMismatch,
    PeerUnreachable,
    TierMismatch,
    TlsError,
    WireDecodeError,
    WireLimitError,
)
from edge_node.net.channels import CHANNELS
from edge_node.net.tls import CertificateMismatch, TlsConfig, verify_fingerprint, warn_insecure
from edge_node.protocol import MAX_PEER_ENTRIES, NodeIdentity, check_round, is_valid_node_id
from edge_node.threads import KeptThreads
from edge_node.wire import (
    PROTOCOL_VERSION,
    DecodedModel,
    ModelDecoder,
    ModelSpec,
    ValueType,
    WireLimits,
)
from edge_node.wire.messages import (
    GET_MODEL_METHOD,
    HELLO_METHOD,
    LIST_PEERS_METHOD,
    GetModelRequest,
    HelloReply,
    HelloRequest,
    ListPeersReply,
    ListPeersRequest,
    PeerEntry,
    unknown_field_numbers,
)

_LOGGER = logging.getLogger(__name__)

FAILURE_KINDS = (
    "unreachable",  # no connection, or it broke (after the retries)
    "timeout",  # the pull's (or the batch's) deadline ran out
    "tls",  # TLS handshake failed: wrong CA, wrong name, no client certificate accepted
    "refused",  # the peer answered with a refusal (FAILED_PRECONDITION, PERMISSION_DENIED, busy, ...)
    "not-ready",  # the round asked for (or any model) is not published yet
    "gone",  # the round asked for is no longer kept by the peer
    "decode",  # the stream is malformed
    "limit",  # the stream or a message is larger than the receiver's limits
    "header",  # the stream's header is invalid or for another fleet/architecture/version/round
    "identity",  # the peer is not who it was pulled as (header node id, certificate fingerprint)
    "tier",  # width tiers (1.5): a stream of another tier mode, or shapes that are not its tier's prefixes
    "cancelled",  # the caller cancelled
)
# A connection that stops delivering mid-stream is given up and the pull retried on a new one. Under heavy
# loss TCP doubles its retransmission timeout after each lost retransmission, so a connection can sit silent
# for 10-25 s while a new one would deliver at once (seen: 10 % loss at each end, a stream stalled until its
# 30 s deadline, RTO 13 s). A call that has received nothing for KEEPALIVE_TIME_MS pings the server, and any
# ping unanswered for PING_TIMEOUT_MS (gRPC also pings along a stream, for its flow-control window) ends the
# connection: the call fails UNAVAILABLE, a transient failure. The answer travels behind what the server has
# queued, so a slow link whose queue holds 10 s of data would be cut too: 10 s is far above a LAN's or a
# congested Wi-Fi's queue (tens to hundreds of ms), and a healthy slow stream keeps the keepalive quiet.
KEEPALIVE_TIME_MS = 5_000
PING_TIMEOUT_MS = 10_000
KEEPALIVE_TIMEOUT_MS = PING_TIMEOUT_MS
# A new connection's first socket reads take up to this much at once. gRPC starts at 8 KiB and grows its
# read size over many reads; a first pull from a peer is a new connection (and a peer's server closes one
# idle for 30 s), so a ResNet18 stream was read mostly in small pieces (one event-engine wake-up each).
# 4 MiB: pulls 2.4x the raw socket against 2.7x, three runs; a cnn pull unchanged. An open connection may
# keep one such buffer (at most ``channels.MAX_CHANNELS`` kept, and a peer closes idle ones).
READ_CHUNK_BYTES = 4 << 20
MAX_BACKOFF_S = 30.0  # cap of one wait between retries of a transient failure
NOT_READY_FIRST_WAIT_S = 0.05  # a round not published yet: first poll after this ...
NOT_READY_MAX_WAIT_S = 1.0  # ... growing 1.5x per poll up to this (each jittered down to half)
HELLO_MAX_REPLY_BYTES = 64 << 10  # a Hello reply is a few ids; anything larger is refused
# A ListPeers reply (1.4) of MAX_PEER_ENTRIES entries of the longest ids, IPv6 hosts and fingerprints is under
# 12 KiB; a larger reply is refused whole (``limit``), before it is parsed.
LIST_PEERS_MAX_REPLY_BYTES = 16 << 10
_POLL_S = 0.1  # pull_models checks its cancel event this often
_MAX_REASON_CHARS = 300  # of a peer's status details quoted in a reason

_TLS_DETAILS = re.compile(r"ssl|tls|handshake|certificate|x509|hostname verification", re.IGNORECASE)
_jitter = random.Random()  # backoff jitter only; never the algorithm's randomness
# The threads of every pull_models call: kept, since a pool made per call cost a loopback ResNet18 pull (about
# 16 ms) 0.3-0.5 ms more. Idle for a minute, one ends: a node keeps as many as it pulls at once.
PULLERS = KeptThreads("edge-node-pull", idle_s=60.0)


@dataclass(frozen=True)
class PeerAddress:
    """Where to reach a peer; ``node_id`` is also the name its TLS certificate must carry.

    ``host`` may be an IP address: with TLS the certificate is checked against ``node_id``, not the
    host. ``expected_fingerprint`` (``"sha256:<hex>"``, the ``fp`` the peer advertised over mDNS):
    when set and TLS is on, the certificate the peer presents must have it.
    """

    node_id: str
    host: str
    port: int
    expected_fingerprint: str | None = None

    def __post_init__(self) -> None:
        if not self.node_id or not self.host:
            raise ValueError(f"PeerAddress needs a node_id and a host, got {self.node_id!r}, {self.host!r}")
        if isinstance(self.port, bool) or not isinstance(self.port, int) or not 0 < self.port < 65536:
            raise ValueError(f"port={self.port!r} must be in 1..65535")

    @property
    def target(self) -> str:
        """gRPC target ``host:port`` (IPv6 literals bracketed)."""
        host = f"[{self.host}]" if ":" in self.host and not self.host.startswith("[") else self.host
        return f"{host}:{self.port}"


@dataclass(frozen=True)
class PeerHello:
    """A peer's answer to Hello, validated (see ``hello``): who it is, and how it sends values.

    ``identity.round`` and ``identity.density`` are None while the peer has published no model (the reply's
    ``has_model`` is false; it carries round 0 and density 0.0), ``identity.tier`` while it has not measured
    its tier (``""``).
    """

    identity: NodeIdentity
    value_type: ValueType

    @property
    def has_model(self) -> bool:
        """Whether the peer has published a model (a round to pull)."""
        return self.identity.round is not None


@dataclass(frozen=True)
class PullFailure:
    """Why a peer's model did not arrive: ``kind`` (one of ``FAILURE_KINDS``) and a one-line ``detail``."""

    kind: str
    detail: str
    wire_bytes: int = 0  # stream bytes received before the pull failed (all attempts)

    def __post_init__(self) -> None:
        if self.kind not in FAILURE_KINDS:
            raise ValueError(f"kind={self.kind!r} must be one of {FAILURE_KINDS}")

    def __str__(self) -> str:
        return f"{self.kind}: {self.detail}"


@dataclass(frozen=True)
class PullResult:
    """Models that arrived, by node id, and why not for every other peer."""

    received: dict[str, DecodedModel]
    failures: dict[str, PullFailure]
    # Calls retried after a transient failure, by that failure's kind, over all peers (polls for a round not
    # published yet are not retries): a lossy or overloaded link shows here even when every model arrived.
    retries: dict[str, int] = field(default_factory=dict)

    def failure_counts(self) -> dict[str, int]:
        """Failed peers by kind (for a round's log record)."""
        return dict(Counter(f.kind for f in self.failures.values()))


def channel_options(limits: WireLimits, peer: PeerAddress, tls: TlsConfig | None) -> list[tuple[str, int | str]]:
    options: list[tuple[str, int | str]] = [
        ("grpc.max_receive_message_length", limits.max_message_bytes),
        ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        ("grpc.http2.ping_timeout_ms", PING_TIMEOUT_MS),  # every ping's, not only the keepalive's
        ("grpc.keepalive_permit_without_calls", 0),
        ("grpc.http2.max_pings_without_data", 0),  # keep pinging through a long, quiet stream
        ("grpc.enable_retries", 0),  # retries are ours, bounded and logged
        ("grpc.experimental.tcp_read_chunk_size", READ_CHUNK_BYTES),
        # A stream's messages are read by the thread that iterates it, not handed over one by one from
        # gRPC's channel thread: one thread switch less a message. ResNet18 pulls 15.6-16.3 ms against
        # 17.0-18.0 ms, interleaved in one process, three runs. Cancelling from another thread still ends the
        # read (``_Stop`` relies on it).
        (grpc.experimental.ChannelOptions.SingleThreadedUnaryStream, 1),
    ]
    if tls is not None:
        options.append(("grpc.ssl_target_name_override", peer.node_id))  # verify the cert names this node
    return options


def _check_security(tls: TlsConfig | None, insecure: bool) -> None:
    if (tls is None) == (not insecure):
        if tls is None:
            raise ConfigError(
                "no TLS material given: pass tls=TlsConfig(...) or, explicitly, insecure=True (--insecure)"
            )
        raise ConfigError("tls and insecure=True are mutually exclusive")


def open_channel(
    peer: PeerAddress, *, tls: TlsConfig | None, insecure: bool, limits: WireLimits | None = None
) -> grpc.Channel:
    """A channel to ``peer``: mutual TLS with the fleet CA, or plaintext when ``insecure`` says so."""
    _check_security(tls, insecure)
    options = channel_options(limits or WireLimits(), peer, tls)
    if tls is None:
        warn_insecure("client")
        return grpc.insecure_channel(peer.target, options=options)
    return grpc.secure_channel(peer.target, tls.channel_credentials(), options=options)


def _check_seconds(name: str, value: object, *, zero_ok: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name}={value!r} must be a finite number of seconds")
    if value < 0 or (value == 0 and not zero_ok):
        raise ValueError(f"{name}={value!r} must be {'non-negative' if zero_ok else 'positive'}")
    return float(value)


def _check_retries(retries: object) -> int:
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ValueError(f"retries={retries!r} must be a non-negative integer")
    return retries


def _check_round(round: object) -> int | None:
    """None (the latest) or a round (``protocol.check_round``)."""
    return None if round is None else check_round(round)


def _clean(text: str) -> str:
    """A peer's text made safe for a one-line log: printable, bounded."""
    short = text[:_MAX_REASON_CHARS] + ("..." if len(text) > _MAX_REASON_CHARS else "")
    return "".join(c if c.isprintable() else "?" for c in short)


def _rpc_parts(exc: grpc.RpcError) -> tuple[grpc.StatusCode | None, str]:
    code = exc.code() if callable(getattr(exc, "code", None)) else None
    details = exc.details() if callable(getattr(exc, "details", None)) else str(exc)
    return code, _clean(details or "")


def _rpc_reason(exc: grpc.RpcError) -> str:
    code, details = _rpc_parts(exc)
    return f"{code.name if code is not None else 'UNKNOWN'}: {details}"


def _classify(exc: grpc.RpcError) -> tuple[str, bool]:
    """``(kind, transient)`` of a failed call; transient ones are worth another attempt."""
    code, details = _rpc_parts(exc)
    if code is grpc.StatusCode.NOT_FOUND:
        return "not-ready", False
    if code is grpc.StatusCode.OUT_OF_RANGE:
        return "gone", False
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
        if _TLS_DETAILS.search(details):
            return "tls", False
        return "unreachable", True
    if code is grpc.StatusCode.DEADLINE_EXCEEDED:
        return "timeout", True
    if code is grpc.StatusCode.RESOURCE_EXHAUSTED:
        if "larger than max" in details:  # our own receive limit on one message
            return "limit", False
        return "refused", True  # the peer is busy (too many streams): try again later
    return "refused", False  # FAILED_PRECONDITION, INVALID_ARGUMENT, PERMISSION_DENIED, UNAUTHENTICATED, ...


def _peer_answered(exc: BaseException) -> bool:
    """Whether a failed call was the peer's "not ready yet": an answer over a working connection."""
    return isinstance(exc, grpc.RpcError) and _classify(exc)[0] == "not-ready"


def _decode_kind(exc: WireDecodeError) -> str:
    if isinstance(exc, PeerIdentityMismatch):
        return "identity"
    if isinstance(exc, TierMismatch):
        return "tier"
    if isinstance(exc, HeaderMismatch):
        return "header"
    if isinstance(exc, WireLimitError):
        return "limit"
    return "decode"


class _Stop:
    """Cancellation shared by the pulls of one call: an event for waits, hooks that cancel calls."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.kind: str | None = None  # "cancelled" or "timeout" once triggered
        self.detail = ""
        self._lock = threading.Lock()
        self._hooks: dict[int, Callable[[], object]] = {}
        self._next = 0

    def trigger(self, kind: str, detail: str) -> None:
        with self._lock:
            if self.kind is not None:
                return
            self.kind, self.detail = kind, detail
            hooks = list(self._hooks.values())
        self.event.set()
        for hook in hooks:
            hook()

    def register(self, hook: Callable[[], object]) -> int:
        with self._lock:
            self._next += 1
            self._hooks[self._next] = hook
            fire = self.kind is not None
        if fire:
            hook()
        return self._next

    def unregister(self, token: int) -> None:
        with self._lock:
            self._hooks.pop(token, None)


class _Failed(Exception):
    """Internal: a pull's outcome when it failed (and the exception behind it, if any)."""

    def __init__(self, failure: PullFailure, cause: BaseException | None = None) -> None:
        super().__init__(str(failure))
        self.failure = failure
        self.cause = cause


def _stream(
    channel: grpc.Channel, request: GetModelRequest, decoder: ModelDecoder, timeout_s: float, stop: _Stop
) -> DecodedModel:
    """One GetModel call: feed the decoder until the announced messages are in, then end the call."""
    call = channel.unary_stream(
        GET_MODEL_METHOD, request_serializer=GetModelRequest.SerializeToString, response_deserializer=bytes
    )
    responses = call(request, timeout=timeout_s)
    token = stop.register(responses.cancel)
    try:
        for raw in responses:
            decoder.feed(raw)  # raises at the first bad message
            if decoder.complete:
                break  # a peer that keeps the stream open after its model costs nothing more
        # Built before the call is ended: the peer meanwhile ends it itself (its trailers follow the last
        # message), and the last tensors' building does not wait behind the cancellation's work.
        return decoder.finish()
    except BaseException:
        decoder.abandon()  # a call that failed or was cancelled part-way: its queued builds are dropped
        raise
    finally:
        stop.unregister(token)
        _end_call(responses)


def _end_call(responses: grpc.Call) -> None:
    """Cancel a stream's call (a no-op once it has ended) and take the events its cancellation leaves.

    A stream read on the calling thread (``SingleThreadedUnaryStream``) has no gRPC thread to take
    the last events of a call cancelled part-way, as every pull's is once its model is in: left there,
    each call kept its connection open and about 20 KB (RSS +25 MB over 1,250 pulls; none with them
    taken). gRPC has no public call for it: ``_consume_next_event`` is that rendezvous's own step. Other
    rendezvous (gRPC's threaded one, tests' fakes) have no such step and need none.
    """
    responses.cancel()
    consume = getattr(responses, "_consume_next_event", None)
    state = getattr(responses, "_state", None)
    if consume is None or state is None:
        return
    while state.due:  # a cancelled call's operations all complete at once
        consume()


def _progress(decoder: ModelDecoder) -> str:
    """How far a call's stream got before it ended ("" when no message arrived), for a failure's reason."""
    if decoder.header is None:
        return ""
    return f"{decoder.messages} of {decoder.header.message_count + 1} messages in ({decoder.total_bytes:,} bytes)"


def _pull(
    peer: PeerAddress,
    spec: ModelSpec,
    expected_fleet: str,
    request: GetModelRequest,
    *,
    round: int | None,
    deadline: float,
    retries: int,
    backoff_s: float,
    tls: TlsConfig | None,
    insecure: bool,
    limits: WireLimits,
    stop: _Stop,
    retried_by: Counter[str] | None = None,
) -> DecodedModel:
    """Pull one peer's model by ``deadline`` (monotonic); raises ``_Failed`` with the reason.

    ``retried_by`` counts the calls retried after a transient failure, by kind (the caller's, for one pull).
    """
    wire_bytes = 0
    attempts = 0  # calls made
    retried = 0  # of them, retries after a transient failure (polls for a round do not count)
    polls = 0
    last = ""

    def fail(kind: str, detail: str, cause: BaseException | None = None) -> NoReturn:
        if stop.kind == "cancelled":  # whatever broke, it broke because the caller stopped the pull
            kind, detail = stop.kind, stop.detail
        elif stop.kind == "timeout":  # the batch's deadline: say what the pull was waiting for
            kind = "not-ready" if polls else "timeout"
            detail = f"{stop.detail}; last: {last}" if last else stop.detail
        raise _Failed(PullFailure(kind, detail, wire_bytes), cause)

    if stop.kind is not None:
        fail(stop.kind, stop.detail)
    if not is_valid_node_id(peer.node_id):
        fail("identity", f"peer {peer.node_id[:80]!r} has no node id to check its stream against (Hello it first)")
    if tls is not None and peer.expected_fingerprint is not None:
        try:
            timeout_s = max(deadline - time.monotonic(), 0.001)
            verify_fingerprint(
                tls, peer.host, peer.port, peer.node_id, peer.expected_fingerprint, timeout_s=timeout_s, stop=stop.event
            )
        except CertificateMismatch as exc:
            fail("identity", str(exc), exc)
        except TlsError as exc:
            fail("timeout" if time.monotonic() >= deadline else "tls", f"certificate check: {exc}", exc)
    key = (peer.target, tuple(channel_options(limits, peer, tls)), tls)

    def make_channel() -> grpc.Channel:
        return open_channel(peer, tls=tls, insecure=insecure, limits=limits)

    while True:
        remaining = deadline - time.monotonic()
        if stop.kind is not None:
            fail(stop.kind, stop.detail)
        if remaining <= 0:
            fail("not-ready" if polls else "timeout", f"deadline reached; last: {last or 'no answer'}")
        decoder = ModelDecoder(spec, expected_fleet, limits, expected_node_id=peer.node_id, expected_round=round)
        try:
            # A channel leased per attempt: one whose call failed is dropped, so a retry reaches a
            # restarted peer on a new connection; a "not ready" answer keeps it for the next poll.
            with CHANNELS.lease(key, make_channel, served_if=_peer_answered) as channel:
                return _stream(channel, request, decoder, remaining, stop)
        except WireDecodeError as exc:
            wire_bytes += decoder.total_bytes
            fail(_decode_kind(exc), f"{type(exc).__name__}: {exc}", exc)
        except grpc.RpcError as exc:
            wire_bytes += decoder.total_bytes
            attempts += 1
            if stop.kind is not None:  # the caller's stop cancelled the call: say how far it had got
                last = _progress(decoder) or last
                fail(stop.kind, stop.detail, exc)
            kind, transient = _classify(exc)
            if kind == "timeout" and polls:
                # The deadline ran out while waiting for the round: the peer's last answer (which
                # round it has) says more than the transport's DEADLINE_EXCEEDED, so it stays.
                kind = "not-ready"
            else:
                last = "; ".join(filter(None, (_rpc_reason(exc), _progress(decoder))))
            if kind == "not-ready" and round is not None:
                polls += 1
                wait_s = min(NOT_READY_MAX_WAIT_S, NOT_READY_FIRST_WAIT_S * 1.5 ** (polls - 1))
            elif transient and retried < retries:
                retried += 1
                wait_s = min(MAX_BACKOFF_S, backoff_s * 2 ** (retried - 1))
            else:
                fail(kind, last + (f" (after {attempts} attempts)" if attempts > 1 else ""), exc)
            wait_s *= _jitter.uniform(0.5, 1.0)
            remaining = deadline - time.monotonic()
            if kind != "not-ready" and wait_s >= remaining:
                fail(kind, f"{last} (after {attempts} attempts; no time left for another)", exc)
            if kind != "not-ready" and retried_by is not None:
                retried_by[kind] += 1  # a retry there is time for (a stop during the wait still ends it)
            _LOGGER.debug("pull from %s: %s; next attempt in %.2f s", peer.node_id, last, wait_s)
            if stop.event.wait(max(0.0, min(wait_s, remaining - 0.01))):
                fail(stop.kind or "cancelled", stop.detail)


def _request(spec: ModelSpec, expected_fleet: str, node_id: str, round: int | None) -> GetModelRequest:
    request = GetModelRequest(
        protocol_version=PROTOCOL_VERSION, node_id=node_id, fleet_id=expected_fleet, arch_id=spec.arch_id
    )
    if round is not None:
        request.round = round
    if spec.buffers:  # norm_stats average (1.3): the peer's running statistics too, if it sends any
        request.buffers = True
    if spec.tier_mode != "mask":  # width tiers (1.5): a server of another mode refuses rather than stream
        request.tier_mode = spec.tier_mode
    return request


def _caller_id(node_id: str, tls: TlsConfig | None) -> str:
    """The node id to send: the given one, or with TLS the certificate's (servers check they agree)."""
    if node_id or tls is None:
        return node_id
    names = tls.node_names
    return names[0] if names else ""


def pull_model(
    peer: PeerAddress,
    spec: ModelSpec,
    expected_fleet: str,
    *,
    node_id: str = "",
    round: int | None = None,
    deadline_s: float = 120.0,
    retries: int = 2,
    backoff_s: float = 1.0,
    tls: TlsConfig | None = None,
    insecure: bool = False,
    limits: WireLimits | None = None,
    cancel: threading.Event | None = None,
) -> DecodedModel:
    """Pull and validate one peer's model, the latest or round ``round`` (arguments: ``pull_models``).

    Runs in the calling thread; returns within ``deadline_s`` (plus a moment), or within ~0.1 s of
    ``cancel`` being set.

    Raises:
        PeerUnreachable: no model; ``.kind`` is one of ``FAILURE_KINDS`` (not "decode"/"limit"/"header").
        WireDecodeError (WireLimitError, HeaderMismatch, PeerIdentityMismatch): a bad stream.
    """
    deadline_s = _check_seconds("deadline_s", deadline_s)
    _check_seconds("backoff_s", backoff_s, zero_ok=True)
    _check_retries(retries)
    _check_round(round)
    _check_security(tls, insecure)
    stop = _Stop()
    deadline = time.monotonic() + deadline_s
    done = threading.Event()
    watcher = None
    if cancel is not None:

        def watch() -> None:
            while not done.is_set():
                if cancel.wait(0.05):
                    stop.trigger("cancelled", "pull cancelled")
                    return

        watcher = threading.Thread(target=watch, name="edge-node-pull-cancel", daemon=True)
        watcher.start()
    try:
        return _pull(
            peer, spec, expected_fleet, _request(spec, expected_fleet, _caller_id(node_id, tls), round),
            round=round, deadline=deadline, retries=retries, backoff_s=backoff_s, tls=tls, insecure=insecure,
            limits=limits or WireLimits.for_spec(spec), stop=stop,
        )  # fmt: skip
    except _Failed as failed:
        if isinstance(failed.cause, WireDecodeError):
            raise failed.cause from None
        raise PeerUnreachable(f"peer {peer.node_id}: {failed.failure}", kind=failed.failure.kind) from failed.cause
    finally:
        done.set()
        if watcher is not None:
            watcher.join(1.0)


def pull_models(
    peers: Sequence[PeerAddress],
    spec: ModelSpec,
    expected_fleet: str,
    *,
    node_id: str = "",
    round: int | None = None,
    deadline_s: float = 120.0,
    peer_deadline_s: float | None = None,
    retries: int = 2,
    backoff_s: float = 1.0,
    tls: TlsConfig | None = None,
    insecure: bool = False,
    limits: WireLimits | None = None,
    max_workers: int = 8,
    cancel: threading.Event | None = None,
) -> PullResult:
    """Pull the model of every peer in parallel; never raises for a peer's failure.

    Args:
        peers: whom to pull from (distinct node ids; ``node_id`` must be the peer's real id, which
            its stream header must carry).
        spec, expected_fleet: what every stream must be for; anything else is refused.
        node_id: this node, sent so that servers can log who pulled (with TLS: default the
            certificate's name, which servers require).
        round: pull exactly this round of every peer (lock-step), waiting for peers that have not
            published it yet; None: each peer's latest.
        deadline_s: the bound of the whole call: at that time the pulls still running are cancelled
            and reported as "timeout", and what arrived is returned.
        peer_deadline_s: the bound of one pull, retries and waits included (default ``deadline_s``).
        retries, backoff_s: extra attempts after transient failures, waiting
            ``backoff_s * 2**attempt`` (at most 30 s; jittered down to half) between them, within
            the deadline; other failures are final.
        tls, insecure: mutual TLS with the fleet CA, or explicitly plaintext.
        limits: what one stream may be (default ``WireLimits.for_spec(spec)``: about the largest
            valid encoding of this model).
        max_workers: peers pulled at the same time (on ``PULLERS``' threads; every pull ends before this
            returns).
        cancel: set it to abandon every transfer; the call returns within ~0.1 s with "cancelled".

    Returns:
        ``PullResult``: decoded models by node id, and a ``PullFailure(kind, detail)`` for each peer
        that failed (``str()``: e.g. ``"unreachable: UNAVAILABLE: ... (after 3 attempts)"``).
    """
    deadline_s = _check_seconds("deadline_s", deadline_s)
    peer_s = deadline_s if peer_deadline_s is None else _check_seconds("peer_deadline_s", peer_deadline_s)
    _check_seconds("backoff_s", backoff_s, zero_ok=True)
    _check_retries(retries)
    _check_round(round)
    _check_security(tls, insecure)
    if isinstance(max_workers, bool) or not isinstance(max_workers, int) or max_workers < 1:
        raise ValueError(f"max_workers={max_workers!r} must be a positive integer")
    ids = [p.node_id for p in peers]
    if len(set(ids)) != len(ids):
        raise ValueError(f"peers have duplicate node ids: {sorted(i for i in set(ids) if ids.count(i) > 1)}")
    received: dict[str, DecodedModel] = {}
    failures: dict[str, PullFailure] = {}
    if not peers:
        return PullResult(received, failures)
    limits = limits or WireLimits.for_spec(spec)
    request = _request(spec, expected_fleet, _caller_id(node_id, tls), round)
    stop = _Stop()
    deadline = time.monotonic() + deadline_s

    retried_by: dict[str, Counter[str]] = {p.node_id: Counter() for p in peers}  # each written by its own pull

    def pull(peer: PeerAddress) -> DecodedModel | PullFailure:
        try:
            return _pull(
                peer, spec, expected_fleet, request, round=round, deadline=min(deadline, time.monotonic() + peer_s),
                retries=retries, backoff_s=backoff_s, tls=tls, insecure=insecure, limits=limits, stop=stop,
                retried_by=retried_by[peer.node_id],
            )  # fmt: skip
        except _Failed as failed:
            return failed.failure

    futures: dict[Future[DecodedModel | PullFailure], str] = {}
    waiting = list(reversed(peers))  # not started yet; max_workers pull at once
    pending: set[Future[DecodedModel | PullFailure]] = set()
    try:
        while waiting or pending:
            while waiting and len(pending) < max_workers:
                peer = waiting.pop()
                future = PULLERS.call(functools.partial(pull, peer))
                futures[future] = peer.node_id
                pending.add(future)
            if cancel is not None and cancel.is_set():
                stop.trigger("cancelled", "pull cancelled")
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                stop.trigger("timeout", f"the batch deadline of {deadline_s:g} s ran out")
                break
            timeout_s = min(remaining, _POLL_S) if cancel is not None else remaining
            _done, pending = wait(pending, timeout=timeout_s, return_when=FIRST_COMPLETED)
    finally:
        stop.trigger("cancelled", "pull abandoned")  # no-op unless something above raised or a pull still runs
        wait(pending)  # every pull is cancellable: this is quick
    outcomes = {peer_id: future.result() for future, peer_id in futures.items()}
    for peer in peers:
        peer_id = peer.node_id
        outcome = (  # a peer not started has none: the batch was cancelled or ran out of time first
            outcomes[peer_id] if peer_id in outcomes else PullFailure(stop.kind or "cancelled", stop.detail)
        )
        if isinstance(outcome, PullFailure):
            failures[peer_id] = outcome
            log = _LOGGER.info if outcome.kind in ("not-ready", "cancelled") else _LOGGER.warning
            log("no model from %s: %s", peer_id, outcome)
        else:
            received[peer_id] = outcome
    return PullResult(received, failures, dict(sorted(sum(retried_by.values(), Counter()).items())))


def _hello_failure(
    peer: PeerAddress, kind: str, detail: str, method: str = "Hello", *, transient: bool = False
) -> PeerUnreachable:
    message = f"peer {peer.node_id[:80]} at {peer.target}: {method} {kind}: {detail}"
    return PeerUnreachable(message, kind=kind, transient=transient)


def _parse_hello(raw: bytes, peer: PeerAddress) -> PeerHello:
    """The reply, every field validated as strictly as a stream header; PeerUnreachable(kind) otherwise."""

    def bad(detail: str, kind: str = "header") -> NoReturn:
        raise _hello_failure(peer, kind, detail)

    try:
        reply = HelloReply.FromString(raw)
    except DecodeError as exc:
        bad(f"reply is not a HelloReply: {exc}")
    unknown = unknown_field_numbers(reply)
    if unknown:
        bad(f"reply has unknown field number(s) {unknown[:8]} (not in protocol {PROTOCOL_VERSION})")
    if reply.ByteSize() != len(raw):
        bad("reply has repeated or non-canonically encoded fields")
    identity = _hello_identity(reply, bad)
    try:
        compatible = identity.compatible()
    except ValueError as exc:
        bad(str(exc))
    if not compatible:
        bad(f"protocol version {reply.protocol_version!r} is not compatible with {PROTOCOL_VERSION}")
    try:
        identity = identity.check()
    except ValueError as exc:
        bad(_clean(str(exc)))
    if is_valid_node_id(peer.node_id) and reply.node_id != peer.node_id:
        bad(f"answers as node {reply.node_id!r}, was asked as {peer.node_id!r}", "identity")
    try:
        value_type = ValueType(reply.value_type)
    except ValueError:
        bad(f"unknown value type {reply.value_type}")
    return PeerHello(identity, value_type)


def _hello_identity(reply: HelloReply, bad: Callable[[str], NoReturn]) -> NodeIdentity:
    """The reply's values as an identity, not checked yet: a node without a model sends round 0 and density 0.0
    (None here, and no other values), one that has not measured its tier ``""`` (None)."""
    if not reply.has_model and (reply.round, reply.density) != (0, 0.0):
        bad(f"round={reply.round} and density={reply.density!r} with no model (has_model false: 0 and 0.0)")
    return NodeIdentity(
        protocol_version=reply.protocol_version,
        node_id=reply.node_id,
        fleet_id=reply.fleet_id,
        arch_id=reply.arch_id,
        round=reply.round if reply.has_model else None,
        density=reply.density if reply.has_model else None,
        tier=reply.capacity_tier or None,
    )


def hello(
    peer: PeerAddress,
    *,
    node_id: str = "",
    fleet_id: str = "",
    timeout_s: float = 5.0,
    tls: TlsConfig | None = None,
    insecure: bool = False,
) -> PeerHello:
    """Ask ``peer`` who it is and what it publishes; the reply is validated before it is returned.

    Refused (``PeerUnreachable`` with ``kind`` "header"): a reply over 64 KiB, with unknown or
    repeated fields, another protocol major, an id, architecture id, tier, value type, round or
    density out of its domain. Kind "identity": a node id other than ``peer.node_id`` (when that is a
    node id; a static peer listed as ``host:port`` learns its id here), or with TLS a certificate
    other than ``peer.expected_fingerprint``.

    Raises:
        PeerUnreachable: no valid answer within ``timeout_s`` (``kind`` says why).
    """
    request = HelloRequest(protocol_version=PROTOCOL_VERSION, node_id=_caller_id(node_id, tls), fleet_id=fleet_id)
    raw = _ask(peer, "Hello", HELLO_METHOD, request, HELLO_MAX_REPLY_BYTES, timeout_s=timeout_s, tls=tls,
               insecure=insecure)  # fmt: skip
    return _parse_hello(raw, peer)


def _ask(
    peer: PeerAddress, method: str, path: str, request: HelloRequest | ListPeersRequest, max_reply_bytes: int, *,
    timeout_s: float, tls: TlsConfig | None, insecure: bool,
) -> bytes:  # fmt: skip
    """One small unary call (Hello, ListPeers): with TLS and ``peer.expected_fingerprint`` the certificate is
    checked first; the reply is bounded to ``max_reply_bytes`` and returned raw (the caller validates it).

    Raises:
        PeerUnreachable: no reply within ``timeout_s``, kind ``identity``/``tls`` for the certificate, else the
            call's classified failure (transient where another attempt is worth it).
    """
    timeout_s = _check_seconds("timeout_s", timeout_s)
    _check_security(tls, insecure)
    deadline = time.monotonic() + timeout_s
    if tls is not None and peer.expected_fingerprint is not None:
        try:
            verify_fingerprint(tls, peer.host, peer.port, peer.node_id, peer.expected_fingerprint, timeout_s=timeout_s)
        except CertificateMismatch as exc:
            raise _hello_failure(peer, "identity", str(exc), method) from exc
        except TlsError as exc:
            raise _hello_failure(peer, "tls", f"certificate check: {exc}", method) from exc
    limits = WireLimits(max_message_bytes=max_reply_bytes)
    with open_channel(peer, tls=tls, insecure=insecure, limits=limits) as channel:
        serialize = type(request).SerializeToString
        call = channel.unary_unary(path, request_serializer=serialize, response_deserializer=bytes)
        try:
            raw: bytes = call(request, timeout=max(deadline - time.monotonic(), 0.001))
        except grpc.RpcError as exc:
            kind, transient = _classify(exc)
            raise _hello_failure(peer, kind, _rpc_reason(exc), method, transient=transient) from exc
    return raw


def list_peers(
    peer: PeerAddress,
    *,
    node_id: str = "",
    fleet_id: str = "",
    timeout_s: float = 5.0,
    tls: TlsConfig | None = None,
    insecure: bool = False,
) -> tuple[list[PeerEntry], int]:
    """Ask ``peer`` for the peers it has reached (peer exchange, protocol 1.4): ``(entries, dropped)``.

    Only the first ``MAX_PEER_ENTRIES`` entries are returned; ``dropped`` counts the rest. The entries are
    hints, not checked here (``net/discovery/exchange.py`` checks each and verifies it before use). With TLS
    and ``peer.expected_fingerprint`` the peer's certificate must have it, as for :func:`hello`.

    Raises:
        PeerUnreachable: no valid reply within ``timeout_s`` (``kind`` says why: a server before 1.4 answers
            UNIMPLEMENTED, ``refused``; a reply over ``LIST_PEERS_MAX_REPLY_BYTES``, ``limit``).
    """
    request = ListPeersRequest(protocol_version=PROTOCOL_VERSION, node_id=_caller_id(node_id, tls), fleet_id=fleet_id)
    raw = _ask(peer, "ListPeers", LIST_PEERS_METHOD, request, LIST_PEERS_MAX_REPLY_BYTES, timeout_s=timeout_s, tls=tls,
               insecure=insecure)  # fmt: skip
    try:
        reply = ListPeersReply.FromString(raw)
    except DecodeError as exc:
        raise _hello_failure(peer, "header", f"reply is not a ListPeersReply: {exc}", "ListPeers") from None
    if unknown_field_numbers(reply):
        raise _hello_failure(peer, "header", "reply has unknown fields", "ListPeers")
    entries = list(reply.peers)
    return entries[:MAX_PEER_ENTRIES], max(0, len(entries) - MAX_PEER_ENTRIES)
