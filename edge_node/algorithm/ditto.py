"""Ditto's two updates of a sampled client (Li et al., "Ditto: Fair and Robust Federated Learning Through
Personalization", ICML 2021, Algorithm 1), as the FedSpa paper runs it as a baseline.

A sampled client trains the global model ``w`` it received on its loss (FedAvg's local step) and its own
personal model ``v_k`` on its loss plus ``lambda/2 * ||v_k - w||^2``, i.e. each SGD step adds
``lambda * (v_k - w)`` to the gradient (``train_masked``'s ``proximal``). FedSpa's setup (Sec. 5.1) gives
the two updates 2 and 3 of the 5 local epochs the other methods train ("to ensure a fair comparison") and
``lambda = 0.5``. Here the split is of one round's batch stream of E epochs, by step count: the global
model takes the first ``global_steps`` batches and the personal model the rest, so at E = 5 the split is
exactly 2 + 3 epochs, and at E = 1 (a short run) it is the same 40/60 share of one epoch's steps.
"""

from __future__ import annotations

import math

from edge_node.errors import ConfigError

LAMBDA = 0.5  # FedSpa paper, Sec. 5.1: "the regularization factor of Ditto is set to 0.5"
PERSONAL_SHARE = 0.6  # 3 of the 5 local epochs (FedSpa paper, Sec. 5.1)


def split_steps(total_steps: int, personal_share: float) -> tuple[int, int]:
    """``(global, personal)`` SGD steps of a round of ``total_steps``: the personal share rounded to nearest.

    Both get at least one step when there are two or more (each model must move when its client is sampled).
    """
    if total_steps < 1:
        raise ConfigError(f"a Ditto round needs at least one SGD step, got {total_steps}")
    if not 0.0 < personal_share < 1.0:
        raise ConfigError(f"ditto personal share={personal_share!r} must be in (0, 1)")
    if total_steps == 1:
        return 0, 1
    personal = min(max(math.floor(personal_share * total_steps + 0.5), 1), total_steps - 1)
    return total_steps - personal, personal


def steps_per_epoch(samples: int, batch_size: int) -> int:
    """Mini-batches of one epoch (the last one may be short)."""
    return math.ceil(samples / batch_size)
