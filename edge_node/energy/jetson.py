"""NVIDIA Jetson on-module INA3221 power monitors, read from sysfs and integrated.

Two driver layouts exist (the same ones jetson-stats, ``rbonghi/jetson_stats:jtop/core/power.py``,
walks):

* JetPack 5 and later, the mainline ``ina3221`` hwmon driver::

      /sys/bus/i2c/drivers/ina3221/1-0040/hwmon/hwmon1/in1_label    "VDD_IN"
      /sys/bus/i2c/drivers/ina3221/1-0040/hwmon/hwmon1/in1_input    bus voltage, mV
      /sys/bus/i2c/drivers/ina3221/1-0040/hwmon/hwmon1/curr1_input  current, mA

  Labels containing "NC" are unconnected channels (AGX Orin) and ``in7`` is the "sum of shunt
  voltages", not a rail: both are skipped.
* JetPack 4 and earlier, NVIDIA's ``ina3221x`` iio driver::

      /sys/bus/i2c/drivers/ina3221x/6-0040/iio:device0/rail_name_0       "POM_5V_IN"
      /sys/bus/i2c/drivers/ina3221x/6-0040/iio:device0/in_power0_input   power, mW

The module input rail (``VDD_IN`` on Xavier/Orin NX and Nano, ``POM_5V_IN`` on Nano/TX) is
the whole module; the others are parts of it. With an input rail only that one is counted;
without one (AGX Orin) the rails are summed and the detail line says the input is not covered.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path

from edge_node.energy.base import DEFAULT_SAMPLE_INTERVAL_S, Clock, PowerMeter
from edge_node.errors import MeterUnavailable

I2C_DRIVERS_DIR = Path("sys/bus/i2c/drivers")
TOTAL_RAILS = ("VDD_IN", "POM_5V_IN")
_HWMON_LABEL = re.compile(r"in(\d+)_label")
_IIO_RAIL = re.compile(r"rail_name_(\d+)")


@dataclass(frozen=True)
class JetsonRail:
    """One INA3221 channel: either power in mW, or voltage in mV and current in mA."""

    name: str
    power_mw_file: Path | None = None
    voltage_mv_file: Path | None = None
    current_ma_file: Path | None = None

    def read_w(self) -> float:
        if self.power_mw_file is not None:
            return _read_number(self.power_mw_file) / 1000.0
        assert self.voltage_mv_file is not None and self.current_ma_file is not None, self
        return _read_number(self.voltage_mv_file) * _read_number(self.current_ma_file) / 1e6


def _read_number(path: Path) -> float:
    try:
        text = path.read_text()
    except PermissionError as exc:
        raise MeterUnavailable(f"permission denied on {path}; run as root or `chmod a+r {path}`") from exc
    except OSError as exc:
        raise MeterUnavailable(f"cannot read {path}: {exc.strerror or exc}") from exc
    try:
        return float(text.split()[0])  # some attributes append units ("32760 ma")
    except (ValueError, IndexError) as exc:
        raise MeterUnavailable(f"{path} does not hold a number: {text.strip()[:40]!r}") from exc


def _hwmon_rails(hwmon: Path) -> list[JetsonRail]:
    rails = []
    for label_file in sorted(hwmon.glob("in*_label")):
        match = _HWMON_LABEL.fullmatch(label_file.name)
        if match is None:
            continue
        number = match.group(1)
        try:
            label = label_file.read_text().strip()
        except OSError:
            continue
        if number == "7" or "sum of shunt" in label.lower() or label == "NC" or label.startswith("NC "):
            continue
        voltage, current = hwmon / f"in{number}_input", hwmon / f"curr{number}_input"
        if voltage.exists() and current.exists():
            rails.append(JetsonRail(label, voltage_mv_file=voltage, current_ma_file=current))
    return rails


def _iio_rails(device: Path) -> list[JetsonRail]:
    rails = []
    for name_file in sorted(device.glob("rail_name_*")):
        match = _IIO_RAIL.fullmatch(name_file.name)
        if match is None:
            continue
        try:
            label = name_file.read_text().strip()
        except OSError:
            continue
        power = device / f"in_power{match.group(1)}_input"
        if power.exists():
            rails.append(JetsonRail(label, power_mw_file=power))
    return rails


def find_jetson_rails(sysfs_root: Path = Path("/")) -> tuple[list[JetsonRail], str]:
    """The rails to count and the detail line saying which (a total rail, else all summed).

    Raises:
        MeterUnavailable: no INA3221 driver directory or no readable rail.
    """
    base = sysfs_root / I2C_DRIVERS_DIR
    rails: list[JetsonRail] = []
    for hwmon in sorted(base.glob("ina3221*/*/hwmon/hwmon*")):
        rails += _hwmon_rails(hwmon)
    for device in sorted(base.glob("ina3221*/*/iio:device*")):
        rails += _iio_rails(device)
    if not rails:
        raise MeterUnavailable(f"no INA3221 power rails under {base}/ina3221*/ (not a Jetson)")
    for total in TOTAL_RAILS:
        chosen = [r for r in rails if r.name == total]
        if chosen:
            return chosen[:1], f"INA3221 module input rail {total}"
    names = "+".join(r.name for r in rails)
    return rails, f"INA3221 sum of rails {names} (no VDD_IN/POM_5V_IN rail: module input not covered)"


class JetsonMeter(PowerMeter):
    """Jetson module power from INA3221 rails, sampled every ``sample_interval_s``."""

    source = "jetson-ina3221"

    def __init__(
        self,
        sysfs_root: Path = Path("/"),
        *,
        clock: Clock = time.monotonic,
        sample_interval_s: float = DEFAULT_SAMPLE_INTERVAL_S,
    ) -> None:
        self.rails, self.detail = find_jetson_rails(sysfs_root)
        super().__init__(clock=clock, sample_interval_s=sample_interval_s)

    def _read_power_w(self) -> float:
        return sum(rail.read_w() for rail in self.rails)
