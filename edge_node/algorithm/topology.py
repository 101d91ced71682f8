"""Who a client pulls from in a round (docs/ALGORITHM.md "Topology"): the rules the simulation and the daemon share.

``round_neighbours`` is the synchronous algorithm's seeded choice (the simulation, and a lock-step
fleet, where every node computes the same lists); ``pick_peers`` is an asynchronous node's choice
among the peers it currently sees.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from edge_node.errors import ConfigError
from edge_node.seeding import Stream, numpy_generator

TOPOLOGIES = ("random", "ring", "full")
_MAX_ATTEMPTS = 200  # restarts of the capped random draw before giving up


def check_topology(topology: str, num_clients: int, k: int, max_in_degree: int | None) -> None:
    """Raise ConfigError for a topology that cannot be built (checked once, before any work)."""
    if topology not in TOPOLOGIES:
        raise ConfigError(f"topology {topology!r} must be one of {', '.join(TOPOLOGIES)}")
    if num_clients < 2:
        raise ConfigError(f"clients={num_clients} must be at least 2")
    if topology == "random":
        if not 1 <= k <= num_clients - 1:
            raise ConfigError(f"neighbours={k} must be in 1..{num_clients - 1} (clients - 1) for {num_clients} clients")
        if max_in_degree is not None and max_in_degree < k:
            raise ConfigError(f"max_in_degree={max_in_degree} must be >= neighbours={k} (every pull needs a server)")


def _random_capped(num_clients: int, k: int, cap: int, rng: np.random.Generator) -> list[list[int]]:
    for _ in range(_MAX_ATTEMPTS):
        load = np.zeros(num_clients, dtype=np.int64)
        result: list[list[int]] = [[] for _ in range(num_clients)]
        for i in rng.permutation(num_clients):
            free = np.flatnonzero(load < cap)
            free = free[free != i]
            if free.size < k:
                break
            # Prefer the least-loaded so the draw cannot paint itself into a corner at exact capacity.
            weights = (cap - load[free]).astype(np.float64)
            chosen = rng.choice(free, size=k, replace=False, p=weights / weights.sum())
            load[chosen] += 1
            result[int(i)] = sorted(int(c) for c in chosen)
        else:
            return result
    raise ConfigError(f"could not draw {k} neighbours per client with max_in_degree={cap}; raise the cap")


def neighbours(
    topology: str, num_clients: int, k: int, rng: np.random.Generator, max_in_degree: int | None = None
) -> list[list[int]]:
    """Neighbour lists for one round: ``result[i]`` are the clients client ``i`` pulls from."""
    if topology == "ring":
        if num_clients == 2:
            return [[1], [0]]
        return [sorted({(i - 1) % num_clients, (i + 1) % num_clients}) for i in range(num_clients)]
    if topology == "full":
        return [[j for j in range(num_clients) if j != i] for i in range(num_clients)]
    if max_in_degree is not None:
        return _random_capped(num_clients, k, max_in_degree, rng)
    result = []
    for i in range(num_clients):
        others = np.delete(np.arange(num_clients), i)
        result.append(sorted(int(c) for c in rng.choice(others, size=k, replace=False)))
    return result


def round_neighbours(
    topology: str, num_clients: int, k: int, seed: int, round_index: int, max_in_degree: int | None = None
) -> list[list[int]]:
    """The neighbour lists of round ``round_index``, drawn from the seeded topology stream of ``seed``."""
    return neighbours(topology, num_clients, k, numpy_generator(seed, Stream.TOPOLOGY, round_index), max_in_degree)


def pick_peers(candidates: Sequence[str], k: int, rng: np.random.Generator) -> list[str]:
    """Up to ``k`` distinct candidates uniformly at random, in the order drawn (all of them when fewer)."""
    if k < 0:
        raise ValueError(f"k={k} must be >= 0")
    unique = sorted(set(candidates))
    if len(unique) <= k:
        return [unique[i] for i in rng.permutation(len(unique))]
    return [unique[int(i)] for i in rng.choice(len(unique), size=k, replace=False)]
