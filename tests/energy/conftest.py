"""Fixtures for the energy tests: a clock the test moves, a meter the test scripts, the data dir."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from edge_node.energy.base import Meter, MeterReading
from edge_node.errors import MeterUnavailable

DATA = Path(__file__).parent / "data"


class FakeClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self, t_s: float = 0.0) -> None:
        self.t_s = t_s

    def __call__(self) -> float:
        return self.t_s


class ScriptedCounterMeter(Meter):
    """A counter meter whose joules the test sets (stands in for hardware, not for the accountant)."""

    source = "fake-counter"
    measured = True
    detail = "scripted by the test"

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.energy_j = 0.0
        self.reads = 0
        self.closed = False

    def read(self) -> MeterReading:
        if self.closed:
            raise MeterUnavailable("closed")
        self.reads += 1
        return MeterReading(self.clock(), self.energy_j, self.reads, 0)

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def fake_clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def scripted_meter(fake_clock: FakeClock) -> ScriptedCounterMeter:
    return ScriptedCounterMeter(fake_clock)


@pytest.fixture
def data_dir() -> Path:
    return DATA


@pytest.fixture(autouse=True)
def _no_meter_threads_left() -> Iterator[None]:
    """Fail a test that leaves a meter's sampler or poll thread running (they are daemon threads, which
    the repository-wide leak check does not look at)."""
    before = set(threading.enumerate())
    yield
    left = [
        t.name for t in threading.enumerate() if t not in before and t.name.startswith("edge-node-") and t.is_alive()
    ]
    assert not left, f"meter threads still running after the test: {left}"
