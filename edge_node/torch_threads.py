"""``threads``: torch's intra-op thread count, for the daemon and the simulation alike.

An explicit ``threads = N`` (``--threads N``, or ``OMP_NUM_THREADS`` in the environment) is set once, before
the first training step, so that every step of a run sums in the same order: a run that must be reproduced
bit for bit gives it. The default (None) is the thread policy, :class:`ThreadGovernor`: torch runs on the
cores other programs leave free, re-measured while training, because a device's application shares its
cores. Torch's own default (one thread per core) is what made a round 4x slower beside one busy core:
OpenMP's threads wait for the one that lost its core at every parallel region (docs/RESULTS.md, "A device
shared with its application"); on one thread fewer the round costs what the lost core was worth.

The OpenMP wait policy stays OpenMP's own (spin a while, then sleep): ``OMP_WAIT_POLICY=PASSIVE`` made an
idle machine's demo round 1.23x slower here (docs/RESULTS.md), and with threads that follow the free cores
no worker waits long for a core another program holds. It is read only as torch loads: a user who wants
another gives it in the environment.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass

_LOGGER = logging.getLogger(__name__)

# The help of the ``threads`` key of ``edge-node start`` and ``edge-node simulate``.
THREADS_HELP = (
    "Torch intra-op threads, fixed for the run (reproducible sums) [default: the thread policy: the cores other "
    "programs leave free, re-measured while training]. OMP_NUM_THREADS in the environment fixes it too."
)

SAMPLE_EVERY_S = 1.0  # how often the policy reads the CPU counters (between training batches)
SUSTAINED_SAMPLES = 2  # a new thread count must be wanted this many samples in a row (a second of load is noise)


@dataclass(frozen=True)
class CpuSample:
    """CPU time counters at one moment: what the machine's usable cores and this process had used."""

    at_s: float  # monotonic clock
    busy_s: float  # CPU time of the usable cores not idle (all programs), since boot
    own_s: float  # this process's CPU time (all its threads)


def usable_cores() -> tuple[int, ...]:
    """The CPUs this process may run on (its affinity), as numbers."""
    if hasattr(os, "sched_getaffinity"):
        return tuple(sorted(os.sched_getaffinity(0)))
    return tuple(range(os.cpu_count() or 1))


def sample_cpu(cores: Collection[int]) -> CpuSample:
    """The CPU counters now (``/proc/stat`` and this process's times, through psutil): busy time is user,
    nice, system, interrupts and steal (a hypervisor's other guests take the core as surely as a program)."""
    import psutil

    per_cpu = psutil.cpu_times(percpu=True)
    busy = 0.0
    for index in cores:
        if index < len(per_cpu):
            t = per_cpu[index]
            busy += t.user + t.nice + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0)
            busy += getattr(t, "steal", 0.0)
    own = psutil.Process().cpu_times()
    return CpuSample(time.monotonic(), busy, own.user + own.system)


def load_of_others(before: CpuSample, after: CpuSample) -> float:
    """Cores other programs kept busy between two samples: the usable cores' busy time less this process's own
    (our threads spinning count as ours), per second; 0 over no time."""
    span = after.at_s - before.at_s
    if span <= 0:
        return 0.0
    return max(0.0, (after.busy_s - before.busy_s) - (after.own_s - before.own_s)) / span


def threads_for(cores: int, others_busy: float, most: int, quota: float | None = None) -> int:
    """Threads for ``cores`` usable cores of which other programs keep ``others_busy`` cores busy, under a CPU
    ``quota`` (CPUs a cgroup allows; None: none): the free cores, no more than the quota, rounded to the nearest
    whole core, at least one and at most ``most``. Threads beyond a quota only wait for each other while the
    group is throttled."""
    free = cores - others_busy if quota is None else min(cores - others_busy, quota)
    return max(1, min(most, math.floor(free + 0.5)))


class ThreadGovernor:
    """The thread policy: between training batches, torch's threads follow the cores other programs leave free.

    ``tick()`` is called on the training thread (OpenMP's thread count belongs to the thread that sets it)
    before each batch; at most every ``every_s`` it reads the CPU counters, and it moves to a new thread count
    once ``sustain`` readings in a row want it. Other programs' load is the usable cores' busy time less this
    process's own: our threads spinning in OpenMP barriers count as ours, not as a program beside us.
    """

    def __init__(
        self,
        most: int | None = None,
        cores: Collection[int] | None = None,
        *,
        every_s: float = SAMPLE_EVERY_S,
        sustain: int = SUSTAINED_SAMPLES,
        sample: Callable[[Collection[int]], CpuSample] = sample_cpu,
        apply: Callable[[int], None] | None = None,
        quota: Callable[[], float | None] = lambda: None,
    ) -> None:
        self.cores = tuple(cores) if cores is not None else usable_cores()
        # At most torch's own default (its count of cores: physical ones where it tells them apart).
        self.most = most if most is not None else min(_torch_threads(), len(self.cores))
        self.every_s = every_s
        self.sustain = sustain
        self._sample = sample
        self._apply = apply or _set_torch_threads
        self._quota = quota  # the CPU quota now (the daemon reads its cgroup's: edge_node.node.limits)
        self.threads = self.most
        self.changes = 0  # thread-count changes since start
        self._apply(self.threads)
        self._last = sample(self.cores)
        self._wanted: int | None = None
        self._wanted_in_a_row = 0

    def tick(self) -> int:
        """Re-read the counters when ``every_s`` has passed, move when a new count is sustained; the count now."""
        if time.monotonic() - self._last.at_s < self.every_s:
            return self.threads
        now = self._sample(self.cores)
        others = load_of_others(self._last, now)
        self._last = now
        quota = self._quota()
        wanted = threads_for(len(self.cores), others, self.most, quota)
        if wanted == self.threads:
            self._wanted, self._wanted_in_a_row = None, 0
            return self.threads
        self._wanted_in_a_row = self._wanted_in_a_row + 1 if wanted == self._wanted else 1
        self._wanted = wanted
        if self._wanted_in_a_row >= self.sustain:
            _LOGGER.info(
                "torch threads %d -> %d: other programs keep %.1f of this process's %d cores busy%s",
                self.threads, wanted, others, len(self.cores), "" if quota is None else f", CPU quota {quota:g}",
            )  # fmt: skip
            self.threads, self._wanted, self._wanted_in_a_row = wanted, None, 0
            self.changes += 1
            self._apply(wanted)
        return self.threads


def explicit_threads(threads: int | None) -> int | None:
    """The fixed thread count a run asked for: ``threads``, else ``OMP_NUM_THREADS`` when set to a positive
    integer; None: the thread policy decides."""
    if threads is not None:
        return threads
    text = os.environ.get("OMP_NUM_THREADS", "").strip()
    return int(text) if text.isdigit() and int(text) > 0 else None


def apply_threads(threads: int | None, quota: Callable[[], float | None] | None = None) -> ThreadGovernor | None:
    """Set torch's threads for a run: a fixed count (``explicit_threads``) once, else start the thread policy,
    whose ``tick()`` the caller runs between training batches (``quota``: reads the CPU quota the process runs
    under, which caps the threads)."""
    fixed = explicit_threads(threads)
    if fixed is not None:
        _set_torch_threads(fixed)
        return None
    return ThreadGovernor(quota=quota) if quota is not None else ThreadGovernor()


def tick(governor: ThreadGovernor | None) -> None:
    """``governor.tick()`` where there is one (a run with a fixed thread count has none)."""
    if governor is not None:
        governor.tick()


def _torch_threads() -> int:
    import torch

    return int(torch.get_num_threads())


def _set_torch_threads(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)
