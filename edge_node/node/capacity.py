"""``--capacity auto``: measure this device and pick its DisPFL setting (ii) tier (density 0.2 .. 1.0).

What is measured at start (logged, and shown by ``edge-node capacity``); while the node runs,
:mod:`edge_node.node.capacity_watch` measures again from the node's own rounds when the CPU it can get
changes for a sustained period, and moves it to the tier that fits (:func:`from_round`):

* sustained training throughput of the configured model: real masked-SGD steps on the node's own
  training batches, after two warm-up steps of ``WARMUP_SAMPLES`` samples, in a window of
  ``probe_s`` seconds (a step is started only when the last one's duration still fits in the window,
  and a batch whose step would not fit at all is cut down, which the measurements say), so the whole
  probe takes the warm-up plus about ``probe_s``, also for ``resnet18`` on one core;
* the resident-memory growth of those steps (activations, gradients), and the memory available now;
* CPU count, the accelerator in use, and the link speed of the node's interfaces where the OS reports
  one (``/sys/class/net/<if>/speed``; Wi-Fi, loopback and many virtual links report none), or the rate
  of a ``tbf``/``netem`` qdisc shaping the interface when that is slower (``tc -j qdisc show``).

Under cgroup limits (a container, ``edge-node loopback --devices``) the CPU count is what the CPU quota
allows and the available memory what the memory limit leaves (:mod:`edge_node.node.limits`); the
throughput probe is throttled by the quota by itself, since it times real steps.

The rule: the largest tier density ``d`` for which all of these hold, checked from 1.0 down:

1. ``round_s(d) = train_s + transfer_s(d) <= round_budget_s``, where ``train_s`` is ``epochs x
   samples / throughput`` and ``transfer_s(d)`` the time to pull ``neighbours`` models of density ``d``
   (their exact encoded size) at the link speed (skipped, and said so, when no speed is reported);
2. the memory a round needs (own weights, gradients and aggregate, ``neighbours`` decoded peer models,
   the measured activations) fits the available memory with ``MEMORY_HEADROOM`` to spare. This need
   is the same at every tier, so a node short of memory is refused at start (``ConfigError``, exit 2)
   rather than put at the smallest tier to be killed by the OOM killer in its first round.

Honesty about the model: PyTorch's kernels here are dense, so under ``tier_mode mask`` a lower density cuts
the bytes on the wire and the stored model, not the training time or the memory of a round; ``train_s`` and
the memory need are the same for every tier, and only the transfer term makes the tiers differ. The FLOPs
saving of the paper only becomes seconds with sparse kernels, which are not used. When even 0.2 does not
fit, the node takes 0.2 and says which constraint it breaks.

Width tiers (``tier_mode`` width or both) do buy seconds: a tier trains a narrow model (the first channels of
every hidden layer, edge_node.models.tier_widths) on smaller dense kernels. The probe then also times each
tier's own steps (:func:`probe_tiers`: after the full model's window, every tier's model takes steps in turn
in a second window as long, so all see the same load; the probe takes about twice as long), ``train_s`` is
each tier's own, and ``transfer_s`` pulls the tier's
narrow model (with the ``--density`` mask inside under both). While running, a round's throughput is its
tier's, and the other tiers' are scaled from it by the start-up probe's step ratios, or, for a node resumed
without a probe, by their dense FLOP shares, which the decision calls an estimate. The memory need stays the
full model's (conservative): the node keeps full-shape weights, masks and peers' models at every width, and
the activations are the full model's, measured.

``edge-node capacity`` and ``edge-node start --capacity auto`` measure through the same function,
:func:`measure`, with the node's settings (threads, device, fleet seed, data slice). A node resuming
from a checkpoint does not probe at start: its mask holds its tier (:func:`kept_from_checkpoint`).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

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
    weight_positions,
)
from edge_node.algorithm.dp import DPConfig
from edge_node.algorithm.norm_stats import batch_normalised
from edge_node.algorithm.tasks import CLASSIFICATION, Task, resolve_task
from edge_node.data.batches import ClientData
from edge_node.errors import ConfigError
from edge_node.models import TierWidth, build_model, tier_widths
from edge_node.node.limits import Limits, ceil_cpus, own_limits
from edge_node.torch_threads import ThreadGovernor, apply_threads
from edge_node.wire import ModelSpec, ValueType, encoded_model_size

if TYPE_CHECKING:
    from edge_node.node.config import NodeConfig
    from edge_node.node.local_data import LocalData

_LOGGER = logging.getLogger(__name__)

DEFAULT_PROBE_S = 10.0  # the measuring window (after the warm-up); the whole probe stays well under 30 s
MAX_PROBE_STEPS = 50
WARMUP_SAMPLES = 8  # samples of each of the two warm-up steps
MEMORY_HEADROOM = 0.25  # leave a quarter of the available memory free
SYS_NET = Path("/sys/class/net")
TC_TIMEOUT_S = 5.0  # one `tc qdisc show`


@dataclass(frozen=True)
class TierSpeed:
    """One width tier's training speed (``tier_mode`` width or both): its own narrow model's, which runs on smaller
    dense kernels than the full model's."""

    tier: str  # "0.2" .. "1.0"
    width: float  # the narrow model's channel fraction (edge_node.models.tier_widths)
    flop_share: float  # its dense FLOPs over the full model's
    train_samples_per_s: float
    step_ratio: float  # its seconds per sample over the full model's (tier 1.0: 1.0)
    # "probe" (its own timed steps at start), "round" (the round just run, at this tier), "round x probe ratio" (that
    # round scaled by the start-up probe's step ratios) or "round x FLOP share (estimate)" (no probe to scale by)
    source: str
    probe_steps: int = 0  # the probe's steps of this tier (0: not probed)
    probe_batch_size: int = 0
    probe_s: float = 0.0  # this tier's measured window
    warmup_s: float = 0.0  # this tier's two warm-up steps


