"""Screening peers' models before aggregation: how far one peer can push a node's model.

DisPFL's aggregate (``aggregation.py``) is a plain per-coordinate mean: one peer sending huge but
finite values (3e38) moves it arbitrarily far, two make it infinite. A model that arrived over the
wire has passed the decoder (names, shapes, finite values), but its magnitudes are the sender's
choice. This module refuses peers whose per-tensor scale is far outside the node's own and its
other peers', with a bound that holds however many peers collude.

The rule (``screen_peer_models``). For every tensor ``t`` and every model ``m`` (the node's own and
each peer's), over the active weights ``a`` (where the model's mask is true):

- ``rms[m, t] = sqrt(mean(a**2))`` and ``amax[m, t] = max(|a|)``, each raised to at least the
  floor ``phi = floor_fraction * rms(own model, all tensors)`` (so a tensor that is still all zero,
  such as a freshly initialised GroupNorm bias, or that has few weights, does not make every
  peer's look infinitely large);
- the reference of a statistic is its median over the own model and the peers (the mean of the
  two middle values when their number is even), capped at ``own_anchor`` times the own model's:
  ``ref[t] = min(median_m(stat[m, t]), own_anchor * stat[own, t])``;
- a peer is refused when, for any tensor, ``rms > max_rms_ratio * ref_rms`` or
  ``amax > max_abs_ratio * ref_amax``; also when a tensor is missing, of another shape, its mask
  is not a bool tensor of that shape, or an active value is NaN or infinite. The reason names the
  tensor, the value and the limit.

What it guarantees: every accepted peer has, in every tensor, ``max |w| <= max_abs_ratio *
own_anchor * max(amax_own, phi)`` (and ``rms`` likewise with ``max_rms_ratio``), whatever the
other peers send. When fewer than half of the models (own included) collude, the median is an
honest model's or lies between two honest ones, and the bound is ``max_abs_ratio`` times that. The
aggregate of a coordinate is a mean of accepted values and the own one, so it stays within the
bound too, and finite. What it does not do: a lone peer (two models, whose median is their mean)
is held only by the anchor; peers smaller than the reference are never refused (a scaled-down or
zero model dilutes the mean like an absent one); a sign-flipped peer of ordinary size is bounded,
not detected (those are the robust setting's business: ``aggregate = "median"`` or ``"trimmed:BETA"``
with its distance check, ``robust_aggregation.py``). Two honest models are never refused against each
other (neither exceeds twice their mean), so a node that starts late from the initial weights accepts a
trained peer.

Defaults (``max_rms_ratio = max_abs_ratio = 10``, ``own_anchor = 100``, ``floor_fraction = 1``):
honest models stay well inside them. ``bench/screen_margin.py`` screens every client's model against
all the others after each round and finds the smallest ratios that refuse none: at most 2.84x (rms)
and 3.45x (max |w|) in 8 rounds of 10 ``demo`` clients at tier densities 0.2 .. 1.0, and 1.96x and
2.34x in 10 rounds of 20 CIFAR-10 Path(2) clients (``docs/RESULTS.md``). A tensor's statistic did
differ between two clients by up to 5.18x (a classifier bias, demo, round 1); the median absorbs
that. On CIFAR-10 (``docs/RESULTS.md``, "The receive-path screen on an honest fleet") the screen
refused no honest model in 100 clients x 5 rounds nor in 20 clients x 10 rounds of Dir(0.3),
Path(2) and setting ii: runs with and without it are bitwise equal.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch

from edge_node.errors import ConfigError

TensorDict = Mapping[str, torch.Tensor]

DEFAULT_MAX_RMS_RATIO = 10.0
DEFAULT_MAX_ABS_RATIO = 10.0
DEFAULT_OWN_ANCHOR = 100.0
DEFAULT_FLOOR_FRACTION = 1.0
_MIN_FLOOR = 1e-12  # the floor when the own model is all zero


@dataclass(frozen=True)
class ScreenResult:
    """Peers accepted for aggregation (in the order given) and, for each refused peer, why."""

    accepted: list[str]
    refused: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ModelStats:
    """Per-tensor rms and max |w| of a model's active weights, and its sum of squares and active count."""

    rms: dict[str, float]
    amax: dict[str, float]
    sum_squares: float
    active: int


