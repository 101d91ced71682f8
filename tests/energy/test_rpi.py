"""Raspberry Pi 5 PMIC: recorded ``vcgencmd pmic_read_adc`` output, replayed by a fake command."""

from __future__ import annotations

import logging
import os
import shutil
import time
from pathlib import Path

import pytest

from edge_node.energy import RpiPmicMeter, parse_pmic_read_adc
from edge_node.errors import MeterUnavailable

GOOD_TOTAL_W = 3.5240742  # sum of V x A over the 12 paired rails in pmic_read_adc_rpi5.txt


@pytest.fixture
def vcgencmd(tmp_path: Path, data_dir: Path):
    """A `vcgencmd` stand-in printing whichever recorded output the test selects."""
    script = tmp_path / "vcgencmd"
    script.write_text('#!/bin/sh\ncat "$(dirname "$0")/current.txt"\n')
    script.chmod(0o755)

    def use(fixture_name: str) -> list[str]:
        shutil.copyfile(data_dir / fixture_name, tmp_path / "next.txt")
        os.replace(tmp_path / "next.txt", tmp_path / "current.txt")  # atomic: no half-written output
        return [str(script), "pmic_read_adc"]

    return use


def test_parse_recorded_pi5_output(data_dir: Path) -> None:
    rails = parse_pmic_read_adc((data_dir / "pmic_read_adc_rpi5.txt").read_text())
    assert len(rails) == 12  # EXT5V and BATT have a voltage but no current: left out
    assert "EXT5V" not in rails and "BATT" not in rails
    assert rails["VDD_CORE"] == pytest.approx(2.255 * 0.8999922)
    assert sum(rails.values()) == pytest.approx(GOOD_TOTAL_W)


@pytest.mark.parametrize("name", ["pmic_read_adc_garbage.txt", "pmic_read_adc_pi4_error.txt"])
def test_parse_garbage_is_a_clear_error(data_dir: Path, name: str) -> None:
    text = (data_dir / name).read_text()
    with pytest.raises(MeterUnavailable, match="no rail with both volts and amps") as info:
        parse_pmic_read_adc(text)
    assert text.split()[0][:10] in str(info.value)  # quotes what it got


def test_meter_reads_power_from_command(vcgencmd, fake_clock) -> None:
    command = vcgencmd("pmic_read_adc_rpi5.txt")
    with RpiPmicMeter(command, clock=fake_clock, sample_interval_s=3600) as meter:
        assert meter.source == "rpi5-pmic" and meter.measured
        assert "12 rails" in meter.detail
        fake_clock.t_s = 10.0
        assert meter.read().energy_j == pytest.approx(10 * GOOD_TOTAL_W)


def test_opening_on_garbage_refuses_with_the_output(vcgencmd) -> None:
    with pytest.raises(MeterUnavailable, match="Invalid arguments"):
        RpiPmicMeter(vcgencmd("pmic_read_adc_pi4_error.txt"))


def test_sampler_survives_garbage_and_reports_it(vcgencmd, caplog: pytest.LogCaptureFixture) -> None:
    command = vcgencmd("pmic_read_adc_rpi5.txt")
    meter = RpiPmicMeter(command, sample_interval_s=0.02)
    try:
        time.sleep(0.3)
        good = meter.read()
        assert good.samples >= 3 and good.errors == 0
        with caplog.at_level(logging.WARNING, logger="edge_node.energy"):
            vcgencmd("pmic_read_adc_garbage.txt")
            time.sleep(0.3)
            during = meter.read()
        assert during.errors >= 3 and during.energy_j >= good.energy_j
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and "rpi5-pmic sample failed" in warnings[0].getMessage()
        vcgencmd("pmic_read_adc_rpi5.txt")
        time.sleep(0.3)
        after = meter.read()
    finally:
        meter.close()
    assert after.samples > during.samples  # it kept going once the output was good again
    # the power never changed, so the failed samples were bridged: energy = power x elapsed time
    assert after.energy_j - good.energy_j == pytest.approx(GOOD_TOTAL_W * (after.t_s - good.t_s))


def test_missing_command(tmp_path: Path) -> None:
    with pytest.raises(MeterUnavailable, match="not found on PATH"):
        RpiPmicMeter([str(tmp_path / "no-such-vcgencmd"), "pmic_read_adc"])
