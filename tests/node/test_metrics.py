"""The daemon's Prometheus endpoint: names, units and labels by Prometheus' conventions, scraped for real."""

from __future__ import annotations

import json
import re
import signal
import socket
from pathlib import Path
from typing import Any

import pytest

from edge_node.exit_codes import ExitCode
from edge_node.fleet.fleet import free_ports
from edge_node.node.metrics import NodeMetrics
from tests.daemons import QUICK, NodeProcesses, run_cli
from tests.prometheus import PROMETHEUS, PrometheusServer, scrape
from tests.run_dirs import node_record

STATUS: dict[str, Any] = {
    "node_id": "pi-1", "fleet": "lab", "version": "9.9", "model": "cnn/10/abcdef12", "phase": "train", "tier": "0.6",
    "density": 0.6, "healthy": True, "rounds_done": 2, "uptime_s": 30.0, "peers_known": ["a", "b"],
    "bytes_in_total": 2_000_000, "bytes_out_total": 4_000_000, "streams_unfinished_total": 5,
    "server_refusals": {"busy": 3},
    "discovery_refusals": {"other_fleet": 1},
    "peer_exchange": {"interval_s": 30.0, "learned": ["c"], "candidates": 0, "reached": ["a", "c"], "cycles": 4,
                      "asks": 8, "asks_failed": 1, "dials": 2},
}  # fmt: skip
DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "edge-node-fleet.json"
SOLO = ["--fleet", "test", "--num-clients", "6", "--client-index", "0", "--capacity", "0.4", "--discovery", "static",
        "--peers", "127.0.0.1:1"]  # fmt: skip


@pytest.fixture
def served():
    metrics = NodeMetrics(lambda: STATUS)
    port = metrics.serve("127.0.0.1:0")
    yield metrics, f"127.0.0.1:{port}"
    metrics.close()


def test_a_round_record_and_the_status_become_conventional_series(served):
    metrics, address = served
    metrics.observe_round(node_record("pi-1", 0, refusals={"stale": 1}, retries={"unreachable": 2}))
    metrics.observe_round(node_record("pi-1", 1, label="measured"))
    got = scrape(address)
    assert got["edge_node_rounds_total"] == 2
    assert got["edge_node_round_duration_seconds_count"] == 2 and got["edge_node_round_duration_seconds_sum"] == 20
    assert got['edge_node_phase_duration_seconds_sum{phase="train"}'] == 16
    assert got['edge_node_accuracy_ratio{stage="after_training"}'] == pytest.approx(0.4)
    assert got['edge_node_accuracy_ratio{stage="before_training"}'] == pytest.approx(0.2)
    assert got["edge_node_peers_asked_total"] == 4 and got["edge_node_peers_answered_total"] == 2
    assert got['edge_node_peers_refused_total{reason="stale"}'] == 1
    assert got['edge_node_pull_retries_total{reason="unreachable"}'] == 2
    assert got["edge_node_received_bytes_total"] == 2_000_000 and got["edge_node_sent_bytes_total"] == 4_000_000
    assert got['edge_node_server_refusals_total{reason="busy"}'] == 3
    assert got["edge_node_unfinished_streams_total"] == 5
    assert got['edge_node_discovery_refusals_total{reason="other_fleet"}'] == 1
    assert got["edge_node_peers_learned"] == 1 and got['edge_node_peer_exchange_calls_total{kind="ask_failed"}'] == 1
    assert got['edge_node_peer_exchange_calls_total{kind="ask"}'] == 8
    assert got['edge_node_phase{phase="train"}'] == 1 and got['edge_node_phase{phase="idle"}'] == 0
    assert got["edge_node_rounds_done"] == 2 and got["edge_node_tier_density_ratio"] == 0.6
    assert got['edge_node_build_info{fleet="lab",model="cnn/10/abcdef12",node_id="pi-1",version="9.9"}'] == 1


