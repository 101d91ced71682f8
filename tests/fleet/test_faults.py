"""Faults a fleet of real daemons must survive, in network namespaces (root): slow links, a node killed
while serving, a cut link, rogue peers on mDNS, packet loss, and mutual TLS with an intruder.

Nodes run on slices of the demo set with one thread and one epoch per round; fleets that must outlive
an event run until stopped (``rounds=0``) and every wait is bounded.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from edge_node.fleet.fleet import Fleet, issue_tls_material
from edge_node.fleet.link import LinkSpec, shape_links
from edge_node.fleet.netns import run_in_netns
from edge_node.fleet.summary import SUMMARY_PLOT
from edge_node.net.client import FAILURE_KINDS
from tests.daemons import assert_rounds_to_the_end, read_records
from tests.fleet.fleets import config, logs, read_summary, records, run_cli, run_to_end, wait_until
from tests.netns import NetnsProcess

pytestmark = pytest.mark.netns
ROGUE = Path(__file__).with_name("rogue.py")
EVENT_S = 240  # bound on waiting for one fleet event (rounds take ~10-30 s on 2 busy cores)


def _check_summary(out: Path, summary: dict) -> None:
    """The fleet summary agrees with what the nodes recorded: bytes, the busiest node, energy with its label,
    refusal and retry totals; and the plot is a PNG."""
    retried: Counter[str] = Counter()
    for node in summary["nodes"]:
        lines = (out / node["node_id"] / "rounds.jsonl").read_text().splitlines()
        records = list(map(json.loads, lines))
        mine = [r for r in records if not r.get("diverged")]
        assert node["bytes_in"] == sum(r["bytes_in"] for r in mine) > 0, node
        assert node["bytes_out"] == sum(r["bytes_out"] for r in mine), node
        assert node["energy_j"] > 0 and node["energy_label"] == "estimated", node  # --energy-backend estimate
        own_retries: Counter[str] = Counter()
        for record in records:  # calls retried after a transient failure, by kind (diverged rounds too)
            assert set(record["pull_retries"]) <= set(FAILURE_KINDS), record
            own_retries.update(record["pull_retries"])
        assert node["pull_retries"] == dict(own_retries), node
        retried.update(own_retries)
    busiest = max(summary["nodes"], key=lambda n: n["bytes_in"] + n["bytes_out"])
    most = busiest["bytes_in"] + busiest["bytes_out"]
    assert summary["busiest_node"] == {"node_id": busiest["node_id"], "bytes": most}
    totals: Counter[str] = Counter()
    for node in summary["nodes"]:
        totals.update(node["peers_refused"])
    assert summary["peers_refused_total"] == dict(totals)
    assert summary["pull_retries_total"] == dict(sorted(retried.items()))
    assert (out / SUMMARY_PLOT).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _start_s(record: dict) -> float:
    """When a round began: its record's time minus the seconds of its phases."""
    return record["time_unix"] - sum(record["seconds"].values())


def test_four_nodes_find_each_other_over_mdns_on_10mbit_links_and_learn(require_root, tmp_path):
    out = tmp_path / "fleet"
    result = run_cli(["loopback", "--nodes", "4", "--rounds", "3", "--netns", "--link", "rate=10mbit,delay=20ms",
                      "--output", str(out), "--epochs", "1", "--pull-timeout-s", "30", "--no-progress"])  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    summary = read_summary(out)
    link = summary["fleet"]["link"]
    assert link["applied"]["rate"] in ("netem", "tbf")
    if "delay" not in link["applied"]:  # no netem in this kernel: said in the summary and as a warning
        assert "netem" in link["not_applied"]["delay"]
        assert "edge-node: warning: --link delay=20ms not applied" in result.stderr
    for node in summary["nodes"]:
        assert node["rounds"] == 3 and node["exit_code"] == 0, node
        assert node["acc_final"] > node["acc_first"], node
        assert len(node["peers_answered"]) >= 2, node  # found over mDNS and pulled
    assert "| node0 | 3 |" in (out / "fleet-summary.md").read_text()
    _check_summary(out, summary)


