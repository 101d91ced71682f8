"""FedP3's pure pieces: layer groups, the authors' ownership schedules, server-to-client pruning, and
Algorithm 3's per-layer mean and weighted mean over the layers' owners."""

from __future__ import annotations

import pytest
import torch

from edge_node.algorithm.fedp3 import (
    keep_mask,
    layer_average,
    layer_groups,
    owned_layers,
    server_to_client,
    uploaded_names,
)
from edge_node.errors import ConfigError
from edge_node.models import build_model

CNN_NAMES = [name for name, _ in build_model("cnn", 10, seed=0).named_parameters()]


def test_layer_groups_pair_each_modules_weight_and_bias_in_order():
    groups = layer_groups(CNN_NAMES)
    assert [g[0].split(".")[0] for g in groups] == ["conv1", "conv2", "fc1", "fc2", "fc3"]
    assert all(len(g) == 2 for g in groups)


@pytest.mark.parametrize(
    ("schedule", "expected"),
    [("lowerb", [[0], [1], [2], [3]]), ("opu2", [[0, 1], [1, 2], [2, 3], [0, 3]]),
     ("opu3", [[0, 1, 2], [1, 2, 3], [0, 2, 3], [0, 1, 3]])],
)  # fmt: skip
def test_fixed_schedules_give_blocks_of_25_of_100_clients_the_codes_layers(schedule, expected):
    for block, layers in enumerate(expected):
        for client in range(25 * block, 25 * block + 25):
            assert owned_layers(schedule, client, 100, 4, seed=0, round_index=3) == layers


def test_random_schedule_draws_two_distinct_layers_per_client_and_round_reproducibly():
    draws = {tuple(owned_layers("opr2", c, 100, 4, seed=1, round_index=t)) for c in range(10) for t in range(5)}
    assert all(len(d) == 2 and d[0] != d[1] and set(d) <= {0, 1, 2, 3} for d in draws)
    assert len(draws) > 1
    assert owned_layers("opr2", 3, 100, 4, seed=1, round_index=2) == owned_layers(
        "opr2", 3, 100, 4, seed=1, round_index=2
    )


def test_unknown_schedule_is_refused():
    with pytest.raises(ConfigError, match="must be one of"):
        owned_layers("opu9", 0, 4, 4, seed=0, round_index=0)


def test_keep_mask_keeps_the_largest_magnitudes_and_whole_biases():
    w = torch.tensor([[0.1, -5.0], [3.0, 0.2], [-0.05, 1.0]])
    assert keep_mask(w, 0.5).tolist() == [[False, True], [True, False], [False, True]]
    assert keep_mask(torch.tensor([0.0, 1.0, 2.0]), 0.1).all()
    with pytest.raises(ConfigError):
        keep_mask(w, 0.0)


def test_server_to_client_sends_owned_layers_dense_prunes_the_rest_and_keeps_the_personal_final_layer():
    server = {name: torch.randn(p.shape) for name, p in build_model("cnn", 10, seed=0).named_parameters()}
    personal = {name: torch.full_like(w, 7.0) for name, w in server.items()}
    groups = layer_groups(list(server))
    weights, masks = server_to_client(server, personal, groups, [1], 0.5)
    assert torch.equal(weights["conv2.weight"], server["conv2.weight"]) and masks["conv2.weight"].all()
    assert masks["fc1.weight"].sum() == server["fc1.weight"].numel() // 2
    assert torch.equal(weights["fc1.weight"], server["fc1.weight"] * masks["fc1.weight"])
    assert torch.equal(weights["fc1.bias"], server["fc1.bias"])
    assert torch.equal(weights["fc3.weight"], personal["fc3.weight"]) and masks["fc3.weight"].all()
    assert uploaded_names(groups, [1]) == ["conv2.weight", "conv2.bias", "fc3.weight", "fc3.bias"]


def test_layer_average_is_the_mean_over_each_tensors_uploaders_and_keeps_unowned_tensors():
    server = {"a": torch.zeros(2), "b": torch.full((2,), 9.0), "c": torch.ones(1)}
    uploads = [{"a": torch.tensor([1.0, 2.0]), "c": torch.tensor([3.0])}, {"a": torch.tensor([3.0, 6.0])}]
    out = layer_average(server, uploads, [2, 1], "mean")
    assert out["a"].tolist() == [2.0, 4.0] and out["b"].tolist() == [9.0, 9.0] and out["c"].tolist() == [3.0]
    weighted = layer_average(server, uploads, [2, 1], "weighted")  # weights 2/3 and 1/3 on "a"
    assert weighted["a"].tolist() == pytest.approx([5 / 3, 10 / 3])
    assert server["a"].tolist() == [0.0, 0.0]  # inputs untouched
    with pytest.raises(ConfigError):
        layer_average(server, uploads, [2, 1], "attention")
