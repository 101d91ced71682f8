"""A real ``edge-node start`` among peers that lie: a round of 10^15, values of 3e38, another fleet, a
certificate other than the advertised one; and static peers under mutual TLS."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch

from edge_node.exit_codes import ExitCode
from edge_node.fleet.fleet import free_ports
from edge_node.net import PeerAddress, pull_model
from edge_node.net.tls import certificate_fingerprint, create_ca, issue_certificate
from tests.daemons import QUICK, NodeProcesses, run_cli
from tests.node.peer_servers import FLEET, demo_spec, honest_peer, lying_peer, served_peer

ROUND_TIMEOUT_S = 180  # per round, generous: CI shares 2 cores
LIAR_ROUND = 10**15
# One node on a sixth of the demo set, pulling every peer it is given each round.
NODE = ["--fleet", FLEET, "--num-clients", "6", "--client-index", "0", "--capacity", "0.6", "--discovery", "static"]
# Peers that never publish a later round: a node that has done its rounds serves them this long, not 600 s.
STUCK_PEERS = ["--round-budget-s", "2"]


def test_a_huge_round_and_3e38_values_move_nothing_next_to_honest_peers(tmp_path):
    """Two honest peers, a liar claiming round 10^15, a peer of 3e38 values and a peer of another fleet.

    The liar's round is not followed (its model is half of no majority), the 3e38 peer is screened
    out, the other fleet is refused by discovery and counted, and the round goes on with the others.
    """
    (port,) = free_ports(1)
    with (
        honest_peer("h1", 1, client=1) as h1,
        honest_peer("h2", 1, client=2) as h2,
        honest_peer("foreign", 1, client=3, fleet="other-fleet") as foreign,
        lying_peer("liar", LIAR_ROUND, client=4) as liar,
        lying_peer("blown", 1, client=5, fill=3e38) as blown,
    ):
        peers = f"h1@127.0.0.1:{h1},h2@127.0.0.1:{h2},liar@127.0.0.1:{liar.port},blown@127.0.0.1:{blown.port}"
        peers += f",127.0.0.1:{foreign}"  # a bare entry: identified by its Hello, which names another fleet
        args = [*QUICK, *NODE, "--peers", peers, "--neighbours", "4", "--listen", f"127.0.0.1:{port}", "--rounds", "3",
                *STUCK_PEERS]  # fmt: skip
        with NodeProcesses() as nodes:
            node = nodes.start("n0", tmp_path / "n0", args)
            assert node.wait(3 * ROUND_TIMEOUT_S) == 0, node.log()
        assert liar.calls >= 1 and blown.calls >= 1  # both were pulled
        # its last round is 3: h1 and h2 stay at 1, served for the budget; the liar is past it, and blown has
        # no Hello to answer (a refusal: not waited for)
        assert "peers ['h1', 'h2'] have not reached round 3 after 2 s" in node.log(), node.log()
    records = node.records
    assert [r["round"] for r in records] == [0, 1, 2], [(r["round"], r.get("caught_up_to")) for r in records]
    assert all("caught_up_to" not in r for r in records)
    for r in records:
        assert {"h1", "h2"} <= set(r["peers_answered"]), r["peers_refused"]  # the round went on with them
        assert "blown" not in r["peers_answered"]
        if "blown" in r["peers_asked"]:
            assert r["peers_refused"]["blown"]["kind"] == "screened", r["peers_refused"]
        if "liar" in r["peers_answered"]:
            assert r["peer_rounds"]["liar"] == LIAR_ROUND and r["ahead_not_followed"] == {"liar": LIAR_ROUND}
        assert r["discovery_refusals"] == {"other_fleet": 1}
        assert r["lr"] > 0.09  # the schedule kept its place (lr 0.1 x 0.998^round)
    assert any("liar" in r["peers_answered"] for r in records)
    assert any(r["peers_refused"].get("blown", {}).get("kind") == "screened" for r in records)
    checkpoint = torch.load(node.state_dir / "checkpoint.pt", weights_only=True)
    assert checkpoint["rounds_done"] == 3
    largest = max(float(v.abs().max()) for v in checkpoint["values"].values())
    assert largest < 100, largest  # the 3e38 model was never aggregated
    status = json.loads((node.state_dir / "status.json").read_text())
    assert status["discovery_refusals"] == {"other_fleet": 1} and status["rounds_done"] == 3


def test_a_finished_node_serves_a_slower_peer_until_it_has_published_the_last_round(tmp_path):
    """Free-running, a node that has done its rounds keeps serving while a peer is behind them (that peer's
    next rounds pull this node's last model), and stops as soon as the peer has published the last round."""
    (port,) = free_ports(1)
    with served_peer("slow", 0, client=1) as slow:
        args = [*QUICK, *NODE, "--peers", f"slow@127.0.0.1:{slow.port}", "--neighbours", "1", "--listen",
                f"127.0.0.1:{port}", "--rounds", "2"]  # fmt: skip
        with NodeProcesses() as nodes:
            node = nodes.start("n0", tmp_path / "n0", args)
            node.wait_rounds(2, 2 * ROUND_TIMEOUT_S)
            time.sleep(3.0)
            assert node.proc.poll() is None, node.log()  # done, still serving the slow peer
            last = pull_model(PeerAddress("n0", "127.0.0.1", port), demo_spec(), FLEET, insecure=True, round=2)
            assert last.header.round == 2
            slow.publish(2)
            published = time.monotonic()
            assert node.wait(30) == 0, node.log()
            assert time.monotonic() - published < 5.0, node.log()
    assert [r["peers_answered"] for r in node.records] == [["slow"], ["slow"]]
    assert "served " in node.log() and "more, until every peer had published round 2 or left" in node.log()


def _certs(tmp_path: Path, names: list[str]) -> dict[str, list[str]]:
    """A fleet CA and a certificate per node (``edge-node certs``' functions): name -> TLS flags."""
    ca_cert, ca_key = create_ca(FLEET)
    (tmp_path / "ca.pem").write_bytes(ca_cert)
    flags = {}
    for name in names:
        cert, key = issue_certificate(ca_cert, ca_key, name)
        (tmp_path / f"{name}.pem").write_bytes(cert)
        key_path = tmp_path / f"{name}.key"
        key_path.write_bytes(key)
        os.chmod(key_path, 0o600)
        flags[name] = ["--tls-ca", str(tmp_path / "ca.pem"), "--tls-cert", str(tmp_path / f"{name}.pem"),
                       "--tls-key", str(key_path)]  # fmt: skip
    return flags


TLS_QUICK = [a for a in QUICK if a != "--insecure"]


def test_static_peers_under_mutual_tls_trade_models(tmp_path):
    names = ["n0", "n1"]
    tls = _certs(tmp_path, names)
    ports = free_ports(2)
    common = [*TLS_QUICK, "--fleet", FLEET, "--num-clients", "6", "--capacity", "0.6", "--discovery", "static",
              "--neighbours", "1", "--rounds", "12"]  # fmt: skip
    # 12 rounds, not 2: n0 starts first and its pulls of n1 are refused until n1 serves (then n1 is in backoff
    # for 2 s); two rounds of a quick node could end before that (CI once saw n0 with no round from n1).
    own = [[*tls[name], "--client-index", str(i), "--listen", f"127.0.0.1:{ports[i]}"] for i, name in enumerate(names)]
    peer = [["--peers", f"{names[1 - i]}@127.0.0.1:{ports[1 - i]}"] for i in range(2)]  # ID@HOST:PORT
    with NodeProcesses() as nodes:
        procs = [nodes.start(name, tmp_path / name, [*common, *own[i], *peer[i]]) for i, name in enumerate(names)]
        for proc in procs:
            assert proc.wait(2 * ROUND_TIMEOUT_S) == 0, proc.log()
    for i, proc in enumerate(procs):
        other = names[1 - i]
        assert "mutual TLS" in proc.log(200)
        records = proc.records
        assert any(r["peers_answered"] == [other] for r in records), [r["peers_refused"] for r in records]
        kinds = {v["kind"] for r in records for v in r["peers_refused"].values()}
        assert not kinds & {"tls", "identity", "refused"}, kinds


def test_a_bare_static_peer_under_tls_is_one_line_and_exit_2(tmp_path):
    tls = _certs(tmp_path, ["n0"])["n0"]
    state = tmp_path / "state"
    peers = "n1@10.0.0.2:7878,10.0.0.3:7878"
    args = ["--discovery", "static", "--peers", peers, "--state-dir", str(state), "--listen", "127.0.0.1:0"]
    result = run_cli(["start", "--fleet", FLEET, *tls, *args])
    assert result.returncode == int(ExitCode.BAD_INPUT), result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "static peers need ID@HOST:PORT under TLS" in lines[0] and "10.0.0.3:7878" in lines[0]
    assert not state.exists()  # refused before anything was created


# The advertiser of the mDNS test: a real TLS peer server for NODE (its own fleet certificate) that
# advertises the fingerprint FP over mDNS, inside the test's namespace.
_ADVERTISER = r"""
import json, os, sys
sys.path.insert(0, sys.argv[1])
node_id, ca, cert, key, fp, address, client = sys.argv[2:9]
from edge_node.net import TlsConfig
from edge_node.net.discovery import MdnsDiscovery
from tests.node.peer_servers import FLEET, demo_spec, honest_peer
tls = TlsConfig.from_files(ca, cert, key)
with honest_peer(node_id, 1, int(client), tls=tls, address=address + ":0") as port:
    d = MdnsDiscovery(node_id=node_id, port=port, fleet=FLEET, arch=demo_spec().arch_id, tier="t3", density=0.6,
                      round=1, fingerprint=fp, interfaces=[address])
    d.start()
    os.write(1, (json.dumps({"event": "started", "port": port}) + "\n").encode())
    try:
        for _ in sys.stdin:
            pass
    finally:
        d.stop()
"""


def test_a_peer_whose_certificate_is_not_its_advertised_fp_is_refused(require_root, tmp_path):
    """Over mDNS in a private namespace: "honest" advertises its own certificate's fp, "impostor" another one
    (both certificates are valid fleet certificates for their names). Only the impostor is refused."""
    from tests.netns import NetnsProcess, netns

    repo = str(Path(__file__).resolve().parents[2])
    tls = _certs(tmp_path, ["n0", "honest", "impostor"])

    def fp(name: str) -> str:
        return certificate_fingerprint((tmp_path / f"{name}.pem").read_bytes())

    with netns() as ns:
        advertisers = []
        try:
            for i, (name, advertised) in enumerate((("honest", fp("honest")), ("impostor", fp("n0")))):
                ca, cert, key = tls[name][1], tls[name][3], tls[name][5]
                proc = NetnsProcess(ns, [sys.executable, "-c", _ADVERTISER, repo, name, ca, cert, key, advertised,
                                         "127.0.0.1", str(i + 1)])  # fmt: skip
                advertisers.append(proc)
            for proc in advertisers:
                assert proc.wait_for(lambda lines: any('"started"' in x for x in lines), 120), proc.stderr_lines[-20:]
            args = [*TLS_QUICK, *tls["n0"], "--fleet", FLEET, "--num-clients", "6", "--client-index", "0",
                    "--capacity", "0.6", "--discovery", "mdns", "--interface", "127.0.0.1", "--listen",
                    "127.0.0.1:0", "--neighbours", "2", "--rounds", "3", *STUCK_PEERS]  # fmt: skip
            with NodeProcesses() as nodes:
                node = nodes.start("n0", tmp_path / "n0", args, prefix=["ip", "netns", "exec", ns])
                assert node.wait(3 * ROUND_TIMEOUT_S) == 0, node.log()
        finally:
            for proc in advertisers:
                proc.kill()
    records = node.records
    assert any("honest" in r["peers_answered"] for r in records), [r["peers_refused"] for r in records]
    assert all("impostor" not in r["peers_answered"] for r in records)
    refused = [r["peers_refused"]["impostor"] for r in records if "impostor" in r["peers_refused"]]
    assert refused and all(x["kind"] == "identity" for x in refused), refused
    assert f"presents certificate {fp('impostor')}, but advertised {fp('n0')}" in refused[0]["detail"], refused[0]
    assert all("impostor" not in r["peer_rounds"] for r in records)  # its model never reached the aggregate


def test_width_nodes_of_different_tiers_pull_each_other(tmp_path):
    """Width tiers (protocol 1.5) between two real daemons: a tier-0.2 node trains its narrow model and sends only
    its prefixes; the tier-1.0 node pulls them (a far smaller stream than its own), and the narrow node pulls the
    full model into its prefix. Neither refuses the other; each round's record says what its tier bought."""
    ports = free_ports(2)
    peers = f"a@127.0.0.1:{ports[0]},b@127.0.0.1:{ports[1]}"
    common = [*QUICK, "--fleet", FLEET, "--num-clients", "6", "--discovery", "static", "--peers", peers,
              "--neighbours", "1", "--rounds", "2", "--lockstep", "--tier-mode", "width"]  # fmt: skip
    with NodeProcesses() as nodes:
        narrow = nodes.start("a", tmp_path / "a", [*common, "--client-index", "0", "--capacity", "0.2",
                                                   "--listen", f"127.0.0.1:{ports[0]}"])  # fmt: skip
        wide = nodes.start("b", tmp_path / "b", [*common, "--client-index", "1", "--capacity", "1.0",
                                                 "--listen", f"127.0.0.1:{ports[1]}"])  # fmt: skip
        assert narrow.wait(2 * ROUND_TIMEOUT_S) == 0, narrow.log()
        assert wide.wait(2 * ROUND_TIMEOUT_S) == 0, wide.log()
    for node, other in ((narrow, "b"), (wide, "a")):
        assert [r["peers_answered"] for r in node.records] == [[other], [other]], node.records[-1]["peers_refused"]
        assert all(r["refusals"] == {} and r["tier_mode"] == "width" for r in node.records)
    assert {r["tier"] for r in narrow.records} == {"0.2"} and all(r["width"] < 0.5 for r in narrow.records)
    assert {r["tier"] for r in wide.records} == {"1.0"} and all(r["width"] == 1.0 for r in wide.records)
    assert all(r["density"] < 0.2 for r in narrow.records)  # of the full model's weights: its prefix, whole
    # The wide node received the narrow prefixes (no bitmap), the narrow one the whole model.
    assert all(5 * w["bytes_in"] < n["bytes_in"] for w, n in zip(wide.records, narrow.records, strict=True))
