import pytest

from edge_node.algorithm import TIER_DENSITIES, client_densities, tier_of_density
from edge_node.errors import ConfigError


def test_setting_ii_assigns_tier_i_mod_5():
    assert TIER_DENSITIES == (0.2, 0.4, 0.6, 0.8, 1.0)
    assert client_densities(7) == [0.2, 0.4, 0.6, 0.8, 1.0, 0.2, 0.4]
    assert client_densities(3, tiers=[4, 4, 0]) == [1.0, 1.0, 0.2]
    assert tier_of_density(0.65) == 2 and tier_of_density(0.1) == 0 and tier_of_density(1.0) == 4


def test_bad_tiers_are_refused():
    with pytest.raises(ConfigError):
        client_densities(2, tiers=[0, 5])
    with pytest.raises(ConfigError):
        client_densities(2, tiers=[0])
