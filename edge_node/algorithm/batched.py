"""Local training of several clients at once: the simulation's ``--batch-clients`` (one device, many clients).

:func:`train_local_batched` is :func:`edge_node.algorithm.dispfl.train_local` for a group of clients: the same
masked SGD step (cross-entropy, global-norm clipping, weight decay, ``w -= lr * g``, ``w *= mask``) on each
client's own batches from its own generator, but the group's step runs as one ``torch.func.vmap`` call over
the clients' stacked weights, masks and batches: the kernel launches of one client's step for the whole group.
That is what a GPU needs for a small model, whose one-client step is too short to keep it busy
(``bench/train_ceiling.py``: 100 ``cnn`` clients at once, 3.3x the images per second of one at a time on an
H100). The models equal the one-at-a-time path's up to float rounding, not bitwise
(``tests/algorithm/test_batched.py`` states the tolerance).

Clients whose batches run out before the group's last step, and an epoch's last smaller batch, are padded:
padded samples weigh 0 in the loss, and a client without a batch keeps its weights (the step is computed and
discarded). Grouping clients with equal step counts (the caller's job: :func:`groups_by_steps`) keeps that
waste small.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace

import torch
from torch import nn
from torch.func import functional_call, grad_and_value, vmap

from edge_node.algorithm.dispfl import BatchSource, ClientState, DisPFLParams, TrainResult, check_trained
from edge_node.algorithm.training import Batch, SGDConfig, TrainStats, dense_gradients, load_weights
from edge_node.seeding import Stream, torch_generator

Weights = dict[str, torch.Tensor]


def masked_step(model: nn.Module, config: SGDConfig) -> Callable[..., tuple[Weights, torch.Tensor]]:
    """The group's step: ``(weights, masks, x, y, sample_weight, active) -> (new weights, loss)``, every argument
    stacked over clients (dim 0). Per client it is ``train_masked``'s whole-batch step; ``sample_weight`` (1 real,
    0 padding) weighs the mean loss, and a client that is not ``active`` keeps its weights (its loss reads 0).
    The update is :func:`~edge_node.algorithm.training.masked_update`'s written out per tensor: its ``_foreach``
    ops have no vmap batching rule (``aten::_foreach_norm``); the tests hold the two to float rounding."""
    lr, decay, clip = config.lr, config.weight_decay, config.clip_norm

    def step(
        weights: Weights, masks: Weights, x: torch.Tensor, y: torch.Tensor, sample_weight: torch.Tensor,
        active: torch.Tensor,
    ) -> tuple[Weights, torch.Tensor]:  # fmt: skip
        def loss_of(w: Weights) -> torch.Tensor:
            per_sample = nn.functional.cross_entropy(functional_call(model, w, (x,)), y, reduction="none")
            return (per_sample * sample_weight).sum() / sample_weight.sum().clamp(min=1.0)

        grads, loss = grad_and_value(loss_of)(weights)
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads.values()]))
        scale = (clip / (norm + 1e-6)).clamp(max=1.0)
        stepped = {}
        for name, w in weights.items():
            g = grads[name] * scale
            if decay:
                g = g + decay * w
            stepped[name] = torch.where(active, (w - lr * g) * masks[name], w)
        return stepped, torch.where(active, loss, torch.zeros_like(loss))

    return vmap(step)


class _Padding:
    """Pads a step's batches to one size. What a step of full batches needs (the weights of a full batch, "every
    client active") is made once and reused: on a GPU each new small tensor is a launch or a host-to-device copy,
    and a step of 100 clients would make hundreds."""

    def __init__(self) -> None:
        self._cache: dict[tuple[str, int], tuple[torch.Tensor, ...]] = {}

    def _made(self, key: tuple[str, int], make: Callable[[], tuple[torch.Tensor, ...]]) -> tuple[torch.Tensor, ...]:
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]

    def batch(self, batch: Batch | None, size: int, like: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``batch`` padded to ``size`` samples with zeros, and its samples' weights (1 real, 0 padding)."""
        x_like, y_like = like
        if batch is None:  # a client whose batches have run out: zeros that weigh nothing
            x, y, weight = self._made(
                ("none", size),
                lambda: (x_like.new_zeros((size, *x_like.shape[1:])), y_like.new_zeros(size), x_like.new_zeros(size)),
            )
            return x, y, weight
        x, y = batch
        n = int(y.shape[0])
        if n == size:
            (weight,) = self._made(("full", size), lambda: (x.new_ones(size),))
            return x, y, weight
        weight = torch.cat([x.new_ones(n), x.new_zeros(size - n)])
        return torch.cat([x, x.new_zeros((size - n, *x.shape[1:]))]), torch.cat([y, y.new_zeros(size - n)]), weight

    def active(self, present: list[bool], device: torch.device) -> torch.Tensor:
        """Which clients have a batch this step, on ``device``."""
        if all(present):
            (every,) = self._made(("all", len(present)), lambda: (torch.ones(len(present), dtype=torch.bool,
                                                                             device=device),))  # fmt: skip
            return every
        return torch.tensor(present, device=device)


