"""One DisPFL client's round (Dai et al., "DisPFL", ICML 2022, Alg. 1), shared by the simulation and the daemon.

A client's state is its weights and two masks; a round is, in order::

    state = aggregate_peers(state, peers)                 # intersection-weighted gossip average
    trained = train_local(state, model, batches, t, ...)  # E epochs of masked SGD, divergence checked
    state = update_mask(trained.state, t, ...)            # prune + regrow for the next round
    weights, mask = published(state)                      # what neighbours pull in the next round

The simulation calls these for 100 clients in one process (aggregating all of them from the models
as they were at the round's start, then training each); a device's daemon calls them for its one
client with the snapshots it pulled. Randomness comes only from the streams of
:class:`edge_node.seeding.Stream`, keyed by (fleet seed, client index, round): the same client in
the simulation and on a device draws the same masks, shuffles, augmentation and regrowth.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

import torch
from torch import nn

from edge_node.algorithm.aggregation import aggregate
from edge_node.algorithm.masks import MASK_METHODS, check_density, init_masks, mask_density
from edge_node.algorithm.prune_regrow import REGROW_RULES, update_masks
from edge_node.algorithm.schedules import learning_rate, prune_rate
from edge_node.algorithm.training import (
    Batch,
    SGDConfig,
    TrainStats,
    all_finite,
    dense_gradients,
    load_weights,
    read_weights,
    train_masked,
)
from edge_node.errors import ConfigError, TrainingDiverged
from edge_node.seeding import Stream, torch_generator

TensorDict = Mapping[str, torch.Tensor]
# (epochs, generator) -> shuffled, augmented mini-batches of the client's local training data.
BatchSource = Callable[[int, torch.Generator], Iterable[Batch]]


@dataclass(frozen=True)
class DisPFLParams:
    """The hyper-parameters of local training and the mask schedule (docs/ALGORITHM.md "One round")."""

    epochs: int = 5
    batch_size: int = 128
    lr: float = 0.1  # initial learning rate
    lr_decay: float = 0.998  # per round
    weight_decay: float = 5e-4
    clip_norm: float = 10.0  # max global L2 norm of a step's gradient
    planned_rounds: int = 500  # T of the cosine prune schedule
    prune_alpha: float = 0.5  # initial prune fraction
    regrow: str = "random"  # "gradient" (the paper, RigL) or "random" (the reference code's scripts)
    mask_init: str = "erk"
    micro_batch: int = 0  # slices of a batch through the model at once (memory); 0: the whole batch

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

    def sgd(self, round_index: int) -> SGDConfig:
        """The SGD step settings of round ``round_index`` (decayed learning rate)."""
        return SGDConfig(
            lr=learning_rate(round_index, self.lr, self.lr_decay),
            weight_decay=self.weight_decay,
            clip_norm=self.clip_norm,
            micro_batch=self.micro_batch,
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
    """

    weights: dict[str, torch.Tensor]
    train_mask: dict[str, torch.Tensor]
    next_mask: dict[str, torch.Tensor]
    density: float

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


def start(init_weights: TensorDict, density: float, *, seed: int, client: int, mask_init: str = "erk") -> ClientState:
    """A client's state before round 0: the fleet's shared initial weights on its own random mask.

    Args:
        init_weights: the same for every client of a fleet (a model built from the fleet seed).
        density: the client's target density in (0, 1].
        seed, client: key the client's mask stream (``Stream.MASK``).
    """
    density = check_density(density)
    masks = init_masks(init_weights, density, torch_generator(seed, Stream.MASK, client), mask_init)
    weights = {name: w * masks[name] for name, w in init_weights.items()}
    return ClientState(weights, masks, dict(masks), density)


def aggregate_peers(state: ClientState, peers: Sequence[tuple[TensorDict, TensorDict]]) -> ClientState:
    """Average ``state`` with its peers' published ``(weights, mask)`` pairs, of any densities.

    The result is supported on the client's ``next_mask``, which becomes the mask it trains with
    (docs/ALGORITHM.md step 2). With no peers the client keeps its own weights on that mask.
    """
    weights = aggregate(state.weights, state.train_mask, state.next_mask, [w for w, _ in peers], [m for _, m in peers])
    return ClientState(weights, state.next_mask, state.next_mask, state.density)


def train_local(
    state: ClientState,
    model: nn.Module,
    batches: BatchSource,
    round_index: int,
    params: DisPFLParams,
    *,
    seed: int,
    client: int,
) -> TrainResult:
    """E epochs of masked SGD from ``state.weights`` on ``model`` (docs/ALGORITHM.md step 3).

    On return ``model`` holds the trained weights (evaluate it before loading another client). For
    "gradient" regrowth, the dense gradient of one more batch of the same training stream is taken.

    Raises:
        TrainingDiverged: the mean loss or a trained weight is not finite; ``state`` is unchanged
            and nothing of this round should be published.
    """
    load_weights(model, state.weights)
    generator = torch_generator(seed, Stream.TRAIN, client, round_index)
    sgd = params.sgd(round_index)
    stats = train_masked(model, state.train_mask, batches(params.epochs, generator), sgd)
    trained = read_weights(model)
    finite_weights = all_finite(trained)
    if (stats.samples and not math.isfinite(stats.mean_loss)) or not finite_weights:
        raise TrainingDiverged(
            f"training diverged in round {round_index + 1}: client {client} has loss {stats.mean_loss:.4g}"
            f"{'' if finite_weights else ' and non-finite weights'} (lr={sgd.lr:g})"
        )
    gradients = None
    if params.regrow == "gradient":  # RigL-style: the dense gradient of one mini-batch
        gradients = dense_gradients(model, next(iter(batches(1, generator))))
    return TrainResult(replace(state, weights=trained), stats, sgd.lr, gradients)


def update_mask(
    state: ClientState,
    round_index: int,
    params: DisPFLParams,
    *,
    seed: int,
    client: int,
    gradients: TensorDict | None = None,
) -> ClientState:
    """Prune and regrow ``state.train_mask`` into the next round's ``next_mask`` (docs/ALGORITHM.md step 4).

    Per-tensor active counts never change; regrown positions stay 0 until the next aggregation.
    """
    next_mask = update_masks(
        state.weights,
        state.train_mask,
        params.prune_rate(round_index),
        params.regrow,
        gradients=gradients,
        generator=torch_generator(seed, Stream.REGROW, client, round_index),
    )
    return replace(state, next_mask=next_mask)


def published(state: ClientState) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """What neighbours receive: the trained weights and the mask they were trained with (step 5)."""
    return state.weights, state.train_mask
