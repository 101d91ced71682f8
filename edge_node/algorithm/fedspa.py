"""FedSpa's server step and client update ("Achieving Personalized Federated Learning with Sparse Local
Models", anonymous ICLR 2022 submission, Algorithms 1-3) as pure tensor functions.

A server keeps a dense model ``W`` and every client's mask ``m_k``. A sampled client receives ``m_k * W``,
trains it on its mask (masked SGD, :func:`edge_node.algorithm.training.train_masked`) and sends back its
update ``U_k = m_k * W - W_k,N`` (zero outside ``m_k``) and its next mask. The server applies the mean
update, Eq. (4): ``W <- W - (1 / |S_t|) * sum_k U_k``. The mean is over the sampled clients, so a
coordinate that only some of them hold moves by their sum divided by ``|S_t|``, as the paper writes it
(and as its analysis assumes, Eq. (2)); it is not re-normalised by the number of holders.

The next mask (Algorithm 2, "modified DST") is DisPFL's prune-and-regrow of
:func:`edge_node.algorithm.prune_regrow.update_masks` with the gradient rule: drop the ``ceil(alpha_t * nnz)``
active weights of smallest magnitude per tensor and regrow as many where the dense gradient of one
mini-batch is largest, ``alpha_t = alpha_0 / 2 * (1 + cos(pi t / T))`` (the cosine schedule of
:func:`edge_node.algorithm.schedules.prune_rate`, the paper's appendix A). Per-tensor counts never change,
so every client stays at exactly its density. Algorithm 3 (RSM) keeps the initial masks for ever.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from edge_node.errors import ConfigError

TensorDict = Mapping[str, torch.Tensor]


def sparse_update(sent: TensorDict, trained: TensorDict, mask: TensorDict) -> dict[str, torch.Tensor]:
    """``U = m * (sent - trained)``: what a client uploads (exactly zero outside its mask)."""
    with torch.no_grad():
        return {name: (sent[name] - trained[name]) * mask[name] for name in sent}


def apply_mean_update(weights: TensorDict, updates: Sequence[TensorDict]) -> dict[str, torch.Tensor]:
    """Eq. (4): ``W - (1 / |S|) * sum_k U_k``; a new dict, inputs untouched."""
    if not updates:
        raise ConfigError("FedSpa's server step needs at least one client's update")
    scale = 1.0 / len(updates)
    out: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for name, w in weights.items():
            total = torch.zeros_like(w)
            for update in updates:
                total.add_(update[name])
            out[name] = w - scale * total
    return out


def personal_weights(weights: TensorDict, mask: TensorDict) -> dict[str, torch.Tensor]:
    """Client ``k``'s personal sparse model ``m_k * W`` (what it receives, and what it is judged on)."""
    with torch.no_grad():
        return {name: w * mask[name] for name, w in weights.items()}