@dataclass(frozen=True)
class Measurements:
    """What the probe measured on this device."""

    train_samples_per_s: float
    probe_steps: int
    probe_s: float  # the measured window (the steps counted in the throughput)
    probe_batch_size: int  # samples per measured step: the configured batch, unless one step would not fit
    warmup_s: float  # the two warm-up steps before the window
    probe_total_s: float  # the whole probe: warm-up, window and the other measurements
    activation_bytes: int  # resident-memory growth during the probe (>= 0)
    available_memory_bytes: int
    cpu_count: int
    torch_threads: int  # intra-op threads the steps ran with (--threads, else torch's default)
    accelerator: str  # "none", or the CUDA device's name
    link_mbit_s: float | None  # slowest reported link speed of the interfaces, None when none reports
    link_detail: str
    cpu_limit: float | None = None  # CPUs the cgroup's quota allows (None: no quota)
    memory_limit_bytes: int | None = None  # the cgroup's memory limit (None: none)
    limits_detail: str = ""  # which cgroup files said so
    # Width tiers: every tier's own speed (train_samples_per_s above is then tier 1.0's, the full model's); empty
    # under tier_mode mask, where every tier trains the full model on dense kernels.
    tiers: tuple[TierSpeed, ...] = ()


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
    # "measured" (auto, at start), "remeasured" (auto, after the free CPU changed), "configured" (--capacity D) or
    # "checkpoint" (resumed: the mask's tier)
    source: str
    decided_by: str  # one line: why this tier and not the one above
    measurements: Measurements | None
    checks: tuple[TierCheck, ...]

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["checks"] = [asdict(c) for c in self.checks]
        if self.measurements is not None and not self.measurements.tiers:
            del out["measurements"]["tiers"]  # tier_mode mask: the measurements as they always were
        return out


def shaped_rate_mbit(interface: str) -> float | None:
    """The rate (Mbit/s) of a ``tbf`` or ``netem`` root qdisc on ``interface``, None when none shapes it.

    Asks ``tc -j qdisc show`` (iproute2, bounded by ``TC_TIMEOUT_S``); no ``tc``, no answer: None.
    """
    if shutil.which("tc") is None:
        return None
    try:
        result = subprocess.run(["tc", "-j", "qdisc", "show", "dev", interface], capture_output=True, text=True,
                                timeout=TC_TIMEOUT_S, check=False)  # fmt: skip
        qdiscs = json.loads(result.stdout) if result.returncode == 0 else []
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return None
    rates = []
    for q in qdiscs if isinstance(qdiscs, list) else []:
        options = q.get("options") if isinstance(q, dict) else None
        rate = options.get("rate") if isinstance(options, dict) else None
        if q.get("root") and q.get("kind") in ("tbf", "netem") and isinstance(rate, int) and rate > 0:
            rates.append(rate * 8 / 1e6)  # tc's JSON gives bytes per second
    return min(rates) if rates else None


