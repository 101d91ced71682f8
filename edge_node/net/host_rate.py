"""What one host may cost the server in calls per second: a token bucket per host (pure: no grpc, no clock).

Every other bound of the server is on count, bytes or time; a host that calls fast and well-formed
stays within all of them and still costs the node CPU on every call (grpc's and Python's work per call,
answered or refused). ``HostRates`` gives each host a bucket of ``burst`` tokens refilled at ``rate``
per second; a call takes one token or is over the host's rate.

"One host" (``host_key``) is what one party can cheaply be: an IPv4 address, or an IPv6 /64 (the
block a single network is handed, whose 2**64 addresses cost their holder nothing to vary); an
IPv4-mapped IPv6 address is its IPv4 address. Peers that are not IP (a Unix socket) are one host per
kind. A site behind one NAT address is one host: the rate is sized for a fleet's honest traffic from
one address (the README says the figure).

The table of buckets is bounded (``max_hosts``, least recently seen out first), so an attacker cycling
addresses cannot grow memory; the price is that one with more than ``max_hosts`` addresses (/64s)
finds its buckets evicted and full again. A host evicted after idling has a full bucket anyway.
"""

from __future__ import annotations

import collections
import ipaddress
import math
import urllib.parse

__all__ = ["HostRates", "host_key", "refill"]


def host_key(peer: str) -> str:
    """The host a grpc peer string names: ``ipv4:10.0.0.2:5123`` -> ``ipv4:10.0.0.2``,
    ``ipv6:[2001:db8::7]:5123`` -> ``ipv6:2001:db8::/64``, ``ipv6:[::ffff:10.0.0.2]:1`` -> ``ipv4:10.0.0.2``;
    anything else (``unix:``, ``unknown``) -> its scheme. grpc may percent-encode the brackets."""
    scheme, _, rest = peer.partition(":")
    if scheme not in ("ipv4", "ipv6"):
        return scheme
    text = urllib.parse.unquote(rest)
    host = text[1:].partition("]")[0] if text.startswith("[") else text.rpartition(":")[0]
    host = host.split("%")[0]  # a zone (fe80::1%eth0) is not part of the host
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return scheme
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if address.version == 4:
        return f"ipv4:{address}"
    return f"ipv6:{ipaddress.IPv6Network((address, 64), strict=False)}"


def refill(tokens: float, elapsed_s: float, rate: float, burst: float) -> float:
    """The tokens a bucket holds ``elapsed_s`` after it held ``tokens``: ``rate`` per second, at most ``burst``."""
    return min(burst, tokens + max(0.0, elapsed_s) * rate)


class HostRates:
    """A token bucket per host (``rate`` calls/s, ``burst`` at once), for at most ``max_hosts`` hosts.

    Not thread-safe: the caller holds its lock (``AdmissionGuard`` does). Time is passed in.
    """

    def __init__(self, rate: float, burst: float, max_hosts: int = 4096) -> None:
        if not (math.isfinite(rate) and rate > 0):
            raise ValueError(f"rate={rate!r} must be a positive number of calls per second")
        if not (math.isfinite(burst) and burst >= 1):
            raise ValueError(f"burst={burst!r} must be a number >= 1 (one call at least)")
        if max_hosts < 1:
            raise ValueError(f"max_hosts={max_hosts!r} must be at least 1")
        self.rate, self.burst, self.max_hosts = float(rate), float(burst), max_hosts
        self._buckets: collections.OrderedDict[str, tuple[float, float]] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._buckets)

    def take(self, key: str, now: float) -> bool:
        """Take a token of ``key``'s bucket at time ``now`` (seconds, monotonic); False when it has none."""
        tokens, last = self._buckets.pop(key, (self.burst, now))
        tokens = refill(tokens, now - last, self.rate, self.burst)
        allowed = tokens >= 1.0
        if allowed:
            tokens -= 1.0
        self._buckets[key] = (tokens, max(now, last))
        if len(self._buckets) > self.max_hosts:
            self._buckets.popitem(last=False)  # the host seen least recently
        return allowed
