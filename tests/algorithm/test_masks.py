import math

import pytest
import torch

from edge_node.algorithm import active_counts, erk_densities, init_masks, mask_density, uniform_densities
from edge_node.errors import ConfigError
from edge_node.models import build_model

SPARSE_AT_HALF = {
    "layer3.0.conv2.weight": 0.7197,
    "layer3.1.conv1.weight": 0.7197,
    "layer3.1.conv2.weight": 0.7197,
    "layer4.0.conv1.weight": 0.5377,
    "layer4.0.conv2.weight": 0.3578,
    "layer4.1.conv1.weight": 0.3578,
    "layer4.1.conv2.weight": 0.3578,
}


@pytest.fixture(scope="module")
def resnet_shapes():
    return {n: tuple(p.shape) for n, p in build_model("resnet18").named_parameters()}


def test_erk_resnet18_half_density_check_values(resnet_shapes):
    densities = erk_densities(resnet_shapes, 0.5)
    sparse = {n: round(d, 4) for n, d in densities.items() if d < 1.0}
    assert sparse == SPARSE_AT_HALF
    assert sum(active_counts(resnet_shapes, densities).values()) == 5_586_977


@pytest.mark.parametrize("density", [0.05, 0.2, 0.4, 0.6, 0.8])
def test_erk_hits_the_global_budget_and_never_exceeds_one(resnet_shapes, density):
    densities = erk_densities(resnet_shapes, density)
    total = sum(math.prod(s) for s in resnet_shapes.values())
    active = sum(active_counts(resnet_shapes, densities).values())
    assert all(0 < d <= 1.0 for d in densities.values())
    assert abs(active - density * total) <= len(resnet_shapes)  # floor per tensor


def test_density_one_is_dense_and_uniform_is_flat(resnet_shapes):
    assert set(erk_densities(resnet_shapes, 1.0).values()) == {1.0}
    assert set(uniform_densities(resnet_shapes, 0.3).values()) == {0.3}


@pytest.mark.parametrize("bad", [0.0, -0.1, 1.5, float("nan")])
def test_density_outside_unit_interval_is_refused(resnet_shapes, bad):
    with pytest.raises(ConfigError, match="density"):
        erk_densities(resnet_shapes, bad)


def test_init_masks_exact_counts_personal_positions_and_reproducible():
    weights = dict(build_model("cnn").named_parameters())
    a = init_masks(weights, 0.5, torch.Generator().manual_seed(1))
    b = init_masks(weights, 0.5, torch.Generator().manual_seed(1))
    c = init_masks(weights, 0.5, torch.Generator().manual_seed(2))
    shapes = {n: tuple(w.shape) for n, w in weights.items()}
    counts = active_counts(shapes, erk_densities(shapes, 0.5))
    assert {n: int(m.sum()) for n, m in a.items()} == counts
    assert all(m.dtype == torch.bool and m.shape == weights[n].shape for n, m in a.items())
    assert all(torch.equal(a[n], b[n]) for n in a)
    assert not torch.equal(a["fc1.weight"], c["fc1.weight"])
    assert abs(mask_density(a) - 0.5) < 1e-3


def test_unknown_mask_method_is_refused():
    with pytest.raises(ConfigError, match="mask method"):
        init_masks({"w": torch.zeros(3, 3)}, 0.5, torch.Generator(), "largest")
