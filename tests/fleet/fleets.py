"""Helpers for fleet tests: small fleet settings, bounded waits on a running :class:`Fleet`, the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

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
