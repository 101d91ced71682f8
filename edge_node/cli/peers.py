"""``edge-node peers``: the operator's view of the network, and a probe that multicast passes.

Browses ``_edge-node._tcp.local.`` and prints the live peer table; ``--announce ID`` also advertises
this host, so running it on two machines shows whether they see each other before a deployment.
``--static`` prints the peers as ``ID@HOST:PORT`` lines, the syntax of ``--peers`` and peers files.
What discovery refused (bad records, addresses outside the subnets, more peers than ``--max-peers``)
is summarised on stderr.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import TYPE_CHECKING

import click

from edge_node.cli._app import app, fail
from edge_node.errors import DiscoveryError
from edge_node.exit_codes import ExitCode

if TYPE_CHECKING:
    from edge_node.net.discovery import PeerInfo

DEFAULT_TTL_S = 120  # = edge_node.net.discovery.DEFAULT_TTL_S, imported lazily: `edge-node --help` stays fast
DEFAULT_MAX_PEERS = 64  # = edge_node.net.discovery.DEFAULT_MAX_PEERS (same reason)
DEFAULT_BROWSE_S = 3.0  # without --timeout/--watch: long enough for the startup queries and answers
_COLUMNS = ("ID", "ADDRESS", "FLEET", "TIER", "DENSITY", "ROUND", "VERSION")


def _cell(value: object) -> str:
    """A value in a table cell; ``-`` when it is not known (None)."""
    return "-" if value is None else format(value, "g") if isinstance(value, float) else str(value)


def _row(peer: PeerInfo) -> tuple[str, ...]:
    who = peer.identity
    values = (peer.name, peer.endpoint, who.fleet_id, who.tier, who.density, who.round, who.protocol_version)
    return tuple(_cell(v) for v in values)


def format_table(peers: list[PeerInfo]) -> str:
    """The peers as aligned columns, one row each, under a header."""
    rows = [_COLUMNS] + [_row(p) for p in peers]
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows)


def format_static(peers: list[PeerInfo]) -> str:
    """One ``ID@HOST:PORT`` line per peer (``ID@[v6]:PORT``): a peers file for static discovery."""
    return "\n".join(f"{p.name}@{p.endpoint}" for p in peers)


def _render(peers: list[PeerInfo], as_json: bool, as_static: bool = False) -> str:
    if as_json:
        return json.dumps([p.to_json() for p in peers], sort_keys=True)
    if as_static:
        return format_static(peers)
    return format_table(peers)


def _report_refusals(refusals: dict[str, int]) -> None:
    if refusals:
        counts = ", ".join(f"{reason}={n}" for reason, n in refusals.items())
        print(f"edge-node: discovery refused: {counts}", file=sys.stderr, flush=True)


@contextmanager
def _stop_on_signals(stop: threading.Event) -> Iterator[None]:
    """SIGINT/SIGTERM end the wait gracefully (goodbye sent, exit 0) instead of killing the process."""

    def handler(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


@app.command()
@click.option(
    "--interface",
    "interfaces",
    multiple=True,
    metavar="NAME|ADDR",
    help="Interface name or address to use (repeatable). Default: the interfaces with a default route.",
)
@click.option("--fleet", metavar="ID", help="Only list this fleet (and advertise in it with --announce).")
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=0.1, max=86400),
    metavar="S",
    help=f"Browse for S seconds, print the table, exit (default {DEFAULT_BROWSE_S:g} s).",
)
@click.option("--watch", is_flag=True, help="Print the table on every change until SIGINT/SIGTERM.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of peer objects instead of a table.")
@click.option(
    "--static",
    "as_static",
    is_flag=True,
    help="Print ID@HOST:PORT lines instead of a table: the syntax of --peers and of peers files.",
)
@click.option(
    "--max-peers",
    type=click.IntRange(1, 100_000),
    default=DEFAULT_MAX_PEERS,
    show_default=True,
    metavar="N",
    help="List at most N peers (discovery's bound; further newcomers are refused and counted).",
)
@click.option("--announce", "announce_id", metavar="ID", help="Also advertise this host under node id ID.")
@click.option("--port", type=click.IntRange(1, 65535), metavar="P", help="Port advertised with --announce.")
@click.option("--ipv6", is_flag=True, help="Use IPv6 (addresses of the named interfaces); IPv4 by default.")
@click.option(
    "--ttl",
    "ttl_s",
    type=click.IntRange(1, 4500),
    default=DEFAULT_TTL_S,
    show_default=True,
    metavar="S",
    help="TTL of the announcement: how long others list this host if it dies without a goodbye.",
)
def peers(
    interfaces: tuple[str, ...],
    fleet: str | None,
    timeout_s: float | None,
    watch: bool,
    as_json: bool,
    as_static: bool,
    max_peers: int,
    announce_id: str | None,
    port: int | None,
    ipv6: bool,
    ttl_s: int,
) -> None:
    """Browse for edge-node peers over mDNS and print the live peer table.

    With --announce ID (and --fleet, --port) this host is advertised too; without --timeout it
    announces until SIGINT/SIGTERM, printing the table on every change, then sends goodbye and exits 0.
    """
    if timeout_s is not None and watch:
        raise fail("--timeout and --watch exclude each other")
    if as_json and as_static:
        raise fail("--json and --static exclude each other")
    if announce_id is not None and (fleet is None or port is None):
        raise fail("--announce needs --fleet ID and --port P")
    if port is not None and announce_id is None:
        raise fail("--port is only used with --announce ID")
    from edge_node.net.discovery import MdnsDiscovery

    follow = watch or (announce_id is not None and timeout_s is None)
    duration_s = None if follow else (timeout_s if timeout_s is not None else DEFAULT_BROWSE_S)

    discovery = MdnsDiscovery(
        announce_id,
        port,
        fleet=fleet,
        interfaces=list(interfaces) or None,
        ipv6=ipv6,
        ttl_s=ttl_s,
        max_peers=max_peers,
    )
    changed = threading.Event()
    stop = threading.Event()
    discovery.add_listener(lambda event, peer: changed.set())
    with _stop_on_signals(stop):
        try:
            discovery.start()
        except DiscoveryError as exc:
            raise fail(str(exc), ExitCode.NETWORK) from None
        try:
            if announce_id is not None:
                print(
                    f"edge-node: announcing {announce_id} (fleet {fleet}) on {', '.join(discovery.addresses)}"
                    f" port {port}",
                    file=sys.stderr,
                    flush=True,
                )
            if duration_s is not None:
                stop.wait(duration_s)
                print(_render(discovery.peers(), as_json, as_static), flush=True)
                _report_refusals(discovery.refusals())
                return
            print(_render(discovery.peers(), as_json, as_static), flush=True)
            while not stop.is_set():
                if changed.wait(0.5):
                    changed.clear()
                    time.sleep(0.1)  # let a burst of changes settle into one print
                    if not as_json:
                        print(flush=True)
                    print(_render(discovery.peers(), as_json, as_static), flush=True)
            _report_refusals(discovery.refusals())
        finally:
            discovery.stop()
