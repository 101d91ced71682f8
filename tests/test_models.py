import pytest
import torch

from edge_node.errors import ModelError
from edge_node.models import MODEL_NAMES, build_model, count_parameters

EXPECTED_PARAMETERS = {"cnn": 797_962, "resnet18": 11_173_962, "vgg11": 9_231_114}


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_parameter_counts_match_algorithm_md(name):
    model = build_model(name, 10)
    assert count_parameters(model) == EXPECTED_PARAMETERS[name]
    assert list(model.buffers()) == [], "models must carry no buffers (GroupNorm, never BatchNorm)"


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_forward_gives_logits_per_class(name):
    model = build_model(name, 100)
    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 100)


def test_seed_gives_identical_initial_weights_without_touching_global_rng():
    state = torch.random.get_rng_state()
    a = build_model("cnn", seed=7)
    b = build_model("cnn", seed=7)
    c = build_model("cnn", seed=8)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    assert not torch.equal(a.conv1.weight, c.conv1.weight)


def test_unknown_model_is_refused_by_name():
    with pytest.raises(ModelError, match="unknown model 'resnet50'"):
        build_model("resnet50")


def test_resnet18_for_tiny_imagenet_is_the_papers_64x64_variant():
    """DisPFL's ``tiny_resnet18``: the CIFAR network unchanged (3x3 stride-1 stem, no max-pool), with the
    final 4x4 average pool made global, so 64x64 input ends in an 8x8 map averaged to 1x1. Parameters:
    the CIFAR count with a 200-class head."""
    model = build_model("resnet18", 200)
    assert count_parameters(model) == 11_271_432 == 11_173_962 - (512 * 10 + 10) + (512 * 200 + 200)
    assert model(torch.zeros(2, 3, 64, 64)).shape == (2, 200)
    from edge_node.algorithm import dense_nnz, forward_flops, weight_positions

    small = forward_flops(weight_positions(model, (3, 32, 32)), dense_nnz(model))
    large = forward_flops(weight_positions(model, (3, 64, 64)), dense_nnz(model))
    linear = 2 * (512 * 200)
    assert large - linear == pytest.approx(4 * (small - linear))  # every conv runs at 4x the positions


def test_vgg11_for_cifar100_has_a_100_class_head():
    assert count_parameters(build_model("vgg11", 100)) == 9_277_284 == 9_231_114 + 512 * 90 + 90
