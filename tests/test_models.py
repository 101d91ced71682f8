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
