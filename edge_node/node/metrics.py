"""The daemon's Prometheus endpoint (``metrics_listen``; off unless set), fed from what the node already has.

Two sources, so that the daemon needs only a hook per round:

- each round's record (the one appended to ``rounds.jsonl``), through :meth:`NodeMetrics.observe_round`:
  rounds, round and phase durations, accuracy before and after local training, peers asked, answered
  and refused by reason, energy by phase, samples that arrived; and, through
  :meth:`NodeMetrics.export_failed`, rounds whose ``model.onnx`` could not be written;
- the status snapshot (what ``edge-node status`` shows), read at every scrape: phase, rounds done,
  tier and density, training and test samples, bytes in and out, server, discovery and data refusals by
  reason, build info.

Names and units follow Prometheus' conventions (``_total`` counters, ``_seconds``, ``_bytes``, ``_joules``,
``_ratio``). No label takes a value per peer: a fleet of any size gives each node the same series.
Measured energy is ``edge_node_energy_joules_total``; an estimate (CPU time x a power model) has its own
name, ``edge_node_energy_estimated_joules_total``, so that it never adds up with, or looks like, a
measurement. Both carry the meter's ``source``.

The endpoint is plain HTTP on the address given (``127.0.0.1:9478`` keeps it on the device); with the
node's TLS material it is HTTPS and asks for a client certificate of the fleet CA, so that only fleet
members (and an operator holding a fleet certificate) can read it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector

from edge_node.errors import ListenError

_LOGGER = logging.getLogger(__name__)

PHASES = ("communicate", "aggregate", "train", "idle")  # = edge_node.energy.accounting's phases
NODE_PHASES = ("starting", "idle", "communicate", "aggregate", "train", "stopping", "stopped")
ROUND_BUCKETS_S = (1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 1800, 3600)
PHASE_BUCKETS_S = (0.01, 0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800)


class _StatusCollector(Collector):
    """Series read from the node's status snapshot at scrape time (live phase, totals since start)."""

    def __init__(self, status: Callable[[], dict[str, Any]]) -> None:
        self._status = status

    def collect(self) -> Iterator[Metric]:
        status = self._status()
        info = InfoMetricFamily("edge_node_build", "The node's software and identity (value 1).")
        info.add_metric([], {k: str(status.get(k) or "") for k in ("version", "node_id", "fleet", "model")})
        yield info
        yield one_hot(
            "edge_node_phase", "1 for the phase the node is in now.", "phase", NODE_PHASES, status.get("phase")
        )
        for name, key, text in (
            ("edge_node_rounds_done", "rounds_done", "Rounds the node's checkpoint holds (its round counter)."),
            ("edge_node_tier_density_ratio", "tier", "Density of the node's capacity tier (0.2 .. 1.0)."),
            ("edge_node_density_ratio", "density", "Density of the node's sparse model (kept fraction)."),
            ("edge_node_healthy", "healthy", "1 while the node's main loop is alive and it is not stopping."),
            ("edge_node_uptime_seconds", "uptime_s", "Seconds since this daemon started."),
            ("edge_node_peers_known", "peers_known", "Peers discovery lists now."),
            ("edge_node_train_samples", "train_samples", "Training samples the node trains on now."),
            ("edge_node_test_samples", "test_samples", "Test samples the node evaluates on now."),
        ):
            value = status.get(key)
            if key == "peers_known":
                value = len(value or [])
            if value is not None:
                yield GaugeMetricFamily(name, text, value=float(value))
        for name, key, text in (
            ("edge_node_received_bytes", "bytes_in_total", "Encoded model bytes pulled from peers since start."),
            ("edge_node_sent_bytes", "bytes_out_total", "Encoded model bytes served to peers since start."),
            (
                "edge_node_unfinished_streams",
                "streams_unfinished_total",
                "Model streams served that ended before their last message (reader gone, cancelled, or cut at the"
                " connection's age).",
            ),
        ):
            yield CounterMetricFamily(name, text, value=float(status.get(key) or 0))
        for name, key, text in (
            ("edge_node_server_refusals", "server_refusals", "Requests the node's gRPC server refused, by reason."),
            ("edge_node_discovery_refusals", "discovery_refusals", "Advertisements discovery ignored, by reason."),
            (
                "edge_node_data_refused",
                "data_refused",
                "Data files the node skipped (undecodable, wrong_size, unknown_class, ...) and re-reads it could not "
                "use (folder_missing, no_samples, factory_error), by reason (data_refresh round).",
            ),
        ):
            family = CounterMetricFamily(name, text, labels=["reason"])
            for reason, count in sorted((status.get(key) or {}).items()):
                family.add_metric([str(reason)], float(count))
            yield family
        exchange = status.get("peer_exchange") or {}
        yield GaugeMetricFamily(
            "edge_node_peers_learned", "Peers listed through peer exchange now (verified by this node's Hello).",
            value=float(len(exchange.get("learned") or [])),
        )  # fmt: skip
        calls = CounterMetricFamily(
            "edge_node_peer_exchange_calls", "Peer-exchange calls since start: ask (Hello and ListPeers of a known "
            "peer), ask_failed (of them, unanswered), dial (Hello to a learned entry not verified yet).",
            labels=["kind"],
        )  # fmt: skip
        for kind, key in (("ask", "asks"), ("ask_failed", "asks_failed"), ("dial", "dials")):
            calls.add_metric([kind], float(exchange.get(key) or 0))
        yield calls
        moves = CounterMetricFamily(
            "edge_node_tier_moves", "Tier moves of capacity auto after a sustained change of free CPU, by direction.",
            labels=["direction"],
        )  # fmt: skip
        for direction, count in sorted((status.get("tier_moves") or {}).items()):
            moves.add_metric([str(direction)], float(count))
        yield moves


