"""One DisPFL client's round (Dai et al., "DisPFL", ICML 2022, Alg. 1), shared by the simulation and the daemon.

A client's state is its weights and two masks; a round (:func:`client_round`) is, in order::

    accepted = screen(state, offers)                      # the receive-path screen (robust.py)
    state = aggregate_peers(state, accepted)              # intersection-weighted gossip average
    acc_before = evaluate(model)                          # the aggregated personal model
    trained = train_local(state, model, batches, t, ...)  # E epochs of masked SGD, divergence checked
    acc_after = evaluate(model)                           # the trained model (or what ``keep`` kept of it)
    state = update_mask(trained.state, t, ...)            # prune + regrow for the next round
    weights, mask = published(state)                      # what neighbours pull in the next round

:func:`client_round` is that round, written once: the simulation calls it for each of its clients
(every client's offers are the models as they were at the round's start), a device's daemon for its
one client with the snapshots it pulled. What differs between the two (where batches come from, how
accuracy is measured, energy phases, heartbeat and stop checks, what a screen refusal does to a
peer's standing) reaches the round as :class:`RoundHooks` callbacks. Randomness comes only from the streams of
:class:`edge_node.seeding.Stream`, keyed by (fleet seed, client index, round): the same client in
the simulation and on a device draws the same masks, shuffles, augmentation and regrowth.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field, fields, replace
from typing import Any

import torch
from torch import nn

from edge_node.algorithm.aggregation import aggregate, aggregate_buffers
from edge_node.algorithm.dp import DPConfig, dp_noise_generator
from edge_node.algorithm.frozen import frozen_names
from edge_node.algorithm.masks import MASK_METHODS, check_density, init_masks, mask_counts, mask_density
from edge_node.algorithm.norm_stats import (
    DEFAULT_NORM_STATS,
    NORM_STATS,
    batch_normalised,
    load_buffers,
    read_buffers,
    trainable,
)
from edge_node.algorithm.prune_regrow import (
    REGROW_RULES,
    draw_regrow_scores,
    random_regrow_plan,
    retier_masks,
    update_masks,
)
from edge_node.algorithm.robust import StatsOf, model_stats, screen_peer_buffers, screen_peer_models
from edge_node.algorithm.robust_aggregation import DEFAULT_AGGREGATE, check_aggregate, distance_check, robust_aggregate
from edge_node.algorithm.schedules import learning_rate, prune_rate
from edge_node.algorithm.tasks import CLASSIFICATION, Task, resolve_task
from edge_node.algorithm.training import (
    Batch,
    SGDConfig,
    StepReplay,
    TrainStats,
    all_finite,
    dense_gradients,
    load_weights,
    read_weights,
    train_masked,
)
from edge_node.algorithm.width import Shapes, narrow, widen
from edge_node.defaults import DEFAULTS
from edge_node.errors import ConfigError, TrainingDiverged
from edge_node.seeding import Stream, torch_generator

TensorDict = Mapping[str, torch.Tensor]
# (epochs, generator) -> shuffled, augmented mini-batches of the client's local training data.
BatchSource = Callable[[int, torch.Generator], Iterable[Batch]]
# (peer id, weights, mask): a peer's published model as it reached this client.
Offer = tuple[str, TensorDict, TensorDict]


_DERIVED = frozenset({"dp", "secret_noise", "task", "frozen"})  # DisPFLParams fields no config holds under that name


@dataclass(frozen=True)
class DisPFLParams:
    """The hyper-parameters of local training and the mask schedule (docs/ALGORITHM.md "One round")."""

    # Defaults: the one table the commands share (edge_node.defaults, which says why each is what it is).
    epochs: int = DEFAULTS.epochs
    batch_size: int = DEFAULTS.batch_size
    lr: float = DEFAULTS.lr  # initial learning rate
    lr_decay: float = DEFAULTS.lr_decay  # per round
    weight_decay: float = DEFAULTS.weight_decay
    clip_norm: float = DEFAULTS.clip_norm  # max global L2 norm of a step's gradient
    planned_rounds: int = DEFAULTS.planned_rounds  # T of the cosine prune schedule
    prune_alpha: float = DEFAULTS.prune_alpha  # initial prune fraction
    regrow: str = DEFAULTS.regrow  # "gradient" (the paper, RigL) or "random" (the reference code's scripts)
    mask_init: str = DEFAULTS.mask_init
    micro_batch: int = DEFAULTS.micro_batch  # slices of a batch through the model at once; 0: the whole batch
    # DP-SGD's clip and noise multiplier (None: plain SGD). Never a setting of its own: a run derives it from
    # its privacy budget (edge_node.algorithm.dp), so DisPFLParams.of leaves it out.
    dp: DPConfig | None = None
    secret_noise: bool = False  # DP noise from the OS's randomness (a device), not the fleet seed (a simulation)
    # The learning task (its loss and metrics: edge_node.algorithm.tasks); ``of`` resolves a config's ``task`` name.
    task: Task = CLASSIFICATION
    # The parameters that do not train (edge_node.algorithm.frozen): all-true masks that never change, never
    # published. Never a setting of its own: ``fitted`` reads it off the model (``--trainable`` froze the rest).
    frozen: frozenset[str] = frozenset()
    # A BatchNorm model's running statistics (edge_node.algorithm.norm_stats): "local" keeps the client's own,
    # "average" averages them with those of the peers that sent theirs (both configs' ``norm_stats``).
    norm_stats: str = DEFAULT_NORM_STATS
    # The per-coordinate aggregate over the holders (edge_node.algorithm.robust_aggregation): "mean" (DisPFL's),
    # or "median" / "trimmed:BETA" with the distance check (both configs' ``aggregate``).
    aggregate: str = DEFAULT_AGGREGATE

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_size", "planned_rounds"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name}={value!r} must be an integer >= 1")
        if isinstance(self.micro_batch, bool) or not isinstance(self.micro_batch, int) or self.micro_batch < 0:
            raise ConfigError(f"micro_batch={self.micro_batch!r} must be an integer >= 0 (0: the whole batch)")
        for name in ("lr", "lr_decay", "clip_norm"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ConfigError(f"{name}={value!r} must be a positive number")
        decay = self.weight_decay
        if not isinstance(decay, (int, float)) or not math.isfinite(decay) or decay < 0:
            raise ConfigError(f"weight_decay={self.weight_decay!r} must be >= 0")
        if not 0.0 <= self.prune_alpha <= 1.0:
            raise ConfigError(f"prune_alpha={self.prune_alpha!r} must be in [0, 1]")
        if self.regrow not in REGROW_RULES:
            raise ConfigError(f"regrow={self.regrow!r} must be one of {', '.join(REGROW_RULES)}")
        if self.mask_init not in MASK_METHODS:
            raise ConfigError(f"mask_init={self.mask_init!r} must be one of {', '.join(MASK_METHODS)}")
        if self.norm_stats not in NORM_STATS:
            raise ConfigError(f"norm_stats={self.norm_stats!r} must be one of {', '.join(NORM_STATS)}")
        check_aggregate(self.aggregate)
        if self.frozen and self.dp is not None:
            raise ConfigError("DP-SGD trains every parameter: trainable (frozen layers) and privacy exclude each other")

    @classmethod
    def of(cls, settings: object, **overrides: Any) -> DisPFLParams:
        """The parameters a config holds under the same names (both configs' one way to build them)."""
        values: dict[str, Any] = {f.name: getattr(settings, f.name) for f in fields(cls) if f.name not in _DERIVED}
        if "task" not in overrides:
            values["task"] = resolve_task(getattr(settings, "task", CLASSIFICATION.name))
        return cls(**{**values, **overrides})

    def fitted(self, model: nn.Module) -> DisPFLParams:
        """These parameters for ``model``: a BatchNorm model trains whole batches (``micro_batch`` 0), its statistics
        being the batch's (edge_node.algorithm.norm_stats); ``frozen`` is the model's parameters without
        ``requires_grad``; any other model's are these."""
        fitted = replace(self, micro_batch=0) if batch_normalised(model) and self.micro_batch else self
        frozen = frozen_names(model)
        return replace(fitted, frozen=frozen) if frozen != fitted.frozen else fitted

    def sgd(self, round_index: int) -> SGDConfig:
        """The SGD step settings of round ``round_index`` (decayed learning rate)."""
        return SGDConfig(
            lr=learning_rate(round_index, self.lr, self.lr_decay),
            weight_decay=self.weight_decay,
            clip_norm=self.clip_norm,
            micro_batch=self.micro_batch,
            dp=self.dp,
            task=self.task,
        )

    def prune_rate(self, round_index: int) -> float:
        """The cosine-annealed prune fraction of round ``round_index``."""
        return prune_rate(round_index, self.planned_rounds, self.prune_alpha)


@dataclass(frozen=True)
class ClientState:
    """One client between steps. Tensors are never modified in place by the step functions.

    Attributes:
        weights: dense tensors, zero outside ``train_mask``.
        train_mask: the mask the weights were (or are about to be) trained with; published with them.
        next_mask: the mask the last mask update produced, which the next aggregation lands on.
        density: the client's target density (its tier in setting ii).
        buffers: the client's BatchNorm running statistics (edge_node.algorithm.norm_stats: FedBN's ``local``
            policy, never sent nor averaged); {} for a model without any, or before the client first trained
            (a new layer's statistics).
    """

    weights: dict[str, torch.Tensor]
    train_mask: dict[str, torch.Tensor]
    next_mask: dict[str, torch.Tensor]
    density: float
    buffers: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def mask_density(self) -> float:
        """Fraction of active positions of ``train_mask``."""
        return mask_density(self.train_mask)


@dataclass(frozen=True)
class TrainResult:
    """What local training produced: the trained state, its statistics, and the regrowth gradients."""

    state: ClientState
    stats: TrainStats
    lr: float
    gradients: dict[str, torch.Tensor] | None  # dense gradients of one batch, for "gradient" regrowth


def start(
    init_weights: TensorDict, density: float, *, seed: int, client: int, mask_init: str = "erk",
    frozen: Collection[str] = (), within: Shapes | None = None,
) -> ClientState:  # fmt: skip
    """A client's state before round 0: the fleet's shared initial weights on its own random mask.

    Args:
        init_weights: the same for every client of a fleet (a model built from the fleet seed, or its start file).
        density: the client's target density in (0, 1], of the trainable parameters (with ``within``: of its
            narrow model's).
        seed, client: key the client's mask stream (``Stream.MASK``).
        frozen: parameters that do not train: all-true masks (dense, never pruned), outside the density.
        within: a width tier's narrow model's parameter shapes (edge_node.algorithm.width): the mask is drawn
            on those prefixes at ``density`` and is false outside them.
    """
    density = check_density(density)
    generator = torch_generator(seed, Stream.MASK, client)
    if within is not None:
        drawn = init_masks(narrow(init_weights, within), density, generator, mask_init)
        masks = widen({name: torch.zeros_like(w, dtype=torch.bool) for name, w in init_weights.items()}, drawn)
    elif frozen:
        trained = {name: w for name, w in init_weights.items() if name not in frozen}
        sparse = init_masks(trained, density, generator, mask_init)
        masks = {name: sparse.get(name, torch.ones_like(w, dtype=torch.bool)) for name, w in init_weights.items()}
    else:
        masks = init_masks(init_weights, density, generator, mask_init)
    weights = {name: w * masks[name] for name, w in init_weights.items()}
    return ClientState(weights, masks, dict(masks), density)


def aggregate_peers(
    state: ClientState, peers: Sequence[tuple[TensorDict, TensorDict]], frozen: Collection[str] = (),
    rule: str = DEFAULT_AGGREGATE,
) -> ClientState:  # fmt: skip
    """Average ``state`` with its peers' published ``(weights, mask)`` pairs, of any densities.

    The result is supported on the client's ``next_mask``, which becomes the mask it trains with
    (docs/ALGORITHM.md step 2). With no peers the client keeps its own weights on that mask. ``frozen``
    parameters (never published) keep the client's own values. ``rule``: the per-coordinate aggregate,
    ``mean`` (DisPFL's) or a robust one (``median``, ``trimmed:BETA``: robust_aggregation).
    """
    own = state.weights if not frozen else {n: w for n, w in state.weights.items() if n not in frozen}
    peer_weights, peer_masks = [w for w, _ in peers], [m for _, m in peers]
    if rule == DEFAULT_AGGREGATE:
        weights = aggregate(own, state.train_mask, state.next_mask, peer_weights, peer_masks)
    else:
        weights = robust_aggregate(own, state.train_mask, state.next_mask, peer_weights, peer_masks, rule)
    if frozen:
        weights = {name: state.weights[name] if name in frozen else weights[name] for name in state.weights}
    return ClientState(weights, state.next_mask, state.next_mask, state.density, state.buffers)


def train_local(
    state: ClientState,
    model: nn.Module,
    batches: BatchSource,
    round_index: int,
    params: DisPFLParams,
    *,
    seed: int,
    client: int,
    graphs: StepReplay | None = None,
) -> TrainResult:
    """E epochs of masked SGD from ``state.weights`` on ``model`` (docs/ALGORITHM.md step 3).

    On return ``model`` holds the trained weights (evaluate it before loading another client). For
    "gradient" regrowth, the dense gradient of one more batch of the same training stream is taken.
    ``graphs``: replay full batches as a captured CUDA graph (:func:`train_masked`).

    Raises:
        TrainingDiverged: the mean loss or a trained weight is not finite; ``state`` is unchanged
            and nothing of this round should be published.
    """
    load_weights(model, state.weights)
    load_buffers(model, state.buffers)
    generator = torch_generator(seed, Stream.TRAIN, client, round_index)
    sgd = params.sgd(round_index)
    noise = dp_noise_generator(seed, client, round_index, secret=params.secret_noise) if params.dp else None
    stream = batches(params.epochs, generator)
    if batch_normalised(model):  # BatchNorm cannot normalise a batch of one sample (an epoch's last)
        stream = trainable(stream)
    stats = train_masked(model, state.train_mask, stream, sgd, noise, graphs=graphs)
    trained, buffers = read_weights(model), read_buffers(model)
    check_trained(stats, trained, round_index, client, sgd.lr)
    gradients = None
    if params.regrow == "gradient":  # RigL-style: the dense gradient of one mini-batch
        gradients = dense_gradients(model, next(iter(batches(1, generator))), params.task)
        if buffers:
            load_buffers(model, buffers)  # that batch's forward moved the statistics: training's are kept
    return TrainResult(replace(state, weights=trained, buffers=buffers), stats, sgd.lr, gradients)


def check_trained(stats: TrainStats, trained: TensorDict, round_index: int, client: int, lr: float) -> None:
    """Raise TrainingDiverged when the mean loss or a trained weight is not finite (nothing may be kept)."""
    finite_weights = all_finite(trained)
    if (stats.samples and not math.isfinite(stats.mean_loss)) or not finite_weights:
        raise TrainingDiverged(
            f"training diverged in round {round_index + 1}: client {client} has loss {stats.mean_loss:.4g}"
            f"{'' if finite_weights else ' and non-finite weights'} (lr={lr:g})"
        )


def update_mask(
    state: ClientState,
    round_index: int,
    params: DisPFLParams,
    *,
    seed: int,
    client: int,
    gradients: TensorDict | None = None,
    random_scores: TensorDict | None = None,
) -> ClientState:
    """Prune and regrow ``state.train_mask`` into the next round's ``next_mask`` (docs/ALGORITHM.md step 4).

    Per-tensor active counts never change; regrown positions stay 0 until the next aggregation.
    ``random_scores``: random regrowth's scores, drawn ahead by :func:`regrow_scores`.
    """
    next_mask = update_masks(
        state.weights,
        state.train_mask,
        params.prune_rate(round_index),
        params.regrow,
        gradients=gradients,
        generator=torch_generator(seed, Stream.REGROW, client, round_index),
        random_scores=random_scores,
    )
    return replace(state, next_mask=next_mask)


def regrow_scores(
    train_mask: TensorDict, round_index: int, params: DisPFLParams, *, seed: int, client: int
) -> Callable[[], TensorDict]:
    """The draws random regrowth of ``train_mask`` will make in :func:`update_mask`, as a job that may run
    on another thread (one host read here; the job touches only a CPU generator)."""
    plan = random_regrow_plan(train_mask, params.prune_rate(round_index))
    return lambda: draw_regrow_scores(plan, torch_generator(seed, Stream.REGROW, client, round_index))


def retier(
    state: ClientState, density: float, round_index: int, *, seed: int, client: int, mask_init: str = "erk",
    frozen: Collection[str] = (), within: Shapes | None = None,
) -> ClientState:  # fmt: skip
    """``state`` moved to another tier's ``density`` at a round boundary (``capacity = "auto"`` re-measured).

    ``within`` (width tiers): the new tier's prefixes; the mask moves to ``density`` of the new narrow model, false
    outside it (a narrower tier drops what lay beyond, then prunes; a wider one regrows into its new channels).

    The mask the next aggregation lands on (``next_mask``) takes the per-tensor active counts :func:`start` gives
    that density (ERK, or uniform under ``mask_init = "uniform"``): a sparser tier prunes each tensor's smallest
    ``|w|``, a denser one regrows random positions (``Stream.RETIER``), which start at 0 and are filled by the
    aggregation, as the mask update's regrowth is. ``train_mask`` (what was published with the weights) is
    kept; the next round trains and publishes on the moved mask. ``frozen`` parameters stay dense.
    """
    density = check_density(density)
    generator = torch_generator(seed, Stream.RETIER, client, round_index)
    if within is not None:
        counts = mask_counts(within, density, mask_init)
        moved = retier_masks(narrow(state.weights, within), narrow(state.next_mask, within), counts, generator)
        empty = {name: torch.zeros_like(m) for name, m in state.next_mask.items()}
        return replace(state, next_mask=widen(empty, moved), density=density)
    trained = {name: w for name, w in state.weights.items() if name not in frozen}
    counts = mask_counts({name: tuple(w.shape) for name, w in trained.items()}, density, mask_init)
    next_mask = retier_masks(state.weights, state.next_mask, counts, generator)
    return replace(state, next_mask=next_mask, density=density)


def published(
    state: ClientState, frozen: Collection[str] = ()
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """What neighbours receive: the trained weights and the mask they were trained with (step 5), without the
    ``frozen`` parameters (every node holds the same values of those)."""
    if not frozen:
        return state.weights, state.train_mask
    keep = [name for name in state.weights if name not in frozen]
    return {n: state.weights[n] for n in keep}, {n: state.train_mask[n] for n in keep}


@contextmanager
def _no_phase(_name: str) -> Iterator[None]:
    yield


@dataclass(frozen=True)
class RoundHooks:
    """What the caller of :func:`client_round` plugs in: the round's only contact with I/O and clocks.

    Attributes:
        batches: the client's training batches (a daemon's beat the heartbeat and check for a stop).
        evaluate: accuracy of ``model`` as loaded, on the client's test data.
        phase: a context manager around the round's "aggregate" and "train" steps (energy accounting;
            a daemon's also marks a section a stop signal may interrupt).
        screened: told ``(accepted ids, {refused id: reason})`` right after the screen, before anything
            is aggregated (a daemon records its peers' standing here).
        keep: what the client keeps of its trained model (sparse-to-sparser's further prune); it is
            evaluated, mask-updated and published instead of the trained state.
        stats_of: how the screen computes a model's statistics (the simulation shares a ``StatsMemo``
            among a round's clients, who screen the same published models).
        ahead: runs a job meanwhile (on another thread) and returns how to wait for its result; given, random
            regrowth's scores are drawn while the client aggregates and trains (on a GPU the CPU is idle
            then: 700 draws were 6.2 s of a 52 s ResNet18 round on an H100). The draws are the same.
        graphs: local training's captured step (the simulation's ``--cuda-graphs``), None: eager steps.
    """

    batches: BatchSource
    evaluate: Callable[[nn.Module], float]
    phase: Callable[[str], AbstractContextManager[None]] = _no_phase
    screened: Callable[[list[str], dict[str, str]], None] | None = None
    keep: Callable[[ClientState], ClientState] | None = None
    stats_of: StatsOf = model_stats
    ahead: Callable[[Callable[[], TensorDict]], Callable[[], TensorDict]] | None = None
    graphs: StepReplay | None = None


@dataclass(frozen=True)
class Evaluated:
    """Accuracy before local training, the training, and accuracy of what the client kept after it."""

    trained: TrainResult
    kept: ClientState
    acc_before: float
    acc_after: float


@dataclass(frozen=True)
class ClientRound:
    """One client's round: ``state`` is the next state (publish it), with what happened on the way."""

    state: ClientState
    trained: TrainResult
    acc_before: float
    acc_after: float
    accepted: list[str]
    refused: dict[str, str] = field(default_factory=dict)


def evaluate_and_train(
    state: ClientState, model: nn.Module, round_index: int, params: DisPFLParams, *, seed: int, client: int,
    hooks: RoundHooks,
) -> Evaluated:  # fmt: skip
    """Evaluate ``state``, train it locally, evaluate what the client keeps (the dense baselines' round too).

    Raises:
        TrainingDiverged: from :func:`train_local`; nothing of the round should be kept.
    """
    load_weights(model, state.weights)
    load_buffers(model, state.buffers)
    before = hooks.evaluate(model)
    trained = train_local(
        state, model, hooks.batches, round_index, params, seed=seed, client=client, graphs=hooks.graphs
    )
    return keep_and_evaluate(trained, model, hooks, before)


def keep_and_evaluate(trained: TrainResult, model: nn.Module, hooks: RoundHooks, acc_before: float) -> Evaluated:
    """What the client keeps of ``trained`` (``hooks.keep``) and its accuracy; ``model`` holds the trained weights."""
    kept = trained.state
    if hooks.keep is not None:
        kept = hooks.keep(trained.state)
        if kept is not trained.state:
            load_weights(model, kept.weights)
    return Evaluated(trained, kept, acc_before, hooks.evaluate(model))


def screen_and_aggregate(
    state: ClientState, offers: Sequence[Offer], hooks: RoundHooks, *, screen: bool = True,
    frozen: Collection[str] = (), buffers: Mapping[str, TensorDict] | None = None, rule: str = DEFAULT_AGGREGATE,
) -> tuple[ClientState, list[str], dict[str, str]]:  # fmt: skip
    """The round's first step: screen ``offers`` (when ``screen``), tell ``hooks.screened``, aggregate the accepted.

    Returns the aggregated state, the accepted peer ids and the refused ones with their reasons. Offers hold
    the published (not the ``frozen``) parameters. ``buffers`` (``norm_stats = "average"``; None: ``local``,
    the client's statistics are kept as they are): the running statistics each peer sent, by peer id (a peer
    absent or with ``{}`` sent none); those of the accepted peers are screened too (``screen_peer_buffers``: a
    peer refused there is refused whole) and averaged with the client's (``aggregate_buffers``). ``rule``: the
    per-coordinate aggregate; a robust one (not ``mean``) first refuses, after the screen and whether or not
    ``screen``, the peers the distance check refuses (robust_aggregation: reasons begin ``distance:``).
    """
    accepted, refused = [peer for peer, _, _ in offers], {}
    if screen and offers:
        own_weights, own_mask = published(state, frozen)
        result = screen_peer_models(own_weights, own_mask, offers, stats_of=hooks.stats_of)
        accepted, refused = list(result.accepted), dict(result.refused)
    sent = [(peer, buffers[peer]) for peer in accepted if buffers and buffers.get(peer)]
    if screen and sent:
        checked = screen_peer_buffers(state.buffers, sent)
        accepted = [peer for peer in accepted if peer not in checked.refused]
        refused.update(checked.refused)
    if rule != DEFAULT_AGGREGATE and accepted:
        own_weights, own_mask = published(state, frozen)
        kept = {peer: (weights, mask) for peer, weights, mask in offers}
        distant = distance_check(own_weights, own_mask, [(peer, *kept[peer]) for peer in accepted])
        accepted, refused = list(distant.accepted), {**refused, **distant.refused}
    if hooks.screened is not None:
        hooks.screened(accepted, refused)
    models = {peer: (weights, mask) for peer, weights, mask in offers}
    aggregated = aggregate_peers(state, [models[peer] for peer in accepted], frozen, rule)
    if buffers is not None:
        averaged = aggregate_buffers(state.buffers, [buffers.get(peer) or {} for peer in accepted])
        aggregated = replace(aggregated, buffers=averaged)
    return aggregated, accepted, refused


def narrow_state(state: ClientState, shapes: Shapes) -> ClientState:
    """``state``'s prefixes of a width tier's narrow model (``shapes``): what that model trains."""
    return ClientState(
        narrow(state.weights, shapes), narrow(state.train_mask, shapes), narrow(state.next_mask, shapes),
        state.density, state.buffers,
    )  # fmt: skip


def widen_state(full: ClientState, narrowed: ClientState) -> ClientState:
    """``narrowed`` (a narrow model's state) written over the prefixes of ``full``, a state of full shapes that is
    zero and masked off outside them."""
    return ClientState(
        widen(full.weights, narrowed.weights), widen(full.train_mask, narrowed.train_mask),
        widen(full.next_mask, narrowed.next_mask), narrowed.density, narrowed.buffers,
    )  # fmt: skip


def _narrowed_to(state: ClientState, model: nn.Module) -> Shapes | None:
    """The parameter shapes of ``model`` where it is a narrow model (a width tier) of ``state``'s, else None."""
    shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
    return None if all(tuple(w.shape) == shapes.get(name) for name, w in state.weights.items()) else shapes


def client_round(
    state: ClientState, offers: Sequence[Offer], model: nn.Module, round_index: int, params: DisPFLParams, *,
    seed: int, client: int, hooks: RoundHooks, screen: bool = True,
    peer_buffers: Mapping[str, TensorDict] | None = None,
) -> ClientRound:  # fmt: skip
    """DisPFL's client round (the module docstring): screen, aggregate, evaluate, train, evaluate, update the mask.

    ``model`` may be a width tier's narrow model (edge_node.algorithm.width): the state keeps the full shapes
    (zero and masked off outside the prefixes), which the screen and the aggregation see; evaluation, training
    and the mask update run on the prefixes (the mask stays within them), written back before the round ends.
    ``trained`` then holds the narrow model's state.

    Args:
        state: the client's state at the round's start; ``offers`` are screened against what it published.
        offers: the peers' published models, ids distinct.
        screen: screen the offers first (a device always does; the simulation's ``--no-screen`` skips it).
        peer_buffers: the running statistics the peers sent, by peer id; averaged with the client's when
            ``params.norm_stats`` is "average" (:func:`screen_and_aggregate`), ignored under "local".

    Raises:
        TrainingDiverged: local training diverged; ``state`` is unchanged and nothing should be published.
    """
    shapes = _narrowed_to(state, model)
    early_scores = None  # the mask update's random draws, made meanwhile (what update_mask gets: no ``keep``)
    if hooks.ahead is not None and params.regrow == "random" and hooks.keep is None:
        next_mask = state.next_mask if shapes is None else narrow(state.next_mask, shapes)
        early_scores = hooks.ahead(regrow_scores(next_mask, round_index, params, seed=seed, client=client))
    with hooks.phase("aggregate"):
        buffers = dict(peer_buffers or {}) if params.norm_stats == "average" else None
        aggregated, accepted, refused = screen_and_aggregate(
            state, offers, hooks, screen=screen, frozen=params.frozen, buffers=buffers, rule=params.aggregate
        )
    with hooks.phase("train"):
        local = aggregated if shapes is None else narrow_state(aggregated, shapes)
        done = evaluate_and_train(local, model, round_index, params, seed=seed, client=client, hooks=hooks)
        new_state = update_mask(
            done.kept, round_index, params, seed=seed, client=client, gradients=done.trained.gradients,
            random_scores=early_scores() if early_scores is not None else None,
        )  # fmt: skip
        if shapes is not None:
            new_state = widen_state(aggregated, new_state)
    return ClientRound(new_state, done.trained, done.acc_before, done.acc_after, accepted, refused)
