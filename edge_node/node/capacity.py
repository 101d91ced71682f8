"""``--capacity auto``: measure this device and pick its DisPFL setting (ii) tier (density 0.2 .. 1.0).

What is measured, once at start (logged, and shown by ``edge-node capacity``):

* sustained training throughput of the configured model: real masked-SGD steps on the node's own
  training batches, after one warm-up step, for at most ``probe_s`` seconds;
* the resident-memory growth of those steps (activations, gradients), and the memory available now;
* CPU count, the accelerator in use, and the link speed of the node's interfaces where the OS reports
  one (``/sys/class/net/<if>/speed``; Wi-Fi, loopback and many virtual links report none).

The rule: the largest tier density ``d`` for which all of these hold, checked from 1.0 down:

1. ``round_s(d) = train_s + transfer_s(d) <= round_budget_s``, where ``train_s`` is ``epochs x
   samples / throughput`` and ``transfer_s(d)`` the time to pull ``neighbours`` models of density ``d``
   (their exact encoded size) at the link speed (skipped, and said so, when no speed is reported);
2. the memory a round needs (own weights, gradients and aggregate, ``neighbours`` decoded peer models,
   the measured activations) fits the available memory with ``MEMORY_HEADROOM`` to spare.

Honesty about the model: PyTorch's kernels here are dense, so a lower density cuts the bytes on the
wire and the stored model, not the training time or the memory of a round; ``train_s`` and the memory
need are the same for every tier, and only the transfer term makes the tiers differ. The FLOPs saving
of the paper only becomes seconds with sparse kernels, which are not used. When even 0.2 does not
fit, the node takes 0.2 and says which constraint it breaks.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil
import torch
from torch import nn

from edge_node.algorithm import (
    TIER_DENSITIES,
    SGDConfig,
    active_counts,
    erk_densities,
    read_weights,
    tier_name,
    train_masked,
)
from edge_node.data.batches import ClientData
from edge_node.wire import ModelSpec, ValueType, encoded_model_size

_LOGGER = logging.getLogger(__name__)

DEFAULT_PROBE_S = 10.0  # measured training time (after one warm-up step); the whole probe stays < 30 s
MAX_PROBE_STEPS = 50
MEMORY_HEADROOM = 0.25  # leave a quarter of the available memory free
SYS_NET = Path("/sys/class/net")


@dataclass(frozen=True)
class Measurements:
    """What the probe measured on this device."""

    train_samples_per_s: float
    probe_steps: int
    probe_s: float
    activation_bytes: int  # resident-memory growth during the probe (>= 0)
    available_memory_bytes: int
    cpu_count: int
    accelerator: str  # "none", or the CUDA device's name
    link_mbit_s: float | None  # slowest reported link speed of the interfaces, None when none reports
    link_detail: str


@dataclass(frozen=True)
class TierCheck:
    """One tier against the constraints."""

    density: float
    train_s: float
    transfer_s: float | None
    round_s: float
    memory_bytes: int
    fits: bool
    failed: str  # the first constraint it breaks, "" when it fits


@dataclass(frozen=True)
class CapacityDecision:
    density: float
    tier: str
    source: str  # "measured" (auto) or "configured"
    decided_by: str  # one line: why this tier and not the one above
    measurements: Measurements | None
    checks: tuple[TierCheck, ...]

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["checks"] = [asdict(c) for c in self.checks]
        return out


def link_speed(interfaces: Sequence[str], sys_net: Path = SYS_NET) -> tuple[float | None, str]:
    """The slowest speed (Mbit/s) the OS reports for ``interfaces`` (names; all non-loopback if empty)."""
    names = list(interfaces)
    if not names:
        try:
            names = sorted(p.name for p in sys_net.iterdir() if p.name != "lo")
        except OSError:
            names = []
    speeds = {}
    for name in names:
        try:
            value = int((sys_net / name / "speed").read_text().strip())
        except (OSError, ValueError):
            continue
        if value > 0:  # -1: unknown (Wi-Fi, down links)
            speeds[name] = value
    if not speeds:
        return None, f"not reported by the OS for {', '.join(names) or 'any interface'}"
    slowest = min(speeds, key=speeds.__getitem__)
    return float(speeds[slowest]), f"{slowest}: {speeds[slowest]} Mbit/s ({sys_net}/{slowest}/speed)"


def _rss() -> int:
    return int(psutil.Process().memory_info().rss)


def probe(
    model: nn.Module,
    data: ClientData,
    batch_size: int,
    *,
    interfaces: Sequence[str] = (),
    probe_s: float = DEFAULT_PROBE_S,
    generator: torch.Generator | None = None,
) -> Measurements:
    """Measure training throughput (real steps of ``model`` on ``data``), memory, CPUs, accelerator, link.

    ``model`` is trained in place (pass a scratch copy); at most one warm-up step plus ``probe_s``
    seconds or ``MAX_PROBE_STEPS`` steps.
    """
    generator = generator or torch.Generator().manual_seed(0)
    masks = {name: torch.ones_like(w, dtype=torch.bool) for name, w in read_weights(model).items()}
    sgd = SGDConfig(lr=1e-3)
    device = next(model.parameters()).device

    def batches(epochs: int) -> Any:
        return data.train_batches(epochs, generator, batch_size)

    rss_before = _rss()
    stream = iter(batches(10**6))
    train_masked(model, masks, [next(stream)], sgd)  # warm-up: allocator, kernels
    steps = samples = 0
    started = time.perf_counter()
    while steps < MAX_PROBE_STEPS and time.perf_counter() - started < probe_s:
        x, y = next(stream)
        train_masked(model, masks, [(x, y)], sgd)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        steps += 1
        samples += int(y.shape[0])
    elapsed = time.perf_counter() - started
    activation = max(0, _rss() - rss_before)
    speed, detail = link_speed(interfaces)
    accelerator = torch.cuda.get_device_name(device) if device.type == "cuda" else "none"
    affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)
    return Measurements(
        train_samples_per_s=samples / elapsed if elapsed > 0 else float("inf"),
        probe_steps=steps,
        probe_s=round(elapsed, 3),
        activation_bytes=activation,
        available_memory_bytes=int(psutil.virtual_memory().available),
        cpu_count=len(affinity),
        accelerator=accelerator,
        link_mbit_s=speed,
        link_detail=detail,
    )


def model_bytes_at(spec: ModelSpec, density: float, value_type: ValueType = ValueType.FLOAT32) -> int:
    """Encoded bytes of a model of ``spec`` at ERK ``density`` (what a peer pulls)."""
    counts = active_counts(spec.shapes, erk_densities(spec.shapes, density))
    return encoded_model_size(spec, counts, value_type, density=density)


def choose_tier(
    measured: Measurements,
    spec: ModelSpec,
    *,
    epochs: int,
    samples: int,
    neighbours: int,
    round_budget_s: float,
    value_type: ValueType = ValueType.FLOAT32,
) -> CapacityDecision:
    """Apply the module's rule to ``measured``; the decision says which constraint decided."""
    params = spec.total_numel
    # Own weights, gradient and aggregate (4 B each), own masks (2 x 1 B), neighbours' decoded models (4 B + 1 B).
    memory = params * (3 * 4 + 2) + neighbours * params * 5 + measured.activation_bytes
    budget_memory = measured.available_memory_bytes * (1 - MEMORY_HEADROOM)
    train_s = epochs * samples / measured.train_samples_per_s
    checks = []
    for density in sorted(TIER_DENSITIES, reverse=True):
        transfer_s = None
        if measured.link_mbit_s is not None:
            transfer_s = neighbours * model_bytes_at(spec, density, value_type) * 8 / (measured.link_mbit_s * 1e6)
        round_s = train_s + (transfer_s or 0.0)
        failed = ""
        if round_s > round_budget_s:
            terms = f"train {train_s:.1f} s" + (f" + transfer {transfer_s:.1f} s" if transfer_s is not None else "")
            failed = f"round {round_s:.1f} s ({terms}) > budget {round_budget_s:g} s"
        elif memory > budget_memory:
            failed = (
                f"memory {memory / 2**20:.0f} MiB > {budget_memory / 2**20:.0f} MiB "
                f"({100 * (1 - MEMORY_HEADROOM):.0f}% of {measured.available_memory_bytes / 2**20:.0f} MiB available)"
            )
        checks.append(TierCheck(density, train_s, transfer_s, round_s, memory, not failed, failed))
    chosen = next((c for c in checks if c.fits), None)
    if chosen is None:
        chosen = checks[-1]
        decided = f"no tier fits; taking the smallest, {chosen.density:g}, which breaks: {chosen.failed}"
    elif chosen is checks[0]:
        link = "" if measured.link_mbit_s is not None else " (link speed not reported: transfer not counted)"
        decided = f"every constraint fits at density 1.0{link}"
    else:
        above = checks[checks.index(chosen) - 1]
        decided = f"density {above.density:g} breaks: {above.failed}"
    return CapacityDecision(chosen.density, tier_name(chosen.density), "measured", decided, measured, tuple(checks))


def configured(density: float) -> CapacityDecision:
    """The decision for an explicit ``--capacity`` (nothing measured)."""
    return CapacityDecision(density, tier_name(density), "configured", f"--capacity {density:g}", None, ())
