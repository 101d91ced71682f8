"""Model poisoning attacks, for measuring the aggregate against them (loopback fleets and benches only).

An attacker trains honestly (except ``label-flip``) and transforms what it *publishes*; its header, mask
and sizes are ordinary, so each attack stays inside the receive-path screen's bounds (``robust.py``)
unless the attack is the bound itself (``scale:F`` with F above the screen's ratio):

- ``sign-flip``: the published weights negated (same magnitudes, opposite direction).
- ``scale:F``: the published weights times ``F`` (finite, > 0); F < 1 dilutes the mean like a small model.
- ``noise``: each tensor's active weights replaced by Gaussian noise of the same rms (seeded per node and
  round, ``Stream.ATTACK``).
- ``zero``: the published weights all 0 on the attacker's mask (it claims coordinates it zeroes).
- ``label-flip``: local training on flipped labels (class ``y`` becomes ``C - 1 - y``); it publishes what it
  trained, of ordinary size.
- ``stale:R``: the model it published ``R`` rounds ago (its initial model while it has done fewer), under
  its current round.

Nothing here is a node setting: ``edge-node loopback --attackers K --attack ...`` passes the attack to its
own daemons by a route ``edge-node start`` does not accept (``edge_node.cli._attacker``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

import torch

from edge_node.robust_names import ATTACKS, Attack, parse_attack  # re-exported: the names live without torch

__all__ = ["ATTACKS", "Attack", "Poisoning", "StaleModels", "flipped_labels", "parse_attack", "poisoned"]

TensorDict = Mapping[str, torch.Tensor]
Batch = tuple[torch.Tensor, torch.Tensor]


def poisoned(
    attack: Attack, weights: TensorDict, mask: TensorDict, generator: torch.Generator
) -> dict[str, torch.Tensor]:
    """What an attacker publishes instead of ``weights`` (zero outside ``mask``, as published models are).

    ``label-flip`` and ``stale`` publish ``weights`` as given (their harm is in training or in which model is
    given: :func:`flipped_labels`, :class:`StaleModels`). ``generator`` (CPU) draws ``noise``. Inputs are
    never modified.
    """
    out: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for name, w in weights.items():
            if attack.kind == "sign-flip":
                out[name] = -w
            elif attack.kind == "scale":
                out[name] = w * attack.factor
            elif attack.kind == "zero":
                out[name] = torch.zeros_like(w)
            elif attack.kind == "noise":
                active = mask[name]
                count = int(active.sum())
                rms = float(torch.where(active, w, 0).double().square().sum().div(max(count, 1)).sqrt())
                noise = torch.randn(w.shape, generator=generator, dtype=torch.float32).to(w.device, w.dtype)
                out[name] = torch.where(active, noise * rms, torch.zeros_like(w))
            else:
                out[name] = w
    return out


def flipped_labels(batches: Iterable[Batch], num_classes: int) -> Iterator[Batch]:
    """``label-flip``'s training stream: each class label ``y`` becomes ``num_classes - 1 - y``."""
    for inputs, targets in batches:
        yield inputs, (num_classes - 1) - targets


class StaleModels:
    """``stale:R``'s memory: the last ``R + 1`` published models; :meth:`publish` gives the one ``R`` rounds ago."""

    def __init__(self, rounds_back: int) -> None:
        self._kept: deque[tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]] = deque(maxlen=rounds_back + 1)

    def publish(
        self, weights: dict[str, torch.Tensor], mask: dict[str, torch.Tensor]
    ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """Remember this round's model and return the oldest kept (the first ever while fewer are kept)."""
        self._kept.append((weights, mask))
        return self._kept[0]


@dataclass(frozen=True)
class Poisoning:
    """A poisoned loopback fleet as each of its nodes is told: who attacks, and how."""

    attackers: tuple[str, ...]
    attack: Attack

    def of(self, node_id: str) -> Attack | None:
        """The attack ``node_id`` makes (None: an honest node)."""
        return self.attack if node_id in self.attackers else None

    def to_json(self) -> dict[str, object]:
        """What every record of the fleet carries (``attackers``, ``attack``)."""
        return {"attackers": list(self.attackers), "attack": self.attack.spec}
