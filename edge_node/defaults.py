"""The one table of defaults that ``edge-node simulate``, ``start`` and ``loopback`` share, and the demo preset.

A simulation matches a deployment only when both take the same values for the settings they share, so
each such setting has one default, here, which ``DisPFLParams``, ``NodeConfig``, ``SimConfig`` and
``FleetConfig`` read (a command's own settings, such as ``simulate``'s number of clients, stay with it).
Where a value was a deployment setting it is the daemon's.

The one exception is the **demo quick-start preset**: ``simulate`` and ``loopback`` on the built-in
``demo`` set take a few other values when they are not given, so that a first run finishes in seconds on a
small machine and shows learning (README "Demo settings"). ``--print-config`` names the preset and the
values it set. This module imports nothing heavy: ``edge-node loopback`` reads it without torch.
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any


@dataclass(frozen=True)
class SharedDefaults:
    """One default per shared setting; the names are the config keys of the commands that take them."""

    # The fleet and its data.
    seed: int = 0
    model: str = "cnn"
    task: str = "classification"
    dataset: str = "demo"
    partition: str = "dir:0.3"
    # The client round (DisPFLParams; the paper's CIFAR settings).
    neighbours: int = 3  # peers pulled per round; a fleet or a simulation of fewer clients pulls all the others
    epochs: int = 5
    batch_size: int = 128
    # Slices of a batch through the model at once; 0: the whole batch. 16 keeps a cnn daemon of batch 128 under
    # 400 MB (docs/RESULTS.md) for about 9 % more time per step; one value everywhere, so that a lock-step fleet
    # and ``edge-node simulate`` take the same float steps with no extra flag.
    micro_batch: int = 16
    lr: float = 0.1  # initial learning rate
    lr_decay: float = 0.998  # per round
    weight_decay: float = 5e-4
    clip_norm: float = 10.0  # max global L2 norm of a step's gradient
    planned_rounds: int = 500  # T of the cosine prune schedule of a run without a last round (a daemon)
    prune_alpha: float = 0.5  # initial prune fraction
    regrow: str = "random"  # "gradient" (the paper, RigL) or "random" (the reference code's scripts)
    mask_init: str = "erk"
    norm_stats: str = "local"  # a BatchNorm model's running statistics: kept by each client (FedBN)
    aggregate: str = "mean"  # the per-coordinate aggregate over the holders: DisPFL's mean (robust_aggregation)
    # The device.
    capacity: str = "auto"  # a daemon's density: measured (a tier); a simulation has no device, see SimConfig.density
    # Torch intra-op threads; None: torch's default, the cores the process may use. N daemons on one machine
    # (a loopback fleet) share them: ``threads_of``.
    threads: int | None = None
    device: str = "cpu"
    # The network (start, loopback).
    pull_timeout_s: float = 60.0
    round_budget_s: float = 600.0


DEFAULTS = SharedDefaults()

DEMO_DATASET = "demo"
DEMO_PRESET = "demo quick-start preset"
# What the preset sets, per command, where the flag is not given (today's first-run values; the pinned demo
# records and the README's first commands were made with them). Both: 1 epoch of batch 32, enough SGD steps on a
# quarter of the demo set (~47 a round) for a first run to learn in a few rounds.
_BOTH: dict[str, Any] = {"epochs": 1, "batch_size": 32}
PRESETS: Mapping[str, Mapping[str, Any]] = MappingProxyType(
    {
        # 4 clients pulling 2 neighbours each: 19 s for 5 rounds on 2 idle cores.
        "simulate": MappingProxyType({**_BOTH, "neighbours": 2}),
        # Every node at density 0.6 (no capacity probe, the same models on every machine), one torch thread each.
        "loopback": MappingProxyType({**_BOTH, "capacity": "0.6", "threads": 1}),
    }
)


def preset(command: str, dataset: str) -> Mapping[str, Any]:
    """The values the demo preset gives ``command``'s unset settings on ``dataset`` (none off the demo set)."""
    return PRESETS.get(command, {}) if dataset == DEMO_DATASET else {}


def preset_note(command: str, dataset: str, given: Collection[str]) -> str:
    """A TOML comment naming the demo preset and the values it set (``given`` names the settings the user
    set), for ``--print-config``; empty when it set none."""
    applied = {k: v for k, v in preset(command, dataset).items() if k not in given}
    if not applied:
        return ""
    values = ", ".join(f"{k} = {json.dumps(v)}" for k, v in applied.items())
    return f'# {DEMO_PRESET} (dataset "{DEMO_DATASET}", README "Demo settings"): {values}'


def neighbours_of(others: int, neighbours: int = DEFAULTS.neighbours) -> int:
    """The default ``neighbours`` (the table's, or a preset's) of a client with ``others`` peers to pick from:
    at most all of them."""
    return max(1, min(neighbours, others))


def threads_of(processes: int) -> int | None:
    """The table's ``threads`` for each of ``processes`` torch processes on this machine: torch's default for
    one; for more, the cores this process may use shared among them (at least 1)."""
    if DEFAULTS.threads is not None or processes <= 1:
        return DEFAULTS.threads
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // processes)


__all__ = [
    "DEFAULTS",
    "DEMO_DATASET",
    "DEMO_PRESET",
    "PRESETS",
    "SharedDefaults",
    "neighbours_of",
    "preset",
    "preset_note",
    "threads_of",
]
