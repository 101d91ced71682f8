"""Dense clients for the paper's baselines (Local, D-PSGD, FedAvg): the DisPFL client state on all-ones masks.

A dense model is a :class:`~edge_node.algorithm.dispfl.ClientState` whose masks are all ones, so the
baselines run on the same steps as DisPFL (Dai et al., ICML 2022, Sec. 5 "Baselines"), with no copy of
them: ``train_local`` on all-ones masks is plain SGD with the same schedule, clipping and weight decay
(multiplying by a mask of ones changes nothing), and ``aggregate_peers`` over all-ones masks is the
uniform average of the client and its neighbours, D-PSGD's gossip step. Dense clients never call
``update_mask``.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from edge_node.algorithm.dispfl import ClientState


def dense_state(weights: Mapping[str, torch.Tensor]) -> ClientState:
    """A dense client holding ``weights`` (copied), with all-ones train and next masks and density 1."""
    masks = {name: torch.ones_like(w, dtype=torch.bool) for name, w in weights.items()}
    return ClientState({name: w.detach().clone() for name, w in weights.items()}, masks, dict(masks), 1.0)


def is_dense(state: ClientState) -> bool:
    """True when every position of the client's train mask is active."""
    return all(bool(m.all()) for m in state.train_mask.values())
