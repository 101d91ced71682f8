"""The one meter interface every energy backend implements, and the two ways of measuring.

Two kinds of hardware exist, and they need different handling:

* **Counters** (NVML total energy, RAPL ``energy_uj``, the CPU-time estimate) keep a running
  total themselves; reading them at phase boundaries is exact, nothing has to run in between.
* **Power gauges** (Jetson INA3221, Raspberry Pi 5 PMIC) only say "watts right now"; a daemon
  thread samples them at a fixed interval and integrates with the trapezoid rule, and every
  boundary read adds one more sample so that phases start and end on a real sample.

Both present the same :class:`Meter` face: :meth:`Meter.read` returns a :class:`MeterReading`
with the cumulative joules since the meter was opened, on the meter's monotonic clock.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType

from edge_node.errors import MeterUnavailable

_LOGGER = logging.getLogger(__name__)

Clock = Callable[[], float]

DEFAULT_SAMPLE_INTERVAL_S = 0.5  # power gauges: fine enough for rounds of seconds to minutes
_JOIN_TIMEOUT_S = 5.0  # close() waits this long for a sampler or poll thread to finish its current read
_WARN_EVERY_ERRORS = 100  # a failing sampler logs its first error, then one line per this many


@dataclass(frozen=True)
class EnergySample:
    """One reading of a power gauge: watts at a monotonic time."""

    t_s: float
    power_w: float


@dataclass(frozen=True)
class MeterReading:
    """Cumulative state of a meter at one moment (monotonic ``t_s``).

    ``energy_j`` counts from the moment the meter was opened; ``samples`` and ``errors`` are the
    raw readings taken and failed so far. Differences of two readings give a phase's share.
    """

    t_s: float
    energy_j: float
    samples: int
    errors: int


class Meter(ABC):
    """An energy meter: cumulative joules since it was opened, tagged with where they came from.

    Attributes:
        source: short backend name written into every record ("nvml", "rapl", "jetson-ina3221",
            "rpi5-pmic", "estimate").
        measured: False only for the estimate; a record is "measured" only when this is True.
        detail: one human-readable line saying exactly what is counted (which GPU, which rails).
        read_cost_s: about how long one read takes; phase boundaries closer than this to the last read share
            it (see :class:`~edge_node.energy.accounting.EnergyAccountant`). 0: every boundary reads.
    """

    source: str = ""
    measured: bool = True
    detail: str = ""
    read_cost_s: float = 0.0
    join_timeout_s: float = _JOIN_TIMEOUT_S  # longer than one read may take (a slow command, say)

    @abstractmethod
    def read(self) -> MeterReading:
        """The cumulative energy now. Raises MeterUnavailable if the meter cannot be read."""

    @abstractmethod
    def close(self) -> None:
        """Release threads and handles; reading after close is an error. Idempotent."""

    def __enter__(self) -> Meter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} source={self.source!r} detail={self.detail!r}>"


class CounterMeter(Meter):
    """A meter over a hardware or software energy counter, read on demand.

    Subclasses implement :meth:`_read_counter_j`, a monotonically non-decreasing total in joules
    with any offset (wraps are the subclass's business). ``poll_interval_s`` starts a daemon
    thread that reads the counter that often, for counters that wrap faster than a phase may last.
    """

    def __init__(self, *, clock: Clock = time.monotonic, poll_interval_s: float | None = None) -> None:
        if poll_interval_s is not None and not (poll_interval_s > 0 and math.isfinite(poll_interval_s)):
            raise ValueError(f"poll_interval_s={poll_interval_s!r} must be a positive number of seconds")
        self._clock = clock
        self._lock = threading.Lock()
        self._closed = False
        self._samples = 0
        self._base_j = self._read_counter_j()
        self._samples = 1
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if poll_interval_s is not None:
            self._thread = threading.Thread(
                target=self._poll_loop, args=(poll_interval_s,), name=f"edge-node-{self.source}-poll", daemon=True
            )
            self._thread.start()

    @abstractmethod
    def _read_counter_j(self) -> float:
        """The counter's total in joules (any offset). Raises MeterUnavailable on failure."""

    def read(self) -> MeterReading:
        with self._lock:
            if self._closed:
                raise MeterUnavailable(f"{self.source} meter is closed")
            energy_j = self._read_counter_j() - self._base_j
            self._samples += 1
            return MeterReading(self._clock(), energy_j, self._samples, 0)

    def _poll_loop(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            try:
                with self._lock:
                    if self._closed:
                        return
                    self._read_counter_j()
            except MeterUnavailable as exc:
                _LOGGER.warning("%s counter poll failed: %s", self.source, exc)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.join_timeout_s)
        with self._lock:
            if not self._closed:
                self._closed = True
                self._close_backend()

    def _close_backend(self) -> None:
        """Release backend handles (NVML shutdown); called once, under the lock."""


class PowerMeter(Meter):
    """A meter over an instantaneous power gauge, sampled in a daemon thread and integrated.

    The trapezoid rule over (t, W) samples: between two samples the power is taken to change
    linearly. Every :meth:`read` takes one more sample first, so phase boundaries fall on real
    samples and the phases of a round add up to its total exactly. A failed sample is counted,
    logged (first one, then every 100th) and skipped: the integral bridges the gap.
    """

    def __init__(self, *, clock: Clock = time.monotonic, sample_interval_s: float = DEFAULT_SAMPLE_INTERVAL_S) -> None:
        if not (sample_interval_s > 0 and math.isfinite(sample_interval_s)):
            raise ValueError(f"sample_interval_s={sample_interval_s!r} must be a positive number of seconds")
        self._clock = clock
        self._lock = threading.Lock()
        self._closed = False
        self._energy_j = 0.0
        self._samples = 0
        self._errors = 0
        self._last: EnergySample | None = None
        first_w = self._read_power_w()  # let MeterUnavailable out: a gauge that never reads is no meter
        self._add(first_w)
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._sampler_loop, args=(sample_interval_s,), name=f"edge-node-{self.source}-sampler", daemon=True
        )
        self._thread.start()

    @abstractmethod
    def _read_power_w(self) -> float:
        """Instantaneous power in watts. Raises MeterUnavailable on unreadable or garbage output."""

    def _add(self, power_w: float) -> None:
        """Append one sample (call under the lock, or before the thread starts)."""
        t_s = self._clock()
        if self._last is not None:
            dt_s = t_s - self._last.t_s
            if dt_s > 0:
                self._energy_j += 0.5 * (power_w + self._last.power_w) * dt_s
        self._last = EnergySample(t_s, power_w)
        self._samples += 1

    def _sample(self) -> None:
        """Take one sample under the lock; count and report a failure instead of raising."""
        try:
            power_w = self._read_power_w()
        except MeterUnavailable as exc:
            self._errors += 1
            if self._errors == 1 or self._errors % _WARN_EVERY_ERRORS == 0:
                _LOGGER.warning("%s sample failed (%d failures so far): %s", self.source, self._errors, exc)
            return
        self._add(power_w)

    def _sampler_loop(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            with self._lock:
                if self._closed:
                    return
                self._sample()

    def read(self) -> MeterReading:
        with self._lock:
            if self._closed:
                raise MeterUnavailable(f"{self.source} meter is closed")
            self._sample()
            t_s = self._last.t_s if self._last is not None else self._clock()
            return MeterReading(t_s, self._energy_j, self._samples, self._errors)

    @property
    def last_sample(self) -> EnergySample | None:
        """The latest good sample (for status displays)."""
        with self._lock:
            return self._last

    def close(self) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=self.join_timeout_s)
            if self._thread.is_alive():
                _LOGGER.warning("%s sampler thread still busy %.0f s after close", self.source, self.join_timeout_s)
        with self._lock:
            self._closed = True
