import numpy as np
import pytest

from edge_node.algorithm.topology import check_topology, neighbours
from edge_node.errors import ConfigError


def test_random_picks_k_distinct_others():
    nbrs = neighbours("random", 100, 10, np.random.default_rng(0))
    assert all(len(set(n)) == 10 and i not in n for i, n in enumerate(nbrs))
    assert neighbours("random", 100, 10, np.random.default_rng(0)) == nbrs


def test_in_degree_cap_bounds_the_busiest_node():
    uncapped = neighbours("random", 100, 10, np.random.default_rng(1))
    assert max(np.bincount(np.concatenate(uncapped), minlength=100)) > 10  # the reference's ~18
    capped = neighbours("random", 100, 10, np.random.default_rng(1), max_in_degree=10)
    assert all(len(set(n)) == 10 and i not in n for i, n in enumerate(capped))
    assert max(np.bincount(np.concatenate(capped), minlength=100)) <= 10


def test_ring_and_full():
    assert neighbours("ring", 5, 2, np.random.default_rng(0))[0] == [1, 4]
    assert neighbours("full", 4, 3, np.random.default_rng(0))[2] == [0, 1, 3]


def test_impossible_topologies_are_refused():
    with pytest.raises(ConfigError, match="neighbours=10"):
        check_topology("random", 10, 10, None)
    with pytest.raises(ConfigError, match="max_in_degree"):
        check_topology("random", 10, 3, 2)
    with pytest.raises(ConfigError, match="topology"):
        check_topology("star", 10, 3, None)