def interface_names(items: Sequence[str]) -> list[str]:
    """Interface names for ``items`` (names, or addresses as ``--interface`` takes them)."""
    nics = psutil.net_if_addrs()
    names = []
    for item in items:
        owner = next((n for n, addrs in nics.items() if any(a.address.split("%", 1)[0] == item for a in addrs)), None)
        names.append(item if item in nics or owner is None else owner)
    return names


def link_speed(
    interfaces: Sequence[str], sys_net: Path = SYS_NET, shaped: Callable[[str], float | None] = shaped_rate_mbit
) -> tuple[float | None, str]:
    """The slowest speed (Mbit/s) of ``interfaces`` (names or addresses; all non-loopback if empty): what the
    OS reports, or a shaping qdisc's rate (``shaped``) where that is slower."""
    names = interface_names(interfaces)
    if not names:
        try:
            names = sorted(p.name for p in sys_net.iterdir() if p.name != "lo")
        except OSError:
            names = []
    speeds: dict[str, tuple[float, str]] = {}
    for name in names:
        try:
            value = int((sys_net / name / "speed").read_text().strip())
        except (OSError, ValueError):
            value = -1
        if value > 0:  # -1: unknown (Wi-Fi, down links); veths refuse to answer
            speeds[name] = (float(value), f"{name}: {value} Mbit/s ({sys_net}/{name}/speed)")
        rate = shaped(name)
        if rate is not None and (name not in speeds or rate < speeds[name][0]):
            speeds[name] = (rate, f"{name}: {rate:g} Mbit/s (the qdisc shaping it)")
    if not speeds:
        return None, f"not reported by the OS for {', '.join(names) or 'any interface'}"
    slowest = min(speeds, key=lambda n: speeds[n][0])
    return speeds[slowest]


def _rss() -> int:
    return int(psutil.Process().memory_info().rss)


def dense_masks(model: nn.Module) -> dict[str, torch.Tensor]:
    """All-ones masks of ``model``'s weights: a step on dense kernels costs the same at any mask density."""
    return {name: torch.ones_like(w, dtype=torch.bool) for name, w in read_weights(model).items()}


@dataclass(frozen=True)
class _Timing:
    """One model's timed steps (:func:`_time_steps`)."""

    samples_per_s: float
    steps: int
    window_s: float
    batch_size: int
    warmup_s: float
    best_step_s: float = 0.0  # the fastest step's seconds (interleaved turns only)


def _step_timer(
    model: nn.Module, masks: dict[str, torch.Tensor], sgd: SGDConfig
) -> Callable[[torch.Tensor, torch.Tensor], float]:
    """One real training step of ``model`` (in place, on ``masks``) on a batch, timed in seconds."""
    device = next(model.parameters()).device
    noise = torch.Generator(device=device).manual_seed(0) if sgd.dp is not None else None  # timed, never published

    def step(x: torch.Tensor, y: torch.Tensor) -> float:
        began = time.perf_counter()
        train_masked(model, masks, [(x, y)], sgd, noise)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - began

    return step


def _warm_up(
    step: Callable[[torch.Tensor, torch.Tensor], float], x: torch.Tensor, y: torch.Tensor, check: Callable[[], None]
) -> float:
    """Two steps of ``WARMUP_SAMPLES`` samples (the first: allocator, kernels, lazy initialisation); the second's
    seconds."""
    warm = min(WARMUP_SAMPLES, int(y.shape[0]))
    check()
    step(x[:warm], y[:warm])
    check()
    return step(x[:warm], y[:warm])


