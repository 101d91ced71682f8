"""``edge-node start`` stopping during start-up, a full disk, and a restart over a checkpoint of another tier."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import torch

from edge_node.exit_codes import ExitCode
from edge_node.fleet.fleet import free_ports
from edge_node.node.status import rounds_done_text
from tests.daemons import EDGE_NODE, QUICK, NodeProcesses, read_records

ROUND_TIMEOUT_S = 180
SOLO = ["--fleet", "test", "--num-clients", "6", "--client-index", "0", "--discovery", "static",
        "--peers", "127.0.0.1:1"]  # fmt: skip


def _wait_line(path: Path, text: str, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if text in path.read_text(errors="replace"):
            return
        assert proc.poll() is None, path.read_text(errors="replace")
        time.sleep(0.05)
    raise AssertionError(f"no {text!r} after {timeout_s} s:\n{path.read_text(errors='replace')}")


def test_sigterm_during_the_capacity_probe_then_sigint_exits_0_within_5s(tmp_path):
    """A stop signal is seen inside the probe (not after it), and more signals until the process is gone
    neither cut shutdown short nor change the exit code."""
    (port,) = free_ports(1)
    state = tmp_path / "state"
    log = tmp_path / "node.log"
    args = [*QUICK, *SOLO, "--capacity", "auto", "--listen", f"127.0.0.1:{port}", "--state-dir", str(state)]
    with open(log, "wb") as out:
        proc = subprocess.Popen([*EDGE_NODE, "-v", "start", "--node-id", "solo", *args], stdout=out, stderr=out)
    try:
        _wait_line(log, "measuring this device's capacity", proc, 120)
        time.sleep(1.0)  # inside the probe's 10 s window
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        while proc.poll() is None and time.monotonic() - started < 30:
            time.sleep(0.1)  # the impatient operator, until the very end: no exit 130, no skipped clean-up
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        code = proc.wait(30)
        stopped_s = time.monotonic() - started
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    text = log.read_text(errors="replace")
    assert code == 0, text
    assert stopped_s < 5.0, (stopped_s, text)
    assert "stopped during start-up" in text and "stopped in " in text and "Traceback" not in text, text
    assert not state.exists()  # start-up had checked and measured, but created nothing yet


def test_a_full_disk_is_one_line_exit_4_and_a_restart_resumes(require_root, tmp_path):
    """The state dir on a 16 MiB tmpfs that fills up mid-run: exit 4 with one line, the checkpoint and
    rounds.jsonl intact; with the space freed, the same command resumes from the checkpoint."""
    state = tmp_path / "node" / "state"  # the mount point itself: the node's log (../solo.log) stays off it
    state.mkdir(parents=True)
    disk = state
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(disk)], check=True)
    try:
        (port,) = free_ports(1)
        args = [*QUICK, *SOLO, "--capacity", "0.4", "--listen", f"127.0.0.1:{port}", "--rounds", "3"]
        with NodeProcesses() as nodes:
            node = nodes.start("solo", state, args)
            node.wait_rounds(1, ROUND_TIMEOUT_S)
            # The record is appended before the checkpoint is written (a restart drops records the
            # checkpoint does not hold), so wait for the first checkpoint too before filling the disk.
            deadline = time.monotonic() + ROUND_TIMEOUT_S
            while not (state / "checkpoint.pt").exists():
                assert time.monotonic() < deadline and node.proc.poll() is None, node.log()
                time.sleep(0.05)
            filler = disk / "filler"
            with open(filler, "wb") as handle:  # take every byte left
                try:
                    while True:
                        handle.write(b"\0" * 65536)
                        handle.flush()
                except OSError:
                    pass
            assert os.statvfs(disk).f_bavail == 0
            code = node.wait(ROUND_TIMEOUT_S)
            log = node.log(400)
            assert code == int(ExitCode.STORAGE), log
            errors = [line for line in log.splitlines() if line.startswith("edge-node: error: ")]
            assert len(errors) == 1 and "cannot write" in errors[0] and "full" in errors[0], log
            assert log.splitlines()[-1] == errors[0] and "Traceback" not in log, log
            records = read_records(state)  # every line parses: nothing torn
            checkpoint = torch.load(state / "checkpoint.pt", weights_only=True)
            kept = checkpoint["rounds_done"]
            assert kept >= 1 and [r["round"] for r in records][:kept] == list(range(kept)), (kept, records)
            assert not list(state.glob("*.tmp"))
            filler.unlink()
            resumed = nodes.restart(node)
            assert resumed.wait(3 * ROUND_TIMEOUT_S) == 0, resumed.log()
        assert f"{rounds_done_text(kept)}, resumed from {state / 'checkpoint.pt'}" in resumed.log(200)
        assert [r["round"] for r in resumed.records] == [0, 1, 2]
        assert resumed.records[:kept] == records[:kept]
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def test_a_restart_with_capacity_auto_keeps_the_checkpoints_tier_and_says_so(tmp_path):
    (port,) = free_ports(1)
    args = [*QUICK, *SOLO, "--listen", f"127.0.0.1:{port}"]
    with NodeProcesses() as nodes:
        first = nodes.start("solo", tmp_path / "s", [*args, "--capacity", "0.4", "--rounds", "1"])
        assert first.wait(ROUND_TIMEOUT_S) == 0, first.log()
        again = nodes.start("solo", tmp_path / "s", [*args, "--capacity", "auto", "--rounds", "2"])
        assert again.wait(ROUND_TIMEOUT_S) == 0, again.log()
    log = again.log(200)
    assert "tier 0.4 (kept from the checkpoint: not probed at start" in log, log
    status = json.loads((again.state_dir / "status.json").read_text())
    assert status["tier"] == "0.4" and status["capacity"]["source"] == "checkpoint"
    assert status["capacity"]["density"] == 0.4 and status["capacity"]["measurements"] is None  # no probe for nothing
    assert [r["tier"] for r in again.records] == ["0.4", "0.4"]
