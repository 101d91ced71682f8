"""Real ``edge-node start`` processes for tests: start, watch their records, signal, always reap.

    with NodeProcesses() as nodes:
        a = nodes.start("a", state_dir, ["--fleet", "f", "--insecure", ...])
        a.wait_rounds(2, timeout_s=60)
        a.signal(signal.SIGKILL)

Every process started here is killed and reaped on exit of the context, also when the test fails.
Ports come from :func:`free_ports` (bound and released on 127.0.0.1; a tiny race is accepted).
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from contextlib import ExitStack, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

EDGE_NODE = [sys.executable, "-m", "edge_node"]
# Settings that keep a test node small and quick: one thread, one epoch, the demo set.
QUICK = ["--insecure", "--threads", "1", "--epochs", "1", "--energy-backend", "estimate", "--no-export-onnx"]


def read_records(state_dir: Path) -> list[dict[str, Any]]:
    path = state_dir / "rounds.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def assert_rounds_to_the_end(records: list[dict[str, Any]], rounds: int) -> None:
    """Each round once, in order, from round 0 until ``rounds`` are done; a round is left out only where a
    record says the node caught up past it (``caught_up_to``: its peers were ahead, as a late joiner's are).
    The last catch-up may go past ``rounds`` when the peers ran on further."""
    assert records and records[0]["round"] == 0, records
    assert records[-1].get("caught_up_to", records[-1]["round"] + 1) >= rounds, records
    for before, after in itertools.pairwise(records):
        assert after["round"] == before.get("caught_up_to", before["round"] + 1), (before, after)


@dataclass
class NodeProcess:
    name: str
    state_dir: Path
    args: list[str]
    log_path: Path
    proc: subprocess.Popen[bytes] = field(repr=False)

    @property
    def records(self) -> list[dict[str, Any]]:
        return read_records(self.state_dir)

    def completed(self) -> list[dict[str, Any]]:
        return [r for r in self.records if not r.get("diverged")]

    def wait_rounds(self, n: int, timeout_s: float) -> list[dict[str, Any]]:
        """Wait until ``n`` rounds are recorded (AssertionError with the log tail otherwise)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            done = self.completed()
            if len(done) >= n:
                return done
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        raise AssertionError(f"{self.name}: {len(self.completed())} of {n} rounds after {timeout_s} s\n{self.log()}")

    def wait(self, timeout_s: float) -> int:
        """The exit code (AssertionError with the log tail when it does not exit in time)."""
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self.name} still running after {timeout_s} s\n{self.log()}") from None

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def log(self, lines: int = 40) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


class NodeProcesses:
    """Starts node processes and guarantees they are gone afterwards."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.nodes: list[NodeProcess] = []
        self._stack = ExitStack()

    def start(self, name: str, state_dir: Path, args: list[str], *, env: dict[str, str] | None = None,
              prefix: list[str] | None = None) -> NodeProcess:  # fmt: skip
        """``edge-node start --node-id NAME --state-dir STATE_DIR ARGS`` (``prefix`` e.g. ``ip netns exec NS``)."""
        state_dir.mkdir(parents=True, exist_ok=True)
        log_path = state_dir.parent / f"{name}.log"
        handle = self._stack.enter_context(open(log_path, "ab"))  # noqa: SIM115 -- closed by the ExitStack
        full = [*(prefix or []), *EDGE_NODE, "start", "--node-id", name, "--state-dir", str(state_dir), *args]
        proc = subprocess.Popen(full, stdout=handle, stderr=subprocess.STDOUT, env={**self.env, **(env or {})})
        node = NodeProcess(name, state_dir, args, log_path, proc)
        self.nodes.append(node)
        return node

    def restart(self, node: NodeProcess) -> NodeProcess:
        """Start ``node`` again with the same arguments and state dir (after it exited or was killed)."""
        node.wait(10)
        return self.start(node.name, node.state_dir, node.args)

    def __enter__(self) -> NodeProcesses:
        return self

    def __exit__(self, *exc: object) -> None:
        for node in self.nodes:
            if node.proc.poll() is None:
                node.proc.send_signal(signal.SIGKILL)
        for node in self.nodes:
            with suppress(subprocess.TimeoutExpired):
                node.proc.wait(timeout=10)
        self._stack.close()


def run_cli(
    args: list[str], *, timeout_s: float = 120, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``edge-node ARGS`` to completion, capturing text output."""
    return subprocess.run(
        [*EDGE_NODE, *args], capture_output=True, text=True, timeout=timeout_s, env={**os.environ, **(env or {})}
    )
