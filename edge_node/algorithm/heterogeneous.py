"""DisPFL setting (ii): clients of five capacity tiers train at densities 0.2 .. 1.0.

Aggregation needs no change: the per-coordinate holder count handles mixed masks. In the
simulation client i gets tier ``i mod 5`` unless a tier list is given; a device measures its tier.
"""

from __future__ import annotations

from collections.abc import Sequence

from edge_node.errors import ConfigError

TIER_DENSITIES: tuple[float, ...] = (0.2, 0.4, 0.6, 0.8, 1.0)
# How a tier is named where it is advertised (Hello, TXT) and configured (``--capacity t3``): tier
# ``TIER_NAMES[i]`` trains at ``TIER_DENSITIES[i]``. Its density as written here ("0.6") names it too.
TIER_NAMES: tuple[str, ...] = ("t1", "t2", "t3", "t4", "t5")
_TIER_DENSITY_TEXT: tuple[str, ...] = tuple(f"{d:.1f}" for d in TIER_DENSITIES)


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


def tier_of_density(density: float) -> int:
    """The index of the largest tier density not above ``density`` (0 for anything below 0.2)."""
    eligible = [i for i, d in enumerate(TIER_DENSITIES) if d <= density + 1e-9]
    return eligible[-1] if eligible else 0


def tier_name(density: float) -> str:
    """The tier's name as advertised (TXT ``tier``, Hello): its density with one decimal, e.g. ``"0.6"``."""
    return f"{TIER_DENSITIES[tier_of_density(density)]:.1f}"


def parse_tier(name: str) -> int:
    """The tier index named by ``name``: ``"t1"`` .. ``"t5"`` or its density ``"0.2"`` .. ``"1.0"``.

    Raises:
        ConfigError: any other text (the known names are listed).
    """
    if isinstance(name, str):
        if name in TIER_NAMES:
            return TIER_NAMES.index(name)
        if name in _TIER_DENSITY_TEXT:
            return _TIER_DENSITY_TEXT.index(name)
    shown = name if not isinstance(name, str) or len(name) <= 40 else name[:40] + "..."
    raise ConfigError(
        f"tier {shown!r} is not one of {', '.join(TIER_NAMES)} (or the densities {', '.join(_TIER_DENSITY_TEXT)})"
    )
