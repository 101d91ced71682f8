"""Meter choice: auto-detection on this machine, named backends, and the labelled estimate."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from edge_node.energy import EstimateMeter, open_meter
from edge_node.energy.estimate import DEFAULT_WATTS_PER_CORE, process_cpu_seconds
from edge_node.errors import MeterUnavailable


def test_auto_on_this_machine_falls_back_to_the_estimate_and_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    """This machine (and CI) has no NVIDIA driver, no powercap, no INA3221 and no vcgencmd."""
    with caplog.at_level(logging.DEBUG, logger="edge_node"):
        meter = open_meter("auto")
    try:
        assert isinstance(meter, EstimateMeter)
        assert meter.source == "estimate" and meter.measured is False
    finally:
        meter.close()
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1
    message = warnings[0].getMessage()
    assert message.startswith("no energy meter found (tried: nvml: ")
    for name in ("rapl: ", "jetson: ", "rpi5: "):
        assert name in message
    assert f"ESTIMATE of CPU time x {DEFAULT_WATTS_PER_CORE:g} W" in message
    assert "every record is labelled estimated" in message


def test_auto_prefers_a_real_meter(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    zone = tmp_path / "sys/class/powercap/intel-rapl:0"
    zone.mkdir(parents=True)
    (zone / "name").write_text("package-0\n")
    (zone / "energy_uj").write_text("100\n")
    (zone / "max_energy_range_uj").write_text("262143328850\n")
    with caplog.at_level(logging.WARNING, logger="edge_node"):
        meter = open_meter("auto", sysfs_root=tmp_path)
    try:
        assert meter.source == "rapl" and meter.measured
    finally:
        meter.close()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_named_backend_that_is_absent_raises(tmp_path: Path) -> None:
    with pytest.raises(MeterUnavailable):
        open_meter("nvml")
    with pytest.raises(MeterUnavailable, match="vcgencmd"):
        open_meter("rpi5")


def test_bad_arguments_quote_the_value() -> None:
    with pytest.raises(ValueError, match="backend='gpu'"):
        open_meter("gpu")
    with pytest.raises(ValueError, match="estimate_watts=-3"):
        open_meter("estimate", estimate_watts=-3)
    with pytest.raises(ValueError, match="gpu_index=0 only applies to the nvml backend"):
        open_meter("rapl", gpu_index=0)


def test_estimate_follows_this_process_cpu_time() -> None:
    with open_meter("estimate", estimate_watts=20.0) as meter:
        start, cpu0 = meter.read(), process_cpu_seconds()
        deadline = time.process_time() + 0.3
        while time.process_time() < deadline:  # burn ~0.3 s of CPU
            pass
        end, cpu1 = meter.read(), process_cpu_seconds()
    burnt_j = end.energy_j - start.energy_j
    assert burnt_j >= 20.0 * 0.25
    assert burnt_j == pytest.approx(20.0 * (cpu1 - cpu0), abs=20.0 * 0.03)  # CPU time ticks are 10 ms
    assert "20 W per busy core" in meter.detail
