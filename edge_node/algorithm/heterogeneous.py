"""DisPFL setting (ii): clients of five capacity tiers train at densities 0.2 .. 1.0.

Aggregation needs no change: the per-coordinate holder count handles mixed masks. In the
simulation client i gets tier ``i mod 5`` unless a tier list is given; a device measures its tier.
"""

from __future__ import annotations

from collections.abc import Sequence

from edge_node.errors import ConfigError

# The tiers' names and densities are contract values (advertised in Hello and TXT): their rules live in
# ``edge_node.protocol``, re-exported here for the algorithm's callers.
from edge_node.protocol import TIER_DENSITIES, TIER_NAMES, parse_tier, tier_name, tier_of_density

__all__ = ["TIER_DENSITIES", "TIER_NAMES", "client_densities", "parse_tier", "tier_name", "tier_of_density"]


def client_densities(num_clients: int, tiers: Sequence[int] | None = None) -> list[float]:
    """Density of each client: tier ``i mod 5``, or the given per-client tier indices."""
    if num_clients <= 0:
        raise ConfigError(f"num_clients={num_clients} must be positive")
    if tiers is None:
        tiers = [i % len(TIER_DENSITIES) for i in range(num_clients)]
    if len(tiers) != num_clients:
        raise ConfigError(f"{len(tiers)} tiers given for {num_clients} clients")
    bad = [t for t in tiers if not 0 <= t < len(TIER_DENSITIES)]
    if bad:
        raise ConfigError(f"tier index {bad[0]} must be in 0..{len(TIER_DENSITIES) - 1}")
    return [TIER_DENSITIES[t] for t in tiers]
