"""HeteroFL's server step (Diao et al., "HeteroFL: Computation and Communication Efficient Federated Learning for
Heterogeneous Clients", ICLR 2021): nested narrow models averaged per coordinate.

Each sampled client trains the global model's prefix at its width (edge_node.algorithm.width) and returns it;
the server averages every coordinate over the clients whose model holds it, uniformly (the paper's
implementation counts the holders: Sub-FedAvg's server rule), and keeps the global value where no sampled
client holds it. It is the server-based anchor of the width tiers: the same narrow models, one global model
instead of DisPFL's personal masks and gossip. Not reproduced: the paper's static batch normalisation and its
masking of the classifier's rows to a client's labels (the built-in models use GroupNorm; every client trains
the whole head).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from edge_node.algorithm.sub_fedavg import holder_average
from edge_node.algorithm.width import prefix_masks, widen

TensorDict = Mapping[str, torch.Tensor]


def aggregate_nested(global_weights: TensorDict, narrow_models: Sequence[TensorDict]) -> dict[str, torch.Tensor]:
    """Per coordinate, the mean of ``narrow_models`` (each a prefix of ``global_weights``' shapes) over those that
    hold it; ``global_weights``' value where none does (Sub-FedAvg's holder average, the holders being the
    prefixes). Inputs are never modified."""
    shapes = {name: tuple(w.shape) for name, w in global_weights.items()}
    zeros = {name: torch.zeros_like(w) for name, w in global_weights.items()}
    device = next(iter(global_weights.values())).device
    held = [prefix_masks(shapes, {n: tuple(t.shape) for n, t in model.items()}, device) for model in narrow_models]
    return holder_average(global_weights, [widen(zeros, model) for model in narrow_models], held)
