"""The robust setting's and the poisoning attacks' names, parsed and checked without torch (foundations layer).

What reads config files or starts a loopback fleet (the fleet supervisor, the CLI) must not import torch; the
aggregates and attacks themselves are in edge_node.algorithm.robust_aggregation and edge_node.algorithm.poison.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from edge_node.errors import ConfigError

AGGREGATES = ("mean", "median", "trimmed:BETA")  # the settings' spellings (help texts)
DEFAULT_AGGREGATE = "mean"
AGGREGATE_HELP = (
    "The per-coordinate aggregate over the models holding it (the own included): mean (DisPFL's), median or "
    "trimmed:BETA (drop the BETA fraction, in [0, 0.5), at each end); median and trimmed also refuse a peer whose "
    "weights point away from the node's and its other peers' (a counted refusal, kind distance)"
)


def parse_aggregate(spec: str) -> tuple[str, float]:
    """``(rule, beta)`` of an ``aggregate`` setting: ``("mean", 0)``, ``("median", 0)`` or ``("trimmed", BETA)``.

    Raises:
        ConfigError: an unknown rule, or a trimming fraction that is not a number in [0, 0.5).
    """
    if not isinstance(spec, str):
        raise ConfigError(f"aggregate={spec!r} must be one of {', '.join(AGGREGATES)}")
    if spec in ("mean", "median"):
        return spec, 0.0
    if spec.startswith("trimmed:"):
        text = spec.split(":", 1)[1]
        try:
            beta = float(text)
        except ValueError:
            beta = math.nan
        if not (math.isfinite(beta) and 0.0 <= beta < 0.5):
            raise ConfigError(f"aggregate={spec!r}: the trimming fraction {text!r} must be a number in [0, 0.5)")
        return "trimmed", beta
    raise ConfigError(f"aggregate={spec!r} must be one of {', '.join(AGGREGATES)}")


def check_aggregate(spec: str) -> str:
    """``spec`` when it is a valid ``aggregate`` setting (else ConfigError, from :func:`parse_aggregate`)."""
    parse_aggregate(spec)
    return spec


ATTACKS = ("sign-flip", "scale:F", "noise", "zero", "label-flip", "stale:R")


@dataclass(frozen=True)
class Attack:
    """One parsed attack: its ``kind`` (``scale``, ``stale`` without the argument) and argument."""

    spec: str
    kind: str
    factor: float = 1.0  # scale:F
    rounds_back: int = 0  # stale:R

    @property
    def flips_labels(self) -> bool:
        return self.kind == "label-flip"


def parse_attack(spec: str, rounds: int | None = None) -> Attack:
    """The attack ``spec`` names, checked; ``rounds`` (the run's rounds; None or 0: until stopped) bounds ``stale:R``.

    Raises:
        ConfigError: an unknown attack, ``scale:F`` with F not finite or not above 0, ``stale:R`` with R not an
            integer >= 1 or beyond ``rounds``.
    """
    if not isinstance(spec, str):
        raise ConfigError(f"attack {spec!r} must be one of {', '.join(ATTACKS)}")
    if spec in ("sign-flip", "noise", "zero", "label-flip"):
        return Attack(spec, spec)
    kind, _, arg = spec.partition(":")
    if kind == "scale" and arg:
        try:
            factor = float(arg)
        except ValueError:
            factor = math.nan
        if not (math.isfinite(factor) and factor > 0):
            raise ConfigError(f"attack {spec!r}: the factor {arg!r} must be a finite number above 0")
        return Attack(spec, kind, factor=factor)
    if kind == "stale" and arg:
        try:
            back = int(arg)
        except ValueError:
            back = 0
        if back < 1:
            raise ConfigError(f"attack {spec!r}: R={arg!r} must be an integer >= 1 (rounds back)")
        if rounds and back > rounds:
            raise ConfigError(f"attack {spec!r}: R={back} is beyond the run's {rounds} rounds")
        return Attack(spec, kind, rounds_back=back)
    raise ConfigError(f"attack {spec!r} must be one of {', '.join(ATTACKS)}")
