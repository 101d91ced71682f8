"""The operator's view of a real fleet: 3 loopback daemons with metrics on, scraped by a real Prometheus,
shown by ``edge-node fleet``, then reported from their output and from one node's state directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edge_node.fleet.fleet import METRICS_TARGETS, Fleet
from tests.fleet.fleets import FLEET_TIMEOUT_S, config, records, run_cli, wait_until
from tests.prometheus import PROMETHEUS, PrometheusServer

pytestmark = pytest.mark.skipif(PROMETHEUS is None, reason="prometheus is not installed (apt-get install prometheus)")


def test_three_nodes_scraped_by_prometheus_shown_by_the_fleet_view_and_reported(tmp_path: Path):
    out = tmp_path / "fleet"
    with Fleet(config(out, nodes=3, rounds=20, metrics=True)) as fleet:
        targets = json.loads((out / METRICS_TARGETS).read_text())[0]["targets"]
        assert targets == fleet.metrics_endpoints and len(targets) == 3
        fleet.start()
        ids = fleet.config.node_ids
        with PrometheusServer(tmp_path / "prom", targets) as prom:
            wait_until(fleet, lambda: all(len(records(fleet, n)) >= 1 for n in ids), FLEET_TIMEOUT_S, "1 round each")
            found = prom.wait_for("edge_node_rounds_done >= 1", timeout_s=60)
            assert prom.wait_for("count(edge_node_rounds_done >= 1) == 3", timeout_s=60)
            assert {r["metric"]["instance"] for r in found} <= set(targets)
            by_node = prom.wait_for('edge_node_build_info{fleet="loopback"}', timeout_s=30)
            assert sorted(r["metric"]["node_id"] for r in by_node) == ids

            shown = run_cli(["fleet", "--nodes", ",".join(targets), "--json"], timeout_s=60)
            assert shown.returncode == 0, shown.stderr
            rows = json.loads(shown.stdout)
            assert [r["node_id"] for r in rows] == ids and all(r["error"] is None for r in rows)
            assert all(r["rounds_done"] >= 1 and r["tier"] == 0.6 and 0 <= r["acc_after"] <= 1 for r in rows), rows
            table = run_cli(["fleet", "--nodes", ",".join(targets)], timeout_s=60)
            lines = table.stdout.splitlines()
            header = ["ID", "HOST", "TIER", "ROUND", "PHASE", "METRIC", "SAMPLES", "LAST", "ROUND", "REFUSALS"]
            assert table.returncode == 0 and lines[0].split() == header, table.stdout
            assert [line.split()[0] for line in lines[1:]] == ids
        fleet.stop()
        done = {n: len(records(fleet, n)) for n in ids}

    fleet_report = run_cli(["report", str(out)], timeout_s=120)
    assert fleet_report.returncode == 0, fleet_report.stderr
    assert "**Stopped early**" in fleet_report.stdout  # stopped by the test long before its 20 rounds
    for node_id, count in done.items():
        assert f"| {node_id} | 0.6 | {count} of 20 rounds done: stopped early |" in fleet_report.stdout
    node_report = run_cli(["report", str(out / "node1"), "--output", str(tmp_path / "node1-report")], timeout_s=120)
    assert node_report.returncode == 0, node_report.stderr
    assert f"| node1 | 0.6 | {done['node1']} of 20 rounds done: stopped early |" in node_report.stdout
    assert (tmp_path / "node1-report" / "run-report.png").stat().st_size > 0


def test_an_unreachable_node_is_a_row_with_its_reason_and_exit_3(tmp_path: Path):
    from edge_node.fleet.fleet import free_ports

    (port,) = free_ports(1)
    result = run_cli(["fleet", "--nodes", f"127.0.0.1:{port}"], timeout_s=60)
    assert result.returncode == 3
    row = result.stdout.splitlines()[1]
    assert row.startswith(f"?   127.0.0.1:{port}") and "unreachable" in row and "None" not in row


@pytest.mark.netns
def test_the_fleet_view_finds_the_nodes_over_mdns(tmp_path: Path, require_root: None):
    """No list, no inventory: ``edge-node fleet`` browses mDNS on a device's bridge (inside one node's namespace)
    and reads every node's metrics port; ``--fleet`` keeps only that fleet's nodes."""
    from edge_node.fleet.fleet import METRICS_PORT
    from edge_node.fleet.netns import run_in_netns
    from tests.fleet.fleets import EDGE_NODE

    out = tmp_path / "fleet"
    with Fleet(config(out, nodes=2, rounds=20, metrics=True, netns=True)) as fleet:
        fleet.start()
        ids = fleet.config.node_ids
        wait_until(fleet, lambda: all(len(records(fleet, n)) >= 1 for n in ids), FLEET_TIMEOUT_S, "1 round each")
        assert fleet.net is not None
        browse = [*EDGE_NODE, "fleet", "--interface", fleet.net.addresses[0], "--metrics-port", str(METRICS_PORT),
                  "--timeout", "5", "--json"]  # fmt: skip
        shown = run_in_netns(fleet.net.namespaces[0], [*browse, "--fleet", "loopback"], timeout_s=90)
        assert shown.returncode == 0, shown.stderr
        rows = json.loads(shown.stdout)
        assert sorted(r["node_id"] for r in rows) == ids and all(r["error"] is None for r in rows), rows
        assert {r["endpoint"] for r in rows} == {f"{a}:{METRICS_PORT}" for a in fleet.net.addresses}, rows
        other = run_in_netns(fleet.net.namespaces[0], [*browse, "--fleet", "another-fleet"], timeout_s=90)
        assert other.returncode == 3 and "no node found" in other.stderr, (other.stdout, other.stderr)
        fleet.stop()