def _time_steps(
    model: nn.Module,
    data: ClientData,
    batch_size: int,
    probe_s: float,
    sgd: SGDConfig,
    generator: torch.Generator,
    check: Callable[[], None],
    masks: dict[str, torch.Tensor],
) -> _Timing:
    """Two warm-up steps of ``WARMUP_SAMPLES`` samples, then a window of about ``probe_s`` seconds of steps
    (:func:`probe` says how); ``model`` is trained in place on ``masks``."""
    started_total = time.perf_counter()
    step = _step_timer(model, masks, sgd)
    stream = iter(data.train_batches(10**6, generator, batch_size))
    x, y = next(stream)
    least = 2 if batch_normalised(model) else 1  # BatchNorm cannot normalise one sample (training never does)
    warm_step_s = _warm_up(step, x, y, check)
    warmup_s = time.perf_counter() - started_total
    # One step of the configured batch, from the second warm-up step (small batches cost more per sample:
    # an over-estimate). A batch whose step would not fit in the window is cut to fit in half of it.
    full = min(batch_size, int(y.shape[0]))
    estimate = warm_step_s * full / min(WARMUP_SAMPLES, int(y.shape[0]))
    step_samples = full if estimate <= probe_s else max(least, min(full, int(full * probe_s / (2 * estimate))))
    last = estimate * step_samples / full
    steps = samples = 0
    started = time.perf_counter()
    while steps < MAX_PROBE_STEPS:
        if steps and time.perf_counter() - started + last > probe_s:
            break
        check()
        if steps:
            x, y = next(stream)
        last = step(x[:step_samples], y[:step_samples])
        steps += 1
        samples += int(y[:step_samples].shape[0])
    elapsed = time.perf_counter() - started
    return _Timing(samples / elapsed if elapsed > 0 else float("inf"), steps, round(elapsed, 3), step_samples,
                   round(warmup_s, 3))  # fmt: skip


def _time_interleaved(
    models: Sequence[nn.Module],
    data: ClientData,
    batch_size: int,
    step_samples: int,
    window_s: float,
    sgd: SGDConfig,
    seed: int,
    check: Callable[[], None],
) -> list[_Timing]:
    """Each model's speed in one shared window: a warm-up each, then one step of ``step_samples`` of each model in
    turn (the same batches for all), while the next step's last duration still fits in ``window_s`` (counted from
    the first warm-up); every model steps at least once, at most ``MAX_PROBE_STEPS`` times. Taking turns puts every
    model under the same load, so their ratios hold on a machine whose other programs come and go (sequential
    windows would each see another load). A model's time counts its batches' loading and its steps; its
    ``window_s`` is that time. The warm-up is one step of ``step_samples`` (lazy initialisation, and the kernels
    for that batch shape: a first step of a new shape costs several of the next ones, which a turn of few steps
    would count)."""
    steps, streams, firsts, warmups = [], [], [], []
    started = time.perf_counter()  # the window holds the warm-ups too: the probe's length stays the window's
    for model in models:
        began = time.perf_counter()
        step = _step_timer(model, dense_masks(model), sgd)
        stream = iter(data.train_batches(10**6, torch.Generator().manual_seed(seed), batch_size))
        x, y = next(stream)
        check()
        step(x[:step_samples], y[:step_samples])
        steps.append(step)
        streams.append(stream)
        firsts.append((x, y))
        warmups.append(time.perf_counter() - began)
    count = [0] * len(models)
    spent = [0.0] * len(models)
    samples = [0] * len(models)
    last = [0.0] * len(models)
    best = [float("inf")] * len(models)
    while True:
        for i, step in enumerate(steps):
            if count[i] and (count[i] >= MAX_PROBE_STEPS or time.perf_counter() - started + last[i] > window_s):
                return [_Timing(samples[j] / spent[j] if spent[j] > 0 else float("inf"), count[j],
                                round(spent[j], 3), step_samples, round(warmups[j], 3), best[j])
                        for j in range(len(models))]  # fmt: skip
            check()
            began = time.perf_counter()
            x, y = next(streams[i]) if count[i] else firsts[i]
            step(x[:step_samples], y[:step_samples])
            last[i] = time.perf_counter() - began
            best[i] = min(best[i], last[i])
            spent[i] += last[i]
            samples[i] += int(y[:step_samples].shape[0])
            count[i] += 1


