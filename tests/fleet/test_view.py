"""``edge-node fleet``'s parts: where the nodes are (list, Ansible inventory), and mutual TLS on the metrics."""

from __future__ import annotations

import ssl
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from edge_node.errors import ConfigError
from edge_node.fleet.view import inventory_endpoints, parse_endpoints, parse_metrics, read_node, row_cells
from edge_node.node.metrics import NodeMetrics
from tests.daemons import run_cli
from tests.run_dirs import node_record

STATUS = {"node_id": "pi-1", "fleet": "lab", "version": "1", "model": "cnn", "phase": "idle", "tier": "0.4",
          "rounds_done": 1, "healthy": True}  # fmt: skip


def test_node_lists_and_inventories_name_the_metrics_endpoints(tmp_path: Path):
    assert parse_endpoints("a:1,b 10.0.0.3") == ["a:1", "b:9478", "10.0.0.3:9478"]
    with pytest.raises(ConfigError, match="'a:x' must be HOST:PORT"):
        parse_endpoints("a:x")
    inventory = tmp_path / "inventory.ini"
    inventory.write_text(
        "[rpi]\npi-kitchen  ansible_host=192.168.1.21 edge_node_metrics_listen=0.0.0.0:9100\n"
        "pi-garage ansible_host=192.168.1.22  # a comment\n[jetson]\norin-lab\n"
        "[edge_node:children]\nrpi\njetson\n[all:vars]\nansible_user=pi-admin\nedge_node_metrics_listen=0.0.0.0:9200\n"
    )
    assert inventory_endpoints(inventory) == ["192.168.1.21:9100", "192.168.1.22:9200", "orin-lab:9200"]
    empty = tmp_path / "empty.ini"
    empty.write_text("[all:vars]\nx=1\n")
    with pytest.raises(ConfigError, match="lists no host"):
        inventory_endpoints(empty)


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("tls")
    for args in (["init-ca", "--dir", str(d), "--fleet", "lab"], ["issue", "pi-1", "--dir", str(d)],
                 ["issue", "operator", "--dir", str(d)]):  # fmt: skip
        result = run_cli(["certs", *args])
        assert result.returncode == 0, result.stderr
    other = d / "other"
    for args in (["init-ca", "--dir", str(other), "--fleet", "evil"], ["issue", "intruder", "--dir", str(other)]):
        assert run_cli(["certs", *args]).returncode == 0
    return d


def test_under_mutual_tls_only_a_fleet_certificate_reads_the_metrics(tls: Path):
    metrics = NodeMetrics(lambda: STATUS)
    port = metrics.serve("127.0.0.1:0", (str(tls / "ca.pem"), str(tls / "pi-1.pem"), str(tls / "pi-1.key")))
    try:
        metrics.observe_round(node_record("pi-1", 0))
        endpoint = f"127.0.0.1:{port}"
        member = read_node(endpoint, (tls / "ca.pem", tls / "operator.pem", tls / "operator.key"))
        assert member.error is None and member.node_id == "pi-1" and member.rounds_done == 1, member
        intruder = read_node(endpoint, (tls / "ca.pem", tls / "other" / "intruder.pem", tls / "other" / "intruder.key"))
        assert intruder.error is not None and intruder.node_id is None
        anonymous = ssl.create_default_context(cafile=str(tls / "ca.pem"))
        anonymous.check_hostname = False
        with pytest.raises(OSError):
            urllib.request.urlopen(f"https://{endpoint}/metrics", timeout=5, context=anonymous).read()
        assert read_node(endpoint).error is not None  # plain HTTP gets nothing either
        shown = run_cli(["fleet", "--nodes", endpoint, "--tls-ca", str(tls / "ca.pem"), "--tls-cert",
                         str(tls / "operator.pem"), "--tls-key", str(tls / "operator.key"), "--json"])  # fmt: skip
        assert shown.returncode == 0 and '"node_id": "pi-1"' in shown.stdout, shown.stderr
    finally:
        metrics.close()


def test_a_node_that_moved_tiers_says_so_in_its_row():
    """capacity auto's moves (edge_node_tier_moves_total, one series per direction) show beside the tier."""
    metrics = NodeMetrics(lambda: {**STATUS, "tier": "0.2", "tier_moves": {"down": 2, "up": 1}})
    try:
        text = generate_latest(metrics.registry).decode()
    finally:
        metrics.close()
    row = parse_metrics("pi:9478", text, 0.0)
    assert (row.tier, row.tier_moves) == (0.2, 3) and row_cells(row, 0.0)[2] == "0.2 (moved 3x)"
    still = parse_metrics("pi:9478", generate_latest(NodeMetrics(lambda: STATUS).registry).decode(), 0.0)
    assert row_cells(still, 0.0)[2] == "0.4"
