"""FedAvg (McMahan et al., "Communication-Efficient Learning of Deep Networks from Decentralized Data",
AISTATS 2017), the centralised baseline of the DisPFL paper (Dai et al., ICML 2022).

Each round the server samples ``k`` clients (10 in the paper) uniformly without replacement, sends them the
global model, each trains it for E local epochs (:func:`edge_node.algorithm.dispfl.train_local` on a dense
client), and the server averages the returned models weighted by the clients' sample counts
(:func:`weighted_average`). **FedAvg** is evaluated with the global model on every client's test set,
**FedAvg-FT** after each client fine-tunes the global model locally for E epochs (``E * ceil(n_i / B)`` SGD
steps, discarded afterwards: an evaluation, not part of training).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from edge_node.errors import ConfigError
from edge_node.seeding import Stream, numpy_generator

TensorDict = Mapping[str, torch.Tensor]


def sample_clients(num_clients: int, k: int, seed: int, round_index: int) -> list[int]:
    """The sorted ``min(k, num_clients)`` distinct clients the server trains in round ``round_index``."""
    if num_clients < 1 or k < 1:
        raise ConfigError(f"num_clients={num_clients} and clients per round k={k} must be >= 1")
    rng = numpy_generator(seed, Stream.FEDAVG_SAMPLE, round_index)
    return sorted(int(i) for i in rng.choice(num_clients, size=min(k, num_clients), replace=False))


def weighted_average(models: Sequence[TensorDict], sample_counts: Sequence[int]) -> dict[str, torch.Tensor]:
    """``sum_i n_i w_i / sum_i n_i`` per tensor (FedAvg's server step). Inputs are never modified."""
    if len(models) != len(sample_counts) or not models:
        raise ConfigError(f"{len(models)} models and {len(sample_counts)} sample counts: need as many, at least one")
    if any(n < 0 for n in sample_counts) or sum(sample_counts) <= 0:
        raise ConfigError(f"sample counts {list(sample_counts)} must be >= 0 with a positive sum")
    total = float(sum(sample_counts))
    out: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for name in models[0]:
            acc = torch.zeros_like(models[0][name])
            for model, n in zip(models, sample_counts, strict=True):
                acc.add_(model[name], alpha=n / total)
            out[name] = acc
    return out