def _serving(ns: str, port: int) -> bool:
    """Whether a model stream is being sent from ``port`` in ``ns`` right now (bytes queued on a connection)."""
    out = run_in_netns(ns, ["ss", "-tnH", "state", "established", f"( sport = :{port} )"], timeout_s=5).stdout
    return any(int(line.split()[1]) > 0 for line in out.splitlines() if len(line.split()) > 2)


def test_node_killed_while_serving_resumes_and_is_pulled_again(require_root, tmp_path):
    cfg = config(tmp_path / "fleet", nodes=3, rounds=0, netns=True, pull_timeout_s=10.0)
    with Fleet(cfg) as fleet:
        assert fleet.net is not None
        shape_links(fleet.net, LinkSpec(rate_bit_s=8_000_000), hosts=[2])  # a 2 MB model takes ~2 s to leave it
        victim = fleet.daemons[2]
        fleet.start()
        checkpoint = victim.state_dir / "checkpoint.pt"  # written just after the round's record: a kill between
        # the two is a fresh start that runs the round again (the daemon truncates the record), not a resume
        wait_until(fleet, lambda: len(records(fleet, "node2")) >= 1 and checkpoint.exists(), EVENT_S,
                   "node2 at round 1, checkpointed")  # fmt: skip
        port = fleet.endpoints[2][1]
        deadline = time.monotonic() + EVENT_S
        while not _serving(victim.namespace or "", port):
            assert time.monotonic() < deadline, f"node2 never seen serving\n{logs(fleet)}"
            time.sleep(0.1)
        victim.signal(signal.SIGKILL)
        killed_unix = time.time()
        assert victim.wait(10) == -signal.SIGKILL
        kept = len(records(fleet, "node2"))

        def others_went_on() -> bool:  # each finished a round begun after the kill, with the peers that answered
            # (begun after: a round in flight at the kill may have pulled node2 before it and asked it nothing since)
            return all(any(_start_s(r) > killed_unix and r["peers_answered"] for r in records(fleet, n))
                       for n in ("node0", "node1"))  # fmt: skip

        wait_until(fleet, others_went_on, EVENT_S, "the others past the kill")
        asked_victim = [r for n in ("node0", "node1") for r in records(fleet, n)
                        if r["time_unix"] > killed_unix and "node2" in r["peers_asked"]]  # fmt: skip
        fleet.restart(victim)
        restarted_unix = time.time()

        def pulled_again() -> bool:  # a snapshot node2 can only have published after its restart
            return any(r["peer_rounds"].get("node2", -1) > kept for n in ("node0", "node1")
                       for r in records(fleet, n) if _start_s(r) > restarted_unix)  # fmt: skip

        wait_until(fleet, pulled_again, EVENT_S, "node2 pulled from after its restart")
        fleet.stop()
        assert all(d.returncode == 0 for d in fleet.daemons), logs(fleet)  # SIGTERM: a clean stop
    log = victim.log_path.read_text()
    assert f"resumed from {checkpoint}" in log
    rounds = [r["round"] for r in victim.completed]
    assert rounds == sorted(set(rounds)) and rounds[:kept] == list(range(kept)), rounds  # nothing lost or doubled
    # The pull that met the dead node failed, was counted, and its round went on with the peer that answered.
    assert any("node2" in r["peers_refused"] and r["refusals"] and r["peers_answered"] for r in asked_victim), (
        asked_victim
    )
    for r in asked_victim:  # a snapshot of node2 aggregated after the kill was complete before it
        assert "node2" not in r["peers_answered"] or r["peer_rounds"]["node2"] <= kept, r


