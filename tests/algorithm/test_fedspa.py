"""FedSpa's pure pieces: the upload is the masked difference, the server applies the mean update (Eq. 4)."""

import pytest
import torch

from edge_node.algorithm.fedspa import apply_mean_update, personal_weights, sparse_update
from edge_node.errors import ConfigError


def test_a_client_uploads_the_masked_difference_exactly_zero_outside_its_mask():
    sent = {"w": torch.tensor([1.0, 2.0, 0.0, 4.0])}
    trained = {"w": torch.tensor([0.5, 2.5, 9.0, 4.0])}  # 9.0: a position outside the mask (cannot happen; ignored)
    mask = {"w": torch.tensor([True, True, False, True])}
    assert sparse_update(sent, trained, mask)["w"].tolist() == [0.5, -0.5, 0.0, 0.0]


def test_the_server_subtracts_the_mean_over_sampled_clients_not_over_holders():
    weights = {"w": torch.tensor([1.0, 1.0, 1.0])}
    updates = [{"w": torch.tensor([0.2, 0.4, 0.0])}, {"w": torch.tensor([0.2, 0.0, 0.0])}]
    out = apply_mean_update(weights, updates)
    # coordinate 1 is held by one of the two clients: it moves by 0.4 / 2, as Eq. (4) writes it
    assert out["w"].tolist() == pytest.approx([0.8, 0.8, 1.0])
    assert weights["w"].tolist() == [1.0, 1.0, 1.0]  # input untouched
    with pytest.raises(ConfigError, match="at least one"):
        apply_mean_update(weights, [])


def test_a_personal_model_is_the_global_model_on_the_clients_mask():
    weights = {"w": torch.tensor([1.0, -2.0, 3.0])}
    mask = {"w": torch.tensor([False, True, True])}
    assert personal_weights(weights, mask)["w"].tolist() == [0.0, -2.0, 3.0]
