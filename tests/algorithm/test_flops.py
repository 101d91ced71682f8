import pytest

from edge_node.algorithm import (
    active_counts,
    dense_nnz,
    erk_densities,
    forward_flops,
    round_training_flops,
    weight_positions,
)
from edge_node.models import build_model


def test_resnet18_training_flops_check_values():
    model = build_model("resnet18")
    positions = weight_positions(model, (3, 32, 32))
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    erk = active_counts(shapes, erk_densities(shapes, 0.5))
    assert 3 * forward_flops(positions, dense_nnz(model)) == pytest.approx(3.3325e9, rel=1e-4)
    assert 3 * forward_flops(positions, erk) == pytest.approx(2.6533e9, rel=1e-4)


def test_cnn_forward_flops_by_hand_and_round_formula():
    model = build_model("cnn")
    positions = weight_positions(model, (3, 32, 32))
    assert positions == {
        "conv1.weight": 28 * 28,
        "conv2.weight": 10 * 10,
        "fc1.weight": 1,
        "fc2.weight": 1,
        "fc3.weight": 1,
    }
    by_hand = 2 * (64 * 3 * 25 * 784 + 64 * 64 * 25 * 100 + 1600 * 384 + 384 * 192 + 192 * 10)
    dense = dense_nnz(model)
    f = forward_flops(positions, dense)
    assert f == by_hand
    got = round_training_flops(positions, dense, dense, epochs=5, samples=500, regrow_batch=128)
    assert got == 5 * 500 * 3 * f + 128 * 3 * f