def _check_ratio(name: str, value: float, minimum: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < minimum:
        raise ConfigError(f"{name}={value!r} must be a finite number >= {minimum:g}")
    return float(value)


def _problem(name: str, weight: object, mask: object, shape: tuple[int, ...]) -> str | None:
    """Why a peer's tensor cannot be screened (or aggregated), or None."""
    if not isinstance(weight, torch.Tensor) or not weight.is_floating_point():
        return f"tensor {name!r}: weights are not a floating-point tensor"
    if tuple(weight.shape) != shape:
        return f"tensor {name!r}: shape {tuple(weight.shape)}, the node's is {shape}"
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or tuple(mask.shape) != shape:
        return f"tensor {name!r}: mask is not a bool tensor of shape {shape}"
    return None


def model_stats(weights: TensorDict, mask: TensorDict, names: Sequence[str]) -> tuple[ModelStats | None, str | None]:
    """Per-tensor rms and max |w| over active weights (float64), or why not (a non-finite value)."""
    rows = []
    for name in names:
        active = torch.where(mask[name], weights[name], torch.zeros((), dtype=weights[name].dtype))
        active = active.to(torch.float64)  # squares of float32 values up to 3.4e38 do not overflow
        rows.append(
            torch.stack(
                [
                    active.square().sum(),
                    active.abs().amax() if active.numel() else active.new_zeros(()),
                    mask[name].sum().to(torch.float64),
                    torch.isfinite(active).all().to(torch.float64),
                ]
            ).cpu()
        )
    table = torch.stack(rows).tolist() if rows else []  # one transfer per model
    rms: dict[str, float] = {}
    amax: dict[str, float] = {}
    total_squares, total_active = 0.0, 0
    for name, (squares, largest, count, finite) in zip(names, table, strict=True):
        if not finite:
            return None, f"tensor {name!r}: active values are NaN or infinite"
        rms[name] = math.sqrt(squares / count) if count else 0.0
        amax[name] = largest
        total_squares += squares
        total_active += int(count)
    return ModelStats(rms, amax, total_squares, total_active), None


Stats = tuple[ModelStats | None, str | None]  # what model_stats returns
StatsOf = Callable[[TensorDict, TensorDict, Sequence[str]], Stats]


class StatsMemo:
    """:func:`model_stats` of each model computed once while the memo lives (one simulated round).

    In a simulated round every published model is screened by each client that pulls it (10 with the
    paper's neighbours) and by its owner; the statistics depend on the model alone, so they are computed
    once. A model is known by the identity of its weight and mask dicts, which the memo holds so that an
    id is never reused while it lives: the models must not be modified while it is in use (a round's
    round-start models never are).
    """

    def __init__(self) -> None:
        self._known: dict[tuple[int, int], tuple[TensorDict, TensorDict, tuple[str, ...], Stats]] = {}

    def __call__(self, weights: TensorDict, mask: TensorDict, names: Sequence[str]) -> Stats:
        key, names = (id(weights), id(mask)), tuple(names)
        known = self._known.get(key)
        if known is not None and known[2] == names:
            return known[3]
        result = model_stats(weights, mask, names)
        self._known[key] = (weights, mask, names, result)
        return result


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def screen_peer_models(
    own_weights: TensorDict,
    own_mask: TensorDict,
    peers: Sequence[tuple[str, TensorDict, TensorDict]],
    *,
    max_rms_ratio: float = DEFAULT_MAX_RMS_RATIO,
    max_abs_ratio: float = DEFAULT_MAX_ABS_RATIO,
    own_anchor: float = DEFAULT_OWN_ANCHOR,
    floor_fraction: float = DEFAULT_FLOOR_FRACTION,
    stats_of: StatsOf = model_stats,
) -> ScreenResult:
    """Split ``peers`` into those whose models may be aggregated and those refused (the module's rule).

    Args:
        own_weights, own_mask: this node's model (the trained weights and the mask it trained with).
        peers: ``(peer_id, weights, mask)`` for every received model; ids distinct.
        max_rms_ratio: a peer's tensor may have at most this times the reference rms.
        max_abs_ratio: ... and at most this times the reference max |w|.
        own_anchor: the reference never exceeds this times the own model's statistic (the bound
            when most peers collude).
        floor_fraction: statistics below this times the own model's overall rms count as that.
        stats_of: how a model's statistics are computed: :func:`model_stats`, or a :class:`StatsMemo`
            where many screens of one round see the same published models (the simulation).

    Returns:
        ``ScreenResult(accepted, refused)``: ids in the order given, a one-line reason per refusal.
        Nothing is modified.

    Raises:
        ConfigError: a parameter out of range, duplicate peer ids, or an own model that does not
            pass the same checks (missing mask, non-finite values).
    """
    max_rms_ratio = _check_ratio("max_rms_ratio", max_rms_ratio, 1.0)
    max_abs_ratio = _check_ratio("max_abs_ratio", max_abs_ratio, 1.0)
    own_anchor = _check_ratio("own_anchor", own_anchor, 1.0)
    floor_fraction = _check_ratio("floor_fraction", floor_fraction, 0.0)
    ids = [peer_id for peer_id, _w, _m in peers]
    if len(set(ids)) != len(ids):
        raise ConfigError(f"peer ids are not distinct: {sorted(i for i in set(ids) if ids.count(i) > 1)}")
    names = list(own_weights)
    shapes = {name: tuple(own_weights[name].shape) for name in names}
    for name in names:
        problem = _problem(name, own_weights[name], own_mask.get(name), shapes[name])
        if problem:
            raise ConfigError(f"own model: {problem}")
    own, problem = stats_of(own_weights, own_mask, names)
    if own is None:
        raise ConfigError(f"own model: {problem}")

    refused: dict[str, str] = {}
    stats: dict[str, ModelStats] = {}
    with torch.no_grad():
        for peer_id, weights, mask in peers:
            problem = next(
                (
                    p
                    for name in names
                    if (p := _problem(name, weights.get(name), mask.get(name), shapes[name])) is not None
                ),
                None,
            )
            peer_stats = None
            if problem is None:
                peer_stats, problem = stats_of(weights, mask, names)
            if peer_stats is None:
                refused[peer_id] = problem or "unusable model"
            else:
                stats[peer_id] = peer_stats

    own_rms = math.sqrt(own.sum_squares / own.active) if own.active else 0.0
    floor = max(floor_fraction * own_rms, _MIN_FLOOR)
    models = [own, *stats.values()]
    limits = {}
    for name in names:
        for kind, ratio in (("rms", max_rms_ratio), ("amax", max_abs_ratio)):
            values = [max(getattr(m, kind)[name], floor) for m in models]
            reference = min(_median(values), own_anchor * values[0])
            limits[name, kind] = (reference, ratio * reference)
    accepted = []
    for peer_id, peer_stats in stats.items():
        reason = None
        for name in names:
            for kind, label in (("rms", "rms"), ("amax", "max |w|")):
                value = getattr(peer_stats, kind)[name]
                reference, limit = limits[name, kind]
                if value > limit:
                    reason = (
                        f"tensor {name!r}: {label} {value:.3g} is {value / reference:.3g} times the reference"
                        f" {reference:.3g} (the limit is {limit / reference:g}x)"
                    )
                    break
            if reason:
                break
        if reason:
            refused[peer_id] = reason
        else:
            accepted.append(peer_id)
    order = {peer_id: i for i, peer_id in enumerate(ids)}
    accepted.sort(key=order.__getitem__)
    return ScreenResult(accepted, {k: refused[k] for k in sorted(refused, key=order.__getitem__)})


def screen_peer_buffers(
    own_buffers: TensorDict, peers: Sequence[tuple[str, TensorDict]], *, stats_of: StatsOf = model_stats
) -> ScreenResult:
    """The same rule for BatchNorm running statistics (``norm_stats = "average"``): each float buffer is a
    dense tensor screened against the node's own and the other peers' (``num_batches_tracked``, an integer,
    is only checked for its shape and sign); a peer's buffer of another name, shape or dtype, a NaN, an
    infinity or a negative ``running_var`` refuses it. A node without buffers yet (it has not trained)
    accepts every peer that passes those checks, having nothing to compare with.
    """
    accepted: list[str] = []
    refused: dict[str, str] = {}
    for peer_id, buffers in peers:
        problem = _buffer_problem(own_buffers, buffers)
        if problem is None:
            accepted.append(peer_id)
        else:
            refused[peer_id] = problem
    floats = [name for name, b in own_buffers.items() if b.is_floating_point()]
    if not floats or not accepted:
        return ScreenResult(accepted, refused)
    ones = {name: torch.ones_like(own_buffers[name], dtype=torch.bool) for name in floats}
    by_id = dict(peers)
    result = screen_peer_models(
        {name: own_buffers[name] for name in floats},
        ones,
        [(peer_id, {name: by_id[peer_id][name] for name in floats}, ones) for peer_id in accepted],
        stats_of=stats_of,
    )
    refused.update({peer_id: f"buffers: {reason}" for peer_id, reason in result.refused.items()})
    order = {peer_id: i for i, (peer_id, _) in enumerate(peers)}
    return ScreenResult(result.accepted, {k: refused[k] for k in sorted(refused, key=order.__getitem__)})


def _buffer_problem(own: TensorDict, buffers: TensorDict) -> str | None:
    """Why a peer's buffers cannot be averaged with ``own`` (when the node has any), or None."""
    if own and list(buffers) != list(own):
        return f"buffers {sorted(buffers)[:8]} are not the node's {sorted(own)[:8]}"
    for name, value in buffers.items():
        mine = own.get(name)
        if not isinstance(value, torch.Tensor):
            return f"buffer {name!r} is not a tensor"
        if mine is not None and (value.shape != mine.shape or value.dtype != mine.dtype):
            return (
                f"buffer {name!r}: {tuple(value.shape)} {value.dtype}, the node's is {tuple(mine.shape)} {mine.dtype}"
            )
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            return f"buffer {name!r}: values are NaN or infinite"
        if name.rpartition(".")[2] == "running_var" and bool((value < 0).any()):
            return f"buffer {name!r}: a variance is negative"
        if not value.is_floating_point() and bool((value < 0).any()):
            return f"buffer {name!r}: a count is negative"
    return None
