"""DA-DPFL's further pruning (edge_node.algorithm.sparse_to_sparser): PQ index, density floor, vote, gaps."""

import math

import pytest
import torch

from edge_node.algorithm.dispfl import start
from edge_node.algorithm.masks import mask_density
from edge_node.algorithm.sparse_to_sparser import (
    S2SParams,
    further_prune,
    is_prune_round,
    pq_index,
    pq_prune_count,
    prune_rounds,
    prune_state,
    stability,
    vote,
    weight_distance,
)
from edge_node.errors import ConfigError
from edge_node.models import build_model


def test_pq_index_is_zero_for_equal_magnitudes_and_grows_with_sparsity():
    assert pq_index(torch.full((50,), -3.0)) == pytest.approx(0.0, abs=1e-12)
    spiky = torch.zeros(100)
    spiky[0] = 1.0
    assert pq_index(spiky) == pytest.approx(1 - 100 ** (1 - 2) * 1.0 / 1.0)  # ||x||_0.5 = ||x||_1 = 1
    x = torch.tensor([1.0, 4.0])  # ||x||_0.5 = (1 + 2)^2 = 9, ||x||_1 = 5
    assert pq_index(x) == pytest.approx(1 - 2 ** (-1) * 9 / 5)
    assert pq_index(torch.zeros(3)) == 0.0


def test_prune_count_follows_the_formula_and_is_capped():
    x = torch.tensor([1.0, 4.0])  # 1 - I = 0.9 -> keep ceil(1.8) = 2 -> prune 0
    assert pq_prune_count(x, S2SParams()) == 0
    g = torch.Generator().manual_seed(0)
    y = torch.randn(10_000, generator=g)
    keep = math.ceil(10_000 * (1 - pq_index(y)))
    assert pq_prune_count(y, S2SParams()) == math.floor((1 - keep / 10_000) * 10_000)
    spiky = torch.zeros(100)
    spiky[:2] = 1.0  # 1 - I = 0.02 -> keep 2, prune 98 > 0.9 * 100
    assert pq_prune_count(spiky, S2SParams()) == 90


@pytest.fixture(scope="module")
def cnn_state():
    weights = {k: v.detach().clone() for k, v in build_model("cnn", seed=0).named_parameters()}
    return start(weights, 0.3, seed=0, client=1)


def test_further_prune_shrinks_only_matrices_and_never_goes_below_the_target(cnn_state):
    total = sum(m.numel() for m in cnn_state.train_mask.values())
    params = S2SParams(target_density=0.2)
    masks = cnn_state.train_mask
    densities = [mask_density(masks)]
    for _ in range(30):
        new = further_prune(cnn_state.weights, masks, params)
        for name, m in new.items():
            assert not (m & ~masks[name]).any(), "a prune only removes"
            if m.dim() <= 1:
                assert torch.equal(m, masks[name]), f"{name}: vectors are never pruned"
        masks = new
        densities.append(mask_density(masks))
    assert densities[1] < densities[0]
    assert all(d >= 0.2 - 1e-12 for d in densities)
    assert sum(int(m.sum()) for m in masks.values()) == math.ceil(0.2 * total)  # lands exactly on the target
    assert torch.equal(further_prune(cnn_state.weights, masks, params)["fc1.weight"], masks["fc1.weight"])


def test_prune_state_zeroes_the_pruned_weights_and_publishes_the_smaller_mask(cnn_state):
    pruned = prune_state(cnn_state, S2SParams(target_density=0.25))
    assert 0.25 <= pruned.mask_density < cnn_state.mask_density
    for name, w in pruned.weights.items():
        assert not (w[~pruned.train_mask[name]] != 0).any()
        assert torch.equal(pruned.train_mask[name], pruned.next_mask[name])


def test_distance_stability_and_vote():
    init = {"a": torch.zeros(3), "b": torch.zeros(2, 2)}
    w = {"a": torch.tensor([3.0, 4.0, 0.0]), "b": torch.ones(2, 2)}
    assert weight_distance(w, init) == pytest.approx(5.0 + 2.0)
    assert stability(7.1, 7.0, 5.0) == pytest.approx(0.02)
    assert stability(1.0, 0.0, 0.0) == math.inf
    assert vote([True, False]) and not vote([True, False, False]) and not vote([])


def test_prune_rounds_follow_the_authors_gaps_from_the_vote_round():
    # Vote in round V = 9, first prune T0 = 10; gaps f0 = V = 9, then round(9/1.3) = 7, round(7/1.3) = 5, 4, 3,
    # 2, 2, ... (the DA-DPFL code: prunes in 1 + cumsum([9, 7, 5, ...])). Reading f0 = T0 would give 10, 18, 24.
    assert list(zip(range(8), prune_rounds(10), strict=False)) == list(enumerate([10, 17, 22, 26, 29, 31, 33, 35]))
    # V = 1 (the earliest vote): gaps round(1/1.3) = 1, every round from T0 = 2 (f0 = T0 would give 2, 4, 6, ...)
    assert [t for t in range(8) if is_prune_round(t, 2)] == [2, 3, 4, 5, 6, 7]
    # V = 3: gaps 3 -> round(2.31) = 2 -> round(1.54) = 2: rounds 4, 6, 8, 10 (f0 = T0 = 4: 4, 7, 9, 11)
    assert [t for t in range(12) if is_prune_round(t, 4)] == [4, 6, 8, 10]
    assert not any(is_prune_round(t, None) for t in range(10))
    with pytest.raises(ValueError):
        next(prune_rounds(0))
    with pytest.raises(ConfigError):
        S2SParams(target_density=0.0)
    with pytest.raises(ConfigError):
        S2SParams(p=1.0, q=0.5)
