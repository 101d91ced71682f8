"""DisPFL as pure tensor functions: no I/O, no clocks, randomness only from explicit generators.

The simulation (``edge_node.sim``) and the device daemon (``edge_node.node``) call exactly these.
"""

from edge_node.algorithm.aggregation import aggregate
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
    "erk_densities",
    "forward_flops",
    "init_masks",
    "learning_rate",
    "load_weights",
    "mask_density",
    "nnz_per_tensor",
    "parse_tier",
    "prune_rate",
    "read_weights",
    "round_training_flops",
    "screen_peer_models",
    "tier_name",
    "tier_of_density",
    "train_masked",
    "uniform_densities",
    "update_masks",
    "weight_positions",
]
