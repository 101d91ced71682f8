"""What the peer server lets in: the share of calls, streams and connections each host and caller may hold.

``AdmissionGuard`` first takes a call from its host's rate (``over_rate``: a token bucket per host,
``net/host_rate.py``; a refusal may be held back, then ``unhold``), then counts the call against its
host and the server from its headers on (``admit``/``leave``), a model stream against its caller
(``open_stream``/``close_stream``), waits a bounded time for a call's request (``request``), names the
caller (``caller``: its certificate's name with TLS, else its host), and counts and logs every refusal by
kind (``refuse``, ``refusals``). The limits are ``ServerLimits``; the
servicer (``net/server.py``) asks the guard before it serves anything.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, NoReturn

import grpc

from edge_node.net.host_rate import HostRates, host_key

_LOGGER = logging.getLogger(__name__)

REFUSAL_KINDS = (
    "bad-request", "protocol", "fleet", "arch", "identity", "not-ready", "gone", "busy",
    "host-busy", "server-busy", "slow-request", "host-connections", "pex-rate", "host-rate", "tier-mode",
)  # fmt: skip
_LOG_EVERY_S = 10.0  # a refusal kind is logged once per host per this long
_QUIET_KINDS = ("not-ready", "busy")  # expected in lock-step fleets: logged at INFO, the rest at WARNING


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
    # Calls per second one host may start (``host_rate.host_key``: an IPv4 address, an IPv6 /64), any
    # method, at most host_rate * host_burst_s at once; beyond: RESOURCE_EXHAUSTED, ``host-rate``. Sized
    # for a fleet behind one NAT address: a peer waiting for a round asks for each peer's Hello 5 times a
    # second (``node/barrier.POLL_S``), so 50 lets 10 such nodes share an address; a pull is one call.
    # A Hello flood held to it cost a 2-core VM 4 % of a core (docs/RESULTS.md, "CPU per host").
    host_rate: float = 50.0
    host_burst_s: float = 2.0
    # A call over its host's rate is held this long before its refusal goes out: an answer at once would let a
    # flooder's next call come at once, and a refused call costs about as much CPU as an answered one. A held
    # call costs a coroutine; at most max_held_calls are held in all (max_calls_per_host per host), so they
    # stay within grpc's net of 2 * max_concurrent_rpcs calls; beyond, refusals go out at once.
    host_rate_hold_s: float = 0.5
    max_held_calls: int = 32
    max_rate_hosts: int = 4096  # hosts whose buckets are kept (least recently seen out first)

    def __post_init__(self) -> None:
        integers = (
            "max_request_bytes", "max_concurrent_rpcs", "max_calls_per_host", "max_streams_per_caller",
            "max_connections", "max_streams_per_connection", "max_connections_per_host", "max_held_calls",
            "max_rate_hosts",
        )  # fmt: skip
        for name in integers:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r} must be a positive integer")
        seconds = (
            "request_timeout_s", "handshake_timeout_s", "connection_idle_s", "max_connection_age_s",
            "connection_age_grace_s", "connection_guard_period_s", "host_burst_s", "host_rate_hold_s",
        )  # fmt: skip
        for name in seconds:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 86400:
                raise ValueError(f"{name}={value!r} must be a number of seconds in (0, 86400]")
        rate = self.host_rate
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 < rate <= 1e6:
            raise ValueError(f"host_rate={rate!r} must be a number of calls per second in (0, 1e6]")
        if self.max_held_calls > self.max_concurrent_rpcs:  # held calls and open ones share grpc's net of twice it
            raise ValueError(f"max_held_calls={self.max_held_calls} must be <= max_concurrent_rpcs")
        if self.host_rate * self.host_burst_s < 1:
            raise ValueError(f"host_rate * host_burst_s = {self.host_rate * self.host_burst_s:g} must be >= 1 call")


class Refusal(Exception):
    """A call to end with ``code`` and ``reason`` (raised by the checks, sent by the call's coroutine)."""

    def __init__(self, code: grpc.StatusCode, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


def _tls_names(context: grpc.ServicerContext) -> list[str] | None:
    """The DNS names of the caller's certificate when the call came over TLS, else None."""
    auth = context.auth_context() or {}
    if b"ssl" not in auth.get("transport_security_type", []):
        return None
    return [n.decode("utf-8", "replace") for n in auth.get("x509_subject_alternative_name", [])]


def caller_host(context: grpc.ServicerContext) -> str:
    """``ipv4:10.0.0.2:51234`` -> ``ipv4:10.0.0.2`` (the port changes with every connection)."""
    peer = context.peer() or "unknown"
    host, sep, _port = peer.rpartition(":")
    return host if sep else peer


class AdmissionGuard:
    """The open calls per host and streams per caller, the refusals by kind; thread-safe."""

    def __init__(self, limits: ServerLimits | None = None) -> None:
        self._lock = threading.Lock()
        self.limits = limits or ServerLimits()
        self._held: collections.Counter[str] = collections.Counter()  # refusals held back, per host key
        self._held_total = 0
        self._streams: collections.Counter[str] = collections.Counter()  # open GetModel streams per caller
        self._calls: collections.Counter[str] = collections.Counter()  # open calls per host address
        self._open_calls = 0  # open calls, all hosts
        self._logged: dict[tuple[str, str], float] = {}  # (refusal kind, host) -> when last logged
        self._refusals: collections.Counter[str] = collections.Counter()

    @property
    def limits(self) -> ServerLimits:
        return self._limits

    @limits.setter
    def limits(self, limits: ServerLimits) -> None:
        """New limits start every host's bucket afresh (full)."""
        with self._lock:
            self._limits = limits
            burst = limits.host_rate * limits.host_burst_s
            self._rates = HostRates(limits.host_rate, burst, limits.max_rate_hosts)

    def over_rate(self, context: grpc.ServicerContext) -> tuple[Refusal, str | None] | None:
        """None when the call's host is within ``host_rate``; else its refusal (counted, ``host-rate``) and
        the host key when the refusal is to be held back ``host_rate_hold_s`` (then ``unhold`` it after)."""
        key = host_key(context.peer() or "unknown")
        limits = self.limits
        with self._lock:
            if self._rates.take(key, time.monotonic()):
                return None
            hold = self._held_total < limits.max_held_calls and self._held[key] < limits.max_calls_per_host
            if hold:
                self._held[key] += 1
                self._held_total += 1
        reason = f"host {key!r} is over its rate of {limits.host_rate:g} calls/s (burst {limits.host_burst_s:g} s)"
        self._note("host-rate", key, context.peer(), reason)
        return Refusal(grpc.StatusCode.RESOURCE_EXHAUSTED, reason), key if hold else None

    def unhold(self, key: str) -> None:
        """A refusal held back for ``key`` has gone out (or its call ended)."""
        with self._lock:
            self._held[key] -= 1
            self._held_total -= 1
            if self._held[key] <= 0:
                del self._held[key]

    def refusals(self) -> dict[str, int]:
        """Calls refused so far, by kind (``REFUSAL_KINDS``); a copy, safe to read from any thread."""
        with self._lock:
            return dict(self._refusals)

    def open_calls(self) -> dict[str, int]:
        """Open calls per host address (a copy): what each host holds of the server right now."""
        with self._lock:
            return dict(self._calls)

    def refuse(self, context: grpc.ServicerContext, kind: str, code: grpc.StatusCode, reason: str) -> NoReturn:
        """Count and log a refusal, then raise it for the call's coroutine to send."""
        self._note(kind, caller_host(context), context.peer(), reason)
        raise Refusal(code, reason)

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
        reason = f"{n} connection(s) beyond the host's cap of {self.limits.max_connections_per_host} shut down"
        self._note("host-connections", host, host, reason, n)

    def admit(self, context: grpc.ServicerContext) -> str:
        """Count a new call against its host and the server (before its request); refuse beyond the caps."""
        host = caller_host(context)
        limits = self.limits
        with self._lock:
            host_full = self._calls[host] >= limits.max_calls_per_host
            server_full = self._open_calls >= limits.max_concurrent_rpcs
            if not (host_full or server_full):
                self._calls[host] += 1
                self._open_calls += 1
        if host_full:
            reason = f"host {host!r} already has {limits.max_calls_per_host} calls open (the limit)"
            self.refuse(context, "host-busy", grpc.StatusCode.RESOURCE_EXHAUSTED, reason)
        if server_full:
            reason = f"the server has {limits.max_concurrent_rpcs} calls open (the limit)"
            self.refuse(context, "server-busy", grpc.StatusCode.RESOURCE_EXHAUSTED, reason)
        return host

    def leave(self, host: str) -> None:
        """A call admitted for ``host`` has ended."""
        with self._lock:
            self._open_calls -= 1
            self._calls[host] -= 1
            if self._calls[host] <= 0:
                del self._calls[host]

    async def request(self, context: grpc.aio.ServicerContext, method: str) -> Any:
        """The call's one request message, if it arrives within ``request_timeout_s``; refusal otherwise."""
        timeout_s = self.limits.request_timeout_s
        try:
            request = await asyncio.wait_for(context.read(), timeout_s)
        except asyncio.TimeoutError:
            reason = f"{method}: no request message within {timeout_s:g} s"
            self.refuse(context, "slow-request", grpc.StatusCode.DEADLINE_EXCEEDED, reason)
        if request is grpc.aio.EOF:
            self.refuse(context, "bad-request", grpc.StatusCode.INVALID_ARGUMENT, f"{method}: no request message")
        return request

    def caller(self, context: grpc.ServicerContext, claimed: str, *, required: bool) -> str:
        """The caller's name: with TLS the one its certificate and request agree on, else its host address.

        In plaintext the claimed node id is not part of it: one host varying its claim would otherwise
        get ``max_streams_per_caller`` streams per claimed id.
        """
        names = _tls_names(context)
        if names is None:
            return caller_host(context)
        if claimed in names or (not required and claimed == ""):
            return names[0] if names else claimed
        self.refuse(
            context,
            "identity",
            grpc.StatusCode.PERMISSION_DENIED,
            f"caller's node id {claimed[:64]!r} is not the name of its certificate {names[:4]}",
        )

    def open_stream(self, context: grpc.ServicerContext, caller: str) -> None:
        """Take one of ``caller``'s model stream slots; refuse (``busy``) when it holds them all."""
        with self._lock:
            busy = self._streams[caller] >= self.limits.max_streams_per_caller
            if not busy:
                self._streams[caller] += 1
        if busy:
            self.refuse(
                context,
                "busy",
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"caller {caller!r} already has {self.limits.max_streams_per_caller} model streams open (the limit)",
            )

    def close_stream(self, caller: str) -> None:
        """Give back a stream slot taken by :meth:`open_stream`."""
        with self._lock:
            self._streams[caller] -= 1
            if self._streams[caller] <= 0:
                del self._streams[caller]
