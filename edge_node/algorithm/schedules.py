"""Round-indexed schedules: the learning-rate decay and DisPFL's cosine prune rate."""

from __future__ import annotations

import math

LR0 = 0.1  # initial learning rate of DisPFL's CIFAR runs
LR_DECAY = 0.998  # per round
PRUNE_ALPHA = 0.5  # initial prune fraction alpha


def learning_rate(t: int, lr0: float = LR0, decay: float = LR_DECAY) -> float:
    """``lr0 * decay**t`` for round ``t`` (0-based)."""
    return lr0 * decay**t


def prune_rate(t: int, total_rounds: int, alpha: float = PRUNE_ALPHA) -> float:
    """Cosine-annealed prune fraction ``(alpha / 2) * (1 + cos(pi * t / T))``."""
    if total_rounds <= 0:
        raise ValueError(f"total_rounds={total_rounds} must be positive")
    return (alpha / 2.0) * (1.0 + math.cos(math.pi * t / total_rounds))
