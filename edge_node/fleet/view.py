"""The whole fleet from one machine: each node's metrics endpoint read (never written) into one table.

A node is read over HTTP(S) GET ``/metrics`` (``metrics_listen``, edge_node/node/metrics.py), parsed by
``prometheus_client``'s own parser: id, host, tier, round, phase, accuracy after local training, its
training and test samples, when its last round was recorded, refusals. Nothing on the node can be changed
this way. Under mutual TLS the endpoint asks for a certificate of the fleet CA, so only fleet members (or an
operator holding one) can read it. Where the nodes are comes from a list, an Ansible inventory, or mDNS (the
host a node advertises, with the fleet's metrics port).
"""

from __future__ import annotations

import json
import math
import ssl
import time
import urllib.request
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from edge_node.errors import ConfigError
from edge_node.task_names import FRACTION_METRICS, format_metric

DEFAULT_METRICS_PORT = 9478
SCRAPE_TIMEOUT_S = 3.0
MAX_METRICS_BYTES = 4 << 20  # a node's exposition is a few KiB; more is not a node of ours
MAX_NODES = 1024
_REFUSAL_SERIES = ("edge_node_peers_refused_total", "edge_node_server_refusals_total",
                   "edge_node_discovery_refusals_total")  # fmt: skip


@dataclass(frozen=True)
class NodeRow:
    """One node as the fleet view shows it; ``error`` says why it could not be read."""

    endpoint: str
    node_id: str | None = None
    fleet: str | None = None
    tier: float | None = None
    tier_moves: int | None = None  # capacity auto's moves since start (None: a node that does not say)
    rounds_done: int | None = None
    phase: str | None = None
    acc_after: float | None = None  # the task's headline metric after local training (accuracy, mae, ...)
    metric: str = "accuracy"
    last_round_unix: float | None = None
    refusals: int | None = None
    train_samples: int | None = None
    test_samples: int | None = None
    healthy: bool | None = None
    read_unix: float | None = None
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def parse_endpoints(text: str) -> list[str]:
    """``host:port,host2:port`` (or ``host`` with the default metrics port) as ``HOST:PORT`` strings."""
    out = []
    for item in text.replace(",", " ").split():
        host, sep, port = item.rpartition(":")
        if not sep:
            host, port = item, str(DEFAULT_METRICS_PORT)
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"--nodes entry {item!r} must be HOST:PORT (or HOST for port {DEFAULT_METRICS_PORT})")
        out.append(f"{host}:{int(port)}")
    if len(out) > MAX_NODES:
        raise ConfigError(f"--nodes lists {len(out)} endpoints; at most {MAX_NODES}")
    return out


def inventory_endpoints(path: Path) -> list[str]:
    """The metrics endpoints of an Ansible INI inventory's hosts: ``ansible_host`` (else the name) and the port
    of ``edge_node_metrics_listen`` (host line, else ``[all:vars]``, else the default port)."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read inventory {path}: {exc.strerror or exc}") from exc
    hosts: dict[str, dict[str, str]] = {}
    common: dict[str, str] = {}
    section = "ungrouped"
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].split(";", 1)[0].strip()
        if not line:
            continue
        if line.startswith("["):
            if not line.endswith("]"):
                raise ConfigError(f"{path}:{number}: malformed section {raw.strip()!r}")
            section = line[1:-1].strip()
            continue
        if section.endswith(":children"):
            continue
        if section.endswith(":vars"):
            key, sep, value = line.partition("=")
            if section == "all:vars" and sep:
                common[key.strip()] = value.strip().strip("'\"")
            continue
        name, *pairs = line.split()
        values = hosts.setdefault(name, {})
        for pair in pairs:
            key, sep, value = pair.partition("=")
            if sep:
                values[key] = value.strip("'\"")
    if not hosts:
        raise ConfigError(f"inventory {path} lists no host")
    endpoints = []
    for name, values in hosts.items():
        listen = values.get("edge_node_metrics_listen", common.get("edge_node_metrics_listen", ""))
        port = listen.rpartition(":")[2] if listen else str(DEFAULT_METRICS_PORT)
        endpoints.append(f"{values.get('ansible_host', name)}:{port}")
    return parse_endpoints(",".join(endpoints))


def _ssl_context(tls: Tls | None) -> ssl.SSLContext | None:
    """Client context of a fleet member: the fleet CA to trust, this operator's certificate to show."""
    if tls is None:
        return None
    ca, cert, key = tls
    context = ssl.create_default_context(cafile=str(ca))
    context.check_hostname = False  # nodes are reached by address; the fleet CA is what is checked
    context.load_cert_chain(str(cert), str(key))
    return context


Tls = tuple[Path, Path, Path]  # (fleet CA, this operator's certificate, its key)


def read_node(endpoint: str, tls: Tls | None = None, timeout_s: float = SCRAPE_TIMEOUT_S) -> NodeRow:
    """One node's row from its ``/metrics`` (a row with ``error`` when it cannot be read or is no node)."""
    scheme = "https" if tls else "http"
    try:
        context = _ssl_context(tls)
        with urllib.request.urlopen(f"{scheme}://{endpoint}/metrics", timeout=timeout_s, context=context) as answer:
            body = answer.read(MAX_METRICS_BYTES + 1)
        if len(body) > MAX_METRICS_BYTES:
            return NodeRow(endpoint, error=f"answer larger than {MAX_METRICS_BYTES} bytes")
        return parse_metrics(endpoint, body.decode("utf-8"), time.time())
    except (OSError, ValueError, ssl.SSLError) as exc:
        reason = getattr(exc, "reason", None) or exc
        return NodeRow(endpoint, error=f"unreachable: {reason}")


