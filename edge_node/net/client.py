"""The peer gRPC client: ``hello`` one peer, ``pull_models`` from several in parallel.

Every call has a deadline; only transient failures (UNAVAILABLE, DEADLINE_EXCEEDED) are retried,
a bounded number of times with exponential backoff; channels send keepalive pings so that a slow
peer streaming a large model is told apart from a dead one. A pull returns what arrived and, for
every other peer, why not: a round goes on with the peers that answered.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import grpc

from edge_node.errors import ConfigError, PeerUnreachable, WireDecodeError
from edge_node.net.tls import TlsConfig, warn_insecure
from edge_node.wire import PROTOCOL_VERSION, DecodedModel, ModelDecoder, ModelSpec, ValueType, WireLimits
from edge_node.wire.messages import GET_MODEL_METHOD, HELLO_METHOD, GetModelRequest, HelloReply, HelloRequest

_LOGGER = logging.getLogger(__name__)

TRANSIENT_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
KEEPALIVE_TIME_MS = 30_000  # ping the server every 30 s while a call is open
KEEPALIVE_TIMEOUT_MS = 10_000  # and give up on the connection after 10 s without an answer
MAX_BACKOFF_S = 30.0  # cap of one wait between retries


@dataclass(frozen=True)
class PeerAddress:
    """Where to reach a peer; ``node_id`` is also the name its TLS certificate must carry."""

    node_id: str
    host: str
    port: int

    def __post_init__(self) -> None:
        if not self.node_id or not self.host:
            raise ValueError(f"PeerAddress needs a node_id and a host, got {self.node_id!r}, {self.host!r}")
        if not isinstance(self.port, int) or not 0 < self.port < 65536:
            raise ValueError(f"port={self.port!r} must be in 1..65535")

    @property
    def target(self) -> str:
        """gRPC target ``host:port`` (IPv6 literals bracketed)."""
        host = f"[{self.host}]" if ":" in self.host and not self.host.startswith("[") else self.host
        return f"{host}:{self.port}"


@dataclass(frozen=True)
class PeerHello:
    """A peer's answer to Hello."""

    protocol_version: str
    node_id: str
    fleet_id: str
    arch_id: str
    round: int
    density: float
    tier: str
    has_model: bool
    value_type: ValueType | None


@dataclass(frozen=True)
class PullResult:
    """Models that arrived, by node id, and a one-line reason for every peer that did not deliver."""

    received: dict[str, DecodedModel]
    failures: dict[str, str]


def channel_options(limits: WireLimits, peer: PeerAddress, tls: TlsConfig | None) -> list[tuple[str, int | str]]:
    options: list[tuple[str, int | str]] = [
        ("grpc.max_receive_message_length", limits.max_message_bytes),
        ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        ("grpc.keepalive_permit_without_calls", 0),
        ("grpc.http2.max_pings_without_data", 0),  # keep pinging through a long, quiet stream
        ("grpc.enable_retries", 0),  # retries are ours, bounded and logged
    ]
    if tls is not None:
        options.append(("grpc.ssl_target_name_override", peer.node_id))  # verify the cert names this node
    return options


def open_channel(
    peer: PeerAddress, *, tls: TlsConfig | None, insecure: bool, limits: WireLimits | None = None
) -> grpc.Channel:
    """A channel to ``peer``: mutual TLS with the fleet CA, or plaintext when ``insecure`` says so."""
    if (tls is None) == (not insecure):
        if tls is None:
            raise ConfigError(
                "no TLS material given: pass tls=TlsConfig(...) or, explicitly, insecure=True (--insecure)"
            )
        raise ConfigError("tls and insecure=True are mutually exclusive")
    options = channel_options(limits or WireLimits(), peer, tls)
    if tls is None:
        warn_insecure("client")
        return grpc.insecure_channel(peer.target, options=options)
    return grpc.secure_channel(peer.target, tls.channel_credentials(), options=options)