def test_a_cut_link_for_a_round_and_the_node_rejoins(require_root, tmp_path):
    cfg = config(tmp_path / "fleet", nodes=3, rounds=0, netns=True, pull_timeout_s=8.0)
    with Fleet(cfg) as fleet:
        assert fleet.net is not None
        fleet.start()
        wait_until(fleet, lambda: all(len(records(fleet, n)) >= 1 for n in cfg.node_ids), EVENT_S, "round 1 done")
        fleet.net.set_link(2, False)
        cut = time.time()

        def isolated_round() -> bool:  # node2 went on alone; the others went on without it
            mine = any(_start_s(r) > cut and not r["peers_answered"] for r in records(fleet, "node2"))
            theirs = all(any(_start_s(r) > cut and "node2" not in r["peers_answered"] and r["peers_answered"]
                             for r in records(fleet, n)) for n in ("node0", "node1"))  # fmt: skip
            return mine and theirs

        wait_until(fleet, isolated_round, EVENT_S, "a round with the link cut")
        fleet.net.set_link(2, True)
        restored = time.time()

        def rejoined() -> bool:
            mine = any(_start_s(r) > restored and r["peers_answered"] for r in records(fleet, "node2"))
            theirs = any(_start_s(r) > restored and "node2" in r["peers_answered"]
                         for n in ("node0", "node1") for r in records(fleet, n))  # fmt: skip
            return mine and theirs

        wait_until(fleet, rejoined, EVENT_S, "node2 rejoined")
        fleet.stop()
        assert all(d.returncode == 0 for d in fleet.daemons), logs(fleet)
    during = [r for r in records(fleet, "node2") if cut < _start_s(r) and r["time_unix"] < restored]
    assert during and all(not r["peers_answered"] for r in during)
    assert any(r["refusals"] for r in during if r["peers_asked"]) or all(not r["peers_asked"] for r in during)


ROGUES = {"rogue-garbage": ("garbage", "decode"), "rogue-arch": ("wrong-arch", "header"),
          "rogue-endless": ("endless", "timeout")}  # fmt: skip


def test_rogue_peers_on_mdns_change_no_honest_model(require_root, tmp_path):
    pull_timeout_s = 6.0
    cfg = config(tmp_path / "fleet", nodes=3, rounds=2, netns=True, neighbours=5, pull_timeout_s=pull_timeout_s)
    with Fleet(cfg) as fleet:
        rogues = []
        try:
            assert fleet.net is not None
            for node_id, (mode, _) in ROGUES.items():
                i = fleet.add_host(node_id)
                ns, address = fleet.net.namespaces[i], fleet.net.addresses[i]
                rogue = NetnsProcess(ns, [sys.executable, str(ROGUE), mode, node_id, cfg.fleet, address])
                rogues.append(rogue)
            for rogue in rogues:
                assert rogue.wait_for(lambda lines: any('"started"' in x for x in lines), 60), rogue.stderr_text
            run_to_end(fleet)
            calls = [sum('"get_model"' in x for x in rogue.lines) for rogue in rogues]
        finally:
            for rogue in rogues:
                rogue.kill()
    honest = set(cfg.node_ids)
    refused: dict[str, set[str]] = {rogue: set() for rogue in ROGUES}
    for daemon in fleet.own_daemons():
        node = records(fleet, daemon.node_id)
        assert [r["round"] for r in node] == [0, 1], daemon.node_id
        log = daemon.log_path.read_text().splitlines()
        for r in node:
            assert set(r["peers_answered"]) <= honest, r  # no rogue model reached an aggregate...
            assert set(r["peer_rounds"]) <= honest, r  # ...nor any snapshot of one
            for peer, why in r["peers_refused"].items():
                assert peer in ROGUES, r  # honest peers were never refused
                assert why["kind"] == ROGUES[peer][1], (peer, why)
                refused[peer].add(daemon.node_id)
            # each refusal counted with its reason
            assert r["refusals"] == dict(Counter(why["kind"] for why in r["peers_refused"].values())), r
            assert r["seconds"]["communicate"] <= pull_timeout_s + 5, r  # nobody waited past its deadline
            assert set(r["peers_asked"]) - honest <= set(r["peers_refused"]), r
        for rogue, (_, kind) in ROGUES.items():  # and each refusal logged, one line per refused pull
            logged = sum(f"no model from {rogue}: {kind}: " in line for line in log)
            assert logged == sum(rogue in r["peers_refused"] for r in node), (daemon.node_id, rogue, logged)
    assert all(refused.values()), refused  # every rogue was found over mDNS, asked, and refused
    assert all(calls), calls


