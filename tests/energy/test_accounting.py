"""EnergyAccountant: per-phase attribution on an injected clock, and the JSONL record per round."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from edge_node.energy import EnergyAccountant, EstimateMeter, RaplMeter
from edge_node.errors import MeterUnavailable
from edge_node.protocol import MAX_ROUND

from .conftest import ScriptedCounterMeter


def test_phases_get_what_the_meter_advanced_while_they_ran(scripted_meter, fake_clock, tmp_path: Path) -> None:
    log = tmp_path / "state" / "energy.jsonl"
    acct = EnergyAccountant(scripted_meter, log, clock=fake_clock)
    fake_clock.t_s, scripted_meter.energy_j = 1.0, 5.0  # idle until t=1
    acct.start_phase("train")
    assert acct.current_phase == "train"
    fake_clock.t_s, scripted_meter.energy_j = 4.0, 35.0
    acct.stop_phase("train")
    with acct.phase("communicate"):
        fake_clock.t_s, scripted_meter.energy_j = 5.0, 37.0
    with acct.phase("aggregate"):
        fake_clock.t_s, scripted_meter.energy_j = 5.5, 38.0
    fake_clock.t_s, scripted_meter.energy_j = 6.0, 40.0  # idle again
    record = acct.close_round(0, accuracy=0.5)
    assert record["joules"] == {"train": 30.0, "aggregate": 1.0, "communicate": 2.0, "idle": 7.0}
    assert record["seconds"] == {"train": 3.0, "aggregate": 0.5, "communicate": 1.0, "idle": 1.5}
    assert record["total_j"] == 40.0 and record["duration_s"] == 6.0
    assert record["mean_power_w"] == pytest.approx(40 / 6, abs=1e-6)
    assert record["source"] == "fake-counter" and record["measured"] is True and record["label"] == "measured"
    assert record["round"] == 0 and record["accuracy"] == 0.5
    assert record["samples"] == 7  # seven reads after the opening one (six boundaries and the close)
    assert json.loads(log.read_text()) == record  # one line, same content

    fake_clock.t_s, scripted_meter.energy_j = 8.0, 50.0
    second = acct.close_round(1)
    assert second["joules"]["idle"] == 10.0 and second["total_j"] == 10.0 and second["duration_s"] == 2.0
    assert [json.loads(line)["round"] for line in log.read_text().splitlines()] == [0, 1]
    acct.close()
    assert scripted_meter.closed


def test_boundaries_within_a_slow_meters_read_share_it(scripted_meter, fake_clock) -> None:
    """A meter whose read takes 5 ms: a boundary within 5 ms of the last read does not read again (what ran
    in between goes to the next phase); later boundaries and every close_round read; totals stay exact."""
    scripted_meter.read_cost_s = 0.005
    acct = EnergyAccountant(scripted_meter, clock=fake_clock)
    opened = scripted_meter.reads
    fake_clock.t_s, scripted_meter.energy_j = 1.0, 10.0
    acct.start_phase("aggregate")  # 1 s after the opening read: reads
    fake_clock.t_s, scripted_meter.energy_j = 1.5, 15.0
    acct.stop_phase("aggregate")  # reads
    fake_clock.t_s, scripted_meter.energy_j = 1.502, 15.1
    acct.start_phase("train")  # 2 ms after the last read: shares it
    fake_clock.t_s, scripted_meter.energy_j = 3.0, 45.0
    acct.stop_phase("train")  # reads: the 2 ms of idle and 0.1 J land in train
    fake_clock.t_s, scripted_meter.energy_j = 3.001, 45.0
    record = acct.close_round(0)  # always reads
    assert scripted_meter.reads - opened == 4
    assert record["joules"] == {"train": 30.0, "aggregate": 5.0, "communicate": 0.0, "idle": 10.0}
    assert record["seconds"]["train"] == pytest.approx(1.5) and record["seconds"]["idle"] == pytest.approx(1.001)
    assert record["total_j"] == 45.0 and record["duration_s"] == pytest.approx(3.001)


def test_phase_running_across_close_round_is_split(scripted_meter, fake_clock) -> None:
    acct = EnergyAccountant(scripted_meter, None, clock=fake_clock)
    acct.start_phase("train")
    fake_clock.t_s, scripted_meter.energy_j = 1.0, 10.0
    first = acct.close_round(0)
    fake_clock.t_s, scripted_meter.energy_j = 3.0, 30.0
    acct.stop_phase("train")
    second = acct.close_round(1)
    assert first["joules"]["train"] == 10.0 and second["joules"]["train"] == 20.0
    assert second["joules"]["idle"] == 0.0


def test_nested_phase_charges_the_innermost(scripted_meter, fake_clock) -> None:
    acct = EnergyAccountant(scripted_meter, None, clock=fake_clock)
    with acct.phase("communicate"):
        fake_clock.t_s, scripted_meter.energy_j = 1.0, 1.0
        with acct.phase("aggregate"):
            fake_clock.t_s, scripted_meter.energy_j = 2.0, 5.0
        fake_clock.t_s, scripted_meter.energy_j = 3.0, 6.0
    record = acct.close_round(0)
    assert record["joules"] == {"train": 0.0, "aggregate": 4.0, "communicate": 2.0, "idle": 0.0}


def test_bad_calls_are_refused_with_the_value(scripted_meter, fake_clock) -> None:
    acct = EnergyAccountant(scripted_meter, None, clock=fake_clock)
    with pytest.raises(ValueError, match="phase='sleep'"):
        acct.start_phase("sleep")
    with pytest.raises(ValueError, match="phase='train' is not running"):
        acct.stop_phase("train")
    with pytest.raises(ValueError, match="round_index=-1"):
        acct.close_round(-1)
    with pytest.raises(ValueError, match=f"round_index={MAX_ROUND + 1} must be"):  # the round rule: at most MAX_ROUND
        acct.close_round(MAX_ROUND + 1)
    with pytest.raises(ValueError, match="total_j"):
        acct.close_round(0, total_j=1.0)
    acct.close()
    acct.close()  # idempotent
    with pytest.raises(MeterUnavailable, match="closed"):
        acct.close_round(0)


def test_estimate_records_say_estimated(fake_clock, tmp_path: Path) -> None:
    cpu_s = [0.0]
    meter = EstimateMeter(12.0, cpu_seconds=lambda: cpu_s[0], clock=fake_clock)
    with EnergyAccountant(meter, tmp_path / "energy.jsonl", clock=fake_clock) as acct:
        with acct.phase("train"):
            cpu_s[0], fake_clock.t_s = 2.5, 3.0  # 2.5 CPU seconds in 3 s of wall time
        record = acct.close_round(0)
    assert record["joules"]["train"] == pytest.approx(30.0)  # 2.5 s x 12 W
    assert record["measured"] is False and record["label"] == "estimated" and record["source"] == "estimate"
    assert "ESTIMATE" in record["detail"]


def test_a_meter_that_fails_its_first_read_is_closed_not_leaked(tmp_path: Path) -> None:
    """The accountant owns the meter: if it cannot even start, the meter's sampler thread must stop."""
    zone = tmp_path / "sys/class/powercap/intel-rapl:0"
    zone.mkdir(parents=True)
    (zone / "name").write_text("package-0\n")
    (zone / "energy_uj").write_text("100\n")
    (zone / "max_energy_range_uj").write_text("262143328850\n")
    meter = RaplMeter(tmp_path, poll_interval_s=0.01)  # a poll thread runs from here on
    (zone / "energy_uj").write_text("garbage\n")
    with pytest.raises(MeterUnavailable, match="does not hold an integer"):
        EnergyAccountant(meter, tmp_path / "energy.jsonl")
    with pytest.raises(MeterUnavailable, match="closed"):
        meter.read()
    assert not (tmp_path / "energy.jsonl").exists()