def probe(
    model: nn.Module,
    data: ClientData,
    batch_size: int,
    *,
    interfaces: Sequence[str] = (),
    probe_s: float = DEFAULT_PROBE_S,
    micro_batch: int = 0,
    dp: DPConfig | None = None,
    generator: torch.Generator | None = None,
    check_stop: Callable[[], None] | None = None,
    task: Task = CLASSIFICATION,
) -> Measurements:
    """Measure training throughput (real steps of ``model`` on ``data``), memory, CPUs, accelerator, link.

    ``model`` is trained in place (pass a scratch copy). Time: two warm-up steps of ``WARMUP_SAMPLES``
    samples, then steps of ``batch_size`` samples (fewer when the warm-up says one such step would
    not fit in ``probe_s``), each started only while the previous one's duration still fits in the
    ``probe_s`` window; at least one, at most ``MAX_PROBE_STEPS``. ``check_stop`` is called before
    every step (the daemon raises from it when it is told to stop). With ``dp`` the steps are DP-SGD's
    (per-sample gradients cost several times a plain step: a private node timed on plain steps would
    take a tier it cannot train in its round budget).
    """
    started_total = time.perf_counter()
    sgd = SGDConfig(lr=1e-3, micro_batch=micro_batch, dp=dp, task=task)  # steps as the node's training takes them
    device = next(model.parameters()).device
    masks = dense_masks(model)
    rss_before = _rss()
    timing = _time_steps(model, data, batch_size, probe_s, sgd, generator or torch.Generator().manual_seed(0),
                         check_stop or (lambda: None), masks)  # fmt: skip
    activation = max(0, _rss() - rss_before)
    return Measurements(
        train_samples_per_s=timing.samples_per_s,
        probe_steps=timing.steps,
        probe_s=timing.window_s,
        probe_batch_size=timing.batch_size,
        warmup_s=timing.warmup_s,
        probe_total_s=round(time.perf_counter() - started_total, 3),
        activation_bytes=activation,
        **_device_readings(interfaces, device),
    )


def _device_readings(interfaces: Sequence[str], device: torch.device) -> dict[str, Any]:
    """The measurements that cost no training: memory, CPUs and cgroup limits, accelerator, link speed."""
    speed, detail = link_speed(interfaces)
    affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)
    available, limits = available_memory()
    return {
        "available_memory_bytes": available,
        "cpu_count": len(affinity) if limits.cpus is None else min(len(affinity), ceil_cpus(limits.cpus)),
        "torch_threads": torch.get_num_threads(),
        "accelerator": torch.cuda.get_device_name(device) if device.type == "cuda" else "none",
        "link_mbit_s": speed,
        "link_detail": detail,
        "cpu_limit": limits.cpus,
        "memory_limit_bytes": limits.memory_limit_bytes,
        "limits_detail": f"{limits.cpu_detail}; {limits.memory_detail}",
    }


def from_round(
    train_samples_per_s: float,
    interfaces: Sequence[str],
    device: torch.device,
    previous: Measurements | None,
    *,
    tier: str | None = None,
    widths: Mapping[str, TierWidth] | None = None,
) -> Measurements:
    """The device measured again while the node runs: the training throughput of a whole round just run (its
    samples over its training seconds: what the round budget holds), and memory, CPUs, limits and link read
    now. The probe's fields are 0 (no probe ran); the activations are the start-up probe's (0 when the node
    resumed without one: memory is the same at every tier, and was checked at the first start).

    Width tiers (``tier``: the node's tier in the round, ``widths``: edge_node.models.tier_widths): the round ran
    that tier's narrow model, so every other tier's speed is the round's scaled by the step ratios the start-up
    probe timed (``previous.tiers``), or, with no probe (a node resumed from a checkpoint), by the tiers' dense FLOP
    shares: an estimate, and said so (:func:`choose_tier`'s decision).
    """
    speeds: tuple[TierSpeed, ...] = ()
    if tier is not None:
        if widths is None or tier not in widths:
            raise ValueError(f"from_round: width tier {tier!r} needs the tiers' widths (edge_node.models.tier_widths)")
        # The start-up probe's ratios, carried by every re-decision since; an estimate stays an estimate.
        carried = previous.tiers if previous is not None else ()
        estimated = any(t.source.endswith("(estimate)") for t in carried)
        probed = {} if estimated else {t.tier: t.step_ratio for t in carried}
        measured = set(probed) >= set(widths)
        ratios = probed if measured else {name: w.flop_share for name, w in widths.items()}
        full_rate = train_samples_per_s * ratios[tier]  # the round's seconds per sample = ratio x the full model's
        scaled = "round x probe ratio" if measured else "round x FLOP share (estimate)"
        speeds = tuple(
            TierSpeed(name, w.width, w.flop_share, full_rate / ratios[name], ratios[name],
                      "round" if name == tier else scaled)
            for name, w in sorted(widths.items(), key=lambda item: item[1].density)
        )  # fmt: skip
        train_samples_per_s = full_rate
    return Measurements(
        train_samples_per_s=train_samples_per_s, probe_steps=0, probe_s=0.0, probe_batch_size=0, warmup_s=0.0,
        probe_total_s=0.0, activation_bytes=previous.activation_bytes if previous is not None else 0,
        **_device_readings(interfaces, device), tiers=speeds,
    )  # fmt: skip


