"""Jetson INA3221 on fake sysfs trees: hwmon (JetPack 5+) and iio (JetPack 4) layouts."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from edge_node.energy import JetsonMeter, find_jetson_rails, open_meter
from edge_node.errors import MeterUnavailable

HOUR_S = 3600.0  # sampler interval in tests that drive every sample by hand


def _write(path: Path, text: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{text}\n")


def _hwmon(root: Path, chip: str, hwmon: str, channels: dict[int, tuple[str, int, int]]) -> Path:
    """channels: number -> (label, mV, mA); also writes the 'sum of shunt voltages' channel 7.

    As on a real board, the driver directory entry is a symlink to the device.
    """
    device = root / "sys/devices/platform/bus@0/c240000.i2c/i2c-1" / chip
    link = root / "sys/bus/i2c/drivers/ina3221" / chip
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(device, target_is_directory=True)
    base = device / "hwmon" / hwmon
    for number, (label, mv, ma) in channels.items():
        _write(base / f"in{number}_label", label)
        _write(base / f"in{number}_input", mv)
        _write(base / f"curr{number}_input", ma)
    _write(base / "in7_label", "sum of shunt voltages")
    _write(base / "in7_input", 123)
    return base


def _iio(root: Path, chip: str, rails: dict[int, tuple[str, int]]) -> Path:
    """rails: number -> (rail name, mW)."""
    base = root / "sys/bus/i2c/drivers/ina3221x" / chip / "iio:device0"
    for number, (name, mw) in rails.items():
        _write(base / f"rail_name_{number}", name)
        _write(base / f"in_power{number}_input", mw)
    return base


def test_hwmon_orin_nano_uses_vdd_in_only(tmp_path: Path) -> None:
    _hwmon(
        tmp_path,
        "1-0040",
        "hwmon1",
        {1: ("VDD_IN", 5000, 1400), 2: ("VDD_CPU_GPU_CV", 4992, 360), 3: ("VDD_SOC", 4992, 320)},
    )
    with JetsonMeter(tmp_path, sample_interval_s=HOUR_S) as meter:
        assert meter.source == "jetson-ina3221" and meter.measured
        assert [r.name for r in meter.rails] == ["VDD_IN"]
        assert "VDD_IN" in meter.detail
        assert meter.last_sample is not None and meter.last_sample.power_w == pytest.approx(7.0)  # 5 V x 1.4 A


def test_hwmon_agx_orin_without_input_rail_sums_connected_rails(tmp_path: Path) -> None:
    _hwmon(
        tmp_path,
        "1-0040",
        "hwmon1",
        {1: ("VDD_GPU_SOC", 19000, 400), 2: ("VDD_CPU_CV", 19000, 100), 3: ("VIN_SYS_5V0", 5000, 600)},
    )
    _hwmon(tmp_path, "1-0041", "hwmon2", {1: ("NC", 0, 0), 2: ("VDDQ_VDD2_1V8AO", 19000, 50), 3: ("NC", 0, 0)})
    rails, detail = find_jetson_rails(tmp_path)
    assert sorted(r.name for r in rails) == ["VDDQ_VDD2_1V8AO", "VDD_CPU_CV", "VDD_GPU_SOC", "VIN_SYS_5V0"]
    assert "sum of rails" in detail and "not covered" in detail
    with JetsonMeter(tmp_path, sample_interval_s=HOUR_S) as meter:
        # 19 V x (0.4 + 0.1 + 0.05) A + 5 V x 0.6 A
        assert meter.last_sample is not None and meter.last_sample.power_w == pytest.approx(13.45)


def test_iio_nano_uses_pom_5v_in(tmp_path: Path) -> None:
    _iio(tmp_path, "6-0040", {0: ("POM_5V_IN", 4210), 1: ("POM_5V_GPU", 410), 2: ("POM_5V_CPU", 1200)})
    with JetsonMeter(tmp_path, sample_interval_s=HOUR_S) as meter:
        assert [r.name for r in meter.rails] == ["POM_5V_IN"]
        assert meter.last_sample is not None and meter.last_sample.power_w == pytest.approx(4.21)


def test_iio_missing_total_rail_sums_the_rest(tmp_path: Path) -> None:
    _iio(tmp_path, "1-0040", {0: ("VDD_GPU", 2000), 1: ("VDD_CPU", 1500), 2: ("VDD_SOC", 500)})
    rails, detail = find_jetson_rails(tmp_path)
    assert len(rails) == 3 and "sum of rails VDD_GPU+VDD_CPU+VDD_SOC" in detail
    with JetsonMeter(tmp_path, sample_interval_s=HOUR_S) as meter:
        assert meter.last_sample is not None and meter.last_sample.power_w == pytest.approx(4.0)


def test_trapezoid_integration_between_reads(tmp_path: Path, fake_clock) -> None:
    base = _hwmon(tmp_path, "1-0040", "hwmon1", {1: ("VDD_IN", 5000, 1000)})  # 5 W at t=0
    with JetsonMeter(tmp_path, clock=fake_clock, sample_interval_s=HOUR_S) as meter:
        _write(base / "curr1_input", 1400)  # 7 W at t=2
        fake_clock.t_s = 2.0
        first = meter.read()
        assert first.energy_j == pytest.approx(12.0)  # (5 + 7) / 2 x 2 s
        fake_clock.t_s = 3.0
        second = meter.read()
        assert second.energy_j == pytest.approx(19.0)  # + 7 W x 1 s
        assert (first.samples, second.samples) == (2, 3)


def test_sampler_thread_integrates_without_reads(tmp_path: Path) -> None:
    _hwmon(tmp_path, "1-0040", "hwmon1", {1: ("VDD_IN", 5000, 2000)})  # 10 W
    meter = open_meter("jetson", sysfs_root=tmp_path, sample_interval_s=0.01)
    try:
        start = meter.read()
        time.sleep(0.3)
        end = meter.read()
    finally:
        meter.close()
    assert end.samples - start.samples >= 5  # the thread sampled in between
    assert (end.energy_j - start.energy_j) == pytest.approx(10.0 * (end.t_s - start.t_s), rel=1e-6)


def test_unreadable_rail_fails_sample_then_recovers(tmp_path: Path, fake_clock) -> None:
    base = _hwmon(tmp_path, "1-0040", "hwmon1", {1: ("VDD_IN", 5000, 1000)})
    with JetsonMeter(tmp_path, clock=fake_clock, sample_interval_s=HOUR_S) as meter:
        (base / "curr1_input").write_text("garbage\n")
        fake_clock.t_s = 1.0
        bad = meter.read()
        assert (bad.energy_j, bad.errors) == (0.0, 1)
        (base / "curr1_input").write_text("1000\n")
        fake_clock.t_s = 2.0
        good = meter.read()
        assert good.energy_j == pytest.approx(10.0) and good.errors == 1  # the gap is bridged


def test_not_a_jetson(tmp_path: Path) -> None:
    with pytest.raises(MeterUnavailable, match="not a Jetson"):
        open_meter("jetson", sysfs_root=tmp_path)


def test_hwmon_channel_without_current_file_is_a_missing_rail(tmp_path: Path) -> None:
    """A labelled channel whose curr*_input is absent is not counted; VDD_IN missing means the sum."""
    base = _hwmon(tmp_path, "1-0040", "hwmon1", {1: ("VDD_IN", 5000, 1000), 2: ("VDD_SOC", 5000, 200)})
    (base / "curr1_input").unlink()
    rails, detail = find_jetson_rails(tmp_path)
    assert [r.name for r in rails] == ["VDD_SOC"] and "no VDD_IN/POM_5V_IN rail" in detail
    with JetsonMeter(tmp_path, sample_interval_s=HOUR_S) as meter:
        assert meter.last_sample is not None and meter.last_sample.power_w == pytest.approx(1.0)


def test_both_layouts_on_one_board_count_the_input_rail_once(tmp_path: Path) -> None:
    """A board with hwmon and iio drivers both bound (mid-upgrade): VDD_IN is taken once, not twice."""
    _hwmon(tmp_path, "1-0040", "hwmon1", {1: ("VDD_IN", 5000, 1000)})
    _iio(tmp_path, "1-0040", {0: ("VDD_IN", 5000), 1: ("VDD_GPU", 800)})
    rails, _ = find_jetson_rails(tmp_path)
    assert len(rails) == 1 and rails[0].name == "VDD_IN"