def _check_call_args(timeout_s: float, retries: int, backoff_s: float) -> None:
    if not isinstance(timeout_s, (int, float)) or not math.isfinite(timeout_s) or timeout_s <= 0:
        raise ValueError(f"timeout_s={timeout_s!r} must be a positive number of seconds")
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ValueError(f"retries={retries!r} must be a non-negative integer")
    if not isinstance(backoff_s, (int, float)) or not math.isfinite(backoff_s) or backoff_s < 0:
        raise ValueError(f"backoff_s={backoff_s!r} must be a non-negative number of seconds")


def _rpc_reason(exc: grpc.RpcError) -> str:
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    return f"{code.name if code is not None else 'UNKNOWN'}: {details}"


def hello(
    peer: PeerAddress,
    *,
    node_id: str = "",
    fleet_id: str = "",
    timeout_s: float = 5.0,
    tls: TlsConfig | None = None,
    insecure: bool = False,
) -> PeerHello:
    """Ask ``peer`` who it is and what it publishes.

    Raises:
        PeerUnreachable: no answer within ``timeout_s`` or the call failed (the reason says which).
    """
    _check_call_args(timeout_s, 0, 0.0)
    with open_channel(peer, tls=tls, insecure=insecure) as channel:
        call = channel.unary_unary(
            HELLO_METHOD, request_serializer=HelloRequest.SerializeToString, response_deserializer=HelloReply.FromString
        )
        request = HelloRequest(protocol_version=PROTOCOL_VERSION, node_id=node_id, fleet_id=fleet_id)
        try:
            reply: HelloReply = call(request, timeout=timeout_s)
        except grpc.RpcError as exc:
            raise PeerUnreachable(f"peer {peer.node_id} at {peer.target}: Hello failed: {_rpc_reason(exc)}") from exc
    try:
        value_type: ValueType | None = ValueType(reply.value_type)
    except ValueError:
        value_type = None
    return PeerHello(
        protocol_version=reply.protocol_version,
        node_id=reply.node_id,
        fleet_id=reply.fleet_id,
        arch_id=reply.arch_id,
        round=reply.round,
        density=reply.density,
        tier=reply.capacity_tier,
        has_model=reply.has_model,
        value_type=value_type,
    )


def _pull_once(
    channel: grpc.Channel, request: GetModelRequest, spec: ModelSpec, expected_fleet: str, timeout_s: float,
    limits: WireLimits,
) -> DecodedModel:  # fmt: skip
    call = channel.unary_stream(
        GET_MODEL_METHOD, request_serializer=GetModelRequest.SerializeToString, response_deserializer=bytes
    )
    responses = call(request, timeout=timeout_s)
    decoder = ModelDecoder(spec, expected_fleet, limits)
    try:
        for raw in responses:
            decoder.feed(raw)
    except WireDecodeError:
        responses.cancel()  # stop the transfer at the first bad message
        raise
    return decoder.finish()


def pull_model(
    peer: PeerAddress,
    spec: ModelSpec,
    expected_fleet: str,
    *,
    node_id: str = "",
    timeout_s: float = 120.0,
    retries: int = 2,
    backoff_s: float = 1.0,
    tls: TlsConfig | None = None,
    insecure: bool = False,
    limits: WireLimits | None = None,
) -> DecodedModel:
    """Pull and validate one peer's latest model (see ``pull_models`` for the arguments).

    Raises:
        PeerUnreachable: the call failed (after retries for transient codes); the reason has the code.
        WireDecodeError (and its WireLimitError / HeaderMismatch): the peer sent a bad stream.
    """
    _check_call_args(timeout_s, retries, backoff_s)
    limits = limits or WireLimits()
    request = GetModelRequest(
        protocol_version=PROTOCOL_VERSION, node_id=node_id, fleet_id=expected_fleet, arch_id=spec.arch_id
    )
    with open_channel(peer, tls=tls, insecure=insecure, limits=limits) as channel:
        for attempt in range(retries + 1):
            try:
                return _pull_once(channel, request, spec, expected_fleet, timeout_s, limits)
            except grpc.RpcError as exc:
                code = exc.code() if hasattr(exc, "code") else None
                reason = _rpc_reason(exc)
                if code not in TRANSIENT_CODES or attempt == retries:
                    tries = f" after {attempt + 1} attempts" if attempt else ""
                    raise PeerUnreachable(f"{reason}{tries}") from exc
                wait_s = min(MAX_BACKOFF_S, backoff_s * 2**attempt)
                _LOGGER.info(
                    "pull from %s failed (%s); retry %d/%d in %.2f s",
                    peer.node_id,
                    reason,
                    attempt + 1,
                    retries,
                    wait_s,
                )
                time.sleep(wait_s)
    raise AssertionError("unreachable: the loop returns or raises")


