"""Sub-FedAvg's pure pieces: which tensors it prunes, its per-round rate towards the target, candidate masks,
the mask distance, and the server's average over holders."""

import math

import pytest
import torch

from edge_node.algorithm.sub_fedavg import (
    candidate_mask,
    holder_average,
    mask_distance,
    prunable,
    prunable_density,
    round_rate,
)
from edge_node.errors import ConfigError


def _masks() -> dict[str, torch.Tensor]:
    return {"conv": torch.ones(4, 5, dtype=torch.bool), "bias": torch.ones(4, dtype=torch.bool)}


def test_only_weight_matrices_and_kernels_are_pruned():
    masks = _masks()
    assert prunable(masks) == ["conv"]
    weights = {"conv": torch.arange(20.0).reshape(4, 5) - 10.0, "bias": torch.zeros(4)}
    out = candidate_mask(weights, masks, 0.25)
    assert int(out["conv"].sum()) == 15 and bool(out["bias"].all())
    # the 5 smallest |w| of -10..9 are 0, -1, 1, -2, 2 (ties of magnitude broken by index)
    dropped = set((torch.arange(20.0) - 10.0)[~out["conv"].reshape(-1)].tolist())
    assert dropped == {0.0, -1.0, 1.0, -2.0, 2.0}
    assert prunable_density(out) == 0.75


def test_the_rate_shrinks_to_land_on_the_target_and_is_zero_there():
    assert round_rate(1.0, 0.5, 0.05) == 0.05
    assert round_rate(0.52, 0.5, 0.05) == pytest.approx(1 - 0.5 / 0.52)
    assert round_rate(0.5, 0.5, 0.05) == 0.0
    density = 1.0
    for _ in range(100):  # the schedule: 0.95^k down to the target, never below
        density *= 1 - round_rate(density, 0.5, 0.05)
    assert density == pytest.approx(0.5)
    assert math.ceil(math.log(0.5) / math.log(0.95)) == 14  # prunes to reach it (the last one shrunk)
    with pytest.raises(ConfigError):
        round_rate(1.0, 0.5, 0.0)


def test_mask_distance_is_the_mean_hamming_fraction_over_pruned_tensors():
    a = _masks()
    b = {"conv": a["conv"].clone(), "bias": torch.zeros(4, dtype=torch.bool)}  # bias is not counted
    assert mask_distance(a, b) == 0.0
    b["conv"][0, :2] = False
    assert mask_distance(a, b) == pytest.approx(2 / 20)


def test_the_server_averages_each_coordinate_over_its_holders_and_keeps_its_own_elsewhere():
    server = {"w": torch.tensor([9.0, 9.0, 9.0])}
    models = [{"w": torch.tensor([1.0, 2.0, 0.0])}, {"w": torch.tensor([3.0, 0.0, 0.0])}]
    masks = [{"w": torch.tensor([True, True, False])}, {"w": torch.tensor([True, False, False])}]
    assert holder_average(server, models, masks)["w"].tolist() == [2.0, 2.0, 9.0]
    with pytest.raises(ConfigError):
        holder_average(server, models, masks[:1])
