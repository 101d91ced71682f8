"""Pick the energy meter: by name, or the first real one that works, else a loud estimate."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from pathlib import Path

from edge_node.energy.base import DEFAULT_SAMPLE_INTERVAL_S, Clock, Meter
from edge_node.energy.estimate import DEFAULT_WATTS_PER_CORE, EstimateMeter
from edge_node.energy.jetson import JetsonMeter
from edge_node.energy.nvml import NvmlMeter
from edge_node.energy.rapl import RaplMeter
from edge_node.energy.rpi import RpiPmicMeter
from edge_node.errors import MeterUnavailable

_LOGGER = logging.getLogger(__name__)

BACKENDS = ("auto", "nvml", "rapl", "jetson", "rpi5", "estimate")
AUTO_ORDER = ("nvml", "rapl", "jetson", "rpi5")  # measured meters, most specific to the GPU first


def open_meter(
    backend: str = "auto",
    *,
    gpu_index: int | None = None,
    estimate_watts: float | None = None,
    sysfs_root: Path = Path("/"),
    sample_interval_s: float = DEFAULT_SAMPLE_INTERVAL_S,
    clock: Clock = time.monotonic,
) -> Meter:
    """Open the named meter, or with "auto" the first of nvml, rapl, jetson, rpi5 that works.

    Args:
        backend: "auto", "nvml", "rapl", "jetson", "rpi5" or "estimate".
        gpu_index: NVML GPU index; None counts every GPU.
        estimate_watts: watts per busy core for the estimate (default 10 W, see ``estimate``).
        sysfs_root: prefix for /sys paths (tests point it at a fake tree).
        sample_interval_s: sampling period of power-gauge meters (Jetson, Raspberry Pi 5).
        clock: monotonic clock for timestamps.

    Returns:
        An open meter; close it (or the EnergyAccountant using it) to stop its threads.

    Raises:
        MeterUnavailable: a named backend cannot be used here; the message says why and the fix.
        ValueError: an unknown backend name or a bad argument.

    With "auto" and no working meter, ONE warning is logged naming what was tried and why each
    failed, and the estimate meter is returned: every record it makes is labelled estimated.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} is not one of {', '.join(BACKENDS)}")
    if gpu_index is not None and backend not in ("auto", "nvml"):
        raise ValueError(f"gpu_index={gpu_index!r} only applies to the nvml backend, not {backend!r}")
    if not (isinstance(sample_interval_s, (int, float)) and sample_interval_s > 0 and math.isfinite(sample_interval_s)):
        raise ValueError(f"sample_interval_s={sample_interval_s!r} must be a positive number of seconds")
    openers: dict[str, Callable[[], Meter]] = {
        "nvml": lambda: NvmlMeter(gpu_index, clock=clock),
        "rapl": lambda: RaplMeter(sysfs_root, clock=clock),
        "jetson": lambda: JetsonMeter(sysfs_root, clock=clock, sample_interval_s=sample_interval_s),
        "rpi5": lambda: RpiPmicMeter(clock=clock, sample_interval_s=sample_interval_s),
        "estimate": lambda: EstimateMeter(estimate_watts, clock=clock),
    }
    if backend != "auto":
        meter = openers[backend]()
        _LOGGER.info("energy meter: %s (%s)", meter.source, meter.detail)
        return meter
    estimate = EstimateMeter(estimate_watts, clock=clock)  # checks estimate_watts before probing hardware
    failures = []
    for name in AUTO_ORDER:
        try:
            meter = openers[name]()
        except MeterUnavailable as exc:
            _LOGGER.debug("energy meter %s unavailable: %s", name, exc)
            failures.append(f"{name}: {exc}")
            continue
        estimate.close()
        _LOGGER.info("energy meter: %s (%s)", meter.source, meter.detail)
        return meter
    watts = DEFAULT_WATTS_PER_CORE if estimate_watts is None else estimate_watts
    _LOGGER.warning(
        "no energy meter found (tried: %s); using an ESTIMATE of CPU time x %g W per busy core; "
        "every record is labelled estimated",
        " | ".join(failures),
        watts,
    )
    return estimate