def pull_models(
    peers: Sequence[PeerAddress],
    spec: ModelSpec,
    expected_fleet: str,
    *,
    node_id: str = "",
    timeout_s: float = 120.0,
    retries: int = 2,
    backoff_s: float = 1.0,
    tls: TlsConfig | None = None,
    insecure: bool = False,
    limits: WireLimits | None = None,
    max_workers: int = 8,
) -> PullResult:
    """Pull the latest model of every peer in parallel; never raises for a peer's failure.

    Args:
        peers: whom to pull from (distinct node ids).
        spec, expected_fleet: what every stream must be for; anything else is refused.
        node_id: this node, sent so that servers can log who pulled.
        timeout_s: deadline of each call (the whole stream); slow links need minutes.
        retries, backoff_s: extra attempts after UNAVAILABLE / DEADLINE_EXCEEDED, waiting
            ``backoff_s * 2**attempt`` (at most 30 s) between them; other failures are final.
        tls, insecure: mutual TLS with the fleet CA, or explicitly plaintext.
        limits: what one stream may be (message size, chunks, total bytes).
        max_workers: peers pulled at the same time.

    Returns:
        ``PullResult``: decoded models by node id, and ``"<reason>"`` for each peer that failed
        (e.g. ``"UNAVAILABLE: ... after 3 attempts"``, ``"WireDecodeError: tensor 'fc.weight': ..."``).
    """
    _check_call_args(timeout_s, retries, backoff_s)
    if isinstance(max_workers, bool) or not isinstance(max_workers, int) or max_workers < 1:
        raise ValueError(f"max_workers={max_workers!r} must be a positive integer")
    ids = [p.node_id for p in peers]
    if len(set(ids)) != len(ids):
        raise ValueError(f"peers have duplicate node ids: {sorted(i for i in set(ids) if ids.count(i) > 1)}")
    if tls is None and not insecure:
        raise ConfigError("no TLS material given: pass tls=TlsConfig(...) or, explicitly, insecure=True (--insecure)")
    received: dict[str, DecodedModel] = {}
    failures: dict[str, str] = {}
    if not peers:
        return PullResult(received, failures)

    def pull(peer: PeerAddress) -> DecodedModel:
        return pull_model(
            peer, spec, expected_fleet, node_id=node_id, timeout_s=timeout_s, retries=retries, backoff_s=backoff_s,
            tls=tls, insecure=insecure, limits=limits,
        )  # fmt: skip

    with ThreadPoolExecutor(max_workers=min(max_workers, len(peers)), thread_name_prefix="edge-node-pull") as pool:
        futures = {peer.node_id: pool.submit(pull, peer) for peer in peers}
        for peer_id, future in futures.items():
            try:
                received[peer_id] = future.result()
            except PeerUnreachable as exc:
                failures[peer_id] = str(exc)
            except WireDecodeError as exc:
                failures[peer_id] = f"{type(exc).__name__}: {exc}"
            if peer_id in failures:
                _LOGGER.warning("no model from %s: %s", peer_id, failures[peer_id])
    return PullResult(received, failures)