def model_bytes_at(spec: ModelSpec, density: float, value_type: ValueType = ValueType.FLOAT32) -> int:
    """Encoded bytes of a model of ``spec`` at ERK ``density`` (what a peer pulls)."""
    counts = active_counts(spec.shapes, erk_densities(spec.shapes, density))
    return encoded_model_size(spec, counts, value_type, density=density)


def round_memory_bytes(spec: ModelSpec, neighbours: int, activation_bytes: int) -> int:
    """What a round holds besides the runtime: own weights, gradient and aggregate (4 B each), own masks
    (2 x 1 B), the neighbours' decoded models (4 B + 1 B each), and the activations."""
    params = spec.total_numel
    return params * (3 * 4 + 2) + neighbours * params * 5 + activation_bytes


def available_memory() -> tuple[int, Limits]:
    """Memory available to this process: the machine's, or less where a cgroup limit leaves less."""
    limits = own_limits()
    available = int(psutil.virtual_memory().available)
    if limits.memory_available_bytes is not None:
        available = min(available, limits.memory_available_bytes)
    return available, limits


def choose_tier(
    measured: Measurements,
    spec: ModelSpec,
    *,
    epochs: int,
    samples: int,
    neighbours: int,
    round_budget_s: float,
    value_type: ValueType = ValueType.FLOAT32,
    source: str = "measured",
    widths: Mapping[str, TierWidth] | None = None,
    mask_density: float = 1.0,
) -> CapacityDecision:
    """Apply the module's rule to ``measured``; the decision says which constraint decided (``source``: "measured"
    at start, "remeasured" while running).

    Width tiers (``widths``: edge_node.models.tier_widths of the full ``spec``; ``measured.tiers`` then holds every
    tier's speed): each tier's ``train_s`` is its own narrow model's, and its transfer the narrow model's bytes with
    a mask of ``mask_density`` inside (1.0 under tier_mode width, ``--density`` under both).
    """
    memory = round_memory_bytes(spec, neighbours, measured.activation_bytes)
    budget_memory = measured.available_memory_bytes * (1 - MEMORY_HEADROOM)
    speeds = {t.tier: t for t in measured.tiers}
    if widths is not None and set(speeds) < set(widths):
        raise ValueError(f"choose_tier: width tiers need every tier's speed; measured has {sorted(speeds)}")
    checks = []
    for density in sorted(TIER_DENSITIES, reverse=True):
        name = tier_name(density)
        if widths is None:  # tier_mode mask: one dense-kernel step for every tier, a mask of the tier's density
            train_s = epochs * samples / measured.train_samples_per_s
            wire_spec, wire_density = spec, density
        else:  # the spec's header is not 1.5's tier header: a few bytes off, nothing for a capacity figure
            train_s = epochs * samples / speeds[name].train_samples_per_s
            wire_spec = ModelSpec(spec.arch_name, spec.num_classes, widths[name].shapes, variant=spec.variant)
            wire_density = mask_density
        transfer_s = None
        if measured.link_mbit_s is not None:
            wire_bytes = model_bytes_at(wire_spec, wire_density, value_type)
            transfer_s = neighbours * wire_bytes * 8 / (measured.link_mbit_s * 1e6)
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
    if widths is not None and any(t.source.endswith("(estimate)") for t in measured.tiers):
        decided += (
            "; the other tiers' train times are estimates from their dense FLOP shares, not measurements "
            "(no start-up probe to scale by)"
        )
    return CapacityDecision(chosen.density, tier_name(chosen.density), source, decided, measured, tuple(checks))


def check_memory(decision: CapacityDecision, model: str) -> None:
    """ConfigError (one line) when the memory a round needs does not fit this device at any tier.

    The need is the same at every tier (dense kernels), so no tier can help: starting would only get
    the node killed by the OOM killer in its first round.
    """
    measured = decision.measurements
    if measured is not None and decision.checks:
        refuse_short_memory(model, decision.checks[-1].memory_bytes, measured.available_memory_bytes,
                            measured.memory_limit_bytes)  # fmt: skip


