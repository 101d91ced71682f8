"""Raspberry Pi 5 PMIC (Renesas DA9091) rail telemetry via ``vcgencmd pmic_read_adc``.

The firmware prints one line per ADC channel, currents and voltages separately::

      VDD_CORE_A current(7)=2.25500000A
      ...
      VDD_CORE_V volt(15)=0.89999220V
         EXT5V_V volt(24)=5.13656000V

A rail's power is its ``<RAIL>_V`` volts times its ``<RAIL>_A`` amps; rails with only a voltage
(``EXT5V``, ``BATT``) carry no current reading and are left out. The sum covers the SoC, DRAM
and on-board supplies behind the PMIC, not the 5 V input stage, USB or PCIe peripherals, so it
reads below a wall meter. Older boards (Pi 4 and earlier) answer with an error instead.
``vcgencmd`` needs access to /dev/vcio (user in the ``video`` group).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from collections.abc import Sequence

from edge_node.energy.base import DEFAULT_SAMPLE_INTERVAL_S, Clock, PowerMeter
from edge_node.errors import MeterUnavailable

DEFAULT_COMMAND = ("vcgencmd", "pmic_read_adc")
COMMAND_TIMEOUT_S = 5.0
_LINE = re.compile(
    r"^\s*(?P<rail>\S+)_(?P<unit>[AV])\s+(?:current|volt)\(\d+\)=(?P<value>[-+]?[0-9.]+(?:[eE][-+]?\d+)?)(?P=unit)\s*$"
)


def parse_pmic_read_adc(text: str) -> dict[str, float]:
    """Watts per rail from ``vcgencmd pmic_read_adc`` output (rails with both V and A only).

    Raises:
        MeterUnavailable: not one rail has both a voltage and a current line (garbage, an error
            message from the firmware, or a board without the PMIC ADC); quotes the output.
    """
    volts: dict[str, float] = {}
    amps: dict[str, float] = {}
    for line in text.splitlines():
        match = _LINE.match(line)
        if match is None:
            continue
        (amps if match["unit"] == "A" else volts)[match["rail"]] = float(match["value"])
    rails = {rail: volts[rail] * amps[rail] for rail in sorted(volts.keys() & amps.keys())}
    if not rails:
        excerpt = " ".join(text.split())[:120]
        raise MeterUnavailable(
            f"`vcgencmd pmic_read_adc` output has no rail with both volts and amps (not a Raspberry Pi 5?): {excerpt!r}"
        )
    return rails


class RpiPmicMeter(PowerMeter):
    """Raspberry Pi 5 power as the sum of PMIC rails, sampled in a daemon thread.

    Args:
        command: the command that prints the ADC table; tests point it at a script replaying
            recorded output.
        sample_interval_s: seconds between samples; each costs a process start (~10 ms).
    """

    source = "rpi5-pmic"
    join_timeout_s = COMMAND_TIMEOUT_S + 1.0  # close() outwaits a sample stuck in a slow vcgencmd

    def __init__(
        self,
        command: Sequence[str] = DEFAULT_COMMAND,
        *,
        clock: Clock = time.monotonic,
        sample_interval_s: float = DEFAULT_SAMPLE_INTERVAL_S,
    ) -> None:
        self.command = list(command)
        if shutil.which(self.command[0]) is None:
            raise MeterUnavailable(f"`{self.command[0]}` not found on PATH (not a Raspberry Pi OS install)")
        rails = parse_pmic_read_adc(self._run())
        self.rail_names = sorted(rails)
        self.detail = (
            f"PMIC sum of {len(rails)} rails V x A via `{' '.join(self.command)}` "
            "(excludes the 5 V input stage and USB/PCIe loads)"
        )
        super().__init__(clock=clock, sample_interval_s=sample_interval_s)

    def _run(self) -> str:
        try:
            done = subprocess.run(self.command, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired as exc:
            raise MeterUnavailable(f"`{' '.join(self.command)}` did not answer within {COMMAND_TIMEOUT_S} s") from exc
        except OSError as exc:
            raise MeterUnavailable(f"cannot run `{' '.join(self.command)}`: {exc}") from exc
        if done.returncode != 0:
            why = " ".join((done.stderr or done.stdout).split())[:120]
            hint = "; add the user to the video group" if "vcio" in why or "ermission" in why else ""
            raise MeterUnavailable(f"`{' '.join(self.command)}` exited with {done.returncode}: {why!r}{hint}")
        return done.stdout

    def _read_power_w(self) -> float:
        return sum(parse_pmic_read_adc(self._run()).values())