def test_ten_percent_loss_on_every_link(require_root, tmp_path):
    out = tmp_path / "fleet"
    result = run_cli(["loopback", "--nodes", "3", "--rounds", "2", "--netns", "--link", "loss=10%", "--output",
                      str(out), "--pull-timeout-s", "30", "--no-progress"])  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    summary = read_summary(out)
    assert summary["fleet"]["link"]["applied"]["loss"] in ("netem", "iptables statistic (random drop)")
    for node in summary["nodes"]:
        assert node["exit_code"] == 0 and node["peers_answered"], node  # every node got some peer's model
        # a node may catch up: finished peers now serve on, so a slow node's one pull can be of round 2
        completed = [r for r in read_records(out / node["node_id"]) if not r.get("diverged")]
        assert_rounds_to_the_end(completed, 2)
    _check_summary(out, summary)


def test_mutual_tls_fleet_trains_and_a_foreign_certificate_is_refused(require_root, tmp_path):
    cfg = config(tmp_path / "fleet", nodes=3, rounds=2, netns=True, tls=True, neighbours=3, pull_timeout_s=8.0)
    foreign = tmp_path / "foreign-ca"
    issue_tls_material(foreign, "loopback", ["intruder"])  # same fleet id and name scheme, another CA
    with Fleet(cfg) as fleet:
        host = fleet.add_host("intruder")
        flags = fleet.node_flags(0, node_id="intruder", host=host, overrides={
            "tls_ca": foreign / "ca.pem", "tls_cert": foreign / "intruder.pem", "tls_key": foreign / "intruder.key",
            "rounds": 0})  # fmt: skip
        intruder = fleet.start_extra(fleet.make_daemon(0, node_id="intruder", host=host, flags=flags))
        run_to_end(fleet)
        wait_until(fleet, lambda: len(records(fleet, "intruder")) >= 2, EVENT_S, "the intruder at round 2")
    honest = set(cfg.node_ids)
    refused_by: set[str] = set()
    for node_id in cfg.node_ids:
        mine = records(fleet, node_id)
        # The fleet trains together: each node got models from both others (a first round may start
        # before mDNS found anyone), and no certificate of the fleet CA was refused...
        assert {p for r in mine for p in r["peers_answered"]} == honest - {node_id}, mine
        for r in mine:
            assert not any(why["kind"] == "tls" for p, why in r["peers_refused"].items() if p in honest), r
            assert set(r["peer_rounds"]) <= honest, r  # ...and nothing of the intruder's reached a model
            if "intruder" in r["peers_asked"]:
                assert r["peers_refused"]["intruder"]["kind"] == "tls", r
                refused_by.add(node_id)
    # Refused by everyone: every honest node asked it (it is on mDNS like them) and refused its certificate.
    # (Its own pulls are refused in the TLS handshake, inside gRPC: no honest server's handler sees those,
    # so they are not in server_refusals; what proves them is the intruder's side, below.)
    assert refused_by == honest, refused_by
    theirs = records(fleet, "intruder")
    assert {p for r in theirs for p in r["peers_asked"]} == honest, theirs  # it asked every honest node...
    for r in theirs:  # ...and got nothing from any: each pull refused in the TLS handshake, not a byte of a model
        assert not r["peers_answered"] and not r["peer_rounds"] and r["bytes_in"] == 0, r
        assert all(r["peers_refused"][p]["kind"] == "tls" for p in r["peers_asked"]), r
        assert r["refusals"] == ({"tls": len(r["peers_asked"])} if r["peers_asked"] else {}), r
    assert intruder.returncode is not None  # stopped with the fleet
