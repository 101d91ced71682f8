"""Per-phase energy attribution and the one-JSON-line-per-round energy log.

The device does one thing at a time as far as its energy is concerned: whatever phase is
active when the meter advances gets the joules. The accountant reads the meter at every phase
boundary and charges the difference to the phase that just ran; time outside any phase is
``idle``. Phases nest: the innermost active phase is charged. ``close_round`` charges the
phase running at that moment, writes the record and starts counting the next round.

A meter whose read is slow (NVML's counter: about 4 ms) says so in ``read_cost_s``: a boundary within that
long of the last read does not read again, so what ran in between is charged with the next phase instead
(the simulation ends one client's training and starts the next client's aggregation back to back, 400
boundaries a round). Round totals stay exact: ``close_round`` always reads.

With ``read_on_thread`` a boundary's read is handed to one reader thread, in order, and the caller goes on
(the simulation on a GPU: NVML's call releases the GIL, so 4 ms a boundary come off the round). Each
difference of the counter is charged, when its read is back, to the phase that ran before the boundary that
asked for it; a read that starts late because the previous one is still running moves the boundary by at
most one read's time. A read that fails raises at the next boundary or at ``close_round``.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any

from edge_node.energy.base import Clock, Meter, MeterReading
from edge_node.errors import MeterUnavailable, StorageError
from edge_node.protocol import check_round
from edge_node.storage import append_line, describe_failure

PHASES = ("train", "aggregate", "communicate", "idle")
IDLE = "idle"
RECORD_KEYS = frozenset(
    {
        "round",
        "joules",
        "seconds",
        "total_j",
        "duration_s",
        "mean_power_w",
        "source",
        "detail",
        "measured",
        "label",
        "samples",
        "sample_errors",
        "time_unix",
    }
)


def label_for(meter: Meter) -> str:
    """ "measured" for a real meter, "estimated" for the CPU-time estimate."""
    return "measured" if meter.measured else "estimated"


class EnergyAccountant:
    """Integrates a meter per phase (train, aggregate, communicate, idle) and logs each round.

    Args:
        meter: an open meter; the accountant owns it from now on and closes it on :meth:`close`
            (or at once, if its first read fails here, so that no sampler thread is left running).
        log_path: JSONL file each round's record is appended to (parents created), or None.
        clock: monotonic clock for phase durations (tests inject one).
        read_on_thread: read at phase boundaries on a reader thread (module docstring); ``close_round``
            and the opening read are always taken by the caller.

    Use ``with acct.phase("train"): ...`` or ``start_phase``/``stop_phase``, then
    ``close_round(i)`` once per round. Thread-safe: the daemon may call it from executor threads.
    """

    def __init__(
        self, meter: Meter, log_path: Path | None = None, *, clock: Clock = time.monotonic, read_on_thread: bool = False
    ) -> None:
        self.meter = meter
        self.log_path = Path(log_path) if log_path is not None else None
        self._clock = clock
        self._lock = threading.Lock()
        self._closed = False
        self._stack: list[str] = []
        self._joules = dict.fromkeys(PHASES, 0.0)
        self._seconds = dict.fromkeys(PHASES, 0.0)
        try:
            self._last: MeterReading = meter.read()
        except BaseException:
            meter.close()
            raise
        self._last_t = clock()
        self._round_reading = self._last
        self._round_t = self._last_t
        # Boundary reads in flight, oldest first: each with the phase its counter difference is charged to.
        self._in_flight: deque[tuple[Future[MeterReading], str]] = deque()
        self._reader = ThreadPoolExecutor(1, thread_name_prefix="edge-node-meter") if read_on_thread else None

    @property
    def current_phase(self) -> str:
        """The phase being charged now ("idle" when none is active)."""
        with self._lock:
            return self._stack[-1] if self._stack else IDLE

    def _charge(self, *, boundary: bool = False) -> None:
        """Read the meter and charge what it advanced since the last read (call under the lock); a
        ``boundary`` within the meter's ``read_cost_s`` of the last read leaves it to the next read."""
        if self._closed:
            raise MeterUnavailable("the energy accountant is closed")
        if boundary and self._clock() - self._last_t < self.meter.read_cost_s:
            return
        phase = self._stack[-1] if self._stack else IDLE
        if boundary and self._reader is not None:
            self._in_flight.append((self._reader.submit(self.meter.read), phase))
            self._settle(wait=False)
            reading = None
        else:
            self._settle(wait=True)  # every earlier read is charged before this one
            reading = self.meter.read()
        now = self._clock()
        self._seconds[phase] += now - self._last_t
        self._last_t = now
        if reading is not None:
            self._joules[phase] += reading.energy_j - self._last.energy_j
            self._last = reading

    def _settle(self, *, wait: bool) -> None:
        """Charge the boundary reads that are back (all of them, waiting, with ``wait``), in order."""
        while self._in_flight and (wait or self._in_flight[0][0].done()):
            future, phase = self._in_flight.popleft()
            reading = future.result()  # a failed read raises its MeterUnavailable here
            self._joules[phase] += reading.energy_j - self._last.energy_j
            self._last = reading

    @staticmethod
    def _check_phase(name: str) -> None:
        if name not in PHASES:
            raise ValueError(f"phase={name!r} is not one of {', '.join(PHASES)}")

    def start_phase(self, name: str) -> None:
        """Charge the time so far to the running phase, then charge ``name`` from now on."""
        self._check_phase(name)
        with self._lock:
            self._charge(boundary=True)
            self._stack.append(name)

    def stop_phase(self, name: str) -> None:
        """Charge the time since the last boundary to the running phase and end ``name``."""
        self._check_phase(name)
        with self._lock:
            if name not in self._stack:
                raise ValueError(f"phase={name!r} is not running (running: {self._stack or ['idle']})")
            self._charge(boundary=True)
            del self._stack[len(self._stack) - 1 - self._stack[::-1].index(name)]

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """``with acct.phase("train"):`` charges the block's energy to train."""
        self.start_phase(name)
        try:
            yield
        finally:
            self.stop_phase(name)

    def close_round(self, round_index: int, **extra: Any) -> dict[str, Any]:
        """Finish the round: build its record, append it to the log, start the next round.

        Args:
            round_index: the round number (``protocol.check_round``: an int in [0, MAX_ROUND]).
            **extra: more JSON-serialisable fields for the record (e.g. ``modelled=...``); they
                may not reuse the record's own keys.

        Returns:
            The record: round, joules and seconds per phase, total_j, duration_s, mean_power_w,
            source, detail, measured, label ("measured" or "estimated"), samples,
            sample_errors, time_unix, then ``extra``.
        """
        check_round(round_index, "round_index")
        clash = RECORD_KEYS & extra.keys()
        if clash:
            raise ValueError(f"extra fields {sorted(clash)} would overwrite the record's own keys")
        with self._lock:
            self._charge()
            total_j = sum(self._joules.values())
            if not math.isfinite(total_j):
                raise MeterUnavailable(f"{self.meter.source} meter returned a non-finite energy: {total_j}")
            duration_s = self._last_t - self._round_t
            record: dict[str, Any] = {
                "round": round_index,
                "joules": {p: round(j, 6) for p, j in self._joules.items()},
                "seconds": {p: round(s, 6) for p, s in self._seconds.items()},
                "total_j": round(total_j, 6),
                "duration_s": round(duration_s, 6),
                "mean_power_w": round(total_j / duration_s, 6) if duration_s > 0 else None,
                "source": self.meter.source,
                "detail": self.meter.detail,
                "measured": bool(self.meter.measured),
                "label": label_for(self.meter),
                "samples": self._last.samples - self._round_reading.samples,
                "sample_errors": self._last.errors - self._round_reading.errors,
                "time_unix": round(time.time(), 3),
                **extra,
            }
            line = json.dumps(record, allow_nan=False)  # fails here, before anything is reset
            if self.log_path is not None:
                self._append(line)
            self._joules = dict.fromkeys(PHASES, 0.0)
            self._seconds = dict.fromkeys(PHASES, 0.0)
            self._round_reading, self._round_t = self._last, self._last_t
        return record

    def _append(self, line: str) -> None:
        """Append one line and fsync, so a killed daemon loses at most the round in progress."""
        assert self.log_path is not None
        try:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StorageError(describe_failure(self.log_path, exc)) from exc
        append_line(self.log_path, line)

    def close(self) -> None:
        """Stop the meter's threads and release it. Idempotent; the unclosed round is dropped."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self._reader is not None:
            self._reader.shutdown(wait=True, cancel_futures=True)  # no read may run on a closed meter
        self.meter.close()

    def __enter__(self) -> EnergyAccountant:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