def refuse_short_memory(model: str, need: int, available: int, limit: int | None) -> None:
    """ConfigError when ``need`` bytes do not fit ``available`` with ``MEMORY_HEADROOM`` to spare."""
    if need <= available * (1 - MEMORY_HEADROOM):
        return
    under = "" if limit is None else f" under its memory limit of {limit / 2**20:.0f} MiB"
    raise ConfigError(
        f"too little memory for {model}: a round needs about {need / 2**20:.0f} MiB, but this device has "
        f"{available / 2**20:.0f} MiB available{under} (at most {100 * (1 - MEMORY_HEADROOM):.0f}% of it is "
        "used); give it more memory, or a smaller model or fewer --neighbours"
    )


def configured(density: float) -> CapacityDecision:
    """The decision for an explicit ``--capacity`` (nothing measured)."""
    return CapacityDecision(density, tier_name(density), "configured", f"--capacity {density:g}", None, ())


def kept_from_checkpoint(density: float, configured_density: float | None) -> CapacityDecision:
    """The decision of a node resuming from a checkpoint: its mask fixes the tier, nothing is measured."""
    why = (
        f"kept from the checkpoint (= --capacity {configured_density:g})" if configured_density is not None else
        "kept from the checkpoint: not probed at start (capacity auto measures again from the node's rounds when its"
        " free CPU changes; edge-node capacity shows what this device would pick now)"
    )  # fmt: skip
    return CapacityDecision(density, tier_name(density), "checkpoint", why, None, ())


def runtime_device(config: NodeConfig) -> tuple[torch.device, ThreadGovernor | None]:
    """Apply the node's torch settings (``threads``: fixed, or the thread policy, returned for the training
    loop to tick) and check its device, as ``edge-node start`` runs.

    Raises:
        ConfigError: ``device = "cuda"`` where torch sees no CUDA device.
    """
    governor = apply_threads(config.threads, quota=lambda: own_limits().cpus)  # a container's quota caps the threads
    if config.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device 'cuda' asked for but torch.cuda.is_available() is False")
    return torch.device(config.device), governor


def _timing_dp(config: NodeConfig) -> DPConfig | None:
    """A DP-SGD step's settings for timing a node that will train privately (the noise scale costs nothing)."""
    return DPConfig(config.dp_clip, 1.0) if config.privacy == "dp-sgd" else None


def measure(
    config: NodeConfig,
    local: LocalData,
    spec: ModelSpec,
    device: torch.device,
    *,
    check_stop: Callable[[], None] | None = None,
    widths: Mapping[str, TierWidth] | None = None,
    probe_s: float = DEFAULT_PROBE_S,
) -> CapacityDecision:
    """Probe this device with the node's model, data, batch and fleet seed, and choose its tier.

    The one code path of ``edge-node capacity`` and ``edge-node start --capacity auto`` (call
    :func:`runtime_device` first): both measure exactly what the running node would train. Width tiers
    (``config.tier_mode`` width or both; ``widths``: edge_node.models.tier_widths, worked out here when None) also
    time every narrow tier's own steps (:func:`probe_tiers`), and the rule takes each tier's own train time.

    Raises:
        ConfigError: the memory a round needs does not fit (:func:`check_memory`); width tiers for a model whose
            FLOPs cannot be counted (no tier widths).
    """
    available, limits = available_memory()  # before the probe: a device far too small is not probed into the OOM killer
    refuse_short_memory(config.model, round_memory_bytes(spec, config.neighbours, 0), available,
                        limits.memory_limit_bytes)  # fmt: skip
    input_shape = local.data.pool.input_shape
    scratch = build_model(config.model, local.num_classes, seed=config.seed, input_shape=input_shape).to(device)
    if config.tier_mode != "mask" and widths is None:  # sizing the tiers (shapes only) is no part of the probe
        widths = model_tier_widths(config.model, local.num_classes, input_shape, scratch)
    started = time.perf_counter()
    micro_batch = 0 if batch_normalised(scratch) else config.micro_batch  # a BatchNorm model: whole batches
    measured = probe(
        scratch, local.data, config.batch_size, interfaces=config.interfaces, probe_s=probe_s, micro_batch=micro_batch,
        dp=_timing_dp(config), generator=torch.Generator().manual_seed(config.seed),
        check_stop=check_stop, task=resolve_task(config.task),
    )  # fmt: skip
    if widths is not None:
        sgd = SGDConfig(lr=1e-3, micro_batch=micro_batch, dp=_timing_dp(config), task=resolve_task(config.task))
        speeds = probe_tiers(config, local, widths, scratch, measured, sgd, check_stop or (lambda: None))
        measured = replace(measured, tiers=speeds, probe_total_s=round(time.perf_counter() - started, 3))
    decision = choose_tier(
        measured, spec, epochs=config.epochs, samples=local.data.num_train, neighbours=config.neighbours,
        round_budget_s=config.round_budget_s, value_type=ValueType.parse(config.value_type), widths=widths,
        mask_density=config.density if config.tier_mode == "both" else 1.0,
    )  # fmt: skip
    check_memory(decision, config.model)
    return decision


