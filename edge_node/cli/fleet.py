"""``edge-node fleet``: every node of a fleet in one table, read from their metrics endpoints (never controlled).

Where the nodes are: ``--nodes HOST:PORT,...`` (their ``metrics_listen``), ``--inventory`` (an Ansible INI
inventory: ``ansible_host`` and the port of ``edge_node_metrics_listen``), or, with neither, mDNS (the host
each node advertises, with the fleet's ``--metrics-port``). Once, or live with ``--watch``; ``--json`` for
scripts. Under mutual TLS pass a fleet certificate (``--tls-ca/--tls-cert/--tls-key``): the nodes serve
their metrics to fleet members only.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType

import click

from edge_node.cli._app import app, fail
from edge_node.errors import DiscoveryError
from edge_node.exit_codes import ExitCode

DEFAULT_METRICS_PORT = 9478  # = edge_node.fleet.view.DEFAULT_METRICS_PORT (kept import-free: fast help)
DEFAULT_BROWSE_S = 3.0


def _mdns_endpoints(interfaces: tuple[str, ...], fleet: str | None, browse_s: float, port: int) -> list[str]:
    """The hosts advertised over mDNS (of ``fleet`` when given), each with the metrics ``port``."""
    from edge_node.net.discovery import MdnsDiscovery

    discovery = MdnsDiscovery(None, None, fleet=fleet, interfaces=list(interfaces) or None)
    try:
        discovery.start()
    except DiscoveryError as exc:
        raise fail(str(exc), ExitCode.NETWORK) from None
    try:
        time.sleep(browse_s)
        peers = discovery.peers()
    finally:
        discovery.stop()
    return sorted({f"{p.endpoint.rpartition(':')[0]}:{port}" for p in peers})


@app.command()
@click.option("--nodes", metavar="HOST:PORT,...", help="The nodes' metrics endpoints (metrics_listen).")
@click.option("--inventory", type=click.Path(dir_okay=False, path_type=Path), help="An Ansible INI inventory.")
@click.option("--interface", "interfaces", multiple=True, metavar="NAME|ADDR",
              help="mDNS: interface to browse on (repeatable) [default: those with a default route].")  # fmt: skip
@click.option("--fleet", "fleet_id", metavar="ID", help="Only nodes of this fleet.")
@click.option("--metrics-port", type=click.IntRange(1, 65535), default=DEFAULT_METRICS_PORT, show_default=True,
              help="mDNS: the metrics port of the fleet's nodes (mDNS advertises the peer port).")  # fmt: skip
@click.option("--timeout", "browse_s", type=click.FloatRange(0.1, 600), default=DEFAULT_BROWSE_S, show_default=True,
              help="mDNS: seconds to browse.")  # fmt: skip
@click.option("--watch", is_flag=True, help="Refresh until SIGINT/SIGTERM (a live table in a terminal).")
@click.option("--interval", "interval_s", type=click.FloatRange(1, 3600), default=5.0, show_default=True,
              help="Seconds between refreshes with --watch.")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="A JSON list of the nodes (one list per refresh).")
@click.option("--tls-ca", type=click.Path(dir_okay=False, path_type=Path), help="Fleet CA (HTTPS metrics).")
@click.option("--tls-cert", type=click.Path(dir_okay=False, path_type=Path), help="A fleet certificate to show.")
@click.option("--tls-key", type=click.Path(dir_okay=False, path_type=Path), help="Its private key.")
def fleet(nodes: str | None, inventory: Path | None, interfaces: tuple[str, ...], fleet_id: str | None,
          metrics_port: int, browse_s: float, watch: bool, interval_s: float, as_json: bool, tls_ca: Path | None,
          tls_cert: Path | None, tls_key: Path | None) -> None:  # fmt: skip
    """Every node of the fleet in one table: id, host, tier, round, phase, accuracy, last round, refusals.

    Reads each node's metrics endpoint; changes nothing on any node. Exit 0 when every node answered,
    3 when one did not (or none was found).
    """
    from edge_node.fleet.view import format_json, format_table, inventory_endpoints, parse_endpoints, read_fleet

    if nodes is not None and inventory is not None:
        raise fail("--nodes and --inventory exclude each other")
    tls_files = [tls_ca, tls_cert, tls_key]
    if any(tls_files) and not all(tls_files):
        raise fail("TLS needs all three of --tls-ca, --tls-cert and --tls-key")
    tls = (tls_ca, tls_cert, tls_key) if tls_ca and tls_cert and tls_key else None
    for path in [p for p in tls_files if p is not None]:
        if not path.is_file():
            raise fail(f"cannot read {path}")
    if nodes is not None:
        endpoints = parse_endpoints(nodes)
    elif inventory is not None:
        endpoints = inventory_endpoints(inventory)
    else:
        endpoints = _mdns_endpoints(interfaces, fleet_id, browse_s, metrics_port)
    if not endpoints:
        raise fail("no node found (give --nodes or --inventory, or check mDNS with edge-node peers)", ExitCode.NETWORK)

    def snapshot() -> tuple[str, bool]:
        rows = [r for r in read_fleet(endpoints, tls) if fleet_id is None or r.error or r.fleet == fleet_id]
        text = format_json(rows) if as_json else format_table(rows, time.time())
        return text, all(r.error is None for r in rows)

    if not watch:
        text, all_read = snapshot()
        click.echo(text)
        if not all_read:
            raise click.exceptions.Exit(int(ExitCode.NETWORK))
        return
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        if sys.stdout.isatty() and not as_json:
            from rich.live import Live
            from rich.text import Text

            with Live(Text(snapshot()[0]), auto_refresh=False) as live:
                while not stop.wait(interval_s):
                    live.update(Text(snapshot()[0]), refresh=True)
        else:
            while True:
                click.echo(snapshot()[0] + ("" if as_json else "\n"))
                if stop.wait(interval_s):
                    break
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