def parse_metrics(endpoint: str, text: str, now: float) -> NodeRow:
    """A node's row from its exposition; a row with ``error`` when the text holds no edge-node series."""
    values: dict[str, float] = {}
    labels: dict[str, dict[str, str]] = {}
    refusals = 0.0
    phase = None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in _REFUSAL_SERIES:
                refusals += sample.value
            elif sample.name == "edge_node_phase" and sample.value == 1:
                phase = sample.labels.get("phase")
            elif sample.name == "edge_node_accuracy_ratio":
                values[f"accuracy_{sample.labels.get('stage')}"] = sample.value
            elif sample.name == "edge_node_task_metric" and sample.labels.get("stage") == "after_training":
                values["metric_after_training"] = sample.value
                labels["metric_after_training"] = dict(sample.labels)
            elif sample.name == "edge_node_tier_moves_total":  # one sample per direction: their sum
                values[sample.name] = values.get(sample.name, 0.0) + sample.value
            else:
                values[sample.name] = sample.value
                labels[sample.name] = dict(sample.labels)
    if "edge_node_build_info" not in values:
        return NodeRow(endpoint, error="not an edge-node metrics endpoint (no edge_node_build_info)")

    def number(name: str) -> float | None:
        value = values.get(name)
        return value if value is not None and math.isfinite(value) else None

    rounds = number("edge_node_rounds_done")
    moves = number("edge_node_tier_moves_total")
    last = number("edge_node_last_round_timestamp_seconds")
    healthy = number("edge_node_healthy")
    train, test = number("edge_node_train_samples"), number("edge_node_test_samples")
    metric = labels.get("metric_after_training", {}).get("metric", "accuracy")
    after = number("metric_after_training") if "metric_after_training" in values else number("accuracy_after_training")
    return NodeRow(
        endpoint=endpoint, node_id=labels["edge_node_build_info"].get("node_id"),
        fleet=labels["edge_node_build_info"].get("fleet"),
        tier=number("edge_node_tier_density_ratio"), tier_moves=None if moves is None else int(moves),
        rounds_done=None if rounds is None else int(rounds), phase=phase,
        acc_after=after, metric=metric, last_round_unix=last if last else None, refusals=int(refusals),
        train_samples=None if train is None else int(train), test_samples=None if test is None else int(test),
        healthy=None if healthy is None else healthy == 1, read_unix=now,
    )  # fmt: skip


def read_fleet(endpoints: Iterable[str], tls: Tls | None = None) -> list[NodeRow]:
    """Every node's row, read in parallel (each bounded by its timeout), sorted by node id then endpoint."""
    endpoints = list(endpoints)
    if not endpoints:
        return []
    with ThreadPoolExecutor(max_workers=min(16, len(endpoints)), thread_name_prefix="edge-node-fleet") as pool:
        rows = list(pool.map(lambda e: read_node(e, tls), endpoints))
    return sorted(rows, key=lambda r: (r.node_id is None, r.node_id or "", r.endpoint))


COLUMNS = ("ID", "HOST", "TIER", "ROUND", "PHASE", "METRIC", "SAMPLES", "LAST ROUND", "REFUSALS")


def _metric_cell(row: NodeRow) -> str:
    """``61.4%`` for accuracy (after local training); another task's metric by name: ``mae 54.07``."""
    if row.acc_after is None:
        return "-"
    if row.metric == "accuracy":
        return f"{100 * row.acc_after:.1f}%"
    return f"{row.metric} {format_metric(row.acc_after, fraction=row.metric in FRACTION_METRICS)}"


def row_cells(row: NodeRow, now: float) -> tuple[str, ...]:
    """The table's cells of one row (``-`` where unknown; an unreadable node says why)."""
    if row.error:
        return ("?", row.endpoint, "-", "-", row.error, "-", "-", "-", "-")
    ago = "-" if row.last_round_unix is None else f"{max(now - row.last_round_unix, 0):.0f} s ago"
    phase = (row.phase or "-") + ("" if row.healthy in (True, None) else " (NOT healthy)")
    return (
        row.node_id or "?", row.endpoint, _tier_cell(row),
        "-" if row.rounds_done is None else f"{row.rounds_done} done", phase,
        _metric_cell(row), _samples_cell(row), ago, str(row.refusals),
    )  # fmt: skip


def _tier_cell(row: NodeRow) -> str:
    """``0.6``, or ``0.2 (moved 1x)`` after capacity auto moved the node (``-`` for a node that does not say)."""
    if row.tier is None:
        return "-"
    return f"{row.tier:g}" + (f" (moved {row.tier_moves}x)" if row.tier_moves else "")


def _samples_cell(row: NodeRow) -> str:
    """``600/120``: training / test samples now (``-`` for a node that does not say)."""
    if row.train_samples is None or row.test_samples is None:
        return "-"
    return f"{row.train_samples}/{row.test_samples}"


def format_table(rows: list[NodeRow], now: float) -> str:
    """Aligned columns, one row per node."""
    table = [COLUMNS, *(row_cells(r, now) for r in rows)]
    widths = [max(len(line[i]) for line in table) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in table)


def format_json(rows: list[NodeRow]) -> str:
    return json.dumps([r.to_json() for r in rows], sort_keys=True)
