"""``edge-node loopback`` as a user runs it: bad input, Ctrl-C/SIGTERM, a crashed daemon, a killed supervisor;
and the link shaping it applies (rate really limited, loss rules, delay reported when it cannot be applied)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from edge_node.errors import ConfigError
from edge_node.exit_codes import ExitCode
from edge_node.fleet import link
from edge_node.fleet import netns as _netns
from edge_node.fleet.config import FleetConfig
from edge_node.fleet.fleet import RUN_FILE, Fleet
from edge_node.fleet.link import LinkSpec, netem_available, shape_links
from edge_node.fleet.netns import NetnsError
from tests.fleet.fleets import EDGE_NODE, FLEET_TIMEOUT_S, cli_process, read_summary, run_cli

QUICK_CLI = ["--epochs", "1", "--pull-timeout-s", "15", "--no-progress"]


def _one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("edge-node: error: "), result.stderr
    return lines[0]


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--nodes", "3", "--link", "rate=10mbit"], "--link needs --netns"),
        (["--nodes", "1"], "--nodes"),
        (["--nodes", "3", "--netns", "--link", "rate=fast"], "rate='fast'"),
        (["--nodes", "3", "--netns", "--link", "loss=150%"], "loss='150%'"),
        (["--nodes", "3", "--dataset", "cifar10"], "needs --data-dir"),
        (["--nodes", "3", "--lockstep", "--neighbours", "3"], "lock-step fleet of 3"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, words):
    result = run_cli(["loopback", *args, "--output", str(tmp_path / "out")], timeout_s=60)
    assert result.returncode == ExitCode.BAD_INPUT, result.stderr
    assert words in _one_line_error(result)
    assert not (tmp_path / "out").exists()  # nothing written


def test_netns_without_root_is_a_clear_error(tmp_path):
    argv = [*EDGE_NODE, "loopback", "--nodes", "2", "--netns", "--output", str(tmp_path / "out")]
    if os.geteuid() == 0:  # run it as nobody
        setpriv = shutil.which("setpriv")
        assert setpriv is not None, "util-linux setpriv is needed to drop root"
        argv = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", *argv]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd="/")
    assert result.returncode == ExitCode.BAD_INPUT, result.stderr
    assert "--netns needs root" in _one_line_error(result)


def test_link_spec_parses_every_property():
    spec = LinkSpec.parse("rate=10mbit, delay=20ms,loss=1.5%")
    assert (spec.rate_bit_s, spec.delay_ms, spec.loss_pct) == (10_000_000, 20.0, 1.5)
    assert spec.describe() == {"rate": "10mbit", "delay": "20ms", "loss": "1.5%"}
    for bad in ("rate=10mbps", "speed=1", "rate=1mbit,rate=2mbit", "delay=-1ms", "loss=1"):
        with pytest.raises(ConfigError):
            LinkSpec.parse(bad)


def test_config_refuses_settings_a_run_cannot_keep(tmp_path):
    with pytest.raises(ConfigError, match="--link needs --netns"):
        FleetConfig(nodes=2, link="rate=1mbit", output=tmp_path)
    with pytest.raises(ConfigError, match="--nodes 65"):
        FleetConfig(nodes=65, output=tmp_path)


def _throughput_bit_s(net: _netns.BridgeNet, nbytes: int) -> float:
    """Send ``nbytes`` over TCP from host 0 to host 1 of ``net``; bits per second as the receiver saw them."""
    script = (
        "import socket,sys,time\n"
        "s=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1);s.bind((sys.argv[1],5001));s.listen(1)\n"
        "print('ready',flush=True);c,_=s.accept();t=time.monotonic();n=0\n"
        "while (b:=c.recv(65536)):\n    n+=len(b)\n"
        "print(n, time.monotonic()-t, flush=True)\n"
    )
    receiver = subprocess.Popen(["ip", "netns", "exec", net.namespaces[1], "python3", "-c", script,
                                 net.addresses[1]], stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert receiver.stdout is not None and receiver.stdout.readline().strip() == "ready"
        sender = (f"import socket;s=socket.create_connection(('{net.addresses[1]}',5001),timeout=30);"
                  f"s.sendall(b'x'*{nbytes});s.close()")  # fmt: skip
        _netns.run_in_netns(net.namespaces[0], ["python3", "-c", sender], timeout_s=60, check=True)
        got, seconds = receiver.stdout.readline().split()
        assert int(got) == nbytes
        return 8 * nbytes / float(seconds)
    finally:
        receiver.kill()
        receiver.wait(10)


@pytest.mark.netns
def test_link_shaping_limits_the_rate_and_reports_what_it_could_not_apply(require_root):
    with _netns.bridge_with_namespaces(2, kind="test") as net:
        has_netem = netem_available(net.bridge_ns)
        report = shape_links(net, LinkSpec.parse("rate=8mbit,delay=20ms,loss=0%"))
        assert report.applied["rate"] == ("netem" if has_netem else "tbf")
        if has_netem:
            assert report.applied["delay"] == "netem" and not report.not_applied
        else:
            assert "no netem" in report.not_applied["delay"] and report.warnings() == [
                f"--link delay=20ms not applied: {report.not_applied['delay']}"
            ]
        rate = _throughput_bit_s(net, 2_000_000)
        assert 4e6 < rate < 9e6, rate  # 8 Mbit/s, shaped (loopback between namespaces would be Gbit/s)
        loss = shape_links(net, LinkSpec.parse("loss=10%"), hosts=[0]) if not has_netem else None
        if loss is not None:
            rules = _netns.run_in_netns(net.namespaces[0], ["iptables-save"]).stdout
            assert rules.count("--probability 0.1") == 2 and loss.applied["loss"].startswith("iptables")


def _path_of(tmp_path: Path, *tools: str) -> str:
    """A PATH holding only ``tools`` (links to this machine's): a machine where the others are not installed."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in tools:
        found = shutil.which(tool)
        assert found is not None, f"this test needs {tool}"
        (bin_dir / tool).symlink_to(found)
    return str(bin_dir)


@pytest.mark.netns
def test_link_without_tc_is_one_line_naming_its_package_exit_3_before_anything_is_made(require_root, tmp_path):
    out = tmp_path / "out"
    before = set(_netns.list_namespaces())
    result = run_cli(["loopback", "--nodes", "2", "--netns", "--link", "rate=10mbit", "--output", str(out)],
                     timeout_s=60, env={"PATH": _path_of(tmp_path, "ip")})  # fmt: skip
    assert result.returncode == ExitCode.NETWORK, result.stderr
    line = _one_line_error(result)
    assert line.endswith("--link rate=10mbit needs tc, which is not installed: install the package iproute2 "
                         "(apt-get install iproute2)"), line  # fmt: skip
    assert not out.exists() and set(_netns.list_namespaces()) == before


@pytest.mark.netns
def test_loss_without_netem_needs_iptables_and_says_so_before_shaping(require_root, tmp_path, monkeypatch):
    with _netns.bridge_with_namespaces(2, kind="test") as net:
        with monkeypatch.context() as m:
            m.setattr(link, "netem_available", lambda ns: False)  # as on a kernel without sch_netem
            m.setenv("PATH", _path_of(tmp_path, "ip", "tc"))
            with pytest.raises(NetnsError) as caught:
                shape_links(net, LinkSpec.parse("rate=8mbit,loss=10%"))
        assert str(caught.value) == (
            "--link loss=10% on a kernel without netem (sch_netem) needs iptables, which "
            "is not installed: install the package iptables (apt-get install iptables)"
        )
        shaped = [_netns.run_in_netns(ns, ["tc", "qdisc", "show"]).stdout for ns in net.names]
        assert not any(re.search(r"\b(tbf|netem)\b", q) for q in shaped), shaped  # no link half shaped


def test_sigterm_stops_every_daemon_and_writes_the_summary(tmp_path):
    out = tmp_path / "fleet"
    args = ["loopback", "--nodes", "2", "--rounds", "0", "--output", str(out), *QUICK_CLI]
    with cli_process(args, tmp_path / "stdout.txt") as (proc, stderr):
        assert stderr.wait_for("fleet round 1:", FLEET_TIMEOUT_S), stderr.so_far()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
    errors = stderr.text()
    assert code == ExitCode.INTERRUPTED, errors
    assert "stopping the fleet (interrupted)" in errors and "edge-node: interrupted; every daemon stopped" in errors
    summary = read_summary(out)
    assert summary["fleet"]["outcome"] == "interrupted"
    assert all(n["rounds"] >= 1 and n["exit_code"] == 0 for n in summary["nodes"]), summary["nodes"]
    assert "| node0 |" in (tmp_path / "stdout.txt").read_text() and not (out / RUN_FILE).exists()


@pytest.mark.netns
def test_a_crashed_daemon_and_a_killed_supervisor_leave_nothing_behind(require_root, tmp_path):
    out = tmp_path / "fleet"
    args = ["loopback", "--nodes", "2", "--rounds", "0", "--netns", "--output", str(out), *QUICK_CLI]
    # 1. A daemon crashes: the fleet stops, says which node and why, and removes its namespaces.
    with cli_process(args, tmp_path / "stdout-1.txt") as (proc, stderr):
        assert stderr.wait_for("node1 round 1", FLEET_TIMEOUT_S), stderr.so_far()
        run = json.loads((out / RUN_FILE).read_text())
        crashed = next(n for n in run["nodes"] if n["node_id"] == "node1")
        os.kill(crashed["pid"], signal.SIGKILL)
        code = proc.wait(60)
    errors = stderr.text()
    assert code == ExitCode.UNEXPECTED, errors
    assert "node1: killed by signal 9 (SIGKILL); stopping the fleet" in errors
    assert "edge-node: error: node1 killed by signal 9 (SIGKILL); its log ends:" in errors
    assert not set(run["namespaces"]) & set(_netns.list_namespaces())
    summary = read_summary(out)
    assert summary["fleet"]["outcome"] == "node1 killed by signal 9 (SIGKILL)"
    assert {n["node_id"]: n["exit_code"] for n in summary["nodes"]} == {"node0": 0, "node1": -signal.SIGKILL}
    assert "| node1 (SIGKILL) |" in (tmp_path / "stdout-1.txt").read_text()
    # 2. The supervisor is killed: its daemons go with it; the next start removes its namespaces.
    with cli_process([*args, "--fresh"], tmp_path / "stdout-2.txt") as (proc, stderr):
        assert stderr.wait_for("round 1", FLEET_TIMEOUT_S), stderr.so_far()
        run = json.loads((out / RUN_FILE).read_text())
        proc.kill()
        assert proc.wait(10) == -signal.SIGKILL
    stderr.text()  # the pipe closed with the supervisor: no daemon holds it
    left = set(run["namespaces"]) & set(_netns.list_namespaces())
    assert left  # nobody cleaned up after a SIGKILL...
    deadline = time.monotonic() + 30
    while any(_netns.pids_in(ns) for ns in left) and time.monotonic() < deadline:
        time.sleep(0.2)  # ...but the daemons got SIGTERM from the kernel when their parent died
    assert not any(_netns.pids_in(ns) for ns in left)
    with Fleet(FleetConfig(nodes=2, rounds=1, netns=True, output=out, energy_backend="estimate")) as fleet:
        assert not left & set(_netns.list_namespaces())  # the next start removed them
        assert fleet.net is not None and len(fleet.net.namespaces) == 2
    assert not (out / RUN_FILE).exists() and not Path(out / RUN_FILE).with_suffix(".tmp").exists()