def train_local_batched(
    states: Sequence[ClientState],
    model: nn.Module,
    sources: Sequence[BatchSource],
    round_index: int,
    params: DisPFLParams,
    *,
    seed: int,
    clients: Sequence[int],
) -> list[TrainResult]:
    """``train_local`` of each client of ``clients`` (weights ``states[k]``, batches ``sources[k]``), stepped together.

    ``model`` gives the architecture (``torch.func.functional_call``); its parameters are left as they were, but for
    "gradient" regrowth, which loads each client's trained weights in turn to take its gradient. Each client
    draws its shuffles and augmentation from its own ``Stream.TRAIN`` generator, as
    ``train_local`` does; "gradient" regrowth's extra batch comes from it after training, as there.

    Raises:
        ValueError: DP-SGD or micro-batches (whole batches only), or sequences of different lengths.
        TrainingDiverged: a client's loss or weights are not finite (the first such client, by position).
    """
    if not len(states) == len(sources) == len(clients) or not states:
        raise ValueError("train_local_batched needs one state, batch source and client index per client (>= 1)")
    if params.dp is not None or params.micro_batch != 0:
        raise ValueError("batched clients take whole batches of plain SGD: no DP-SGD, micro_batch 0")
    sgd = params.sgd(round_index)
    generators = [torch_generator(seed, Stream.TRAIN, client, round_index) for client in clients]
    streams: list[Iterator[Batch]] = [
        iter(source(params.epochs, generator)) for source, generator in zip(sources, generators, strict=True)
    ]
    names = list(states[0].weights)
    masks = {n: torch.stack([s.train_mask[n] for s in states]).to(states[0].weights[n].dtype) for n in names}
    weights = {n: torch.stack([s.weights[n] for s in states]) * masks[n] for n in names}  # start on the mask
    step = masked_step(model, sgd)
    steps, samples = [0] * len(states), [0] * len(states)
    loss_sum = torch.zeros(len(states), device=masks[names[0]].device)
    padding = _Padding()
    model.train()
    while True:
        batches = [next(stream, None) for stream in streams]
        present = [b for b in batches if b is not None]
        if not present:
            break
        size = max(int(b[1].shape[0]) for b in present)
        parts = [padding.batch(b, size, present[0]) for b in batches]
        for k, b in enumerate(batches):
            if b is not None:
                steps[k] += 1
                samples[k] += int(b[1].shape[0])
        x, y, sample_weight = (torch.stack(column) for column in zip(*parts, strict=True))
        active = padding.active([b is not None for b in batches], x.device)
        with torch.no_grad():
            weights, loss = step(weights, masks, x, y, sample_weight, active)
            loss_sum += loss.detach() * sample_weight.sum(dim=1)
    losses = loss_sum.tolist()  # one host read for the group
    results = []
    for k, (state, client) in enumerate(zip(states, clients, strict=True)):
        trained = {n: weights[n][k].clone() for n in names}  # a client's own storage, not a view of the group's
        stats = TrainStats(steps=steps[k], samples=samples[k],
                           mean_loss=losses[k] / samples[k] if samples[k] else math.nan)  # fmt: skip
        check_trained(stats, trained, round_index, client, sgd.lr)
        gradients = None
        if params.regrow == "gradient":
            load_weights(model, trained)
            gradients = dense_gradients(model, next(iter(sources[k](1, generators[k]))))
        results.append(TrainResult(replace(state, weights=trained), stats, sgd.lr, gradients))
    return results


def groups_by_steps(steps: Sequence[int], size: int) -> list[list[int]]:
    """Positions ``0..len(steps)-1`` in groups of at most ``size``, clients with the most steps together (a group
    runs as many steps as its longest client; the others are padded)."""
    if size < 1:
        raise ValueError(f"group size {size} must be >= 1")
    order = sorted(range(len(steps)), key=lambda k: (-steps[k], k))
    return [order[start : start + size] for start in range(0, len(order), size)]
