"""Fixtures for the energy tests: a clock the test moves, a meter the test scripts, the data dir."""

from __future__ import annotations

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
