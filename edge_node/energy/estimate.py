"""The fallback when no meter exists: this process's CPU time times a configured power.

This is a guess, not a measurement, and every record made with it says ``estimated``. It
leaves out idle and baseline power, other processes, and any accelerator (GPU work shows up
only as the CPU time spent driving it), so it is only good for comparing runs on one machine.

The default, :data:`DEFAULT_WATTS_PER_CORE` = 10 W per fully busy core, is a TDP-per-core guess:
vendor TDP divided by core count is about 4-7 W for 40-64-core server parts (Xeon Platinum
8380: 270 W / 40; EPYC 7763: 280 W / 64), about 10 W for 8-16-core desktop parts (Core
i7-12700: 125 W / 12) and 1-3 W for Arm boards (Raspberry Pi 5: roughly 6-8 W at full load / 4 cores).
Choosing the upper end means the estimate errs towards more joules, never fewer.
Pass ``watts_per_core`` (``open_meter(estimate_watts=...)``) for the machine at hand.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import psutil

from edge_node.energy.base import Clock, CounterMeter

DEFAULT_WATTS_PER_CORE = 10.0  # W per fully busy core; see the module docstring


def process_cpu_seconds(process: psutil.Process | None = None) -> float:
    """User + system CPU seconds of this process and its waited-for children."""
    times = (process or psutil.Process()).cpu_times()
    return times.user + times.system + times.children_user + times.children_system


class EstimateMeter(CounterMeter):
    """Joules = CPU seconds x ``watts_per_core``; ``measured`` is False and the label ``estimated``.

    Args:
        watts_per_core: power of one fully busy core, in W.
        cpu_seconds: where CPU time comes from (default: this process, via psutil).
    """

    source = "estimate"
    measured = False

    def __init__(
        self,
        watts_per_core: float | None = None,
        *,
        cpu_seconds: Callable[[], float] = process_cpu_seconds,
        clock: Clock = time.monotonic,
    ) -> None:
        watts = DEFAULT_WATTS_PER_CORE if watts_per_core is None else watts_per_core
        if isinstance(watts, bool) or not isinstance(watts, (int, float)) or not (watts > 0 and math.isfinite(watts)):
            raise ValueError(f"estimate_watts={watts_per_core!r} must be a positive number of watts per core")
        self.watts_per_core = float(watts)
        self._cpu_seconds = cpu_seconds
        self.detail = (
            f"ESTIMATE: process CPU time x {self.watts_per_core:g} W per busy core "
            "(no energy meter; idle power and accelerators not counted)"
        )
        super().__init__(clock=clock)

    def _read_counter_j(self) -> float:
        return self._cpu_seconds() * self.watts_per_core