def test_an_estimate_never_looks_like_a_measurement(served):
    metrics, address = served
    metrics.observe_round(node_record("pi-1", 0, label="estimated"))
    got = scrape(address)
    assert got['edge_node_energy_estimated_joules_total{phase="train",source="estimate"}'] == 16
    assert not [k for k in got if k.startswith("edge_node_energy_joules")]  # no measured series from an estimate
    metrics.observe_round(node_record("pi-1", 1, label="measured"))
    assert scrape(address)['edge_node_energy_joules_total{phase="train",source="rapl"}'] == 16


def test_no_series_grows_with_the_fleet(served):
    metrics, address = served
    metrics.observe_round(node_record("pi-1", 0))
    before = set(scrape(address))
    for t in range(1, 6):
        record = node_record("pi-1", t)
        record["peers_asked"] = record["peers_answered"] = [f"peer-{t}-{i}" for i in range(20)]
        metrics.observe_round(record)
    assert set(scrape(address)) == before


def dashboard_queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]


def test_the_grafana_dashboard_asks_only_for_series_a_node_exports(served):
    metrics, address = served
    metrics.observe_round(node_record("pi-1", 0, refusals={"stale": 1}, retries={"unreachable": 2}))
    metrics.observe_round(node_record("pi-1", 1, label="measured"))
    exported = {re.sub(r"\{.*", "", name) for name in scrape(address)}
    asked = {name for expression in dashboard_queries() for name in re.findall(r"edge_node_[a-z_]+", expression)}
    assert asked and asked <= exported, asked - exported


def test_bad_or_busy_metrics_listen_is_refused_before_anything_is_written(tmp_path: Path):
    bad = run_cli(["start", *QUICK, *SOLO, "--state-dir", str(tmp_path / "a"), "--metrics-listen", "9478"])
    assert bad.returncode == int(ExitCode.BAD_INPUT) and "metrics_listen='9478' must be HOST:PORT" in bad.stderr
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        (port,) = free_ports(1)
        busy = run_cli(["start", *QUICK, *SOLO, "--state-dir", str(tmp_path / "b"), "--listen", f"127.0.0.1:{port}",
                        "--metrics-listen", f"127.0.0.1:{holder.getsockname()[1]}"])  # fmt: skip
    assert busy.returncode == int(ExitCode.NETWORK) and "metrics_listen" in busy.stderr, busy.stderr
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


@pytest.mark.skipif(PROMETHEUS is None, reason="prometheus is not installed (apt-get install prometheus)")
def test_prometheus_scrapes_a_running_daemon(tmp_path: Path):
    port, metrics_port = free_ports(2)
    args = [*QUICK, *SOLO, "--listen", f"127.0.0.1:{port}", "--metrics-listen", f"127.0.0.1:{metrics_port}"]
    with NodeProcesses() as nodes, PrometheusServer(tmp_path / "prom", [f"127.0.0.1:{metrics_port}"]) as prom:
        node = nodes.start("solo", tmp_path / "solo", args)
        node.wait_rounds(1, 240)
        rounds = prom.wait_for("edge_node_rounds_total >= 1", timeout_s=60)
        assert rounds[0]["metric"]["job"] == "edge-node"
        after = prom.wait_for('edge_node_accuracy_ratio{stage="after_training"}', timeout_s=30)
        assert abs(float(after[0]["value"][1]) - node.records[0]["acc_after"]) < 1e-6 or len(node.records) > 1
        assert prom.wait_for('edge_node_build_info{node_id="solo",fleet="test"}', timeout_s=30)
        assert prom.wait_for('edge_node_energy_estimated_joules_total{phase="train",source="estimate"} > 0', 30)
        assert not prom.query("edge_node_energy_joules_total")  # the estimate is never a measurement
        for expression in dashboard_queries():  # the Grafana dashboard's PromQL parses and runs
            answer = prom.answer(expression.replace("$job", ".*").replace("$fleet", ".*"))
            assert answer["status"] == "success", (expression, answer)
        node.signal(signal.SIGTERM)
        assert node.wait(30) == 0, node.log()
