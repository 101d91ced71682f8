"""``capacity = "auto"`` while the node runs: a sustained change of the CPU it can get moves it to another tier.

A device's CPU changes under a running node: its application starts on one core, a container's quota is
changed, another service is deployed beside it. The tier measured at start then no longer fits the round
budget (or wastes it). The watch reads, over each round, the CPU this node can get:

    free CPU = min(the cgroup's CPU quota, the usable cores) - the cores other programs kept busy

(the quota from :mod:`edge_node.node.limits`, read at the round's end; other programs' load from
``/proc/stat`` less this process's own time, as the thread policy reads it, :mod:`edge_node.torch_threads`).
When it differs from the reading the tier was last decided on by at least ``CHANGE_FRACTION`` (of the
larger of both, and at least ``MIN_CHANGE_CPUS``) in the same direction for ``sustain`` rounds in a row,
the device is measured again: the last round's training throughput (its trained samples over its training
seconds, a round run wholly under the new CPU) with memory, limits and link read now
(:func:`edge_node.node.capacity.from_round`), and the module's rule picks the tier that fits the round
budget (:func:`edge_node.node.capacity.choose_tier`). A different tier is a :class:`TierMove`, which the
daemon applies at the next round boundary (:func:`edge_node.algorithm.dispfl.retier`: prune or regrow the
mask to the new tier's counts), logs, records (``tier_move``) and counts (``edge_node_tier_moves_total``).

So a move happens at the second round boundary after a change that lasts (``sustain`` = 2): the round in
which it began may show only part of it, the next shows all of it. A change that is over within a round
moves nothing. With mask tiers and dense kernels a move changes the bytes on the wire, not the training
time (docs/RESULTS.md); the round budget decides through the transfer term, or, where even the sparsest
tier's training breaks it, by taking the sparsest tier.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from edge_node.node.capacity import CapacityDecision
from edge_node.node.limits import Limits, own_limits
from edge_node.torch_threads import CpuSample, load_of_others, sample_cpu, usable_cores

_LOGGER = logging.getLogger(__name__)

CHANGE_FRACTION = 0.25  # a change of free CPU by a quarter (of the larger reading) or more counts
MIN_CHANGE_CPUS = 0.1  # and by at least a tenth of a core (a nearly idle reading is noise)


@dataclass(frozen=True)
class FreeCpu:
    """The CPU this node could get over one round."""

    cpus: float  # min(quota, cores) less other programs' busy cores, at least 0
    cores: int
    quota: float | None  # the cgroup's CPU quota in CPUs; None: none
    others: float  # cores other programs kept busy (the round's mean)

    def text(self) -> str:
        quota = "no quota" if self.quota is None else f"quota {self.quota:g} CPUs"
        return f"{self.cpus:.2f} CPUs free ({self.cores} cores, {quota}, other programs {self.others:.2f})"

    def to_json(self) -> dict[str, Any]:
        return {"cpus": round(self.cpus, 3), "cores": self.cores, "quota": self.quota, "others": round(self.others, 3)}


class CpuWindow:
    """Free CPU over a window: :meth:`start`, then :meth:`read` at its end."""

    def __init__(
        self,
        cores: Collection[int] | None = None,
        *,
        sample: Callable[[Collection[int]], CpuSample] = sample_cpu,
        limits: Callable[[], Limits] = own_limits,
    ) -> None:
        self.cores = tuple(cores) if cores is not None else usable_cores()
        self._sample = sample
        self._limits = limits
        self._first: CpuSample | None = None

    def start(self) -> None:
        self._first = self._sample(self.cores)

    def read(self) -> FreeCpu | None:
        """The window's free CPU; None before :meth:`start` or over no time."""
        first, now = self._first, self._sample(self.cores)
        if first is None or now.at_s <= first.at_s:
            return None
        others = load_of_others(first, now)
        quota = self._limits().cpus
        cores = len(self.cores)
        allowed = float(cores) if quota is None else min(float(cores), quota)
        return FreeCpu(max(0.0, min(allowed, cores - others)), cores, quota, others)


def changed(before: float, after: float, fraction: float = CHANGE_FRACTION) -> int:
    """+1 when ``after`` is up from ``before`` by the module's threshold, -1 when down, 0 otherwise."""
    if abs(after - before) < max(fraction * max(before, after), MIN_CHANGE_CPUS):
        return 0
    return 1 if after > before else -1


@dataclass(frozen=True)
class TierMove:
    """A new tier decided after round ``after_round``, applied at the next round boundary."""

    after_round: int
    before: str  # tier names
    after: str
    cause: str
    decision: CapacityDecision

    @property
    def direction(self) -> str:
        return "down" if float(self.after) < float(self.before) else "up"

    def to_json(self) -> dict[str, Any]:
        return {"from": self.before, "to": self.after, "direction": self.direction, "cause": self.cause,
                "decided_after_round": self.after_round, "decided_by": self.decision.decided_by}  # fmt: skip


class CapacityWatch:
    """Re-decides the tier of a ``capacity = "auto"`` node from its rounds when its free CPU changes (module doc).

    ``rechoose(throughput)`` measures the device again around the given training throughput (samples/s) and
    returns the rule's decision.
    """

    def __init__(
        self,
        tier: str,
        rechoose: Callable[[float], CapacityDecision],
        *,
        sustain: int,
        window: CpuWindow | None = None,
    ) -> None:
        if sustain < 1:
            raise ValueError(f"sustain={sustain} must be at least 1")
        self.tier = tier
        self.sustain = sustain
        self._rechoose = rechoose
        self._window = window or CpuWindow()
        self._reference: tuple[FreeCpu, float] | None = None  # what the tier was last decided on
        self._direction = 0
        self._streak = 0

    def round_began(self) -> None:
        self._window.start()

    def round_ended(self, round_index: int, samples: int, train_s: float) -> TierMove | None:
        """Read the round's free CPU; a :class:`TierMove` when a sustained change puts the node in another tier."""
        reading = self._window.read()
        if reading is None or samples <= 0 or train_s <= 0:
            return None
        throughput = samples / train_s
        if self._reference is None:  # the first round run: what later rounds are compared with
            self._reference = (reading, throughput)
            return None
        before, before_throughput = self._reference
        direction = changed(before.cpus, reading.cpus)
        self._streak = self._streak + 1 if direction and direction == self._direction else int(bool(direction))
        self._direction = direction
        if self._streak < self.sustain:
            return None
        cause = (
            f"free CPU {before.text()} -> {reading.text()} for {self._streak} rounds; training "
            f"{before_throughput:.1f} -> {throughput:.1f} samples/s"
        )
        self._reference, self._streak, self._direction = (reading, throughput), 0, 0
        decision = self._rechoose(throughput)
        if decision.tier == self.tier:
            _LOGGER.info("capacity measured again (%s): tier %s still fits (%s)", cause, self.tier, decision.decided_by)
            return None
        move = TierMove(round_index, self.tier, decision.tier, cause, decision)
        _LOGGER.warning("capacity measured again (%s): tier %s -> %s at the next round boundary (%s)",
                        cause, self.tier, decision.tier, decision.decided_by)  # fmt: skip
        self.tier = decision.tier
        return move
