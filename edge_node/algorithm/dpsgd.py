"""D-PSGD (Lian et al., "Can Decentralized Algorithms Outperform Centralized Algorithms?", NeurIPS 2017),
as the DisPFL paper runs it as a baseline (Dai et al., ICML 2022): dense models, gossip averaging with the
round's neighbours, then local SGD.

One client's round is DisPFL's round on a dense client (:mod:`edge_node.algorithm.dense`) without the
mask update::

    state = neighbourhood_average(state, peers)          # (w_i + sum_j w_j) / (1 + |S_i|)
    trained = dispfl.train_local(state, model, ...)       # E epochs of SGD

**D-PSGD** is evaluated on the neighbourhood average (the model the gossip step produced), **D-PSGD-FT**
after fine-tuning that average locally: with E local epochs per round, the fine-tune is the round's own
local training, ``E * ceil(n_i / B)`` SGD steps (the reference code instead fine-tunes the average of all
clients every 100 rounds, for one round of E epochs).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from edge_node.algorithm.dense import is_dense
from edge_node.algorithm.dispfl import ClientState, aggregate_peers
from edge_node.errors import ConfigError

TensorDict = Mapping[str, torch.Tensor]


def neighbourhood_average(state: ClientState, peers: Sequence[tuple[TensorDict, TensorDict]]) -> ClientState:
    """The uniform average of a dense client and its peers' published dense models.

    Exactly :func:`edge_node.algorithm.dispfl.aggregate_peers` with all-ones masks: every coordinate is
    held by the client and every peer, so the intersection-weighted average is the plain mean.

    Raises:
        ConfigError: the client is not dense (D-PSGD averages whole models).
    """
    if not is_dense(state):
        raise ConfigError("D-PSGD averages dense models; this client has a sparse mask")
    return aggregate_peers(state, peers)