def one_hot(name: str, text: str, label: str, states: tuple[str, ...], current: Any) -> GaugeMetricFamily:
    """A gauge over a fixed set of states: 1 for ``current``, 0 for the others."""
    family = GaugeMetricFamily(name, text, labels=[label])
    for state in states:
        family.add_metric([state], 1.0 if state == current else 0.0)
    return family


class NodeMetrics:
    """The node's metrics in their own registry; :meth:`observe_round` feeds them, :meth:`serve` exposes them."""

    def __init__(self, status: Callable[[], dict[str, Any]]) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_StatusCollector(status))
        reg = self.registry
        self.rounds = Counter("edge_node_rounds", "Rounds completed by this daemon since it started.", registry=reg)
        self.round_seconds = Histogram(
            "edge_node_round_duration_seconds", "Wall time of a completed round.", buckets=ROUND_BUCKETS_S, registry=reg
        )
        self.phase_seconds = Histogram(
            "edge_node_phase_duration_seconds", "Wall time of a round's phase.", ["phase"], buckets=PHASE_BUCKETS_S,
            registry=reg,
        )  # fmt: skip
        self.accuracy = Gauge(
            "edge_node_accuracy_ratio", "Local test accuracy in the last round, before (the aggregate) and after "
            "local training (classification only; see edge_node_task_metric).", ["stage"], registry=reg,
        )  # fmt: skip
        self.task_metric = Gauge(
            "edge_node_task_metric", "The task's headline metric on the local test set in the last round (accuracy, "
            "mae, micro_f1, ...), before and after local training; direction says which way is better.",
            ["stage", "metric", "direction"], registry=reg,
        )  # fmt: skip
        self.last_round = Gauge(
            "edge_node_last_round_timestamp_seconds", "Unix time the last round was recorded.", registry=reg
        )
        self.asked = Counter("edge_node_peers_asked", "Peers asked for their model.", registry=reg)
        self.answered = Counter("edge_node_peers_answered", "Peers whose model was accepted.", registry=reg)
        self.refused = Counter(
            "edge_node_peers_refused", "Peers refused in a round, by reason.", ["reason"], registry=reg
        )
        self.pull_retries = Counter(
            "edge_node_pull_retries",
            "Pull calls retried after a transient failure (a lost connection, a timeout, a busy peer), by kind.",
            ["reason"],
            registry=reg,
        )
        self.measured = Counter(
            "edge_node_energy_joules", "Measured energy by phase; source: the meter.", ["phase", "source"], registry=reg
        )
        self.estimated = Counter(
            "edge_node_energy_estimated_joules", "ESTIMATED energy (CPU time x a power model, no meter) by phase.",
            ["phase", "source"], registry=reg,
        )  # fmt: skip
        self.arrived = Counter(
            "edge_node_samples_arrived", "Samples that arrived in the node's data between rounds (data_refresh round).",
            registry=reg,
        )  # fmt: skip
        self.export_failures = Counter(
            "edge_node_export_failures", "Rounds whose model could not be handed over or written as model.onnx "
            "(export_onnx: the exporter, a full disk; the pair handed over before stays, training goes on).",
            registry=reg,
        )  # fmt: skip
        self.handovers = Counter(
            "edge_node_handover_rounds", "Rounds whose model was handed over (outcome handed_over) or not, the one "
            "handed over before scoring better (kept; handover = best).", ["outcome"], registry=reg,
        )  # fmt: skip
        self._server: Any = None
        self._thread: threading.Thread | None = None

    def export_failed(self) -> None:
        """Count a round whose handover failed (edge_node.node.handover)."""
        self.export_failures.inc()

    def handover_outcome(self, outcome: str) -> None:
        """Count a round's handover: "handed_over" or "kept" (edge_node.node.handover)."""
        self.handovers.labels(outcome=outcome).inc()

    def observe_round(self, record: dict[str, Any]) -> None:
        """Count a completed round from its ``rounds.jsonl`` record."""
        self.rounds.inc()
        seconds = record.get("seconds") or {}
        self.round_seconds.observe(sum(float(v) for v in seconds.values()))
        for phase, value in seconds.items():
            self.phase_seconds.labels(phase=phase).observe(float(value))
        metric = str(record.get("metric") or "accuracy")
        direction = "higher" if record.get("metric_higher_is_better", True) else "lower"
        for stage, key in (("before_training", "acc_before"), ("after_training", "acc_after")):
            if record.get(key) is not None:
                if metric == "accuracy":
                    self.accuracy.labels(stage=stage).set(float(record[key]))
                self.task_metric.labels(stage=stage, metric=metric, direction=direction).set(float(record[key]))
        self.last_round.set(float(record.get("time_unix") or 0.0))
        self.arrived.inc(int(record.get("samples_arrived") or 0))
        self.asked.inc(len(record.get("peers_asked") or []))
        self.answered.inc(len(record.get("peers_answered") or []))
        for reason, count in (record.get("refusals") or {}).items():
            self.refused.labels(reason=reason).inc(int(count))
        for reason, count in (record.get("pull_retries") or {}).items():
            self.pull_retries.labels(reason=reason).inc(int(count))
        energy = self.measured if record.get("energy_label") == "measured" else self.estimated
        source = str(record.get("energy_source") or "unknown")
        for phase, joules in (record.get("joules") or {}).items():
            energy.labels(phase=phase, source=source).inc(max(float(joules), 0.0))

    def serve(self, listen: str, tls: tuple[str, str, str] | None = None) -> int:
        """Expose the registry on ``HOST:PORT`` (HTTPS with a required fleet client certificate when ``tls`` =
        (ca, cert, key)); returns the port (0 picks a free one).

        Raises:
            ListenError: the address cannot be listened on.
        """
        host, _, port = listen.rpartition(":")
        host = host.strip("[]")
        kwargs: dict[str, Any] = {}
        if tls is not None:
            ca, cert, key = tls
            kwargs = {"certfile": cert, "keyfile": key, "client_cafile": ca, "client_auth_required": True}
        try:
            self._server, self._thread = start_http_server(int(port), addr=host, registry=self.registry, **kwargs)
        except OSError as exc:
            raise ListenError(f"metrics_listen={listen!r}: cannot listen: {exc.strerror or exc}") from exc
        bound = int(self._server.server_address[1])
        _LOGGER.info("Prometheus metrics on %s://%s:%d/metrics", "https" if tls else "http", host, bound)
        return bound

    def close(self) -> None:
        """Stop serving (no-op when it never served)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=2)
            self._thread = None


def start_metrics(config: Any, status: Callable[[], dict[str, Any]]) -> NodeMetrics:
    """The node's metrics, served when ``config.metrics_listen`` is set (with its TLS material when it has some)."""
    metrics = NodeMetrics(status)
    if config.metrics_listen:
        tls = (str(config.tls_ca), str(config.tls_cert), str(config.tls_key)) if config.tls_enabled else None
        metrics.serve(config.metrics_listen, tls)
    return metrics
