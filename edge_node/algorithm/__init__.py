"""DisPFL as pure tensor functions: no I/O, no clocks, randomness only from explicit generators.

The simulation (``edge_node.sim``) and the device daemon (``edge_node.node``) call exactly these. One
client's round is :mod:`edge_node.algorithm.dispfl`; the paper's baselines (:mod:`.dense`, :mod:`.dpsgd`,
:mod:`.fedavg`) and DA-DPFL's further pruning (:mod:`.sparse_to_sparser`) are built from it, and so are the
server methods the FedSpa paper compares (:mod:`.fedspa`, :mod:`.ditto`, :mod:`.sub_fedavg`; simulation only).
"""

from edge_node.algorithm.aggregation import aggregate
from edge_node.algorithm.dense import dense_state, is_dense
from edge_node.algorithm.dpsgd import neighbourhood_average
from edge_node.algorithm.fedavg import sample_clients, weighted_average
from edge_node.algorithm.flops import dense_nnz, forward_flops, round_training_flops, weight_positions
from edge_node.algorithm.heterogeneous import (
    TIER_DENSITIES,
    TIER_NAMES,
    client_densities,
    parse_tier,
    tier_name,
    tier_of_density,
)
from edge_node.algorithm.masks import (
    MASK_METHODS,
    active_counts,
    check_density,
    erk_densities,
    init_masks,
    mask_density,
    nnz_per_tensor,
    uniform_densities,
)
from edge_node.algorithm.prune_regrow import REGROW_RULES, update_masks
from edge_node.algorithm.robust import ScreenResult, screen_peer_models
from edge_node.algorithm.schedules import learning_rate, prune_rate
from edge_node.algorithm.sparse_to_sparser import S2SParams, further_prune, pq_index, prune_state
from edge_node.algorithm.training import (
    SGDConfig,
    TrainStats,
    all_finite,
    count_correct,
    dense_gradients,
    load_weights,
    read_weights,
    train_masked,
)

__all__ = [
    "MASK_METHODS",
    "REGROW_RULES",
    "TIER_DENSITIES",
    "TIER_NAMES",
    "S2SParams",
    "SGDConfig",
    "ScreenResult",
    "TrainStats",
    "active_counts",
    "aggregate",
    "all_finite",
    "check_density",
    "client_densities",
    "count_correct",
    "dense_gradients",
    "dense_nnz",
    "dense_state",
    "erk_densities",
    "forward_flops",
    "further_prune",
    "init_masks",
    "is_dense",
    "learning_rate",
    "load_weights",
    "mask_density",
    "neighbourhood_average",
    "nnz_per_tensor",
    "parse_tier",
    "pq_index",
    "prune_rate",
    "prune_state",
    "read_weights",
    "round_training_flops",
    "screen_peer_models",
    "tier_name",
    "sample_clients",
    "tier_of_density",
    "train_masked",
    "uniform_densities",
    "update_masks",
    "weight_positions",
    "weighted_average",
]