def model_tier_widths(
    model_name: str, num_classes: int, input_shape: Sequence[int], full: nn.Module
) -> dict[str, TierWidth]:
    """Every tier's narrow model of ``full`` (edge_node.models.tier_widths), or one ConfigError line where the
    model's FLOPs cannot be counted (a tier's width is its share of the full model's FLOPs)."""
    positions = weight_positions(full, input_shape)
    if positions is None:
        raise ConfigError(f"model {model_name}: its FLOPs cannot be counted, so width tiers cannot be sized; use "
                          "--tier-mode mask")  # fmt: skip
    return tier_widths(model_name, num_classes, input_shape, positions)


TIER_WINDOW_SHARE = 0.9  # width tiers: their shared window against the full model's (the probe stays under 2x)


def probe_tiers(
    config: NodeConfig,
    local: LocalData,
    widths: Mapping[str, TierWidth],
    full_model: nn.Module,
    full: Measurements,
    sgd: SGDConfig,
    check: Callable[[], None],
) -> tuple[TierSpeed, ...]:
    """Every width tier's speed, after the full model's probe (``full``, of ``full_model``, already warm).

    A second window of ``TIER_WINDOW_SHARE`` of the full model's (at most ``probe_s``; shorter when it reached
    ``MAX_PROBE_STEPS``), in which every tier's model, the full one too, takes real dense steps in turn
    (:func:`_time_interleaved`: one load for all, so their ratios hold on a shared machine) on the same batches,
    after a warm-up step of each (the narrow models built with the node's seed on the full model's device). The steps
    are of the full probe's samples, fewer where one turn of all five would take over a quarter of the window (as
    the full model's per-sample time and the tiers' FLOP shares estimate it): a turn always runs whole, and a
    slow device's turn must not outlast the window. A tier's speed is the full model's (its window, the configured
    batch) over the tier's step ratio: its fastest step in the turns over the full model's (a step that a burst of
    other programs' load slowed does not count against one tier only; the load itself is in the full model's
    window, as in a mask-mode probe). Dense: a mask of any density (tier_mode both) costs the same step on dense
    kernels. So the whole probe takes about twice a mask-mode one (the second window holds the warm-ups: about a
    turn, at most a quarter of it as estimated).
    """
    device = next(full_model.parameters()).device
    tiers = sorted(widths.values(), key=lambda w: w.density)
    models = [
        full_model if w.width >= 1.0 else
        build_model(config.model, local.num_classes, seed=config.seed, input_shape=local.data.pool.input_shape,
                    width=w.width).to(device)
        for w in tiers
    ]  # fmt: skip
    per_sample_s = full.probe_s / max(1, full.probe_steps * full.probe_batch_size)
    turn_per_sample_s = per_sample_s * sum(w.flop_share for w in tiers)
    least = 2 if batch_normalised(full_model) else 1
    step_samples = max(least, min(full.probe_batch_size, int(full.probe_s / (4 * turn_per_sample_s))))
    window_s = TIER_WINDOW_SHARE * full.probe_s  # the narrow models' building and a last step's overrun fit beside it
    timings = _time_interleaved(models, local.data, config.batch_size, step_samples, window_s, sgd, config.seed,
                                check)  # fmt: skip
    full_step_s = next(t for w, t in zip(tiers, timings, strict=True) if w.width >= 1.0).best_step_s
    speeds = []
    for w, t in zip(tiers, timings, strict=True):
        ratio = t.best_step_s / full_step_s
        speeds.append(TierSpeed(tier_name(w.density), w.width, w.flop_share, full.train_samples_per_s / ratio, ratio,
                                "probe", t.steps, t.batch_size, t.window_s, t.warmup_s))  # fmt: skip
    return tuple(speeds)
