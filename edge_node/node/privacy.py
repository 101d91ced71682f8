"""A device's DP-SGD budget (``edge-node start --privacy dp-sgd --epsilon E --delta D``).

The node trains every round with DP-SGD (edge_node.algorithm.dp: per-sample clipping, Gaussian noise drawn
from the OS's randomness) at the noise multiplier that spends ``E`` at ``D`` after ``planned_rounds`` rounds
of ``epochs * ceil(n / batch_size)`` steps on its ``n`` local samples. The budget spent after ``r`` rounds
is Opacus's RDP figure for ``r`` rounds of steps; ``r`` is the node's round counter, which a catch-up may
advance past rounds it never trained (the figure then over-states what was spent, never under-states).
Before a round that would spend more than ``E`` the node stops training and publishing: it keeps serving
the last model it published, which the budget covers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from edge_node.algorithm.dispfl import DisPFLParams
from edge_node.algorithm.dp import DPConfig, noise_multiplier_for, spent_epsilon


@dataclass(frozen=True)
class PrivacyBudget:
    """The node's (epsilon, delta) target and the DP-SGD noise calibrated to it."""

    epsilon: float
    delta: float
    clip: float
    sample_rate: float
    steps_per_round: int
    noise_multiplier: float

    @classmethod
    def calibrate(
        cls, epsilon: float, delta: float, clip: float, params: DisPFLParams, num_samples: int
    ) -> PrivacyBudget:
        """The noise that spends ``epsilon`` by ``params.planned_rounds`` rounds on ``num_samples`` samples."""
        rate = min(1.0, params.batch_size / max(num_samples, 1))
        per_round = params.epochs * math.ceil(max(num_samples, 1) / params.batch_size)
        z = noise_multiplier_for(epsilon, delta, rate, params.planned_rounds * per_round)
        return cls(epsilon, delta, clip, rate, per_round, z)

    def params(self, params: DisPFLParams) -> DisPFLParams:
        """``params`` training with this budget's DP-SGD, its noise from the OS."""
        return replace(params, dp=DPConfig(self.clip, self.noise_multiplier), secret_noise=True)

    def spent(self, rounds: int) -> float:
        """Epsilon spent (at ``delta``) after ``rounds`` rounds of training."""
        return spent_epsilon(self.noise_multiplier, self.sample_rate, rounds * self.steps_per_round, self.delta)

    def allows(self, rounds_done: int) -> bool:
        """Whether one more round keeps the spent epsilon within the target."""
        return self.spent(rounds_done + 1) <= self.epsilon * (1 + 1e-9)

    def to_json(self, rounds_done: int) -> dict[str, Any]:
        """The fields a round record and ``edge-node status`` carry."""
        return {
            "privacy": "dp-sgd",
            "dp_epsilon_spent": self.spent(rounds_done),
            "dp_epsilon_target": self.epsilon,
            "dp_delta": self.delta,
            "dp_noise_multiplier": self.noise_multiplier,
            "dp_budget_left": self.allows(rounds_done),
        }
