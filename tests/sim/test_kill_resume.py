"""A simulation killed at any moment (SIGKILL, or SIGINT) loses at most the round in progress: the
same command resumes it, and the records match a run that was never interrupted."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

SIM = [
    sys.executable, "-m", "edge_node", "simulate", "--dataset", "demo", "--clients", "4", "--neighbours", "2",
    "--rounds", "4", "--epochs", "1", "--samples-per-client", "100", "--no-progress", "--energy-backend", "estimate",
]  # fmt: skip


def _records(run: Path) -> list[dict]:
    lines = (run / "rounds.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k != "wall_s"} for line in lines]


def _start_and_signal(out: Path, sig: int, after_rounds: int) -> subprocess.CompletedProcess:
    """Start a run, send ``sig`` once ``after_rounds`` records exist, wait for it to end."""
    proc = subprocess.Popen(
        [*SIM, "--output", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        # Python leaves SIGINT ignored in a child whose parent ignores it (a test run started in the
        # background of a non-interactive shell does): give the run the default Ctrl-C behaviour.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    log = out / "rounds.jsonl"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        if log.exists() and log.read_text().count("\n") >= after_rounds:
            proc.send_signal(sig)
            break
        time.sleep(0.02)
    stdout, stderr = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("straight") / "run"
    assert subprocess.run([*SIM, "--output", str(out)], capture_output=True, timeout=300).returncode == 0
    return _records(out)


@pytest.mark.parametrize("after_rounds", [1, 2])
def test_sigkill_mid_run_then_the_same_command_resumes_to_the_same_records(tmp_path, straight, after_rounds):
    out = tmp_path / "run"
    killed = _start_and_signal(out, signal.SIGKILL, after_rounds)
    assert killed.returncode == -signal.SIGKILL, "the run ended before it could be killed"
    assert (out / "checkpoint.pt").exists() or after_rounds == 1  # killed around the first checkpoint
    resumed = subprocess.run([*SIM, "--output", str(out)], capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert _records(out) == straight
    assert not (out / "checkpoint.pt.tmp").exists()


def test_sigint_stops_with_exit_130_keeping_completed_rounds(tmp_path, straight):
    out = tmp_path / "run"
    stopped = _start_and_signal(out, signal.SIGINT, 1)
    assert stopped.returncode == 130, stopped.stderr
    assert stopped.stderr.strip().splitlines()[-1] == "edge-node: interrupted"
    kept = _records(out)
    assert kept and kept == straight[: len(kept)]
    resumed = subprocess.run([*SIM, "--output", str(out)], capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert _records(out) == straight
