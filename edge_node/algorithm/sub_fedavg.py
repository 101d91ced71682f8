"""Sub-FedAvg, unstructured (Vahidian et al., "Personalized Federated Learning by Structured and Unstructured
Pruning under Data Heterogeneity", ICDCS workshops 2021), as the FedSpa paper runs it as a baseline.

Each client starts dense and prunes its own sub-network as it trains. After a sampled client's local
epochs it draws a candidate mask by magnitude pruning ``rate`` (FedSpa's setup: 5 %) of the active
weights of every weight matrix/kernel (tensors of rank >= 2; biases and norm parameters stay dense, as the
authors' code prunes only ``weight`` tensors of conv/linear layers). It adopts the candidate when
(i) the candidate mask after the first epoch and the one after the last epoch differ by more than
``dist_threshold`` (mean over tensors of the Hamming fraction; FedSpa's setup: 1e-4), (ii) it is not yet
at its target density, and (iii) the pruned model's accuracy is at least ``acc_threshold`` (0.5). The
last prune is shrunk to land on the target, as the authors' code does. With a single local epoch there is
one candidate; it is compared with the mask before the round, which is what the authors' code compares
whenever it trains fewer than 5 epochs. The server averages each coordinate over the sampled clients that
hold it and keeps its own value where none does (the code's ``Sub_FedAVG_U``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch

from edge_node.algorithm.prune_regrow import drop_smallest
from edge_node.errors import ConfigError

TensorDict = Mapping[str, torch.Tensor]
PRUNE_RATE = 0.05  # FedSpa paper, Sec. 5.1: "prune rate each round"
DIST_THRESHOLD = 1e-4  # "distance threshold"
ACC_THRESHOLD = 0.5  # "accuracy threshold"


def prunable(masks: TensorDict) -> list[str]:
    """The tensors Sub-FedAvg prunes: weight matrices and kernels (rank >= 2)."""
    return [name for name, m in masks.items() if m.dim() > 1]


def prunable_density(masks: TensorDict) -> float:
    """Active fraction of the prunable tensors (what the target density refers to)."""
    names = prunable(masks)
    return sum(int(masks[n].sum()) for n in names) / max(sum(masks[n].numel() for n in names), 1)


def round_rate(density: float, target: float, rate: float) -> float:
    """The fraction of active weights this prune removes: ``rate``, or less to land on ``target``."""
    if not 0.0 < rate < 1.0:
        raise ConfigError(f"sub-fedavg prune rate={rate!r} must be in (0, 1)")
    if density <= target:
        return 0.0
    return min(rate, 1.0 - target / density)


def candidate_mask(weights: TensorDict, masks: TensorDict, rate: float) -> dict[str, torch.Tensor]:
    """``masks`` without the ``floor(rate * active)`` smallest-magnitude active weights of each prunable tensor."""
    names = set(prunable(masks))
    return {
        name: drop_smallest(weights[name], m, math.floor(rate * int(m.sum()))) if name in names else m.clone()
        for name, m in masks.items()
    }


def mask_distance(first: TensorDict, second: TensorDict) -> float:
    """Mean over the prunable tensors of the fraction of positions where the two masks differ."""
    names = prunable(first)
    if not names:
        return 0.0
    return sum(float((first[n] != second[n]).float().mean()) for n in names) / len(names)


def holder_average(
    server: TensorDict, models: Sequence[TensorDict], masks: Sequence[TensorDict]
) -> dict[str, torch.Tensor]:
    """Per coordinate, the mean of the clients' values among those whose mask holds it; the server's value
    where none does. Inputs untouched."""
    if len(models) != len(masks) or not models:
        raise ConfigError(f"{len(models)} models and {len(masks)} masks: need as many, at least one")
    out: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for name, w in server.items():
            total = torch.zeros_like(w)
            count = torch.zeros_like(w)
            for model, mask in zip(models, masks, strict=True):
                total += model[name] * mask[name]
                count += mask[name]
            out[name] = torch.where(count > 0, total / count.clamp_min(1), w)
    return out
