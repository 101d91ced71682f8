"""The simulation reads a slow meter at phase boundaries on a reader thread; the records stay exact."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from edge_node.api import run_simulation
from edge_node.energy.base import CounterMeter
from edge_node.sim.config import SimConfig


class _SlowPowerMeter(CounterMeter):
    """100 W since it was opened, read in 2 ms, and it notes which threads read it."""

    source = "slow-test-meter"
    detail = "100 W of wall time, 2 ms a read"
    read_cost_s = 0.002

    def __init__(self) -> None:
        self.threads: set[str] = set()
        self.opened_at = time.monotonic()
        super().__init__()

    def _read_counter_j(self) -> float:
        self.threads.add(threading.current_thread().name)
        time.sleep(0.002)
        return 100.0 * (time.monotonic() - self.opened_at)

    def _close_backend(self) -> None:
        return None


def test_a_slow_meters_boundaries_are_read_on_a_thread_and_the_records_add_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    meter = _SlowPowerMeter()
    monkeypatch.setattr("edge_node.sim.runner._open_meter", lambda backend: meter)
    config = SimConfig(
        dataset="demo", clients=2, neighbours=1, rounds=2, epochs=1, samples_per_client=40, batch_size=20,
        progress=False, output=tmp_path / "run",
    )  # fmt: skip
    run_simulation(config, fresh=True)
    records = [json.loads(line) for line in (tmp_path / "run" / "energy.jsonl").read_text().splitlines()]
    assert [r["round"] for r in records] == [0, 1]
    for record in records:
        assert record["source"] == "slow-test-meter" and record["label"] == "measured"
        # every figure is rounded to 6 decimals on its own: the parts may miss the total by half a unit each
        rounding = 0.5e-6 * (len(record["joules"]) + 1) + 1e-9
        assert sum(record["joules"].values()) == pytest.approx(record["total_j"], abs=rounding)
        assert record["joules"]["train"] > 0 and record["joules"]["aggregate"] > 0
        # 100 W throughout: each round's joules are its seconds between its first and last reads, x 100
        assert record["total_j"] == pytest.approx(100 * record["duration_s"], rel=0.05)
    assert any(name.startswith("edge-node-meter") for name in meter.threads), meter.threads
