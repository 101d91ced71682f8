"""Channels to peers, kept from one pull to the next.

A node pulls the same peers round after round. A channel made for each pull paid its construction, TCP
connection and HTTP/2 handshake (and TLS handshake) every time, and its closing: a loopback ResNet18 pull
took 15.9 ms with a new channel and 14.0 ms on one kept from the pull before (medians of 30; first message
at 2.2 against 1.0 ms).

A channel is kept while it serves: a call that fails discards it (closed once no pull uses it), unless
the failure is an answer that proves the connection (the caller says which: a peer's "not ready yet").
So the next attempt, a retry within the same pull or the next pull, reaches a peer that restarted or
moved on a new connection, never through one in gRPC's reconnect backoff: a refused channel fails its
calls at once until its backoff (1 s, growing 1.6x a failure) runs out, and with the daemon's two
retries a pull from a peer back 1.2 s after the first refusal failed in 6 of 8 runs (0 of 8 on new
channels). At most ``max_channels`` are kept (the least recently used idle one is closed first), and
one idle for ``idle_s`` is closed at the next use of the cache. Each kept connection may hold gRPC's
read buffer (``READ_CHUNK_BYTES``).
"""

from __future__ import annotations

import atexit
import contextlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass

import grpc

MAX_CHANNELS = 16  # kept at once, in use or idle
IDLE_S = 300.0  # an idle channel is closed after this long: longer than a round


@dataclass
class _Kept:
    channel: grpc.Channel
    last_used: float
    users: int = 0
    discarded: bool = False


class ChannelCache:
    """Channels by key (the peer's address, the channel's options, its TLS material), leased per pull."""

    def __init__(
        self, max_channels: int = MAX_CHANNELS, idle_s: float = IDLE_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if max_channels < 0:
            raise ValueError(f"max_channels={max_channels} must be at least 0")
        self.max_channels = max_channels
        self.idle_s = idle_s
        self._clock = clock
        self._lock = threading.Lock()
        self._kept: OrderedDict[Hashable, _Kept] = OrderedDict()  # least recently used first
        self.made = 0  # channels made, for tests and metrics
        self.reused = 0  # leases served by a kept channel

    def __len__(self) -> int:
        return len(self._kept)

    @contextlib.contextmanager
    def lease(
        self,
        key: Hashable,
        make: Callable[[], grpc.Channel],
        served_if: Callable[[BaseException], bool] = lambda exc: False,
    ) -> Iterator[grpc.Channel]:
        """The channel kept for ``key``, or a new one from ``make``; discarded if the block raises an
        exception other than those ``served_if`` says the channel served (a peer's answer)."""
        with self._lock:
            kept = self._kept.pop(key, None)
            if kept is None:
                kept = _Kept(make(), self._clock())
                self.made += 1
            else:
                self.reused += 1
            kept.users += 1
            self._kept[key] = kept  # the most recently used
            to_close = self._sweep()
        _close(to_close)
        served = False
        try:
            yield kept.channel
            served = True
        except BaseException as exc:
            served = served_if(exc)
            raise
        finally:
            with self._lock:
                kept.users -= 1
                kept.last_used = self._clock()
                if not served:
                    kept.discarded = True
                    if self._kept.get(key) is kept:
                        del self._kept[key]
                to_close = self._sweep()
                if kept.discarded and not kept.users:
                    to_close.append(kept.channel)
            _close(to_close)

    def close(self) -> None:
        """Close every idle channel and discard the rest (closed when their pulls end)."""
        with self._lock:
            to_close = []
            for kept in self._kept.values():
                kept.discarded = True
                if not kept.users:
                    to_close.append(kept.channel)
            self._kept.clear()
        _close(to_close)

    def _sweep(self) -> list[grpc.Channel]:
        """Take out the idle channels past ``idle_s`` and, beyond ``max_channels``, the least recently used
        idle ones; the caller closes them outside the lock."""
        now = self._clock()
        idle = [key for key, kept in self._kept.items() if not kept.users]
        excess = len(self._kept) - self.max_channels
        taken = []
        for key in idle:
            if excess > 0 or now - self._kept[key].last_used >= self.idle_s:
                taken.append(self._kept.pop(key).channel)
                excess -= 1
        return taken


def _close(channels: list[grpc.Channel]) -> None:
    for channel in channels:
        channel.close()


CHANNELS = ChannelCache()
atexit.register(CHANNELS.close)  # before gRPC's own exit handlers (registered earlier, run later)
