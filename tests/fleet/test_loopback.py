"""``edge-node loopback`` as a user runs it: bad input, Ctrl-C/SIGTERM, a crashed daemon, a killed supervisor;
and the link shaping it applies (rate really limited, loss rules, delay reported when it cannot be applied)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from edge_node.errors import ConfigError
from edge_node.exit_codes import ExitCode
from edge_node.fleet import netns as _netns
from edge_node.fleet.config import FleetConfig
from edge_node.fleet.fleet import RUN_FILE, Fleet
from edge_node.fleet.link import LinkSpec, netem_available, shape_links
from tests.fleet.fleets import EDGE_NODE, FLEET_TIMEOUT_S, read_summary, run_cli

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


def _stream_until(proc: subprocess.Popen[str], needle: str, timeout_s: float, sink: list[str]) -> bool:
    """Read ``proc``'s stderr lines into ``sink`` until one contains ``needle`` (bounded by ``timeout_s``)."""
    found = threading.Event()

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            sink.append(line)
            if needle in line:
                found.set()

    threading.Thread(target=read, daemon=True).start()
    return found.wait(timeout_s)


def test_sigterm_stops_every_daemon_and_writes_the_summary(tmp_path):
    out = tmp_path / "fleet"
    proc = subprocess.Popen([*EDGE_NODE, "loopback", "--nodes", "2", "--rounds", "0", "--output", str(out),
                             *QUICK_CLI], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    lines: list[str] = []
    try:
        assert _stream_until(proc, "fleet round 1:", FLEET_TIMEOUT_S, lines), "".join(lines)
        proc.send_signal(signal.SIGTERM)
        stdout, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == ExitCode.INTERRUPTED, "".join(lines)
    summary = read_summary(out)
    assert summary["fleet"]["outcome"] == "interrupted"
    assert all(n["rounds"] >= 1 and n["exit_code"] == 0 for n in summary["nodes"]), summary["nodes"]
    assert "| node0 |" in stdout and not (out / RUN_FILE).exists()


@pytest.mark.netns
def test_a_crashed_daemon_and_a_killed_supervisor_leave_nothing_behind(require_root, tmp_path):
    out = tmp_path / "fleet"
    argv = [*EDGE_NODE, "loopback", "--nodes", "2", "--rounds", "0", "--netns", "--output", str(out), *QUICK_CLI]
    # 1. A daemon crashes: the fleet stops, says which node and why, and removes its namespaces.
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    try:
        assert _stream_until(proc, "node1 round 1", FLEET_TIMEOUT_S, lines), "".join(lines)
        run = json.loads((out / RUN_FILE).read_text())
        crashed = next(n for n in run["nodes"] if n["node_id"] == "node1")
        os.kill(crashed["pid"], signal.SIGKILL)
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == ExitCode.UNEXPECTED, "".join(lines)
    assert "edge-node: error: node1 exited with code -9" in "".join(lines)
    assert not set(run["namespaces"]) & set(_netns.list_namespaces())
    assert read_summary(out)["fleet"]["outcome"] == "node1 exited with code -9"
    # 2. The supervisor is killed: its daemons go with it; the next start removes its namespaces.
    proc = subprocess.Popen([*argv, "--fresh"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = []
    try:
        assert _stream_until(proc, "round 1", FLEET_TIMEOUT_S, lines), "".join(lines)
        run = json.loads((out / RUN_FILE).read_text())
        proc.kill()
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
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

