"""Who each simulated client pulls from in a round (ALGORITHM.md "Topology")."""

from __future__ import annotations

import numpy as np

from edge_node.errors import ConfigError

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