class _OrderedMeter(ScriptedCounterMeter):
    """Each read returns 10 J more than the last, so what a phase gets depends only on the order of reads;
    while ``gate`` is clear a read waits (a slow counter), and read number ``fail_at`` raises."""

    def __init__(self, clock, gate: threading.Event, fail_at: int = 0) -> None:
        super().__init__(clock)
        self.gate, self.fail_at = gate, fail_at
        self.threads: set[str] = set()

    def read(self):
        if self.reads and not self.gate.wait(5):  # the opening read never waits
            raise MeterUnavailable("the test's gate stayed shut")
        self.threads.add(threading.current_thread().name)
        if self.reads + 1 == self.fail_at:
            self.reads += 1
            raise MeterUnavailable("scripted failure")
        self.energy_j = 10.0 * self.reads
        return super().read()


def test_boundary_reads_on_a_thread_do_not_wait_and_are_charged_in_order(fake_clock) -> None:
    gate = threading.Event()
    meter = _OrderedMeter(fake_clock, gate)
    acct = EnergyAccountant(meter, clock=fake_clock, read_on_thread=True)
    started = time.monotonic()
    fake_clock.t_s = 1.0
    acct.start_phase("train")  # read 1 (10 J): idle's
    fake_clock.t_s = 3.0
    acct.stop_phase("train")  # read 2 (20 J): train's
    with acct.phase("aggregate"):  # reads 3 (30 J, idle's) and 4 (40 J, aggregate's)
        fake_clock.t_s = 3.5
    assert time.monotonic() - started < 1.0  # the boundaries returned while the reads waited at the gate
    assert meter.reads == 1
    gate.set()
    fake_clock.t_s = 4.0
    record = acct.close_round(0)  # read 5 (50 J), by the caller, after the four in flight
    assert record["joules"] == {"train": 10.0, "aggregate": 10.0, "communicate": 0.0, "idle": 30.0}
    assert record["seconds"] == {"train": 2.0, "aggregate": 0.5, "communicate": 0.0, "idle": 1.5}
    assert record["total_j"] == 50.0 and record["samples"] == 5
    assert any(name.startswith("edge-node-meter") for name in meter.threads)
    acct.close()
    assert meter.closed


def test_a_boundary_read_that_fails_on_the_thread_raises_later(fake_clock) -> None:
    gate = threading.Event()
    gate.set()
    acct = EnergyAccountant(_OrderedMeter(fake_clock, gate, fail_at=2), clock=fake_clock, read_on_thread=True)
    try:
        with pytest.raises(MeterUnavailable, match="scripted failure"):
            acct.start_phase("train")  # its read (the first after the opening one) fails on the reader thread
            for _ in range(100):  # this boundary, a later one or the round's close says so
                acct.stop_phase("train")
                acct.start_phase("train")
            acct.close_round(0)
    finally:
        acct.close()
