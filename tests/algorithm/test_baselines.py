"""The paper's baselines as the DisPFL round on dense clients: D-PSGD's gossip step and FedAvg's server step."""

import pytest
import torch

from edge_node.algorithm.aggregation import aggregate
from edge_node.algorithm.dense import dense_state, is_dense
from edge_node.algorithm.dispfl import published, start
from edge_node.algorithm.dpsgd import neighbourhood_average
from edge_node.algorithm.fedavg import sample_clients, weighted_average
from edge_node.errors import ConfigError


def _model(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(4, 5, generator=g), "b": torch.randn(5, generator=g)}


def test_dense_state_has_all_ones_masks_and_copies_the_weights():
    w = _model(0)
    state = dense_state(w)
    assert is_dense(state) and state.density == 1.0
    assert all(torch.equal(state.weights[k], w[k]) for k in w)
    state.weights["w"].add_(1.0)
    assert not torch.equal(state.weights["w"], w["w"])  # a copy, not the caller's tensors


def test_dpsgd_average_is_the_plain_mean_and_exactly_aggregate_with_dense_masks():
    me, peers = dense_state(_model(0)), [dense_state(_model(s)) for s in (1, 2, 3)]
    out = neighbourhood_average(me, [published(p) for p in peers])
    for name in me.weights:
        stacked = torch.stack([me.weights[name], *(p.weights[name] for p in peers)])
        torch.testing.assert_close(out.weights[name], stacked.mean(dim=0))
        ones = me.train_mask
        expected = aggregate(me.weights, ones, ones, [p.weights for p in peers], [p.train_mask for p in peers])
        assert torch.equal(out.weights[name], expected[name])
    assert is_dense(out)


def test_dpsgd_refuses_a_sparse_client():
    sparse = start(_model(0), 0.5, seed=0, client=0, mask_init="uniform")
    with pytest.raises(ConfigError, match="dense"):
        neighbourhood_average(sparse, [])


def test_fedavg_weights_by_sample_count():
    a, b = _model(0), _model(1)
    out = weighted_average([a, b], [100, 300])
    for name in a:
        torch.testing.assert_close(out[name], 0.25 * a[name] + 0.75 * b[name])
    with pytest.raises(ConfigError):
        weighted_average([a, b], [1])
    with pytest.raises(ConfigError):
        weighted_average([a], [0])


def test_fedavg_samples_k_distinct_clients_per_round_reproducibly():
    rounds = [sample_clients(100, 10, seed=3, round_index=t) for t in range(20)]
    assert all(len(r) == 10 == len(set(r)) and r == sorted(r) and r[0] >= 0 and r[-1] < 100 for r in rounds)
    assert rounds[0] == sample_clients(100, 10, seed=3, round_index=0)
    assert len({tuple(r) for r in rounds}) > 15  # a new draw every round
    assert sample_clients(4, 10, seed=0, round_index=0) == [0, 1, 2, 3]  # fewer clients than k: all of them
