"""Helpers for fleet tests: small fleet settings, bounded waits on a running :class:`Fleet`, the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from edge_node.fleet.config import FleetConfig
from edge_node.fleet.fleet import Fleet

EDGE_NODE = [sys.executable, "-m", "edge_node"]
# Small and quick: one thread, one epoch of batch 32 on a slice of the demo set, short pulls.
QUICK: dict[str, Any] = {"epochs": 1, "threads": 1, "pull_timeout_s": 15.0, "energy_backend": "estimate"}
FLEET_TIMEOUT_S = 300  # bound on any fleet test's wait (2 busy cores); a healthy run takes a fraction


def config(output: Path, **settings: Any) -> FleetConfig:
    return FleetConfig(output=output, **{**QUICK, **settings})


def wait_until(fleet: Fleet, predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Poll the fleet (reading records) until ``predicate()``; AssertionError with every log tail when
    ``timeout_s`` passes or a running daemon exits with an error (one the test killed does not count)."""
    started = time.monotonic()
    running = [d for d in fleet.daemons if d.running]
    while time.monotonic() < started + timeout_s:
        fleet.poll()
        if predicate():
            return
        crashed = [d.node_id for d in running if d.returncode not in (None, 0)]
        if crashed:
            raise AssertionError(f"not {what}: {crashed} exited with an error\n{logs(fleet)}")
        time.sleep(0.3)
    raise AssertionError(f"not {what} after {time.monotonic() - started:.0f} s\n{logs(fleet)}")


def run_to_end(fleet: Fleet, timeout_s: float = FLEET_TIMEOUT_S) -> None:
    """Start the fleet and wait until every node exited 0."""
    fleet.start()
    wait_until(fleet, fleet.finished, timeout_s, "finished")
    codes = {d.node_id: d.returncode for d in fleet.own_daemons()}
    assert set(codes.values()) == {0}, f"{codes}\n{logs(fleet)}"


def logs(fleet: Fleet, lines: int = 15) -> str:
    return "\n".join(f"--- {d.node_id} (exit {d.returncode}):\n{d.log_tail(lines)}" for d in fleet.daemons)


def records(fleet: Fleet, node_id: str) -> list[dict[str, Any]]:
    fleet.poll()
    return next(d for d in fleet.daemons if d.node_id == node_id).completed


def run_cli(args: list[str], *, timeout_s: float = FLEET_TIMEOUT_S,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """``edge-node ARGS`` to completion, capturing text output."""
    return subprocess.run(
        [*EDGE_NODE, *args], capture_output=True, text=True, timeout=timeout_s, env={**os.environ, **(env or {})}
    )


def read_summary(output: Path) -> dict[str, Any]:
    return json.loads((output / "fleet-summary.json").read_text())


class LineReader:
    """The one reader of a text pipe (a process's stderr): a thread collects its lines until EOF.

    Waiting for a line and reading the whole text later go through the same object, so every line is
    seen once and in order (a second reader of the same pipe would take lines away from the first).
    """

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream
        self._lines: list[str] = []
        self._eof = False
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._read, name="line-reader", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for line in self._stream:
                with self._changed:
                    self._lines.append(line)
                    self._changed.notify_all()
        finally:
            with self._changed:
                self._eof = True
                self._changed.notify_all()

    def wait_for(self, needle: str, timeout_s: float) -> bool:
        """True once a line contains ``needle``; False after ``timeout_s`` or at EOF without one."""
        deadline = time.monotonic() + timeout_s
        seen = 0
        with self._changed:
            while True:
                if any(needle in line for line in self._lines[seen:]):
                    return True
                seen = len(self._lines)
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._eof:
                    return False
                self._changed.wait(remaining)

    def so_far(self) -> str:
        """The lines read until now (for a failure message while the process runs)."""
        with self._changed:
            return "".join(self._lines)

    def text(self, timeout_s: float = 30.0) -> str:
        """Everything written to the pipe: waits for EOF (AssertionError if it stays open ``timeout_s``)."""
        self._thread.join(timeout_s)
        assert not self._thread.is_alive(), f"the pipe is still open after {timeout_s:g} s:\n{self.so_far()}"
        return "".join(self._lines)


@contextmanager
def cli_process(args: list[str], stdout_path: Path) -> Iterator[tuple[subprocess.Popen[str], LineReader]]:
    """``edge-node ARGS`` running: stdout into ``stdout_path``, stderr read by a :class:`LineReader`.

    The caller waits for it (``proc.wait``); on leaving, a process still running is killed by its pid.
    """
    with open(stdout_path, "w") as stdout:
        proc = subprocess.Popen([*EDGE_NODE, *args], stdout=stdout, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    reader = LineReader(proc.stderr)
    try:
        yield proc, reader
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
